//! A worker thread that serves one virtio queue.
//!
//! Devices with a single request queue (blk, rng) only say how to serve one
//! descriptor chain ([`ChainHandler`]); [`QueueServer`] does the rest on a
//! [`Worker`] thread: sleep in epoll on the queue's notification eventfd and
//! the stop eventfd, pop chains, return them on the used ring, suppress
//! notifications while busy (EVENT_IDX when negotiated) and raise the
//! interrupt when the driver wants one.
//!
//! The guest controls the ring, so the loop must never spin or block on it:
//! a corrupt avail index ends a round, and a driver that keeps the queue full
//! is served in bounded batches so a stop request is always seen.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;

use virtio_queue::{DescriptorChain, Queue, QueueOwnedT, QueueT};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

use super::worker::Worker;
use super::{ActivateContext, ActivateError, GuestMemoryMmap, VirtioInterrupt};

/// What became of a chain a handler was given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Served {
    /// Done: return it on the used ring with this used length (bytes
    /// written into its device-writable buffers).
    Used(u32),
    /// Kept by the device, returned later by other means.
    Kept,
    /// Not served now (a rate limiter said wait): put it back at the head
    /// of the avail ring and end the round; one of the handler's
    /// [`ChainHandler::wake_fds`] brings the server back.
    Deferred,
}

/// Serves the chains of one queue.
pub trait ChainHandler: Send + 'static {
    /// Serves one chain (see [`Served`]).
    fn serve(&mut self, mem: &GuestMemoryMmap, chain: DescriptorChain<&GuestMemoryMmap>) -> Served;

    /// Fds the server also waits on (a rate limiter's timer, an io_uring's
    /// completion eventfd); when the `i`th is readable, `on_wake(i)` runs,
    /// the chains it returns go on the used ring, and the queue is served
    /// again.
    fn wake_fds(&self) -> Vec<RawFd> {
        Vec::new()
    }

    /// Returns chains [`Served::Kept`] earlier that are now done, as
    /// `(head index, used length)`.
    fn on_wake(&mut self, _which: usize, _mem: &GuestMemoryMmap) -> Vec<(u16, u32)> {
        Vec::new()
    }

    /// Called when the server stops (snapshot, reset): finish every kept
    /// chain, waiting if need be, so the queue is handed back consistent.
    fn finish(&mut self, _mem: &GuestMemoryMmap) -> Vec<(u16, u32)> {
        Vec::new()
    }

    /// Called after a round of chains went back to the driver (and the
    /// driver was interrupted): work that need not delay the driver.
    fn after_round(&mut self) {}

    /// If `Some`, [`Self::on_idle`] runs once the queue has been quiet this
    /// long: deferred work that should wait until a burst of requests ends.
    fn idle_timeout(&self) -> Option<std::time::Duration> {
        None
    }

    fn on_idle(&mut self) {}
}

const TOKEN_QUEUE: u64 = 0;
const TOKEN_STOP: u64 = 1;
/// Tokens from here on: the handler's wake fds, in order.
const TOKEN_WAKE: u64 = 2;

/// One queue, its notification eventfd and the handler for its chains.
pub struct QueueServer<H: ChainHandler> {
    queue: Queue,
    mem: GuestMemoryMmap,
    interrupt: Arc<VirtioInterrupt>,
    queue_evt: EventFd,
    handler: H,
    /// Names the device in log messages.
    tag: String,
}

impl<H: ChainHandler> QueueServer<H> {
    /// Takes the only queue of `ctx`, which must be ready.
    pub fn from_single_queue(
        ctx: ActivateContext,
        handler: H,
        tag: String,
    ) -> Result<Self, ActivateError> {
        let ActivateContext {
            mem,
            interrupt,
            queues,
            queue_events,
            ..
        } = ctx;
        let got = queues.len();
        let (Ok([queue]), Ok([queue_evt])) = (
            <[Queue; 1]>::try_from(queues),
            <[EventFd; 1]>::try_from(queue_events),
        ) else {
            return Err(ActivateError::QueueCount { expected: 1, got });
        };
        if !queue.ready() {
            return Err(ActivateError::Device(format!(
                "{tag}: the driver did not enable the queue"
            )));
        }
        Ok(Self {
            queue,
            mem,
            interrupt,
            queue_evt,
            handler,
            tag,
        })
    }

    /// Starts serving on a thread named `<kind>-<id>` (cut to Linux's 15 bytes).
    /// Stopping the worker hands back the queue and the handler.
    pub fn spawn(self, kind: &str, id: &str) -> Result<Worker<(Queue, H)>, ActivateError> {
        let mut name = format!("{kind}-{id}");
        while name.len() > 15 {
            name.pop();
        }
        Worker::spawn(&name, move |stop| self.run(stop)).map_err(ActivateError::Worker)
    }

