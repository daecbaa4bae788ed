//! Turns a validated [`VmConfig`] into a ready-to-start [`Vm`].
//!
//! Order matters: RAM, then the irqchip (devices register irqfds against
//! it), then devices (the Linux command line and the unikernel boot info
//! list them), then the kernel, then vCPUs (their registers point at the
//! loaded kernel).

use std::fs::File;
use std::sync::{Arc, Mutex};

use kvm_bindings::{kvm_pit_config, KVM_PIT_SPEAKER_DUMMY};
use kvm_ioctls::{IoEventAddress, Kvm, VmFd};
use vm_memory::GuestMemoryRegion;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::arch::x86_64::layout;
use crate::arch::x86_64::linux::{load_linux, LinuxBootError};
use crate::arch::x86_64::linux_vcpu::{configure_linux_vcpu, LinuxVcpuError};
use crate::arch::x86_64::unikernel::{
    configure_vcpu as configure_unikernel_vcpu, is_spore_unikernel, load_unikernel_mapping,
    set_supported_cpuid, UnikernelError,
};
use crate::config::{BootProtocol, ConfigError, VmConfig};
use crate::devices::bus::{Bus, BusError};
use crate::devices::legacy::i8042::I8042;
use crate::devices::legacy::serial::{IrqTrigger, SerialDevice, SerialOut};
use crate::devices::legacy::signal::SignalPort;
use crate::devices::tmem::TmemDevice;
use crate::devices::virtio::balloon::{Balloon, BalloonSettings};
use crate::devices::virtio::blk::{Block, BlockError};
use crate::devices::virtio::mem::{MemHandle, VirtioMem, VirtioMemState};
use crate::devices::virtio::mmio::state::MmioTransportState;
use crate::devices::virtio::mmio::MmioTransport;
use crate::devices::virtio::rng::Rng;
use crate::devices::virtio::vsock::{Vsock, VsockError};
use crate::devices::virtio::{GuestMemoryMmap, VirtioDevice, VirtioInterrupt};
use crate::host::lock;
use crate::memory::hotplug::HotplugMemory;
use crate::memory::{GuestRam, MemoryError};
use crate::snapshot::MicrovmState;
use crate::vm::control::{RunControl, StopReason};
use crate::vm::vcpu::{Vcpu, VcpuIo};
use crate::vm::wake::GuestWake;
use crate::vm::{GuestKind, Vm, VmParts};

