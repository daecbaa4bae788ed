//! Turns a validated [`VmConfig`] into a ready-to-start [`Vm`]: booted
//! ([`build_for_boot`]) or rebuilt from a snapshot's state
//! ([`build_from_state`]).
//!
//! Order matters: the VM, then RAM (before the irqchip: see
//! [`kvm::create_vm`]), then the irqchip (devices register irqfds against
//! it), then devices (the Linux command line and the unikernel boot info
//! list them), then vCPUs and the kernel (their registers point at it), or
//! for a restore the vCPU and VM state, and only then the devices'
//! restarts (their first interrupts need the restored irqchip).
//!
//! - [`kvm`]: VM, irqchip, PIT, vCPUs; [`PreparedKvm`].
//! - [`boot`]: guest kind, kernel loading, the Linux command line.
//! - [`crate::device_manager`]: every device, fresh or from its state.

mod boot;
mod kvm;

use std::fs::File;
use std::sync::Arc;

pub use kvm::{make_vm_ahead, prepare_kvm, PreparedKvm};
use kvm_ioctls::{Kvm, VcpuFd, VmFd};
use vm_memory::GuestMemoryRegion;

pub use crate::arch::DEFAULT_LINUX_CMDLINE;
use crate::arch::{self, GuestKind, Irqchip, MmioPlacement};
use crate::config::{ConfigError, VmConfig};
use crate::device_manager::{
    make_mem_device, AttachContext, Buses, DeviceError, MemDevice, StateLookup, VmDevices,
};
use crate::devices::legacy::serial::SerialOut;
use crate::devices::legacy::signal::SignalPort;
use crate::devices::wake::GuestWake;
use crate::memory::{GuestMemoryMmap, GuestRam, MemoryError};
use crate::snapshot::MicrovmState;
use crate::vm::control::RunControl;
use crate::vm::vcpu::{Vcpu, VcpuIo};
use crate::vm::{Vm, VmParts};

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cannot open {what} {path}: {source}")]
    Open {
        what: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot use /dev/kvm: {0}")]
    Kvm(#[source] kvm_ioctls::Error),
    #[error("KVM refused {what}: {source}")]
    KvmSetup {
        what: &'static str,
        #[source]
        source: kvm_ioctls::Error,
    },
    #[error(transparent)]
    Memory(#[from] MemoryError),
    #[error(transparent)]
    Devices(#[from] DeviceError),
    #[error(transparent)]
    Boot(#[from] arch::BootError),
    #[error(transparent)]
    Platform(#[from] arch::PlatformError),
    #[error("the spore unikernel runs on x86_64 only; this spore is built for {0}")]
    UnikernelArch(&'static str),
    #[error("the spore unikernel runs on one vCPU; vcpu_count is {0}")]
    UnikernelVcpus(u64),
    #[error("a unikernel takes no initrd")]
    UnikernelInitrd,
    #[error("device {what}: {detail}")]
    Device { what: &'static str, detail: String },
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// Host-side choices that are not part of the VM's configuration.
pub struct BuildOptions {
    /// Where the guest's serial console goes.
    pub serial_out: SerialOut,
    /// Run control of the VM-to-be; the caller may already wait on it.
    pub control: Arc<RunControl>,
    /// The VMM's MMDS data store (a restore puts the snapshot's in it).
    pub mmds: crate::mmds::SharedMmds,
}

fn open(what: &'static str, path: &str) -> Result<File, BuildError> {
    crate::files::open_regular(std::path::Path::new(path)).map_err(|source| BuildError::Open {
        what,
        path: path.to_string(),
        source,
    })
}

fn kvm_setup(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> BuildError {
    move |source| BuildError::KvmSetup { what, source }
}

/// Builds a VM to boot from `config`'s boot source; nothing runs until
/// [`Vm::start`].
pub fn build_for_boot(config: &VmConfig, opts: BuildOptions) -> Result<Vm, BuildError> {
    config.validate()?;
    let machine = &config.machine;
    let boot = config
        .boot_source
        .as_ref()
        .ok_or(ConfigError::NoBootSource)?;
    let mut kernel = open("kernel image", &boot.kernel_image_path)?;
    let kind = boot::guest_kind(boot.boot_protocol, &mut kernel)?;
    boot::check_guest(config, kind)?;
    let initrd = match &boot.initrd_path {
        Some(path) => Some(open("initrd", path)?),
        None => None,
    };

    crate::phase::mark("build: files opened");
    let (kvm, vm_fd) = kvm::create_vm()?;
    crate::phase::mark("build: VM created");
    let ram = if machine.huge_pages_2m() {
        GuestRam::new_hugetlb(machine.mem_bytes())?
    } else {
        GuestRam::anonymous(machine.mem_bytes())?
    };
    ram.register(&vm_fd, machine.track_dirty_pages)?;
    crate::phase::mark("build: RAM mapped and registered");
    let mem_device = match &config.memory_hotplug {
        Some(h) => Some(make_mem_device(
            &kvm,
            &vm_fd,
            machine.mem_bytes(),
            h,
            machine.track_dirty_pages,
            None,
        )?),
        None => None,
    };
    let mut irqchip = kvm::create_irqchip(&vm_fd, kind, false, machine.vcpu_count_u8())?;
    let vcpus = kvm::create_vcpus(&vm_fd, machine.vcpu_count_u8(), Vec::new())?;
    irqchip.finish(&vcpus)?;
    crate::phase::mark("build: irqchip and vCPUs created");

    let wake = new_wake()?;
    let hotplug_end = mem_device.as_ref().map_or(0, |m| {
        let region = m.region();
        region.start_addr().0.saturating_add(region.len())
    });
    let ctx = AttachContext {
        vm_fd: &vm_fd,
        irqchip: irqchip.present(),
        wake: &wake,
        kind,
        serial_out: opts.serial_out,
        on_reset: reset_hook(&opts.control),
        device_mem: device_memory(&ram, mem_device.as_ref())?,
        mmds: opts.mmds.clone(),
    };
    let (devices, buses) = VmDevices::attach(ctx, config, mem_device, None)?;
    crate::phase::mark("build: devices attached");

    let cmdline = match kind {
        GuestKind::Linux => boot::linux_cmdline(config),
        GuestKind::Unikernel => boot::unikernel_cmdline(config),
    };
    let placed: Vec<MmioPlacement> = devices.mmio_placements();
    arch::load_kernel(arch::KernelLoad {
        kvm: &kvm,
        vcpus: &vcpus,
        irqchip: &irqchip,
        mem: ram.memory(),
        config,
        kind,
        kernel,
        initrd,
        cmdline,
        placed: &placed,
        hotplug_end,
    })?;
    crate::phase::mark("build: kernel loaded, vCPUs set up");
    Ok(assemble(VmPieces {
        kvm,
        vm_fd,
        ram,
        control: opts.control,
        wake,
        devices,
        buses,
        vcpus,
        kind,
        irqchip,
        config,
    }))
}

/// Builds the VM a snapshot describes, with `state` applied over guest RAM
/// already mapped by the caller (a restore path's layers, or a clone's
/// template), on KVM objects made ahead by [`prepare_kvm`] when given;
/// nothing runs until [`Vm::start`].
pub fn build_from_state(
    config: &VmConfig,
    state: &MicrovmState,
    ram: GuestRam,
    prepared: Option<PreparedKvm>,
    opts: BuildOptions,
) -> Result<Vm, BuildError> {
    check_restore_inputs(config, state, &ram, prepared.as_ref())?;
    config.validate()?;
    config
        .boot_source
        .as_ref()
        .ok_or(ConfigError::NoBootSource)?;
    let machine = &config.machine;
    let kind = state.kind;
    boot::check_guest(config, kind)?;
    let mut saved = StateLookup::new(&state.devices);

    let (kvm, vm_fd, prepared_irqchip, premade_vcpus) = match prepared {
        Some(p) => (p.kvm, p.vm_fd, Some(p.irqchip), p.vcpus),
        None => {
            let (kvm, vm_fd) = kvm::create_vm()?;
            crate::phase::mark("restore: VM created");
            ram.register(&vm_fd, machine.track_dirty_pages)?;
            crate::phase::mark("restore: RAM registered");
            (kvm, vm_fd, None, Vec::new())
        }
    };
    let mem_device = match &config.memory_hotplug {
        Some(h) => Some(make_mem_device(
            &kvm,
            &vm_fd,
            machine.mem_bytes(),
            h,
            machine.track_dirty_pages,
            Some((&ram, &mut saved)),
        )?),
        None => None,
    };
    let (irqchip, vcpus) = match prepared_irqchip {
        Some(made) => {
            arch::create_platform_timer(&vm_fd, kind)?;
            (made, premade_vcpus)
        }
        None => {
            let mut irqchip = kvm::create_irqchip(
                &vm_fd,
                kind,
                state.vm.has_irqchip(),
                machine.vcpu_count_u8(),
            )?;
            let vcpus = kvm::create_vcpus(&vm_fd, machine.vcpu_count_u8(), premade_vcpus)?;
            irqchip.finish(&vcpus)?;
            crate::phase::mark("restore: irqchip and vCPUs created");
            (irqchip, vcpus)
        }
    };
    if vcpus.len() as u64 != machine.vcpu_count {
        return Err(BuildError::Device {
            what: "prepared VM",
            detail: "it was made for another vCPU count".into(),
        });
    }

    let wake = new_wake()?;
    let ctx = AttachContext {
        vm_fd: &vm_fd,
        irqchip: irqchip.present(),
        wake: &wake,
        kind,
        serial_out: opts.serial_out,
        on_reset: reset_hook(&opts.control),
        device_mem: device_memory(&ram, mem_device.as_ref())?,
        mmds: opts.mmds.clone(),
    };
    let (devices, buses) = VmDevices::attach(ctx, config, mem_device, Some(&mut saved))?;
    saved.finish()?;
    crate::phase::mark("restore: devices attached");

    kvm::restore_cpus(&vm_fd, &irqchip, &vcpus, state)?;
    devices.finish_restore()?;
    crate::phase::mark("restore: vCPU and device state set");
    let vm = assemble(VmPieces {
        kvm,
        vm_fd,
        ram,
        control: opts.control,
        wake,
        devices,
        buses,
        vcpus,
        kind,
        irqchip,
        config,
    });
    vm.signal().set_generation(state.generation);
    vm.signal().set_restored(machine.vcpu_count.min(255) as u8);
    for (id, &value) in (0..=u8::MAX).zip(&state.signal_results) {
        vm.set_signal_result(id, value);
    }
    Ok(vm)
}

/// Refuses RAM or prepared KVM objects made for another VM.
fn check_restore_inputs(
    config: &VmConfig,
    state: &MicrovmState,
    ram: &GuestRam,
    prepared: Option<&PreparedKvm>,
) -> Result<(), BuildError> {
    if ram.size() != config.machine.mem_bytes() {
        return Err(BuildError::Device {
            what: "guest RAM",
            detail: format!(
                "{} bytes mapped, the configuration has {}",
                ram.size(),
                config.machine.mem_bytes()
            ),
        });
    }
    if let Some(p) = prepared {
        if ram.size() != p.mem_bytes || !p.fits(config, state) {
            return Err(BuildError::Device {
                what: "prepared VM",
                detail: "it was made for another memory size, vCPU count or memory setup".into(),
            });
        }
    }
    Ok(())
}

fn new_wake() -> Result<Arc<GuestWake>, BuildError> {
    let wake = GuestWake::new().map_err(|source| BuildError::Io {
        what: "wake eventfd",
        source,
    })?;
    Ok(Arc::new(wake))
}

/// What devices may address: boot RAM, and the hotplug region if any (Linux
/// onlines plugged memory movable, so the page cache lands there).
fn device_memory(
    ram: &GuestRam,
    mem_device: Option<&MemDevice<'_>>,
) -> Result<GuestMemoryMmap, BuildError> {
    match mem_device {
        Some(m) => {
            let region = m.region();
            Ok(ram
                .memory()
                .insert_region(region.clone())
                .map_err(|_| MemoryError::Region(region.start_addr().0))?)
        }
        None => Ok(ram.memory().clone()),
    }
}

/// Everything a built VM is made of, before its vCPUs are wrapped.
struct VmPieces<'a> {
    kvm: Kvm,
    vm_fd: VmFd,
    ram: GuestRam,
    control: Arc<RunControl>,
    wake: Arc<GuestWake>,
    devices: VmDevices,
    buses: Buses,
    vcpus: Vec<VcpuFd>,
    kind: GuestKind,
    irqchip: Irqchip,
    config: &'a VmConfig,
}

/// The vCPUs' view of the devices (buses, signal port, tmem), and the [`Vm`].
fn assemble(p: VmPieces<'_>) -> Vm {
    let io = Arc::new(VcpuIo {
        pio: p.buses.pio,
        mmio: p.buses.mmio,
        signal: Arc::new(SignalPort::new(p.wake)),
        tmem: p.devices.tmem().clone(),
        mem: p.ram.memory().clone(),
    });
    let vcpus = p
        .vcpus
        .into_iter()
        .zip(0..=u8::MAX)
        .map(|(fd, id)| Vcpu::new(id, fd, p.kind, io.clone(), p.control.clone()))
        .collect();
    p.control
        .set_guest_snapshots(p.config.guest_snapshots.is_some());
    Vm::from_parts(VmParts {
        kvm: p.kvm,
        vm_fd: p.vm_fd,
        ram: p.ram,
        control: p.control,
        io,
        devices: p.devices,
        vcpus,
        kind: p.kind,
        irqchip: p.irqchip,
    })
}

/// The i8042's reset line: stops the VM (`StopReason::Reset`).
fn reset_hook(control: &Arc<RunControl>) -> crate::device_manager::ResetHook {
    let control = control.clone();
    Arc::new(move || control.stop(crate::vm::control::StopReason::Reset))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device_manager::DeviceId;

    #[test]
    fn state_mismatches_name_the_device() {
        let missing = BuildError::from(DeviceError::MissingState(DeviceId::drive("data")));
        assert!(missing.to_string().contains("drive:data"), "{missing}");
        let unknown = BuildError::from(DeviceError::UnknownDevice(DeviceId::balloon()));
        assert!(unknown.to_string().contains("balloon"), "{unknown}");
    }
}
