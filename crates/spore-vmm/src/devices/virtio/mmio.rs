//! The virtio-mmio transport (virtio 1.2, §4.2.2, "modern" register layout).
//!
//! [`MmioTransport`] owns the register file of one device: feature and queue
//! negotiation, the device status state machine and the queue notification
//! eventfds. Once the driver sets DRIVER_OK it hands validated copies of the
//! queues to the device, which runs them on its own worker thread.
//!
//! Every register access comes from the guest and is untrusted: a wrong width,
//! an unknown offset or a write out of protocol order is logged and ignored.
//! Nothing here may panic on guest input.

use std::sync::Arc;

use virtio_bindings::virtio_config::{
    VIRTIO_CONFIG_S_ACKNOWLEDGE, VIRTIO_CONFIG_S_DRIVER, VIRTIO_CONFIG_S_DRIVER_OK,
    VIRTIO_CONFIG_S_FAILED, VIRTIO_CONFIG_S_FEATURES_OK, VIRTIO_CONFIG_S_NEEDS_RESET,
    VIRTIO_F_VERSION_1,
};
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use virtio_queue::{Queue, QueueT};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::interrupt::{INT_CONFIG, INT_VRING};
use super::{ActivateContext, GuestMemoryMmap, VirtioDevice, VirtioInterrupt};
use crate::devices::bus::BusDevice;

/// Size of the MMIO window of one device.
pub const MMIO_WINDOW_SIZE: u64 = 0x1000;
/// Offset of the QueueNotify register, where the VMM registers ioeventfds.
pub const QUEUE_NOTIFY_OFFSET: u64 = 0x50;

/// "virt" in little endian.
const MAGIC_VALUE: u32 = 0x7472_6976;
/// Version 2 is the non-legacy (virtio 1.x) interface.
const MMIO_VERSION: u32 = 2;
/// "SPOR" in little endian; drivers match on device id, not vendor.
const VENDOR_ID: u32 = 0x524f_5053;

// Register offsets (§4.2.2).
const REG_MAGIC: u64 = 0x000;
const REG_VERSION: u64 = 0x004;
const REG_DEVICE_ID: u64 = 0x008;
const REG_VENDOR_ID: u64 = 0x00c;
const REG_DEVICE_FEATURES: u64 = 0x010;
const REG_DEVICE_FEATURES_SEL: u64 = 0x014;
const REG_DRIVER_FEATURES: u64 = 0x020;
const REG_DRIVER_FEATURES_SEL: u64 = 0x024;
const REG_QUEUE_SEL: u64 = 0x030;
const REG_QUEUE_NUM_MAX: u64 = 0x034;
const REG_QUEUE_NUM: u64 = 0x038;
const REG_QUEUE_READY: u64 = 0x044;
const REG_QUEUE_NOTIFY: u64 = QUEUE_NOTIFY_OFFSET;
const REG_INTERRUPT_STATUS: u64 = 0x060;
const REG_INTERRUPT_ACK: u64 = 0x064;
const REG_STATUS: u64 = 0x070;
const REG_QUEUE_DESC_LOW: u64 = 0x080;
const REG_QUEUE_DESC_HIGH: u64 = 0x084;
const REG_QUEUE_DRIVER_LOW: u64 = 0x090;
const REG_QUEUE_DRIVER_HIGH: u64 = 0x094;
const REG_QUEUE_DEVICE_LOW: u64 = 0x0a0;
const REG_QUEUE_DEVICE_HIGH: u64 = 0x0a4;
const REG_SHM_SEL: u64 = 0x0ac;
const REG_SHM_LEN_LOW: u64 = 0x0b0;
const REG_SHM_LEN_HIGH: u64 = 0x0b4;
const REG_SHM_BASE_LOW: u64 = 0x0b8;
const REG_SHM_BASE_HIGH: u64 = 0x0bc;
const REG_CONFIG_GENERATION: u64 = 0x0fc;
const CONFIG_SPACE: u64 = 0x100;

