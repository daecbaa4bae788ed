//! Wake-ups for vCPUs sleeping in the signal port's `WAIT`.
//!
//! A unikernel has no interrupts, so "a device has work for the guest" is
//! told to the vCPU thread through this object: every virtio interrupt, serial
//! input and similar event calls [`GuestWake::notify`]. A wake-up may be
//! spurious (the guest already handled the work); the guest re-polls anyway.

use std::os::fd::AsRawFd;
use std::time::Duration;

use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

pub struct GuestWake {
    event: EventFd,
}

impl GuestWake {
    pub fn new() -> std::io::Result<Self> {
        Ok(Self {
            event: EventFd::new(EFD_NONBLOCK)?,
        })
    }

    /// Records that the guest has work; wakes a sleeping `wait`.
    pub fn notify(&self) {
        // Only fails if the counter would overflow, which means it is already set.
        let _ = self.event.write(1);
    }

    /// Sleeps until [`notify`](Self::notify) or the timeout. Returns true if woken.
    /// A notification that came before the call ends the wait at once.
    pub fn wait(&self, timeout: Duration) -> bool {
        let mut pfd = libc::pollfd {
            fd: self.event.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
        // Round sub-millisecond timeouts up so a 500 µs wait still sleeps.
        let ms = if ms == 0 && !timeout.is_zero() { 1 } else { ms };
        // SAFETY: pfd is a valid pollfd for the duration of the call.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n > 0 {
            let _ = self.event.read();
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    #[test]
    fn wait_times_out_and_wakes() {
        let w = GuestWake::new().unwrap();
        let t = Instant::now();
        assert!(!w.wait(Duration::from_millis(20)));
        assert!(t.elapsed() >= Duration::from_millis(19));
        w.notify();
        w.notify();
        assert!(w.wait(Duration::from_secs(5)));
        // Both notifications were consumed by one wake-up.
        assert!(!w.wait(Duration::from_millis(1)));
    }
}
