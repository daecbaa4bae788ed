//! Before `InstanceStart`: the configuration setters (each valid only while
//! no VM is built), the configuration reads (valid always), and `start`,
//! which builds the VM from the configuration and boots it.
//!
//! Every setter validates what it was given before it looks at the state,
//! so a bad body gets the same answer before and after start.

use super::{bad, BuiltVm, Inner, Phase, StartError, Vmm};
use crate::api::{ApiError, InstanceInfo, InstanceState, MachineConfigPatch};
use crate::builder::{build_for_boot, BuildOptions};
use crate::config::{
    BalloonConfig, BootSourceConfig, DriveConfig, MachineConfig, MemoryHotplugConfig, VmConfig,
    VsockConfig,
};
use crate::vm::RunState;

/// Why a setter refused: only before InstanceStart.
const ONLY_BEFORE_START: &str =
    "the microVM is already started; this can only be set before InstanceStart";

impl Vmm {
    /// Builds and starts the VM from the current configuration.
    pub fn start(&self) -> Result<(), StartError> {
        let mut inner = self.lock();
        let serial_out = inner.take_serial_out(&self.control)?;
        crate::boot_timer::instance_start();
        let opts = BuildOptions {
            serial_out,
            control: self.control.clone(),
            mmds: inner.mmds.clone(),
        };
        let mut vm = match build_for_boot(&inner.config, opts) {
            Ok(vm) => vm,
            Err(e) => {
                inner.build_failed();
                return Err(StartError::Build(e));
            }
        };
        self.install_fork_handler(&vm);
        vm.start().map_err(|e| StartError::Start(e.to_string()))?;
        inner.phase = Phase::Built(BuiltVm::new(vm));
        Ok(())
    }

    /// `GET /`.
    pub fn instance_info(&self) -> InstanceInfo {
        let state = match self.state() {
            RunState::NotStarted => InstanceState::NotStarted,
            RunState::Running => InstanceState::Running,
            RunState::Paused => InstanceState::Paused,
            RunState::Stopped => InstanceState::Stopped,
        };
        InstanceInfo::new(self.id.clone(), state)
    }

    /// `GET /machine-config`.
    pub fn machine_config(&self) -> MachineConfig {
        self.lock().config.machine.clone()
    }

    /// `GET /vm/config`: the whole configuration (a restored or cloned VM's
    /// is the one it was built from).
    pub fn vm_config(&self) -> VmConfig {
        self.lock().config.clone()
    }

    /// `PUT /boot-source`.
    pub fn set_boot_source(&self, b: BootSourceConfig) -> Result<(), ApiError> {
        b.validate().map_err(bad)?;
        self.configure(|c| c.boot_source = Some(b))
    }

    /// `PUT /machine-config`.
    pub fn set_machine_config(&self, m: MachineConfig) -> Result<(), ApiError> {
        m.validate().map_err(bad)?;
        self.configure(|c| {
            // A static template replaces a custom one (PUT /cpu-config).
            if m.cpu_template.as_deref().is_some_and(|t| t != "None") {
                c.cpu_config = None;
            }
            c.machine = m
        })
    }

    /// `PATCH /machine-config`: the fields given, over the current ones.
    pub fn patch_machine_config(&self, p: &MachineConfigPatch) -> Result<(), ApiError> {
        let mut inner = self.lock();
        let m = p.apply(&inner.config.machine);
        m.validate().map_err(bad)?;
        let static_template = p.cpu_template.as_deref().is_some_and(|t| t != "None");
        configure(&mut inner, |c| {
            if static_template {
                c.cpu_config = None;
            }
            c.machine = m
        })
    }

    /// `PUT /drives/{id}`: adds the drive or replaces the one with its id.
    pub fn put_drive(&self, d: DriveConfig) -> Result<(), ApiError> {
        d.validate().map_err(bad)?;
        self.configure(|c| c.upsert_drive(d))
    }

    /// `PUT /vsock`.
    pub fn set_vsock(&self, v: VsockConfig) -> Result<(), ApiError> {
        v.validate().map_err(bad)?;
        self.configure(|c| c.vsock = Some(v))
    }

    /// `PUT /hotplug/memory`: the virtio-mem region.
    pub fn set_hotplug_memory(&self, h: MemoryHotplugConfig) -> Result<(), ApiError> {
        h.validate().map_err(bad)?;
        self.configure(|c| c.memory_hotplug = Some(h))
    }

    /// `PUT /balloon`: checked against the machine's memory size.
    pub fn set_balloon(&self, b: BalloonConfig) -> Result<(), ApiError> {
        let mut inner = self.lock();
        b.validate_for(&inner.config.machine).map_err(bad)?;
        configure(&mut inner, |c| c.balloon = Some(b))
    }

    fn configure(&self, f: impl FnOnce(&mut VmConfig)) -> Result<(), ApiError> {
        configure(&mut self.lock(), f)
    }
}

/// Changes the configuration while no VM is built.
pub(super) fn configure(inner: &mut Inner, f: impl FnOnce(&mut VmConfig)) -> Result<(), ApiError> {
    if !matches!(inner.phase, Phase::PreBoot { .. }) {
        return Err(bad(ONLY_BEFORE_START));
    }
    f(&mut inner.config);
    Ok(())
}