/// Command line used when `/boot-source` gives none (Firecracker's, plus the
/// console): reboot through the keyboard controller, no PCI probing.
pub const DEFAULT_LINUX_CMDLINE: &str =
    "console=ttyS0 reboot=k panic=1 pci=off i8042.noaux i8042.nomux i8042.dumbkbd";

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
    #[error("drive {id}: {source}")]
    Drive {
        id: String,
        #[source]
        source: BlockError,
    },
    #[error("vsock: {0}")]
    Vsock(#[from] VsockError),
    #[error("Linux boot: {0}")]
    Linux(#[from] LinuxBootError),
    #[error("Linux vCPU setup: {0}")]
    LinuxVcpu(#[from] LinuxVcpuError),
    #[error("unikernel boot: {0}")]
    Unikernel(#[from] UnikernelError),
    #[error("the spore unikernel runs on one vCPU; vcpu_count is {0}")]
    UnikernelVcpus(u64),
    #[error("a unikernel takes no initrd")]
    UnikernelInitrd,
    #[error("too many virtio devices (at most {0})")]
    TooManyDevices(usize),
    #[error("device {what}: {detail}")]
    Device { what: &'static str, detail: String },
    #[error(transparent)]
    Bus(#[from] BusError),
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
}

fn open(what: &'static str, path: &str) -> Result<File, BuildError> {
    File::open(path).map_err(|source| BuildError::Open {
        what,
        path: path.to_string(),
        source,
    })
}

fn kvm_setup(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> BuildError {
    move |source| BuildError::KvmSetup { what, source }
}

/// Virtio-mmio devices being attached, in guest order.
struct VirtioSlots<'a> {
    vm_fd: &'a VmFd,
    /// What devices may address: boot RAM, plus the hotplug region if any.
    mem: GuestMemoryMmap,
    wake: &'a Arc<GuestWake>,
    irqchip: bool,
    /// Transport states to apply, in attach order, when restoring.
    restore: Option<&'a [MmioTransportState]>,
    bus: Bus,
    /// (base address, irq, device type) per device, for the cmdline / boot info.
    placed: Vec<(u64, u32, u32)>,
    transports: Vec<Arc<Mutex<MmioTransport>>>,
}

impl VirtioSlots<'_> {
    fn attach(&mut self, device: Box<dyn VirtioDevice>) -> Result<(), BuildError> {
        let index = self.placed.len();
        if index >= layout::VIRTIO_MMIO_MAX {
            return Err(BuildError::TooManyDevices(layout::VIRTIO_MMIO_MAX));
        }
        let addr = layout::virtio_mmio_addr(index);
        let irq = layout::virtio_mmio_irq(index);
        let device_type = device.device_type();
        let irqfd = EventFd::new(EFD_NONBLOCK).map_err(|source| BuildError::Io {
            what: "irqfd",
            source,
        })?;
        if self.irqchip {
            self.vm_fd
                .register_irqfd(&irqfd, irq)
                .map_err(kvm_setup("a virtio irqfd"))?;
        }
        let interrupt = Arc::new(VirtioInterrupt::new(irqfd, self.wake.clone()));
        let mem = self.mem.clone();
        let transport = match self.restore {
            None => MmioTransport::new(device, mem, interrupt).map_err(|e| e.to_string()),
            Some(states) => match states.get(index) {
                Some(state) => {
                    MmioTransport::restore(device, mem, interrupt, state).map_err(|e| e.to_string())
                }
                None => Err(format!(
                    "the snapshot has {} virtio devices, this VM more",
                    states.len()
                )),
            },
        }
        .map_err(|detail| BuildError::Device {
            what: "virtio-mmio transport",
            detail,
        })?;
        for (queue, event) in transport.queue_events().iter().enumerate() {
            // The notify register is at offset 0x50; datamatch on the queue index.
            self.vm_fd
                .register_ioevent(event, &IoEventAddress::Mmio(addr + 0x50), queue as u32)
                .map_err(kvm_setup("a virtio ioeventfd"))?;
        }
        let transport = Arc::new(Mutex::new(transport));
        self.bus
            .insert(addr, layout::VIRTIO_MMIO_SIZE, transport.clone())?;
        self.transports.push(transport);
        self.placed.push((addr, irq, device_type));
        Ok(())
    }
}

/// Builds a VM to boot from `config`'s boot source; nothing runs until
/// [`Vm::start`].
pub fn build_for_boot(config: &VmConfig, opts: BuildOptions) -> Result<Vm, BuildError> {
    build(config, opts, None, None)
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
    if let Some(p) = &prepared {
        if ram.size() != p.mem_bytes || !p.fits(config, state) {
            return Err(BuildError::Device {
                what: "prepared VM",
                detail: "it was made for another memory size, vCPU count or memory setup".into(),
            });
        }
    }
    build(config, opts, Some((state, ram)), prepared)
}

/// KVM objects made ahead of time for a restore whose RAM is not known yet
/// (a standby clone process): the VM, its memory slots over a placeholder
/// mapping of the final size, the irqchip and the vCPUs. Creating and
/// registering these is most of a restore's cost and grows with memory
/// size; the RAM is later mapped over the same host addresses.
pub struct PreparedKvm {
    kvm: Kvm,
    vm_fd: VmFd,
    irqchip: bool,
    vcpus: Vec<kvm_ioctls::VcpuFd>,
    mem_bytes: u64,
}

impl PreparedKvm {
    pub fn mem_bytes(&self) -> u64 {
        self.mem_bytes
    }

    /// Whether a VM with this configuration and state can be restored on it.
    pub fn fits(&self, config: &VmConfig, state: &MicrovmState) -> bool {
        self.mem_bytes == config.machine.mem_bytes()
            && self.vcpus.len() as u64 == config.machine.vcpu_count
            && !config.machine.track_dirty_pages
            && config.memory_hotplug.is_none()
            && (self.irqchip || state.vm.irqchips.is_empty())
    }
}

/// Creates the VM and registers `ram` (a placeholder of the final size,
/// without dirty logging) before the irqchip, as [`build`] would.
pub fn prepare_kvm(ram: &GuestRam, vcpus: u8) -> Result<PreparedKvm, BuildError> {
    let kvm = Kvm::new().map_err(BuildError::Kvm)?;
    let vm_fd = kvm.create_vm().map_err(kvm_setup("KVM_CREATE_VM"))?;
    vm_fd
        .set_tss_address(layout::KVM_TSS_ADDR as usize)
        .map_err(kvm_setup("KVM_SET_TSS_ADDR"))?;
    ram.register(&vm_fd, false)?;
    let irqchip = vm_fd.create_irq_chip().is_ok();
    let vcpus = (0..vcpus)
        .map(|id| vm_fd.create_vcpu(u64::from(id)))
        .collect::<Result<_, _>>()
        .map_err(kvm_setup("KVM_CREATE_VCPU"))?;
    Ok(PreparedKvm {
        kvm,
        vm_fd,
        irqchip,
        vcpus,
        mem_bytes: ram.size(),
    })
}

fn build(
    config: &VmConfig,
    opts: BuildOptions,
    restore: Option<(&MicrovmState, GuestRam)>,
    prepared: Option<PreparedKvm>,
) -> Result<Vm, BuildError> {
    config.validate()?;
    let boot = config
        .boot_source
        .as_ref()
        .ok_or(ConfigError::NoBootSource)?;
    let machine = &config.machine;
    let (state, restored_ram) = match restore {
        Some((s, f)) => (Some(s), Some(f)),
        None => (None, None),
    };
    // A restored VM needs no kernel: its memory already holds one.
    let mut kernel = match state {
        None => Some(open("kernel image", &boot.kernel_image_path)?),
        Some(_) => None,
    };
    let kind = match (state, boot.boot_protocol, kernel.as_mut()) {
        (Some(s), _, _) => s.kind,
        (None, BootProtocol::Linux, _) => GuestKind::Linux,
        (None, BootProtocol::Unikernel, _) => GuestKind::Unikernel,
        (None, BootProtocol::Auto, Some(k)) => {
            if is_spore_unikernel(k)? {
                GuestKind::Unikernel
            } else {
                GuestKind::Linux
            }
        }
        (None, BootProtocol::Auto, None) => GuestKind::Linux,
    };
    if kind == GuestKind::Unikernel {
        if machine.vcpu_count != 1 {
            return Err(BuildError::UnikernelVcpus(machine.vcpu_count));
        }
        if boot.initrd_path.is_some() {
            return Err(BuildError::UnikernelInitrd);
        }
    }
    let mut initrd = match (&boot.initrd_path, state) {
        (Some(p), None) => Some(open("initrd", p)?),
        _ => None,
    };

    let (kvm, vm_fd, pre_irqchip, mut pre_vcpus) = match prepared {
        Some(p) => (p.kvm, p.vm_fd, Some(p.irqchip), p.vcpus),
        None => {
            let kvm = Kvm::new().map_err(BuildError::Kvm)?;
            let vm_fd = kvm.create_vm().map_err(kvm_setup("KVM_CREATE_VM"))?;
            vm_fd
                .set_tss_address(layout::KVM_TSS_ADDR as usize)
                .map_err(kvm_setup("KVM_SET_TSS_ADDR"))?;
            (kvm, vm_fd, None, Vec::new())
        }
    };
    // RAM before the irqchip: with an irqchip present, each memory-slot
    // change is far costlier in KVM (7 ms instead of 70 µs for 128 MiB
    // measured on kvm_pvm), and this is on the boot path.
    // The snapshot's memory file also holds the hotplug region, after RAM:
    // a restore maps it from the file RAM itself was mapped from.
    let hotplug_file = match (&restored_ram, &config.memory_hotplug) {
        (Some(ram), Some(h)) => Some(hotplug_snapshot_file(
            ram,
            machine.mem_bytes(),
            h.total_size_mib << 20,
        )?),
        _ => None,
    };
    let ram = match restored_ram {
        Some(ram) => ram,
        None => GuestRam::new(machine.mem_bytes())?,
    };
    if pre_irqchip.is_none() {
        ram.register(&vm_fd, machine.track_dirty_pages)?;
    }
    // The virtio-mem device is built here, before the irqchip, because a
    // restore re-registers the KVM slots of its plugged chunks.
    let mem_device = match &config.memory_hotplug {
        Some(h) => Some(virtio_mem_device(
            &kvm,
            &vm_fd,
            machine.mem_bytes(),
            h,
            hotplug_file,
            state.map(|s| s.elastic.mem.as_ref()),
        )?),
        None => None,
    };
    // Guest buffers may live in plugged memory (Linux onlines it movable, so
    // the page cache lands there): devices see the hotplug region too.
    let device_mem = match &mem_device {
        Some((_, _, region)) => ram
            .memory()
            .insert_region(region.clone())
            .map_err(|_| MemoryError::Region(region.start_addr().0))?,
        None => ram.memory().clone(),
    };
    // Linux needs the in-kernel irqchip; a unikernel polls and can do without.
    let irqchip = match pre_irqchip {
        Some(made) => made,
        None => match (vm_fd.create_irq_chip(), kind) {
            (Ok(()), _) => true,
            (Err(e), _) if state.is_some_and(|s| !s.vm.irqchips.is_empty()) => {
                return Err(kvm_setup("KVM_CREATE_IRQCHIP (the snapshot has one)")(e))
            }
            (Err(e), GuestKind::Linux) => return Err(kvm_setup("KVM_CREATE_IRQCHIP")(e)),
            (Err(e), GuestKind::Unikernel) => {
                tracing::debug!("no in-kernel irqchip for the unikernel: {e}");
                false
            }
        },
    };
    if kind == GuestKind::Linux {
        let pit = kvm_pit_config {
            flags: KVM_PIT_SPEAKER_DUMMY,
            ..Default::default()
        };
        vm_fd
            .create_pit2(pit)
            .map_err(kvm_setup("KVM_CREATE_PIT2"))?;
    }

    let control = opts.control;
    let wake = Arc::new(GuestWake::new().map_err(|source| BuildError::Io {
        what: "wake eventfd",
        source,
    })?);

    // Legacy devices.
    let mut pio = Bus::new();
    let serial_irq = new_irqfd(&vm_fd, irqchip, layout::SERIAL_IRQ)?;
    let serial_trigger = IrqTrigger::new(serial_irq, wake.clone());
    let serial =
        Arc::new(Mutex::new(match state {
            Some(s) => SerialDevice::restore(serial_trigger, opts.serial_out, &s.serial).map_err(
                |detail| BuildError::Device {
                    what: "serial",
                    detail,
                },
            )?,
            None => SerialDevice::new(serial_trigger, opts.serial_out),
        }));
    pio.insert(
        layout::SERIAL_PORT_BASE,
        layout::SERIAL_PORT_LEN,
        serial.clone(),
    )?;
    let i8042 = if kind == GuestKind::Linux {
        let kbd_irq = new_irqfd(&vm_fd, irqchip, layout::I8042_IRQ)?;
        let ctl = control.clone();
        let on_reset = Box::new(move || ctl.stop(StopReason::Reset));
        let dev = Arc::new(Mutex::new(match state.and_then(|s| s.i8042.as_ref()) {
            Some(saved) => I8042::restore(kbd_irq, on_reset, saved),
            None => I8042::new(kbd_irq, on_reset),
        }));
        pio.insert(layout::I8042_PORT_BASE, layout::I8042_PORT_LEN, dev.clone())?;
        Some(dev)
    } else {
        None
    };

    // Virtio devices: the root drive first so that it is /dev/vda.
    let mut slots = VirtioSlots {
        vm_fd: &vm_fd,
        mem: device_mem,
        wake: &wake,
        irqchip,
        restore: state.map(|s| s.virtio.as_slice()),
        bus: Bus::new(),
        placed: Vec::new(),
        transports: Vec::new(),
    };
    let mut drives: Vec<_> = config.drives.iter().collect();
    drives.sort_by_key(|d| !d.is_root_device);
    let mut drive_handles = Vec::with_capacity(drives.len());
    for d in &drives {
        let block = Block::open(d).map_err(|source| BuildError::Drive {
            id: d.drive_id.clone(),
            source,
        })?;
        drive_handles.push(block.handle());
        slots.attach(Box::new(block))?;
    }
    slots.attach(Box::new(Rng::new()))?;
    let mut vsock_handle = None;
    if let Some(v) = &config.vsock {
        let vsock = Vsock::new(v.guest_cid as u64, v.uds_path.clone().into())?;
        vsock_handle = Some(vsock.handle()?);
        slots.attach(Box::new(vsock))?;
    }
    let mut balloon = None;
    if let Some(b) = &config.balloon {
        let settings = BalloonSettings {
            amount_mib: b.amount_mib,
            deflate_on_oom: b.deflate_on_oom,
            stats_polling_interval_s: b.stats_polling_interval_s,
            free_page_reporting: b.free_page_reporting,
            mem_mib: machine.mem_size_mib,
        };
        let device = match state.map(|s| s.elastic.balloon.as_ref()) {
            None => Balloon::new(settings).map_err(|e| e.to_string()),
            Some(Some(saved)) => Balloon::restore(settings, saved).map_err(|e| e.to_string()),
            Some(None) => Err("the snapshot has no balloon state".to_string()),
        }
        .map_err(|detail| BuildError::Device {
            what: "virtio-balloon",
            detail,
        })?;
        balloon = Some(device.handle());
        slots.attach(Box::new(device))?;
    }
    // The unikernel's identity map must reach the hotplug region.
    let hotplug_end = mem_device
        .as_ref()
        .map_or(0, |(_, _, r)| r.start_addr().0.saturating_add(r.len()));
    let mem_hotplug = match mem_device {
        Some((device, handle, _)) => {
            slots.attach(Box::new(device))?;
            Some(handle)
        }
        None => None,
    };
    if let Some(s) = state {
        if s.virtio.len() != slots.placed.len() {
            return Err(BuildError::Device {
                what: "virtio devices",
                detail: format!(
                    "the snapshot has {} virtio devices, this VM {}",
                    s.virtio.len(),
                    slots.placed.len()
                ),
            });
        }
    }
    let VirtioSlots {
        bus: mmio,
        placed,
        transports: virtio,
        ..
    } = slots;

    // vCPUs and the kernel.
    let num_vcpus = machine.vcpu_count as u8;
    let mut fds = Vec::with_capacity(num_vcpus as usize);
    pre_vcpus.reverse();
    for id in 0..num_vcpus {
        let fd = match pre_vcpus.pop() {
            Some(fd) => fd,
            None => vm_fd
                .create_vcpu(id as u64)
                .map_err(kvm_setup("KVM_CREATE_VCPU"))?,
        };
        fds.push(fd);
    }
    let mem = ram.memory();
    match (state, kernel.as_mut(), kind) {
        (Some(s), _, _) => {
            restore_cpus(&vm_fd, &fds, s)?;
            // Devices start only now: their first interrupts need the
            // restored irqchip.
            for t in &virtio {
                lock(t).finish_restore().map_err(|e| BuildError::Device {
                    what: "virtio device",
                    detail: e.to_string(),
                })?;
            }
        }
        (None, None, _) => {
            return Err(BuildError::Device {
                what: "kernel",
                detail: "no kernel image was opened".into(),
            })
        }
        (None, Some(kernel), GuestKind::Linux) => {
            let cmdline = linux_cmdline(config, &placed);
            let entry = load_linux(mem, kernel, initrd.as_mut(), &cmdline, num_vcpus)?;
            for (id, fd) in fds.iter().enumerate() {
                configure_linux_vcpu(&kvm, fd, mem, id as u8, num_vcpus, &entry)?;
            }
        }
        (None, Some(kernel), GuestKind::Unikernel) => {
            let devices: Vec<spore_abi::boot::MmioDevice> = placed
                .iter()
                .map(|&(base, irq, device_id)| spore_abi::boot::MmioDevice {
                    base,
                    size: layout::VIRTIO_MMIO_SIZE,
                    device_id,
                    irq,
                })
                .collect();
            let tsc_khz = fds[0].get_tsc_khz().map(u64::from).unwrap_or(0);
            let cmdline = boot.boot_args.as_deref().unwrap_or("");
            let entry =
                load_unikernel_mapping(mem, kernel, cmdline, &devices, tsc_khz, hotplug_end)?;
            set_supported_cpuid(&kvm, &fds[0])?;
            configure_unikernel_vcpu(&fds[0], &entry)?;
        }
    }

    let tmem = match (state, &config.tmem) {
        // The pool's contents and quota come from the snapshot.
        (Some(s), _) => TmemDevice::restore(&s.tmem).map_err(|e| BuildError::Device {
            what: "tmem",
            detail: e.to_string(),
        })?,
        (None, t) if t.enabled => TmemDevice::new(t.quota_bytes, t.compression),
        (None, _) => TmemDevice::disabled(),
    };
    let tmem = if config.tmem.timing {
        tmem.with_timing()
    } else {
        tmem
    };
    let signal = SignalPort::new(wake.clone());
    if let Some(s) = state {
        signal.set_generation(s.generation);
    }
    let io = Arc::new(VcpuIo {
        pio,
        mmio,
        signal: Arc::new(signal),
        tmem: Arc::new(tmem),
        mem: mem.clone(),
    });
    if state.is_some() {
        io.signal.set_restored(machine.vcpu_count.min(255) as u8);
    }
    let vcpus = fds
        .into_iter()
        .enumerate()
        .map(|(id, fd)| Vcpu::new(id as u8, fd, kind, io.clone(), control.clone()))
        .collect();
    control.set_guest_snapshots(config.guest_snapshots.is_some());
    let vm = Vm::from_parts(VmParts {
        kvm,
        vm_fd,
        ram,
        control,
        io,
        serial,
        i8042,
        vcpus,
        virtio,
        balloon,
        mem_hotplug,
        drives: drive_handles,
        vsock: vsock_handle,
        kind,
        irqchip,
    });
    if let Some(s) = state {
        for (id, &value) in s.signal_results.iter().enumerate() {
            vm.set_signal_result(id as u8, value);
        }
    }
    Ok(vm)
}

/// The virtio-mem device and its region, placed above boot RAM, with its
/// own handle on the VM (a duplicate fd) to add and remove memory slots from
/// the device's thread. On a restore (`saved` is `Some`), the region is
/// mapped privately from the snapshot's memory file (`file`, where it
/// follows boot RAM) and the device state applied, plugged chunks' slots
/// included.
type MemDevice = (
    VirtioMem,
    MemHandle,
    Arc<crate::devices::virtio::GuestRegionMmap>,
);

/// The file a restored VM's hotplug region is mapped from: the snapshot
/// memory file its RAM was mapped from, which holds the region after RAM.
fn hotplug_snapshot_file(ram: &GuestRam, mem_bytes: u64, region: u64) -> Result<File, BuildError> {
    let unusable = || BuildError::Device {
        what: "virtio-mem",
        detail: "a microVM with virtio-mem memory restores only through the lazy or eager File \
                 path (its region is mapped from the snapshot's memory file)"
            .into(),
    };
    if !ram.is_private() {
        return Err(unusable());
    }
    let file = ram.memfd().try_clone().map_err(|source| BuildError::Io {
        what: "the snapshot memory file",
        source,
    })?;
    let len = file
        .metadata()
        .map_err(|source| BuildError::Io {
            what: "the snapshot memory file",
            source,
        })?
        .len();
    if len < mem_bytes.saturating_add(region) {
        return Err(unusable());
    }
    Ok(file)
}

fn virtio_mem_device(
    kvm: &Kvm,
    vm_fd: &VmFd,
    mem_bytes: u64,
    h: &crate::config::MemoryHotplugConfig,
    file: Option<File>,
    saved: Option<Option<&VirtioMemState>>,
) -> Result<MemDevice, BuildError> {
    let (addr, size, slot) = (
        layout::hotplug_region_addr(mem_bytes),
        h.total_size_mib << 20,
        h.slot_size_mib << 20,
    );
    let mut hp = match file {
        Some(f) => HotplugMemory::from_snapshot_file(f, mem_bytes, addr, size, slot)?,
        None => HotplugMemory::new(addr, size, slot)?,
    };
    attach_vm_copy(kvm, vm_fd, &mut hp)?;
    let region = hp.region();
    let block = h.block_size_mib << 20;
    let (device, handle) = match saved {
        None => VirtioMem::new(hp, block, slot),
        Some(Some(state)) => {
            VirtioMem::restore(hp, block, slot, state).map_err(|e| BuildError::Device {
                what: "virtio-mem",
                detail: e.to_string(),
            })?
        }
        Some(None) => {
            return Err(BuildError::Device {
                what: "virtio-mem",
                detail: "the snapshot has no virtio-mem state".into(),
            })
        }
    };
    Ok((device, handle, region))
}

fn attach_vm_copy(kvm: &Kvm, vm_fd: &VmFd, hp: &mut HotplugMemory) -> Result<(), BuildError> {
    use std::os::fd::AsRawFd;
    // SAFETY: fcntl on an fd we own; the result is checked.
    let fd = unsafe { libc::fcntl(vm_fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
    if fd < 0 {
        return Err(BuildError::Io {
            what: "duplicating the VM fd",
            source: std::io::Error::last_os_error(),
        });
    }
    // SAFETY: `fd` is a fresh duplicate of a KVM VM fd, owned by nobody else.
    let dup = unsafe { kvm.create_vmfd_from_rawfd(fd) }.map_err(kvm_setup("a VM fd copy"))?;
    hp.attach_vm(dup);
    Ok(())
}

/// Applies the snapshot's vCPU and VM-wide KVM state to the new VM.
fn restore_cpus(
    vm_fd: &VmFd,
    fds: &[kvm_ioctls::VcpuFd],
    state: &MicrovmState,
) -> Result<(), BuildError> {
    if fds.len() != state.vcpus.len() {
        return Err(BuildError::Device {
            what: "vCPUs",
            detail: format!(
                "the snapshot has {} vCPUs, the VM {}",
                state.vcpus.len(),
                fds.len()
            ),
        });
    }
    for (fd, vcpu) in fds.iter().zip(&state.vcpus) {
        vcpu.restore(fd).map_err(|e| BuildError::Device {
            what: "vCPU state",
            detail: e.to_string(),
        })?;
    }
    state.vm.restore(vm_fd).map_err(|e| BuildError::Device {
        what: "VM state",
        detail: e.to_string(),
    })
}

fn new_irqfd(vm_fd: &VmFd, irqchip: bool, irq: u32) -> Result<EventFd, BuildError> {
    let fd = EventFd::new(EFD_NONBLOCK).map_err(|source| BuildError::Io {
        what: "irqfd",
        source,
    })?;
    if irqchip {
        vm_fd
            .register_irqfd(&fd, irq)
            .map_err(kvm_setup("a legacy irqfd"))?;
    }
    Ok(fd)
}

/// The guest command line: the user's (or the default), the root device, and
/// one `virtio_mmio.device=` per device.
fn linux_cmdline(config: &VmConfig, placed: &[(u64, u32, u32)]) -> String {
    let boot_args = config
        .boot_source
        .as_ref()
        .and_then(|b| b.boot_args.as_deref())
        .unwrap_or(DEFAULT_LINUX_CMDLINE);
    let mut cmdline = boot_args.trim().to_string();
    if let Some(root) = config.drives.iter().find(|d| d.is_root_device) {
        if !cmdline.split_whitespace().any(|w| w.starts_with("root=")) {
            let mode = if root.is_read_only { "ro" } else { "rw" };
            cmdline.push_str(&format!(" root=/dev/vda {mode}"));
        }
    }
    for (addr, irq, _) in placed {
        cmdline.push_str(&format!(
            " virtio_mmio.device={}K@{addr:#x}:{irq}",
            layout::VIRTIO_MMIO_SIZE >> 10
        ));
    }
    cmdline
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{BootSourceConfig, DriveConfig};

    #[test]
    fn cmdline_lists_devices_and_root() {
        let mut c = VmConfig {
            boot_source: Some(BootSourceConfig {
                kernel_image_path: "/k".into(),
                boot_args: Some("console=ttyS0".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        c.drives.push(DriveConfig {
            drive_id: "root".into(),
            path_on_host: "/d".into(),
            is_root_device: true,
            is_read_only: true,
            partuuid: None,
            cache_type: None,
            io_engine: None,
            cow_overlay: None,
        });
        let s = linux_cmdline(&c, &[(0xd000_0000, 5, 2), (0xd000_1000, 6, 4)]);
        assert_eq!(
            s,
            "console=ttyS0 root=/dev/vda ro virtio_mmio.device=4K@0xd0000000:5 \
             virtio_mmio.device=4K@0xd0001000:6"
        );
    }
}
