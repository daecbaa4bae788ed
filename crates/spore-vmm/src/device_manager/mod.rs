//! The VM's devices: attaching them, their ids, their interrupts and MMIO
//! windows, and their snapshot states.
//!
//! - [`legacy`]: serial, i8042, RTC (where the architecture has them) and tmem.
//! - [`mmio`]: virtio-mmio windows, IRQs, irqfds, ioeventfds, the MMIO bus.
//! - [`virtio`]: which virtio devices a configuration asks for, in guest order.
//! - [`persist`]: device ids and states; the one generic caller of
//!   [`crate::persist::Persist`] for every device.
//! - [`pause`]: [`PausedDevices`], every virtio device stopped for a capture.
//!
//! A device is made fresh for a boot or rebuilt from the state saved under
//! its id for a restore; the builder only says which. Nothing here runs
//! vCPUs or reads guest memory.

pub mod legacy;
pub mod mmds;
pub mod mmio;
pub mod pause;
pub mod persist;
pub mod virtio;

use std::sync::{Arc, Mutex};

use kvm_ioctls::VmFd;
use mmio::{AttachedVirtio, MmioSlots};
pub use pause::PausedDevices;
pub use persist::{DeviceId, DeviceState, DeviceStates, StateLookup};
pub use virtio::{make_mem_device, MemDevice};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::arch::{GuestKind, MmioPlacement};
use crate::config::VmConfig;
use crate::devices::bus::{Bus, BusError};
use crate::devices::legacy::i8042::I8042;
use crate::devices::legacy::rtc::RtcDevice;
use crate::devices::legacy::serial::{SerialDevice, SerialOut};
use crate::devices::tmem::TmemDevice;
use crate::devices::virtio::balloon::BalloonHandle;
use crate::devices::virtio::blk::{BlockError, BlockHandle};
use crate::devices::virtio::mem::MemHandle;
use crate::devices::virtio::mmio::MmioTransport;
use crate::devices::virtio::net::{NetError, NetHandle};
use crate::devices::virtio::vsock::{VsockError, VsockHandle};
use crate::devices::wake::GuestWake;
use crate::host::lock;
use crate::memory::{GuestMemoryMmap, MemoryError};
use crate::mmds::SharedMmds;

