//! Virtio devices and their virtio-mmio transport.
//!
//! A device implements [`VirtioDevice`]: it says what it is (type, features,
//! config space, queue sizes) and, once the driver sets DRIVER_OK, takes its
//! queues in [`VirtioDevice::activate`] and processes them on its own worker
//! thread, woken through the queues' ioeventfds. The transport
//! ([`mmio::MmioTransport`]) owns the register file and the feature/queue
//! negotiation; devices never see MMIO registers.

pub mod balloon;
pub mod blk;
pub mod interrupt;
pub mod mem;
pub mod mmio;
pub mod net;
pub mod queue_server;
pub mod rng;
pub mod vsock;
pub mod worker;

use std::sync::Arc;

pub use interrupt::VirtioInterrupt;
use vmm_sys_util::eventfd::EventFd;

/// Guest memory as devices see it (defined with guest RAM, below them).
pub use crate::memory::{DirtyBitmap, GuestMemoryMmap, GuestRegionMmap};

/// Virtio device ids (virtio 1.2, §5).
pub mod device_type {
    pub const NET: u32 = 1;
    pub const BLOCK: u32 = 2;
    pub const RNG: u32 = 4;
    pub const BALLOON: u32 = 5;
    pub const VSOCK: u32 = 19;
    pub const MEM: u32 = 24;
}

/// Everything a device needs to start processing its queues.
pub struct ActivateContext {
    pub mem: GuestMemoryMmap,
    pub interrupt: Arc<VirtioInterrupt>,
    /// Queues as the driver configured them, in queue-index order.
    pub queues: Vec<virtio_queue::Queue>,
    /// One notification eventfd per queue (registered as ioeventfd with KVM,
    /// or written by the transport when a notify reaches user space).
    pub queue_events: Vec<EventFd>,
    /// Features the driver acknowledged.
    pub acked_features: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum ActivateError {
    #[error("device expects {expected} queues, driver set up {got}")]
    QueueCount { expected: usize, got: usize },
    #[error("cannot start the device worker: {0}")]
    Worker(#[source] std::io::Error),
    #[error("{0}")]
    Device(String),
}

/// A virtio device model, independent of its transport.
///
/// `Any` lets the device manager reach a device's own snapshot state
/// ([`crate::persist::Persist`]) behind the transport's trait object.
pub trait VirtioDevice: Send + std::any::Any {
    /// Virtio device id, see [`device_type`].
    fn device_type(&self) -> u32;
    /// Maximum size of each queue; the length is the number of queues.
    fn queue_max_sizes(&self) -> &[u16];
    /// Feature bits the device offers (VIRTIO_F_VERSION_1 included).
    fn avail_features(&self) -> u64;
    /// Reads the device-specific config space. Out-of-range bytes read as 0.
    fn read_config(&self, offset: u64, data: &mut [u8]);
    /// Writes the device-specific config space; ignored by default.
    fn write_config(&mut self, _offset: u64, _data: &[u8]) {}
    /// Starts the device once the driver set DRIVER_OK.
    fn activate(&mut self, ctx: ActivateContext) -> Result<(), ActivateError>;
    /// Stops the device's worker after a driver reset; the device may be
    /// activated again afterwards.
    fn reset(&mut self);
    /// Stops the worker of an activated device for a snapshot, keeping the
    /// device's own state (connections, open files), and hands back its
    /// queues with their ring positions. The transport re-activates the
    /// device with them afterwards. Devices that cannot be snapshotted keep
    /// this default, which refuses.
    fn quiesce(&mut self) -> Result<Vec<virtio_queue::Queue>, ActivateError> {
        Err(ActivateError::Device(format!(
            "virtio device type {} does not support snapshots",
            self.device_type()
        )))
    }
    /// Runs once after a device restored from a snapshot was re-activated
    /// (vsock tells the guest its connections are gone).
    fn restored(&mut self) {}
}
