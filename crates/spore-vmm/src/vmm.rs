//! The VMM's state machine behind the API: configure, start, pause, resume.
//!
//! [`Vmm`] holds the configuration until `InstanceStart`, then the running
//! [`Vm`]. API requests arrive one at a time (the API thread serializes
//! them); the process's main thread waits in [`Vmm::wait_for_exit`].

use std::sync::{Arc, Mutex};

use crate::api::snapshot_body::{SnapshotCreateParams, SnapshotType};
use crate::api::{
    ActionType, ApiError, ApiHandler, ApiRequest, ApiResponse, InstanceInfo, InstanceState,
    TmemInfo, TmemUpdate, VmState,
};
use crate::builder::{build_vm, restore_vm, BuildError, BuildOptions};
use crate::config::{BalloonConfig, VmConfig};
use crate::devices::bus::lock;
use crate::devices::legacy::serial::SerialOut;
use crate::devices::legacy::signal::Mark;
use crate::devices::tmem::PoolStats;
use crate::devices::virtio::balloon::BalloonHandle;
use crate::devices::virtio::mem::MemStatus;
use crate::snapshot;
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

    /// Writes a full snapshot of the paused VM (Firecracker's rule: pause first).
    pub fn create_snapshot(
        &self,
        p: &SnapshotCreateParams,
    ) -> Result<snapshot::SnapshotInfo, SnapshotApiError> {
        if p.snapshot_type != SnapshotType::Full {
            return Err(SnapshotApiError::Unsupported(
                "only Full snapshots are supported so far",
            ));
        }
        let inner = lock(&self.inner);
        let vm = inner.vm.as_ref().ok_or(SnapshotApiError::NoVm)?;
        // The hotplug region is written whole (plugged blocks, after boot
        // RAM); a diff layer would need its own dirty tracking of it.
        if p.snapshot_type != SnapshotType::Full && vm.mem_hotplug().is_some() {
            return Err(SnapshotApiError::Unsupported(
                "diff snapshots of a microVM with a virtio-mem device are not supported: take a Full snapshot",
            ));
        }
        // The pool lives outside guest memory and is not in the snapshot yet:
        // refuse rather than restore a guest whose tmem objects are gone.
        // (The VM is paused, so no put can race this check.)
        if let Some(objects) = vm.tmem().stats().map(|s| s.objects).filter(|&n| n > 0) {
            return Err(SnapshotApiError::TmemNotEmpty(objects));
        }
        Ok(snapshot::create_full(
            vm,
            &inner.config,
            std::path::Path::new(&p.snapshot_path),
            std::path::Path::new(&p.mem_file_path),
        )?)
    }

    /// Builds the VM from a snapshot instead of a boot source; only on a VMM
    /// that has not started a VM. Without `resume` the VM waits paused.
    pub fn load_snapshot(
        &self,
        state_path: &std::path::Path,
        mem_path: &std::path::Path,
        resume: bool,
    ) -> Result<(), SnapshotApiError> {
        let mut inner = lock(&self.inner);
        if inner.vm.is_some() || self.control.stop_reason().is_some() {
            return Err(SnapshotApiError::AlreadyStarted);
        }
        let loaded = snapshot::load(state_path, mem_path)?;
        let serial_out = inner
            .serial_out
            .take()
            .ok_or(SnapshotApiError::AlreadyStarted)?;
        let opts = BuildOptions {
            serial_out,
            control: self.control.clone(),
        };
        let mut vm = match restore_vm(&loaded.config, &loaded.state, loaded.mem_file, opts) {
            Ok(vm) => vm,
            Err(e) => {
                inner.serial_out = Some(Box::new(std::io::stdout()));
                return Err(SnapshotApiError::Build(e));
            }
        };
        let started = if resume {
            vm.start()
        } else {
            vm.start_paused()
        };
        started.map_err(|e| SnapshotApiError::Start(e.to_string()))?;
        inner.config = loaded.config;
        inner.vm = Some(vm);
        Ok(())
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
pub enum SnapshotApiError {
    #[error("{0}")]
    Unsupported(&'static str),
    #[error("the microVM is not started; there is nothing to snapshot")]
    NoVm,
    #[error(
        "the tmem pool holds {0} objects, and tmem contents are not saved in snapshots yet: \
         flush or invalidate them first"
    )]
    TmemNotEmpty(u64),
    #[error("a snapshot can only be loaded before any microVM was started or loaded in this VMM")]
    AlreadyStarted,
    #[error(transparent)]
    Snapshot(#[from] snapshot::SnapshotError),
    #[error("cannot restore the microVM: {0}")]
    Build(#[source] BuildError),
    #[error("cannot start the restored microVM: {0}")]
    Start(String),
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
            ApiRequest::PutHotplugMemory(h) => {
                h.validate().map_err(bad)?;
                self.configure(|c| c.memory_hotplug = Some(h))
            }
            ApiRequest::PatchHotplugMemory(u) => {
                let inner = lock(&self.inner);
                let vm = inner.vm.as_ref().ok_or_else(|| {
                    bad("PATCH /hotplug/memory needs a running microVM; before InstanceStart, PUT /hotplug/memory sets the region")
                })?;
                let mem = vm.mem_hotplug().ok_or_else(|| {
                    bad("this microVM has no hotplug memory (PUT /hotplug/memory before boot)")
                })?;
                mem.set_requested_mib(u.requested_size_mib).map_err(bad)?;
                Ok(ApiResponse::NoContent)
            }
            ApiRequest::GetHotplugMemory => {
                let inner = lock(&self.inner);
                if let Some(mem) = inner.vm.as_ref().and_then(|vm| vm.mem_hotplug()) {
                    return ApiResponse::json(&mem.status());
                }
                let h = inner.config.memory_hotplug.as_ref().ok_or_else(|| {
                    bad("no hotplug memory is configured (PUT /hotplug/memory before boot)")
                })?;
                ApiResponse::json(&MemStatus {
                    total_size_mib: h.total_size_mib,
                    slot_size_mib: h.slot_size_mib,
                    block_size_mib: h.block_size_mib,
                    plugged_size_mib: 0,
                    requested_size_mib: 0,
                })
            }
            ApiRequest::CreateSnapshot(p) => {
                let info = self.create_snapshot(&p).map_err(bad)?;
                ApiResponse::json(&info.manifest)
            }
            ApiRequest::LoadSnapshot(p) => {
                let mem = p.mem_file().map_err(ApiError::BadRequest)?;
                self.load_snapshot(
                    std::path::Path::new(&p.snapshot_path),
                    std::path::Path::new(mem),
                    p.resume_vm,
                )
                .map_err(bad)?;
                Ok(ApiResponse::NoContent)
            }
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
            ApiRequest::PutBalloon(b) => {
                b.validate_for(&lock(&self.inner).config.machine)
                    .map_err(bad)?;
                self.configure(|c| c.balloon = Some(b))
            }
            ApiRequest::PatchBalloon(u) => self.balloon(
                |h| {
                    h.set_target_mib(u.amount_mib)
                        .map(|()| ApiResponse::NoContent)
                },
                |c| {
                    let machine = c.machine.clone();
                    let b = c.balloon.as_mut().ok_or_else(no_balloon)?;
                    let new = BalloonConfig {
                        amount_mib: u.amount_mib,
                        ..b.clone()
                    };
                    new.validate_for(&machine).map_err(bad)?;
                    *b = new;
                    Ok(ApiResponse::NoContent)
                },
            ),
            ApiRequest::GetBalloon => self.balloon(
                |h| ApiResponse::json(&h.status()).map_err(|e| e.to_string()),
                |c| ApiResponse::json(c.balloon.as_ref().ok_or_else(no_balloon)?),
            ),
            ApiRequest::GetBalloonStatistics => self.balloon(
                |h| match h.statistics() {
                    Ok(s) => ApiResponse::json(&s).map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                },
                |_| {
                    Err(bad(
                        "balloon statistics are available once the microVM is started",
                    ))
                },
            ),
            ApiRequest::PatchBalloonStatistics(u) => self.balloon(
                |h| {
                    h.set_stats_interval(u.stats_polling_interval_s)
                        .map(|()| ApiResponse::NoContent)
                },
                |c| {
                    let b = c.balloon.as_mut().ok_or_else(no_balloon)?;
                    b.stats_polling_interval_s = u.stats_polling_interval_s;
                    Ok(ApiResponse::NoContent)
                },
            ),
        }
    }
}

fn no_balloon() -> ApiError {
    bad("no balloon device: configure one with PUT /balloon before InstanceStart")
}

impl Vmm {
    /// Runs `running` on the balloon of the started VM, or `configuring` on
    /// the configuration before InstanceStart.
    fn balloon<E: std::fmt::Display>(
        &self,
        running: impl FnOnce(&BalloonHandle) -> Result<ApiResponse, E>,
        configuring: impl FnOnce(&mut VmConfig) -> Result<ApiResponse, ApiError>,
    ) -> Result<ApiResponse, ApiError> {
        let mut inner = lock(&self.inner);
        match &inner.vm {
            Some(vm) => running(vm.balloon().ok_or_else(no_balloon)?).map_err(bad),
            None => configuring(&mut inner.config),
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
