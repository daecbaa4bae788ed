//! The vsock worker thread's loop: one epoll set (the muxer's) watching the
//! three queue notifications, the transport-reset request, the stop event,
//! the host listener and every connection socket.
//!
//! Each wake-up serves the event queue, drains guest tx, then fills guest rx
//! buffers, and raises one interrupt for whatever was used. The loop owns the
//! queues and the muxer while it runs and hands both back when stopped.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::Instant;

use virtio_queue::{Queue, QueueT};
use vmm_sys_util::epoll::EpollEvent;
use vmm_sys_util::eventfd::EventFd;

use super::muxer::VsockMuxer;
use crate::devices::virtio::{GuestMemoryMmap, VirtioInterrupt};

pub const RX_QUEUE: usize = 0;
pub const TX_QUEUE: usize = 1;
pub const EVENT_QUEUE: usize = 2;

/// What a stopped worker hands back to the device.
pub struct WorkerState {
    pub muxer: VsockMuxer,
    /// rx, tx, event, with their ring positions (for a later snapshot).
    pub queues: Vec<Queue>,
}

pub struct EventLoop {
    muxer: VsockMuxer,
    mem: GuestMemoryMmap,
    interrupt: Arc<VirtioInterrupt>,
    queues: Vec<Queue>,
    queue_events: Vec<EventFd>,
    reset_evt: EventFd,
}

impl EventLoop {
    /// Registers the queue and reset eventfds with the muxer's epoll set;
    /// on failure nothing stays registered.
    pub fn watch_fds(
        muxer: &VsockMuxer,
        queue_events: &[EventFd],
        reset_evt: &EventFd,
    ) -> io::Result<()> {
        let mut watched: Vec<RawFd> = Vec::new();
        for fd in queue_events
            .iter()
            .map(AsRawFd::as_raw_fd)
            .chain([reset_evt.as_raw_fd()])
        {
            if let Err(e) = muxer.watch(fd) {
                for fd in watched {
                    let _ = muxer.unwatch(fd);
                }
                return Err(e);
            }
            watched.push(fd);
        }
        Ok(())
    }

    /// A loop over fds already registered with [`EventLoop::watch_fds`].
    pub fn new(
        muxer: VsockMuxer,
        mem: GuestMemoryMmap,
        interrupt: Arc<VirtioInterrupt>,
        queues: Vec<Queue>,
        queue_events: Vec<EventFd>,
        reset_evt: EventFd,
    ) -> Self {
        EventLoop {
            muxer,
            mem,
            interrupt,
            queues,
            queue_events,
            reset_evt,
        }
    }

    /// Runs until `stop` is readable (or epoll fails).
    pub fn run(mut self, stop: EventFd) -> WorkerState {
        if let Err(e) = self.muxer.watch(stop.as_raw_fd()) {
            tracing::error!("vsock worker cannot watch its stop event: {e}");
            return self.finish(&stop);
        }
        let mut events = vec![EpollEvent::default(); 64];
        // Buffers may have been queued (and a transport reset requested)
        // before the worker started.
        self.process_queues(Instant::now());
        loop {
            let n = match self.muxer.wait(&mut events, None) {
                Ok(n) => n,
                Err(e) => {
                    tracing::error!("vsock worker epoll failed, device stops: {e}");
                    return self.finish(&stop);
                }
            };
            let now = Instant::now();
            for ev in &events[..n] {
                // Registered with a descriptor as data: non-negative, fits.
                let Ok(fd) = RawFd::try_from(ev.data()) else {
                    continue;
                };
                if fd == stop.as_raw_fd() {
                    return self.finish(&stop);
                }
                if fd == self.reset_evt.as_raw_fd() {
                    let _ = self.reset_evt.read();
                    self.muxer.transport_reset();
                } else if let Some(qe) = self.queue_events.iter().find(|e| e.as_raw_fd() == fd) {
                    // Level-triggered: clear it; the queues are processed below.
                    let _ = qe.read();
                } else if !self.muxer.handle_event(fd, ev.event_set(), now) {
                    tracing::warn!("vsock worker: event for unknown fd {fd}");
                }
            }
            self.muxer.process_timeouts(now);
            self.process_queues(now);
        }
    }

    fn process_queues(&mut self, now: Instant) {
        let mem = &self.mem;
        // Events first: a transport reset the guest acknowledged releases
        // held host clients, whose requests then go out on rx below.
        let ev = self
            .muxer
            .process_event_queue(mem, &mut self.queues[EVENT_QUEUE], now);
        let tx = self.muxer.process_tx(mem, &mut self.queues[TX_QUEUE], now);
        let rx = self.muxer.process_rx(mem, &mut self.queues[RX_QUEUE], now);
        let mut notify = false;
        for (q, used) in [(RX_QUEUE, rx), (TX_QUEUE, tx), (EVENT_QUEUE, ev)] {
            if used {
                // Each used queue must be asked: with EVENT_IDX the call
                // records what the driver has been told.
                notify |= self.queues[q].needs_notification(mem).unwrap_or(true);
            }
        }
        if notify {
            self.interrupt.signal_used_queue();
        }
    }

    fn finish(self, stop: &EventFd) -> WorkerState {
        // The transport may hold other fds for these eventfds, so closing
        // ours would not take them out of the epoll set.
        for fd in self
            .queue_events
            .iter()
            .map(AsRawFd::as_raw_fd)
            .chain([self.reset_evt.as_raw_fd(), stop.as_raw_fd()])
        {
            let _ = self.muxer.unwatch(fd);
        }
        WorkerState {
            muxer: self.muxer,
            queues: self.queues,
        }
    }
}
