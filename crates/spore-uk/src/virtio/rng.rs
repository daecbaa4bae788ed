//! The virtio-rng driver (device id 4, virtio 1.2 §5.4): entropy from the
//! host, which [`crate::random`] seeds (and, in a clone, reseeds) from.
//!
//! One queue; the driver offers a device-writable buffer and the device
//! fills it with random bytes from the host kernel. Requests go one at a
//! time, polled, sleeping in the signal port's `wait` between polls.

use super::mmio::{Transport, F_VERSION_1};
use super::queue::VirtQueue;
use super::{device_id, find_device, VirtioError};
use crate::BootInfo;

/// How long one request may take before the driver gives up on the device.
const REQUEST_TIMEOUT_US: u64 = 5_000_000;
/// Polls without a TSC frequency (no clock to time out with).
const MAX_POLLS: u32 = 1000;

/// Why no entropy came back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RngError {
    /// The device returned the buffer without writing anything.
    Empty,
    /// No answer within the timeout.
    Timeout,
    /// The queue had no room (a previous request never came back).
    QueueFull,
}

pub struct VirtioRng {
    transport: Transport,
    queue: VirtQueue,
    /// Set when a request timed out: the device may still write that buffer.
    failed: bool,
}

impl VirtioRng {
    /// Finds the virtio-rng device in the boot info and brings it up.
    pub fn new(info: &BootInfo) -> Result<VirtioRng, VirtioError> {
        let dev = find_device(info, device_id::RNG).ok_or(VirtioError::NoDevice(device_id::RNG))?;
        // SAFETY: the boot info lists this window as a virtio-mmio device,
        // identity-mapped by the boot protocol; only this driver uses it.
        let (transport, _) = unsafe { Transport::init(&dev, F_VERSION_1, 0)? };
        let queue = transport.setup_queue(0, 4)?;
        transport.driver_ok();
        Ok(VirtioRng {
            transport,
            queue,
            failed: false,
        })
    }

    /// Fills as much of `buf` as the device gives in one request; returns
    /// the number of bytes (at least 1).
    pub fn read(&mut self, buf: &mut [u8]) -> Result<usize, RngError> {
        if self.failed {
            return Err(RngError::Timeout);
        }
        let len = u32::try_from(buf.len()).unwrap_or(u32::MAX);
        // SAFETY: `buf` is borrowed mutably for this whole call, and the call
        // returns only once the device gave it back (or failed the device).
        let head =
            unsafe { self.queue.add(buf.as_mut_ptr(), len, true) }.ok_or(RngError::QueueFull)?;
        self.transport.notify(0);
        let start = crate::clock::Instant::now();
        let mut polls = 0u32;
        loop {
            if let Some(used) = self.queue.pop_used() {
                if used.id != head {
                    continue;
                }
                return match (used.len as usize).min(buf.len()) {
                    0 => Err(RngError::Empty),
                    n => Ok(n),
                };
            }
            polls += 1;
            let timed_out = match start.elapsed_us() {
                Some(us) => us > REQUEST_TIMEOUT_US,
                None => polls > MAX_POLLS,
            };
            if timed_out {
                // The buffer may still be written later: never reuse the device.
                self.transport.fail();
                self.failed = true;
                return Err(RngError::Timeout);
            }
            crate::signal::wait(10_000);
            self.transport.ack_interrupt();
        }
    }

    /// Fills all of `buf`.
    pub fn fill(&mut self, mut buf: &mut [u8]) -> Result<(), RngError> {
        while !buf.is_empty() {
            let n = self.read(buf)?;
            buf = &mut buf[n..];
        }
        Ok(())
    }
}

// SAFETY: the raw pointers inside (queue memory, device registers) are owned
// by this driver alone; moving it to another context moves that ownership,
// and `crate::random` keeps it behind a mutex.
unsafe impl Send for VirtioRng {}
