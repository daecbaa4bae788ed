//! The VMM's state machine behind the API: configure, start, pause, resume.
//!
//! [`Vmm`] holds the configuration until `InstanceStart`, then the running
//! [`Vm`]. API requests arrive one at a time (the API thread serializes
//! them); the process's main thread waits in [`Vmm::wait_for_exit`].

use std::sync::{Arc, Mutex};

use crate::api::{
    ActionType, ApiError, ApiHandler, ApiRequest, ApiResponse, InstanceInfo, InstanceState,
    TmemInfo, TmemUpdate, VmState,
};
use crate::builder::{build_vm, BuildError, BuildOptions};
use crate::config::VmConfig;
use crate::devices::bus::lock;
use crate::devices::legacy::serial::SerialOut;
use crate::devices::legacy::signal::Mark;
use crate::devices::tmem::PoolStats;
use crate::vm::control::{RunControl, StopReason};
use crate::vm::{RunState, Vm};

pub struct Vmm {
    id: String,
    control: Arc<RunControl>,
    inner: Mutex<Inner>,
}

struct Inner {
    config: VmConfig,
    vm: Option<Vm>,
    /// Consumed when the VM is built.
    serial_out: Option<SerialOut>,
}

impl Vmm {
    pub fn new(id: String, config: VmConfig, serial_out: SerialOut) -> Self {
        Self {
            id,
            control: Arc::new(RunControl::new()),
            inner: Mutex::new(Inner {
                config,
                vm: None,
                serial_out: Some(serial_out),
            }),
        }
    }

    /// Builds and starts the VM from the current configuration.
    pub fn start(&self) -> Result<(), StartError> {
        let mut inner = lock(&self.inner);
        if inner.vm.is_some() || self.control.stop_reason().is_some() {
            return Err(StartError::AlreadyStarted);
        }
        let serial_out = inner.serial_out.take().ok_or(StartError::AlreadyStarted)?;
        let mut vm = match build_vm(
            &inner.config,
            BuildOptions {
                serial_out,
                control: self.control.clone(),
            },
        ) {
            Ok(vm) => vm,
            Err(e) => {
                // A failed build may be retried after fixing the config, but the
                // serial sink is gone: give the next attempt stdout.
                inner.serial_out = Some(Box::new(std::io::stdout()));
                return Err(StartError::Build(e));
            }
        };
        vm.start().map_err(|e| StartError::Start(e.to_string()))?;
        inner.vm = Some(vm);
        Ok(())
    }

    /// Blocks until the VM stops (or a stop is requested before it starts).
    pub fn wait_for_exit(&self) -> StopReason {
        self.control.wait_stopped()
    }

    /// Asks the VM to stop (host signal, shutdown).
    pub fn request_stop(&self) {
        self.control.stop(StopReason::Requested);
    }

    /// Stops vCPU threads and releases the VM; returns the marks it recorded.
    pub fn shutdown(&self) -> Vec<Mark> {
        let mut inner = lock(&self.inner);
        match inner.vm.take() {
            Some(mut vm) => {
                let marks = vm.marks();
                vm.stop(StopReason::Requested);
                marks
            }
            None => Vec::new(),
        }
    }

    pub fn state(&self) -> RunState {
        match &lock(&self.inner).vm {
            Some(vm) => vm.state(),
            None if self.control.stop_reason().is_some() => RunState::Stopped,
            None => RunState::NotStarted,
        }
    }

    pub fn control(&self) -> &Arc<RunControl> {
        &self.control
    }

    /// Feeds console input to the guest's serial port; returns bytes taken.
    pub fn serial_input(&self, bytes: &[u8]) -> usize {
        match &lock(&self.inner).vm {
            Some(vm) => lock(vm.serial()).enqueue_input(bytes),
            None => 0,
        }
    }

    fn configure(&self, f: impl FnOnce(&mut VmConfig)) -> Result<ApiResponse, ApiError> {
        let mut inner = lock(&self.inner);
        if inner.vm.is_some() {
            return Err(ApiError::BadRequest(
                "the microVM is already started; this can only be set before InstanceStart".into(),
            ));
        }
        f(&mut inner.config);
        Ok(ApiResponse::NoContent)
    }
}

impl Vmm {
    /// `GET /tmem`: the running pool, or the configured one before start.
    pub fn tmem_info(&self) -> TmemInfo {
        let inner = lock(&self.inner);
        if let Some(vm) = inner.vm.as_ref() {
            if let Some(stats) = vm.tmem().stats() {
                return TmemInfo {
                    enabled: true,
                    stats,
                    timing: vm.tmem().timing(),
                };
            }
        }
        let t = &inner.config.tmem;
        TmemInfo {
            enabled: t.enabled && inner.vm.is_none(),
            stats: PoolStats {
                quota_bytes: t.quota_bytes,
                compression: t.compression,
                ..Default::default()
            },
            timing: None,
        }
    }

