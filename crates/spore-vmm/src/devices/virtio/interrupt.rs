//! The interrupt line of one virtio-mmio device.
//!
//! Raising it sets a bit in the transport's InterruptStatus register, signals
//! the irqfd registered with KVM (the in-kernel irqchip injects it) and wakes a
//! vCPU sleeping in the signal port's `WAIT` (unikernels poll instead of taking
//! interrupts).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use vmm_sys_util::eventfd::EventFd;

use crate::devices::wake::GuestWake;

/// InterruptStatus bit: the device used buffers in a queue.
pub const INT_VRING: u32 = 1;
/// InterruptStatus bit: the device's configuration changed.
pub const INT_CONFIG: u32 = 2;

pub struct VirtioInterrupt {
    status: AtomicU32,
    irqfd: EventFd,
    wake: Arc<GuestWake>,
}

impl VirtioInterrupt {
    pub fn new(irqfd: EventFd, wake: Arc<GuestWake>) -> Self {
        Self {
            status: AtomicU32::new(0),
            irqfd,
            wake,
        }
    }

    /// The device used buffers: tell the driver.
    pub fn signal_used_queue(&self) {
        self.raise(INT_VRING);
    }

    /// The device's config space changed: tell the driver.
    pub fn signal_config_change(&self) {
        self.raise(INT_CONFIG);
    }

    fn raise(&self, bit: u32) {
        self.status.fetch_or(bit, Ordering::SeqCst);
        if let Err(e) = self.irqfd.write(1) {
            tracing::warn!("virtio irqfd write failed: {e}");
        }
        self.wake.notify();
    }

    /// Restores the interrupt status register from a snapshot; see
    /// [`Self::resend_pending`] for raising it again.
    pub fn restore_status(&self, status: u32) {
        self.status.store(status, Ordering::SeqCst);
    }

    /// Raises the interrupt again if a status bit is pending: after a restore,
    /// an edge that was in flight when the snapshot was taken is in no saved
    /// irqchip state, and the guest would wait for it forever. Call only once
    /// the interrupt controllers hold their restored state (an irqchip still
    /// in its reset state drops the edge). A spurious extra interrupt is
    /// harmless: the driver reads the status and finds nothing new.
    pub fn resend_pending(&self) {
        if self.status() != 0 {
            if let Err(e) = self.irqfd.write(1) {
                tracing::warn!("virtio irqfd write failed: {e}");
            }
            self.wake.notify();
        }
    }

    /// Current InterruptStatus register value.
    pub fn status(&self) -> u32 {
        self.status.load(Ordering::SeqCst)
    }

    /// InterruptACK: the driver clears the bits it handled.
    pub fn ack(&self, bits: u32) {
        self.status.fetch_and(!bits, Ordering::SeqCst);
    }

    /// The irqfd, for registration with KVM.
    pub fn irqfd(&self) -> &EventFd {
        &self.irqfd
    }
}