// Device status bits (§2.1).
const ACKNOWLEDGE: u32 = VIRTIO_CONFIG_S_ACKNOWLEDGE;
const DRIVER: u32 = VIRTIO_CONFIG_S_DRIVER;
const FEATURES_OK: u32 = VIRTIO_CONFIG_S_FEATURES_OK;
const DRIVER_OK: u32 = VIRTIO_CONFIG_S_DRIVER_OK;
const NEEDS_RESET: u32 = VIRTIO_CONFIG_S_NEEDS_RESET;
const FAILED: u32 = VIRTIO_CONFIG_S_FAILED;

#[derive(Debug, thiserror::Error)]
pub enum MmioError {
    #[error("virtio device type {device_type} declares no queues")]
    NoQueues { device_type: u32 },
    #[error(
        "virtio queue {index}: invalid maximum size {size} (must be a power of two, 1..=32768)"
    )]
    QueueSize {
        index: usize,
        size: u16,
        #[source]
        source: virtio_queue::Error,
    },
    #[error("cannot create the notification eventfd of virtio queue {index}: {source}")]
    EventFd {
        index: usize,
        #[source]
        source: std::io::Error,
    },
}

/// The virtio-mmio register file of one device.
pub struct MmioTransport {
    device: Box<dyn VirtioDevice>,
    mem: GuestMemoryMmap,
    interrupt: Arc<VirtioInterrupt>,
    queues: Vec<Queue>,
    queue_events: Vec<EventFd>,
    status: u32,
    /// Whether `device.activate` succeeded and `device.reset` is owed.
    activated: bool,
    device_features_sel: u32,
    driver_features_sel: u32,
    acked_features: u64,
    /// The driver acked bits in a feature page past the 64 this transport knows.
    acked_unknown_features: bool,
    queue_sel: u32,
    shm_sel: u32,
    config_generation: u32,
}

impl MmioTransport {
    pub fn new(
        device: Box<dyn VirtioDevice>,
        mem: GuestMemoryMmap,
        interrupt: Arc<VirtioInterrupt>,
    ) -> Result<Self, MmioError> {
        let sizes = device.queue_max_sizes().to_vec();
        if sizes.is_empty() {
            return Err(MmioError::NoQueues {
                device_type: device.device_type(),
            });
        }
        let mut queues = Vec::with_capacity(sizes.len());
        let mut queue_events = Vec::with_capacity(sizes.len());
        for (index, &size) in sizes.iter().enumerate() {
            let q = Queue::new(size).map_err(|source| MmioError::QueueSize {
                index,
                size,
                source,
            })?;
            queues.push(q);
            let evt = EventFd::new(EFD_NONBLOCK)
                .map_err(|source| MmioError::EventFd { index, source })?;
            queue_events.push(evt);
        }
        Ok(Self {
            device,
            mem,
            interrupt,
            queues,
            queue_events,
            status: 0,
            activated: false,
            device_features_sel: 0,
            driver_features_sel: 0,
            acked_features: 0,
            acked_unknown_features: false,
            queue_sel: 0,
            shm_sel: 0,
            config_generation: 0,
        })
    }

    /// One notification eventfd per queue, in queue order. The VMM registers
    /// each as a KVM ioeventfd at base + [`QUEUE_NOTIFY_OFFSET`], 4 bytes wide,
    /// with datamatch = its index.
    pub fn queue_events(&self) -> &[EventFd] {
        &self.queue_events
    }

    pub fn interrupt(&self) -> &Arc<VirtioInterrupt> {
        &self.interrupt
    }

    /// The device behind the transport (its snapshot state is its own).
    pub fn device(&self) -> &dyn VirtioDevice {
        self.device.as_ref()
    }

    pub fn device_type(&self) -> u32 {
        self.device.device_type()
    }

    /// The device status register as the driver would read it.
    pub fn status(&self) -> u32 {
        self.status
    }

    /// Features the driver acknowledged.
    pub fn acked_features(&self) -> u64 {
        self.acked_features
    }