    fn run(mut self, stop: EventFd) -> (Queue, H) {
        let epoll = match self.epoll(&stop) {
            Ok(e) => e,
            Err(e) => {
                tracing::error!("{}: cannot set up epoll: {e}", self.tag);
                return (self.queue, self.handler);
            }
        };
        // Chains made available before activation need no new notification.
        self.serve_available();
        let mut events = [EpollEvent::default(); 8];
        loop {
            let timeout = self
                .handler
                .idle_timeout()
                .map_or(-1, |d| i32::try_from(d.as_millis()).unwrap_or(i32::MAX));
            let n = match epoll.wait(timeout, &mut events) {
                Ok(0) if timeout >= 0 => {
                    self.handler.on_idle();
                    continue;
                }
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::error!("{}: epoll failed: {e}", self.tag);
                    return (self.queue, self.handler);
                }
            };
            for ev in &events[..n] {
                match ev.data() {
                    TOKEN_STOP => {
                        let done = self.handler.finish(&self.mem);
                        self.serve_with(done, false);
                        return (self.queue, self.handler);
                    }
                    TOKEN_QUEUE => {
                        // EAGAIN only means the counter was already consumed.
                        let _ = self.queue_evt.read();
                        self.serve_available();
                    }
                    token => {
                        let which = usize::try_from(token - TOKEN_WAKE).unwrap_or(usize::MAX);
                        let done = self.handler.on_wake(which, &self.mem);
                        self.serve_with(done, true);
                    }
                }
            }
        }
    }

    fn epoll(&self, stop: &EventFd) -> std::io::Result<Epoll> {
        let epoll = Epoll::new()?;
        let wake = self.handler.wake_fds().into_iter().zip(TOKEN_WAKE..);
        for (fd, token) in [
            (self.queue_evt.as_raw_fd(), TOKEN_QUEUE),
            (stop.as_raw_fd(), TOKEN_STOP),
        ]
        .into_iter()
        .chain(wake)
        {
            epoll.ctl(
                ControlOperation::Add,
                fd,
                EpollEvent::new(EventSet::IN, token),
            )?;
        }
        Ok(epoll)
    }

    /// Serves every available chain (up to a batch limit), then interrupts
    /// the driver if it asked for it.
    fn serve_available(&mut self) {
        self.serve_with(Vec::new(), true);
    }

    /// Returns the chains `done` on the used ring, then (if `more`) serves
    /// the available ones, and interrupts the driver if it wants it.
    fn serve_with(&mut self, done: Vec<(u16, u32)>, more: bool) {
        let Self {
            queue,
            mem,
            queue_evt,
            handler,
            tag,
            interrupt,
        } = self;
        let mut used_any = false;
        for (head, len) in done {
            match queue.add_used(mem, head, len) {
                Ok(()) => used_any = true,
                Err(e) => tracing::warn!("{tag}: cannot return chain {head}: {e}"),
            }
        }
        if more {
            used_any |= drain_queue(queue, queue_evt, mem, tag, |chain| {
                handler.serve(mem, chain)
            });
        }
        if used_any && queue.needs_notification(mem).unwrap_or(true) {
            interrupt.signal_used_queue();
        }
        if used_any {
            handler.after_round();
        }
    }
}

/// Rounds in a row that pop nothing while `enable_notification` says chains
/// are available before the loop gives up (see [`drain_queue`]).
const MAX_IDLE_ROUNDS: u32 = 2;

/// Serves the available chains of `queue` with `serve` (see [`Served`]),
/// at most four rings'
/// worth per call; past that it writes `evt` so the caller's epoll brings it
/// back, after seeing any stop request. Returns whether any chain was used.
///
/// Notifications are off while serving. Turning them back on must be
/// followed by another look: a chain the driver published in between got no
/// kick (the driver saw notifications off) and would wait forever. So when
/// `enable_notification` reports more chains, serve again; only if that
/// finds nothing, several times in a row, is the avail index corrupt, and
/// the loop stops instead of spinning.
pub fn drain_queue(
    queue: &mut Queue,
    evt: &EventFd,
    mem: &GuestMemoryMmap,
    tag: &str,
    mut serve: impl FnMut(DescriptorChain<&GuestMemoryMmap>) -> Served,
) -> bool {
    let batch = 4 * usize::from(queue.size());
    let mut served = 0;
    let mut used_any = false;
    let mut idle_rounds = 0;
    loop {
        if let Err(e) = queue.disable_notification(mem) {
            tracing::warn!("{tag}: queue unusable: {e}");
            break;
        }
        let before = served;
        while served < batch {
            let Some(chain) = queue.pop_descriptor_chain(mem) else {
                break;
            };
            served += 1;
            let head = chain.head_index();
            match serve(chain) {
                Served::Used(len) => match queue.add_used(mem, head, len) {
                    Ok(()) => used_any = true,
                    Err(e) => tracing::warn!("{tag}: cannot return chain {head}: {e}"),
                },
                Served::Kept => {}
                Served::Deferred => {
                    // Popped again once the handler's wake fd fires.
                    queue.go_to_previous_position();
                    return used_any;
                }
            }
        }
        if served >= batch {
            if let Err(e) = evt.write(1) {
                tracing::warn!("{tag}: cannot requeue the rest of a batch: {e}");
            }
            break;
        }
        match queue.enable_notification(mem) {
            Ok(true) => {
                idle_rounds = if served > before { 0 } else { idle_rounds + 1 };
                if idle_rounds > MAX_IDLE_ROUNDS {
                    tracing::warn!(
                        "{tag}: the avail index announces chains that cannot be popped; \
                         waiting for the next notification"
                    );
                    break;
                }
            }
            Ok(false) => break,
            Err(e) => {
                tracing::warn!("{tag}: queue unusable: {e}");
                break;
            }
        }
    }
    used_any
}