    /// `PUT /tmem`: any field before start, only the quota afterwards.
    fn update_tmem(&self, update: &TmemUpdate) -> Result<ApiResponse, ApiError> {
        let mut inner = lock(&self.inner);
        let Some(vm) = &inner.vm else {
            inner.config.tmem = update.apply(&inner.config.tmem);
            return Ok(ApiResponse::NoContent);
        };
        if update.enabled.is_some() || update.compression.is_some() {
            return Err(bad(
                "the microVM is started: PUT /tmem may only change quota_bytes now \
                 (enabled and compression are set before InstanceStart)",
            ));
        }
        let quota = update.quota_bytes.unwrap_or(inner.config.tmem.quota_bytes);
        if !vm.tmem().set_quota(quota) {
            return Err(bad(
                "this microVM has no tmem pool (tmem.enabled was false at InstanceStart)",
            ));
        }
        inner.config.tmem.quota_bytes = quota;
        Ok(ApiResponse::NoContent)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("the microVM was already started (InstanceStart is accepted once)")]
    AlreadyStarted,
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error("cannot start the microVM: {0}")]
    Start(String),
}

fn bad(e: impl std::fmt::Display) -> ApiError {
    ApiError::BadRequest(e.to_string())
}

impl ApiHandler for Vmm {
    fn handle(&self, req: ApiRequest) -> Result<ApiResponse, ApiError> {
        match req {
            ApiRequest::GetInstanceInfo => {
                let state = match self.state() {
                    RunState::NotStarted => InstanceState::NotStarted,
                    RunState::Running => InstanceState::Running,
                    RunState::Paused => InstanceState::Paused,
                    RunState::Stopped => InstanceState::Stopped,
                };
                ApiResponse::json(&InstanceInfo::new(self.id.clone(), state))
            }
            ApiRequest::GetMachineConfig => ApiResponse::json(&lock(&self.inner).config.machine),
            ApiRequest::GetVmConfig => ApiResponse::json(&lock(&self.inner).config),
            ApiRequest::PutBootSource(b) => {
                b.validate().map_err(bad)?;
                self.configure(|c| c.boot_source = Some(b))
            }
            ApiRequest::PutMachineConfig(m) => {
                m.validate().map_err(bad)?;
                self.configure(|c| c.machine = m)
            }
            ApiRequest::PatchMachineConfig(p) => {
                let m = p.apply(&lock(&self.inner).config.machine);
                m.validate().map_err(bad)?;
                self.configure(|c| c.machine = m)
            }
            ApiRequest::PutDrive(d) => {
                d.validate().map_err(bad)?;
                self.configure(|c| c.upsert_drive(d))
            }
            ApiRequest::PutVsock(v) => {
                v.validate().map_err(bad)?;
                self.configure(|c| c.vsock = Some(v))
            }
            ApiRequest::Action(ActionType::InstanceStart) => {
                self.start().map_err(bad)?;
                Ok(ApiResponse::NoContent)
            }
            ApiRequest::Action(ActionType::SendCtrlAltDel) => {
                let inner = lock(&self.inner);
                let vm = inner
                    .vm
                    .as_ref()
                    .ok_or_else(|| bad("the microVM is not started"))?;
                vm.send_ctrl_alt_del().map_err(bad)?;
                Ok(ApiResponse::NoContent)
            }
            ApiRequest::Action(ActionType::FlushMetrics) => Ok(ApiResponse::NoContent),
            ApiRequest::GetTmem => ApiResponse::json(&self.tmem_info()),
            ApiRequest::PutTmem(update) => self.update_tmem(&update),
            ApiRequest::PatchVm(state) => {
                let inner = lock(&self.inner);
                let vm = inner
                    .vm
                    .as_ref()
                    .ok_or_else(|| bad("the microVM is not started"))?;
                match state {
                    VmState::Paused => vm.pause().map_err(bad)?,
                    VmState::Resumed => vm.resume().map_err(bad)?,
                }
                Ok(ApiResponse::NoContent)
            }
        }
    }
}

#[cfg(test)]
mod tmem_api_tests {
    use super::*;
    use crate::config::Compression;

    fn vmm() -> Vmm {
        Vmm::new("t".into(), VmConfig::default(), Box::new(std::io::sink()))
    }

    fn info(v: &Vmm) -> serde_json::Value {
        match v.handle(ApiRequest::GetTmem) {
            Ok(ApiResponse::Json(j)) => j,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn tmem_is_configured_before_start() {
        let v = vmm();
        let j = info(&v);
        assert_eq!(j["enabled"], true);
        assert_eq!(j["quota_bytes"], 256u64 << 20);
        assert_eq!(j["compression"], "none");
        assert_eq!(j["objects"], 0);
        assert_eq!(j["puts"], 0);
        let update = TmemUpdate {
            quota_bytes: Some(4096),
            compression: Some(Compression::Lz4),
            enabled: None,
        };
        assert_eq!(
            v.handle(ApiRequest::PutTmem(update)),
            Ok(ApiResponse::NoContent)
        );
        let j = info(&v);
        assert_eq!(
            (j["quota_bytes"].as_u64(), j["compression"].as_str()),
            (Some(4096), Some("lz4"))
        );
        let off = TmemUpdate {
            enabled: Some(false),
            ..Default::default()
        };
        v.handle(ApiRequest::PutTmem(off)).unwrap();
        assert_eq!(info(&v)["enabled"], false);
        assert!(lock(&v.inner).config.tmem.compression == Compression::Lz4);
    }
}