    /// Whether the device is running (DRIVER_OK accepted and activation succeeded).
    pub fn is_activated(&self) -> bool {
        self.activated
    }

    fn selected_queue(&mut self) -> Option<&mut Queue> {
        self.queues.get_mut(self.queue_sel as usize)
    }

    /// Queue configuration registers may only change while the driver sets
    /// the device up: after FEATURES_OK and before DRIVER_OK (§4.2.3.2).
    fn queue_config_allowed(&self) -> bool {
        self.status & (FEATURES_OK | DRIVER_OK | FAILED | NEEDS_RESET) == FEATURES_OK
    }

    fn read_register(&self, offset: u64) -> u32 {
        let queue = self.queues.get(self.queue_sel as usize);
        match offset {
            REG_MAGIC => MAGIC_VALUE,
            REG_VERSION => MMIO_VERSION,
            REG_DEVICE_ID => self.device.device_type(),
            REG_VENDOR_ID => VENDOR_ID,
            REG_DEVICE_FEATURES => match self.device_features_sel {
                0 => (self.device.avail_features() & 0xffff_ffff) as u32,
                1 => (self.device.avail_features() >> 32) as u32,
                _ => 0,
            },
            // A selector past the last queue reads as an absent queue (§4.2.3.2).
            REG_QUEUE_NUM_MAX => queue.map_or(0, |q| u32::from(q.max_size())),
            REG_QUEUE_READY => queue.map_or(0, |q| u32::from(q.ready())),
            REG_INTERRUPT_STATUS => self.interrupt.status(),
            REG_STATUS => self.status,
            // No shared memory regions: their length reads as all ones.
            REG_SHM_LEN_LOW | REG_SHM_LEN_HIGH | REG_SHM_BASE_LOW | REG_SHM_BASE_HIGH => u32::MAX,
            REG_CONFIG_GENERATION => self.config_generation,
            _ => {
                tracing::warn!("virtio-mmio: read of write-only or unknown register {offset:#x}");
                0
            }
        }
    }

    fn write_register(&mut self, offset: u64, value: u32) {
        match offset {
            REG_DEVICE_FEATURES_SEL => self.device_features_sel = value,
            REG_DRIVER_FEATURES_SEL => self.driver_features_sel = value,
            REG_DRIVER_FEATURES => self.write_driver_features(value),
            REG_QUEUE_SEL => self.queue_sel = value,
            REG_QUEUE_NOTIFY => self.notify(value),
            REG_INTERRUPT_ACK => self.interrupt.ack(value & (INT_VRING | INT_CONFIG)),
            REG_STATUS => self.write_status(value),
            REG_SHM_SEL => self.shm_sel = value,
            REG_QUEUE_NUM
            | REG_QUEUE_READY
            | REG_QUEUE_DESC_LOW
            | REG_QUEUE_DESC_HIGH
            | REG_QUEUE_DRIVER_LOW
            | REG_QUEUE_DRIVER_HIGH
            | REG_QUEUE_DEVICE_LOW
            | REG_QUEUE_DEVICE_HIGH => self.write_queue_register(offset, value),
            _ => tracing::warn!(
                "virtio-mmio: write of {value:#x} to read-only or unknown register {offset:#x}"
            ),
        }
    }

    fn write_driver_features(&mut self, value: u32) {
        if self.status & (DRIVER | FEATURES_OK | FAILED) != DRIVER {
            tracing::warn!(
                "virtio-mmio: driver features written in status {:#x}, ignored",
                self.status
            );
            return;
        }
        let value = u64::from(value);
        match self.driver_features_sel {
            0 => self.acked_features = (self.acked_features & !0xffff_ffff) | value,
            1 => self.acked_features = (self.acked_features & 0xffff_ffff) | (value << 32),
            // Pages past the second hold no features; acking any there makes
            // FEATURES_OK fail because the device offers none of them.
            sel => {
                if value != 0 {
                    tracing::warn!("virtio-mmio: driver acked features {value:#x} in page {sel}");
                    self.acked_unknown_features = true;
                }
            }
        }
    }

