//! virtio-mmio attachment: each device gets a window and an IRQ
//! (`layout::virtio_mmio_addr`/`virtio_mmio_irq` of its slot), an irqfd on
//! that IRQ, one ioeventfd per queue on its QueueNotify register, and a
//! place on the MMIO bus. A booted VM fills slots in attach order; a
//! restored one puts each device back in the slot its state names.

use std::sync::{Arc, Mutex};

use kvm_ioctls::{IoEventAddress, VmFd};

use super::persist::{DeviceId, VirtioState};
use super::{new_irqfd, DeviceError};
use crate::arch::layout;
use crate::devices::bus::Bus;
use crate::devices::virtio::mmio::MmioTransport;
use crate::devices::virtio::{GuestMemoryMmap, VirtioDevice, VirtioInterrupt};
use crate::devices::wake::GuestWake;
use crate::persist::Persist;

/// Offset of the QueueNotify register in a virtio-mmio window.
const QUEUE_NOTIFY: u64 = 0x50;

/// One attached virtio-mmio device.
pub struct AttachedVirtio {
    pub id: DeviceId,
    pub slot: usize,
    pub device_type: u32,
    pub transport: Arc<Mutex<MmioTransport>>,
}

impl AttachedVirtio {
    pub fn addr(&self) -> u64 {
        layout::virtio_mmio_addr(self.slot)
    }

    pub fn irq(&self) -> u32 {
        layout::virtio_mmio_irq(self.slot)
    }
}

/// The virtio-mmio windows of a VM being built.
pub(super) struct MmioSlots<'a> {
    pub vm_fd: &'a VmFd,
    pub irqchip: bool,
    pub wake: &'a Arc<GuestWake>,
    /// What devices may address: boot RAM, plus the hotplug region if any.
    pub mem: GuestMemoryMmap,
    pub bus: Bus,
    pub attached: Vec<AttachedVirtio>,
}

impl MmioSlots<'_> {
    /// Attaches `device` in the next free slot, or with `saved`, in its
    /// saved slot with its transport state applied (the device stays
    /// stopped until `finish_restore`).
    pub fn attach(
        &mut self,
        id: DeviceId,
        device: Box<dyn VirtioDevice>,
        saved: Option<&VirtioState>,
    ) -> Result<(), DeviceError> {
        let slot = match saved {
            Some(s) => s.slot as usize,
            None => self.attached.len(),
        };
        if slot >= layout::VIRTIO_MMIO_MAX {
            return Err(DeviceError::TooManyDevices(layout::VIRTIO_MMIO_MAX));
        }
        if self.attached.iter().any(|a| a.slot == slot) {
            return Err(DeviceError::Restore {
                id,
                detail: format!("virtio-mmio slot {slot} is taken by another device"),
            });
        }
        let (addr, irq) = (
            layout::virtio_mmio_addr(slot),
            layout::virtio_mmio_irq(slot),
        );
        let device_type = device.device_type();
        let irqfd = new_irqfd(self.vm_fd, self.irqchip, irq)?;
        let interrupt = Arc::new(VirtioInterrupt::new(irqfd, self.wake.clone()));
        let mem = self.mem.clone();
        let transport = match saved {
            None => MmioTransport::new(device, mem, interrupt).map_err(|e| e.to_string()),
            Some(s) => <MmioTransport as Persist>::restore((device, mem, interrupt), &s.transport)
                .map_err(|e| e.to_string()),
        }
        .map_err(|detail| DeviceError::Restore {
            id: id.clone(),
            detail: format!("virtio-mmio transport: {detail}"),
        })?;
        for (queue, event) in (0u32..).zip(transport.queue_events()) {
            // Datamatch on the queue index the driver writes.
            self.vm_fd
                .register_ioevent(event, &IoEventAddress::Mmio(addr + QUEUE_NOTIFY), queue)
                .map_err(|source| DeviceError::Kvm {
                    what: "a virtio ioeventfd",
                    source,
                })?;
        }
        let transport = Arc::new(Mutex::new(transport));
        self.bus
            .insert(addr, layout::VIRTIO_MMIO_SIZE, transport.clone())?;
        self.attached.push(AttachedVirtio {
            id,
            slot,
            device_type,
            transport,
        });
        Ok(())
    }
}