#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("the snapshot has no state for device {0}, which this VM has (the configuration and the snapshot disagree)")]
    MissingState(DeviceId),
    #[error("the snapshot has a state for device {0}, which this VM does not have (the configuration and the snapshot disagree)")]
    UnknownDevice(DeviceId),
    #[error("the snapshot's state for device {id} is a {found} state")]
    WrongKind { id: DeviceId, found: &'static str },
    #[error("device {id}: {detail}")]
    Restore { id: DeviceId, detail: String },
    #[error("cannot stop virtio device {id} for the capture: {detail}")]
    Quiesce { id: DeviceId, detail: String },
    #[error("too many virtio devices (at most {0})")]
    TooManyDevices(usize),
    #[error("drive {id}: {source}")]
    Drive {
        id: String,
        #[source]
        source: BlockError,
    },
    #[error(transparent)]
    Net(#[from] NetError),
    #[error("vsock: {0}")]
    Vsock(#[from] VsockError),
    #[error(transparent)]
    Memory(#[from] MemoryError),
    #[error(transparent)]
    Bus(#[from] BusError),
    #[error("KVM refused {what}: {source}")]
    Kvm {
        what: &'static str,
        #[source]
        source: kvm_ioctls::Error,
    },
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// The host's handles on virtio devices (API calls, clone identity).
#[derive(Default)]
pub struct VirtioHandles {
    pub balloon: Option<BalloonHandle>,
    pub mem: Option<MemHandle>,
    /// Every drive's disk, in attach order (freezing to copy-on-write).
    pub drives: Vec<BlockHandle>,
    /// Every network interface, in attach order (PATCH limits, a clone's MAC).
    pub nets: Vec<NetHandle>,
    pub vsock: Option<VsockHandle>,
}

/// Called when the guest resets the machine through the i8042.
pub type ResetHook = Arc<dyn Fn() + Send + Sync>;

/// What attaching devices needs from the VM being built.
pub struct AttachContext<'a> {
    pub vm_fd: &'a VmFd,
    /// Whether KVM's in-kernel irqchip exists (irqfds are registered with it).
    pub irqchip: bool,
    pub wake: &'a Arc<GuestWake>,
    pub kind: GuestKind,
    pub serial_out: SerialOut,
    /// What the i8042's reset line does (the builder stops the VM).
    pub on_reset: ResetHook,
    /// What devices may address: boot RAM, plus the hotplug region if any.
    pub device_mem: GuestMemoryMmap,
    /// The MMDS data store the interfaces named by `mmds-config` serve.
    pub mmds: SharedMmds,
}

/// The buses the vCPUs dispatch port I/O and MMIO exits to.
pub struct Buses {
    pub pio: Bus,
    pub mmio: Bus,
}

/// Every device of a VM.
pub struct VmDevices {
    serial: Arc<Mutex<SerialDevice>>,
    i8042: Option<Arc<Mutex<I8042>>>,
    rtc: Option<Arc<Mutex<RtcDevice>>>,
    tmem: Arc<TmemDevice>,
    /// In slot order.
    virtio: Vec<AttachedVirtio>,
    /// The same transports, for callers that only need those.
    transports: Vec<Arc<Mutex<MmioTransport>>>,
    handles: VirtioHandles,
    /// The MMDS data store, saved with the devices when the VM has MMDS
    /// configured or a store was put.
    mmds: SharedMmds,
    mmds_configured: bool,
}

impl VmDevices {
    /// Attaches every device `config` asks for (and `mem_device`, made
    /// earlier); with `saved`, each is rebuilt from the state saved under
    /// its id. States left over are the caller's to refuse
    /// ([`StateLookup::finish`]).
    pub fn attach(
        ctx: AttachContext<'_>,
        config: &VmConfig,
        mem_device: Option<MemDevice<'_>>,
        mut saved: Option<&mut StateLookup<'_>>,
    ) -> Result<(Self, Buses), DeviceError> {
        let mut mmio_bus = Bus::new();
        let legacy = legacy::LegacySetup {
            vm_fd: ctx.vm_fd,
            irqchip: ctx.irqchip,
            wake: ctx.wake,
            kind: ctx.kind,
            serial_out: ctx.serial_out,
            on_reset: ctx.on_reset,
            tmem: &config.tmem,
        }
        .attach(saved.as_deref_mut(), &mut mmio_bus)?;
        let mut slots = MmioSlots {
            vm_fd: ctx.vm_fd,
            irqchip: ctx.irqchip,
            wake: ctx.wake,
            mem: ctx.device_mem,
            bus: mmio_bus,
            attached: Vec::new(),
        };
        let mmds = mmds::attach(&ctx.mmds, config, saved.as_deref_mut())?;
        let handles = virtio::attach_virtio(&mut slots, config, mem_device, saved, mmds.as_ref())?;
        let mut attached = slots.attached;
        attached.sort_by_key(|a| a.slot);
        let devices = VmDevices {
            serial: legacy.serial,
            i8042: legacy.i8042,
            rtc: legacy.rtc,
            tmem: legacy.tmem,
            transports: attached.iter().map(|a| a.transport.clone()).collect(),
            virtio: attached,
            handles,
            mmds: ctx.mmds.clone(),
            mmds_configured: mmds.is_some(),
        };
        let buses = Buses {
            pio: legacy.pio,
            mmio: slots.bus,
        };
        Ok((devices, buses))
    }

    /// Second half of a restore, once the irqchip and vCPUs hold their
    /// restored state: restarts the devices the driver had running (their
    /// first interrupts need the restored irqchip).
    pub fn finish_restore(&self) -> Result<(), DeviceError> {
        for v in &self.virtio {
            lock(&v.transport)
                .finish_restore()
                .map_err(|e| DeviceError::Restore {
                    id: v.id.clone(),
                    detail: e.to_string(),
                })?;
        }
        Ok(())
    }

    /// Every virtio device's window, IRQ and type, in slot order: what the
    /// guest is told (command line, device tree, unikernel boot info).
    pub fn mmio_placements(&self) -> Vec<MmioPlacement> {
        self.virtio
            .iter()
            .map(|v| MmioPlacement {
                addr: v.addr(),
                irq: v.irq(),
                device_type: v.device_type,
            })
            .collect()
    }

    pub fn serial(&self) -> &Arc<Mutex<SerialDevice>> {
        &self.serial
    }

    pub fn i8042(&self) -> Option<&Arc<Mutex<I8042>>> {
        self.i8042.as_ref()
    }

    pub fn tmem(&self) -> &Arc<TmemDevice> {
        &self.tmem
    }

    /// The virtio-mmio transports, in slot order.
    pub fn transports(&self) -> &[Arc<Mutex<MmioTransport>>] {
        &self.transports
    }

    pub fn handles(&self) -> &VirtioHandles {
        &self.handles
    }

    /// Drops the virtio devices (stopping their workers) ahead of the VM fd
    /// and RAM they use.
    pub fn detach_virtio(&mut self) {
        self.virtio.clear();
        self.transports.clear();
        self.handles.mem = None;
    }
}

/// An eventfd for `irq`, registered as an irqfd when there is an irqchip
/// (without one, a unikernel polls and never reads it).
fn new_irqfd(vm_fd: &VmFd, irqchip: bool, irq: u32) -> Result<EventFd, DeviceError> {
    let fd = EventFd::new(EFD_NONBLOCK).map_err(|source| DeviceError::Io {
        what: "irqfd",
        source,
    })?;
    if irqchip {
        vm_fd
            .register_irqfd(&fd, irq)
            .map_err(|source| DeviceError::Kvm {
                what: "an irqfd",
                source,
            })?;
    }
    Ok(fd)
}