    fn write_queue_register(&mut self, offset: u64, value: u32) {
        if !self.queue_config_allowed() {
            tracing::warn!(
                "virtio-mmio: queue register {offset:#x} written in status {:#x}, ignored",
                self.status
            );
            return;
        }
        let sel = self.queue_sel;
        let Some(q) = self.selected_queue() else {
            tracing::warn!(
                "virtio-mmio: queue register {offset:#x} written for absent queue {sel}"
            );
            return;
        };
        // The queue setters reject bad sizes and misaligned addresses (keeping
        // the old value, which the driver sees when the queue fails validation).
        match offset {
            REG_QUEUE_NUM => match u16::try_from(value) {
                Ok(size) => q.set_size(size),
                Err(_) => tracing::warn!("virtio-mmio: queue {sel} size {value} too large"),
            },
            REG_QUEUE_READY => q.set_ready(value == 1),
            REG_QUEUE_DESC_LOW => q.set_desc_table_address(Some(value), None),
            REG_QUEUE_DESC_HIGH => q.set_desc_table_address(None, Some(value)),
            REG_QUEUE_DRIVER_LOW => q.set_avail_ring_address(Some(value), None),
            REG_QUEUE_DRIVER_HIGH => q.set_avail_ring_address(None, Some(value)),
            REG_QUEUE_DEVICE_LOW => q.set_used_ring_address(Some(value), None),
            REG_QUEUE_DEVICE_HIGH => q.set_used_ring_address(None, Some(value)),
            _ => {}
        }
    }

    fn notify(&mut self, value: u32) {
        // Without VIRTIO_F_NOTIFICATION_DATA the value is the queue index.
        match self.queue_events.get(value as usize) {
            Some(evt) => {
                if let Err(e) = evt.write(1) {
                    tracing::warn!("virtio-mmio: queue {value} notification failed: {e}");
                }
            }
            None => tracing::warn!("virtio-mmio: notification for absent queue {value}"),
        }
    }

    fn write_status(&mut self, value: u32) {
        if value == 0 {
            self.reset();
            return;
        }
        // The driver only ever adds bits (§3.1.1); it may echo back NEEDS_RESET.
        if value & self.status != self.status & !NEEDS_RESET {
            tracing::warn!(
                "virtio-mmio: status {:#x} -> {value:#x} clears bits, ignored",
                self.status
            );
            return;
        }
        let added = value & !self.status & !NEEDS_RESET;
        if added == 0 {
            return;
        }
        if added & FAILED != 0 {
            // The driver gave up on the device; it will reset it before
            // retrying. Whatever else it set in the same write is moot.
            self.status |= FAILED;
            return;
        }
        if self.status & (FAILED | NEEDS_RESET) != 0 {
            tracing::warn!(
                "virtio-mmio: status {value:#x} written while {:#x}; only a reset helps",
                self.status
            );
            return;
        }
        let allowed = match added {
            ACKNOWLEDGE => self.status == 0,
            DRIVER => self.status == ACKNOWLEDGE,
            FEATURES_OK => self.status == ACKNOWLEDGE | DRIVER,
            DRIVER_OK => self.status == ACKNOWLEDGE | DRIVER | FEATURES_OK,
            _ => false,
        };
        if !allowed {
            tracing::warn!(
                "virtio-mmio: invalid status transition {:#x} -> {value:#x}",
                self.status
            );
            return;
        }
        match added {
            FEATURES_OK => {
                if self.features_acceptable() {
                    self.status |= FEATURES_OK;
                } else {
                    // Leaving FEATURES_OK clear tells the driver (which reads it
                    // back) that the device refused its feature set (§3.1.1).
                    tracing::warn!(
                        "virtio-mmio: refusing driver features {:#x} (device offers {:#x})",
                        self.acked_features,
                        self.device.avail_features()
                    );
                }
            }
            DRIVER_OK => {
                self.status |= DRIVER_OK;
                self.activate();
            }
            bit => self.status |= bit,
        }
    }

