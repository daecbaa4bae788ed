//! The VMM's state machine behind the API: configure, start, pause, resume.
//!
//! [`Vmm`] holds the configuration until `InstanceStart`, then the running
//! [`Vm`]. API requests arrive one at a time (the API thread serializes
//! them); the process's main thread waits in [`Vmm::wait_for_exit`].

use std::sync::{Arc, Mutex};

use crate::api::snapshot_body::{SnapshotCreateParams, SnapshotType};
use crate::api::{
    ActionType, ApiError, ApiHandler, ApiRequest, ApiResponse, InstanceInfo, InstanceState, VmState,
};
use crate::builder::{build_vm, restore_vm, BuildError, BuildOptions};
use crate::config::VmConfig;
use crate::devices::bus::lock;
use crate::devices::legacy::serial::SerialOut;
use crate::devices::legacy::signal::Mark;
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

#[derive(Debug, thiserror::Error)]
pub enum SnapshotApiError {
    #[error("{0}")]
    Unsupported(&'static str),
    #[error("the microVM is not started; there is nothing to snapshot")]
    NoVm,
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
        }
    }
}
