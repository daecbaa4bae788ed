//! The thread a virtio device processes its queues on.
//!
//! Each activated device runs its own worker thread, so no device ever waits
//! behind another one's I/O. The worker loop watches its queue eventfds (and
//! whatever else the device needs) plus a stop eventfd; stopping hands back
//! whatever the loop returns, typically the queues and device state, so the
//! device can be reset, re-activated or snapshotted.

use std::thread::JoinHandle;

use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// A running worker thread that returns a `T` when stopped.
pub struct Worker<T: Send + 'static> {
    stop: EventFd,
    handle: Option<JoinHandle<T>>,
}

impl<T: Send + 'static> Worker<T> {
    /// Starts `body` on a thread named `name`. `body` gets the stop eventfd,
    /// which it must watch and return promptly once readable.
    pub fn spawn<F>(name: &str, body: F) -> std::io::Result<Self>
    where
        F: FnOnce(EventFd) -> T + Send + 'static,
    {
        let stop = EventFd::new(EFD_NONBLOCK)?;
        let stop_for_thread = stop.try_clone()?;
        let handle = crate::seccomp::spawn(
            crate::seccomp::ThreadKind::Vmm,
            name.to_string(),
            move || body(stop_for_thread),
        )?;
        Ok(Self {
            stop,
            handle: Some(handle),
        })
    }

    /// Asks the worker to stop and waits for it. `None` if the thread panicked.
    pub fn stop(mut self) -> Option<T> {
        self.stop_inner()
    }

    fn stop_inner(&mut self) -> Option<T> {
        let handle = self.handle.take()?;
        let _ = self.stop.write(1);
        handle.join().ok()
    }
}

impl<T: Send + 'static> Drop for Worker<T> {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use super::*;

    #[test]
    fn stop_returns_state() {
        let w = Worker::spawn("test-worker", |stop: EventFd| {
            let mut pfd = libc::pollfd {
                fd: stop.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: valid pollfd, blocking until the stop event.
            unsafe { libc::poll(&mut pfd, 1, -1) };
            42u32
        })
        .unwrap();
        assert_eq!(w.stop(), Some(42));
    }
}