    fn features_acceptable(&self) -> bool {
        let offered = self.device.avail_features();
        !self.acked_unknown_features
            && self.acked_features & !offered == 0
            && self.acked_features & (1 << VIRTIO_F_VERSION_1) != 0
    }

    fn activate(&mut self) {
        let event_idx = self.acked_features & (1 << VIRTIO_RING_F_EVENT_IDX) != 0;
        let mut queues = Vec::with_capacity(self.queues.len());
        let mut queue_events = Vec::with_capacity(self.queue_events.len());
        for (index, q) in self.queues.iter_mut().enumerate() {
            q.set_event_idx(event_idx);
            if q.ready() && !q.is_valid(&self.mem) {
                return self.activation_failed(&format!(
                    "queue {index} lies outside guest memory or is misconfigured"
                ));
            }
            // The transport keeps its copy for register reads; the device gets its own.
            match Queue::try_from(q.state()) {
                Ok(copy) => queues.push(copy),
                Err(e) => return self.activation_failed(&format!("queue {index}: {e}")),
            }
        }
        for (index, evt) in self.queue_events.iter().enumerate() {
            match evt.try_clone() {
                Ok(evt) => queue_events.push(evt),
                Err(e) => {
                    return self.activation_failed(&format!(
                        "cannot clone the eventfd of queue {index}: {e}"
                    ))
                }
            }
        }
        let ctx = ActivateContext {
            mem: self.mem.clone(),
            interrupt: self.interrupt.clone(),
            queues,
            queue_events,
            acked_features: self.acked_features,
        };
        match self.device.activate(ctx) {
            Ok(()) => self.activated = true,
            Err(e) => self.activation_failed(&e.to_string()),
        }
    }

    fn activation_failed(&mut self, why: &str) {
        tracing::warn!(
            "virtio-mmio: cannot activate device type {}: {why}",
            self.device.device_type()
        );
        self.status |= NEEDS_RESET;
        self.config_generation = self.config_generation.wrapping_add(1);
        self.interrupt.signal_config_change();
    }

    fn reset(&mut self) {
        // Always: a failed activation may still have left state in the device.
        self.device.reset();
        self.activated = false;
        for q in &mut self.queues {
            q.reset();
        }
        for evt in &self.queue_events {
            // Drop notifications meant for the old queues; EAGAIN means none.
            let _ = evt.read();
        }
        self.interrupt.ack(INT_VRING | INT_CONFIG);
        self.status = 0;
        self.acked_features = 0;
        self.acked_unknown_features = false;
        self.device_features_sel = 0;
        self.driver_features_sel = 0;
        self.queue_sel = 0;
        self.shm_sel = 0;
    }
}

impl BusDevice for MmioTransport {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        if offset >= CONFIG_SPACE {
            // Config space takes any width (§4.2.2.2); the device zero-fills
            // bytes it does not have.
            data.fill(0);
            self.device.read_config(offset - CONFIG_SPACE, data);
            return;
        }
        if data.len() != 4 || !offset.is_multiple_of(4) {
            tracing::warn!(
                "virtio-mmio: {}-byte register read at {offset:#x} ignored (registers are aligned 32-bit)",
                data.len()
            );
            data.fill(0);
            return;
        }
        data.copy_from_slice(&self.read_register(offset).to_le_bytes());
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if offset >= CONFIG_SPACE {
            self.device.write_config(offset - CONFIG_SPACE, data);
            return;
        }
        match <[u8; 4]>::try_from(data) {
            Ok(word) if offset.is_multiple_of(4) => self.write_register(offset, u32::from_le_bytes(word)),
            _ => tracing::warn!(
                "virtio-mmio: {}-byte register write at {offset:#x} ignored (registers are aligned 32-bit)",
                data.len()
            ),
        }
    }
}

#[cfg(test)]
#[path = "mmio_tests.rs"]
mod tests;

#[path = "mmio_state.rs"]
pub mod state;
