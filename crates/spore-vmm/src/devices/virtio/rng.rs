//! virtio-rng: host randomness for the guest (virtio 1.2, §5.4).
//!
//! One queue; the driver offers device-writable buffers and the device fills
//! them with bytes from the host's CSPRNG (`getrandom`). At most
//! [`MAX_BYTES_PER_CHAIN`] bytes are produced per chain and they pass through
//! a fixed-size stack buffer, so a guest offering huge buffers costs the host
//! bounded time and no allocation. Firecracker's `rate_limiter` (`PUT
//! /entropy`) applies: a chain costs one op and the bytes it asks for, and
//! waits at the head of the queue while the buckets are empty.

use std::os::fd::RawFd;
use std::sync::{Arc, Mutex};

use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use virtio_queue::desc::split::Descriptor;
use virtio_queue::{DescriptorChain, Queue};
use vm_memory::{Address, Bytes};

use super::queue_server::{ChainHandler, QueueServer, Served};
use super::worker::Worker;
use super::{device_type, ActivateContext, ActivateError, GuestMemoryMmap, VirtioDevice};
use crate::config::RateLimiterConfig;
use crate::host::lock;
use crate::rate_limiter::{RateLimiter, RateLimiterState};

/// Entries in the device's only queue.
pub const QUEUE_SIZE: u16 = 256;
/// Most random bytes handed out per descriptor chain.
pub const MAX_BYTES_PER_CHAIN: u32 = 64 * 1024;
/// Bytes generated per getrandom call and guest-memory write.
const CHUNK: usize = 4096;

/// The rng's snapshot state beyond its transport: its rate limiter's
/// buckets (the entropy source is the host's).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RngState {
    pub limiter: RateLimiterState,
}

impl crate::persist::Persist for Rng {
    type State = RngState;
    type Args = ();
    type Error = std::io::Error;

    fn save(&self) -> RngState {
        RngState {
            limiter: lock(&self.limiter).save(),
        }
    }

    fn restore((): (), state: &RngState) -> Result<Self, Self::Error> {
        Ok(Rng::with_limiter(RateLimiter::restore(&state.limiter)?))
    }
}

/// A virtio entropy device.
pub struct Rng {
    worker: Option<Worker<(Queue, EntropySource)>>,
    limiter: Arc<Mutex<RateLimiter>>,
}

impl Rng {
    /// An rng limited by `limits` (none: unlimited). Fails only when the
    /// limiter's timer cannot be made.
    pub fn new(limits: Option<&RateLimiterConfig>) -> std::io::Result<Self> {
        Ok(Self::with_limiter(RateLimiter::new(limits)?))
    }

    fn with_limiter(limiter: RateLimiter) -> Self {
        Self {
            worker: None,
            limiter: Arc::new(Mutex::new(limiter)),
        }
    }

    /// The limits in force (for `GET /vm/config`).
    pub fn rate_limiter(&self) -> Option<RateLimiterConfig> {
        lock(&self.limiter).config()
    }

    fn stop_worker(&mut self) {
        if let Some(worker) = self.worker.take() {
            if worker.stop().is_none() {
                tracing::error!("virtio-rng: worker thread panicked");
            }
        }
    }
}

impl VirtioDevice for Rng {
    fn device_type(&self) -> u32 {
        device_type::RNG
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE]
    }

    fn avail_features(&self) -> u64 {
        1 << VIRTIO_F_VERSION_1 | 1 << VIRTIO_RING_F_EVENT_IDX
    }

    /// virtio-rng has no config space.
    fn read_config(&self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    fn activate(&mut self, ctx: ActivateContext) -> Result<(), ActivateError> {
        self.stop_worker();
        let source = EntropySource {
            timer_fd: lock(&self.limiter).timer_fd(),
            limiter: self.limiter.clone(),
        };
        let server = QueueServer::from_single_queue(ctx, source, "virtio-rng".into())?;
        self.worker = Some(server.spawn("virtio", "rng")?);
        Ok(())
    }

    fn reset(&mut self) {
        self.stop_worker();
    }

    fn quiesce(&mut self) -> Result<Vec<Queue>, ActivateError> {
        let worker = self
            .worker
            .take()
            .ok_or_else(|| ActivateError::Device("virtio-rng is not active".into()))?;
        let (queue, _) = worker
            .stop()
            .ok_or_else(|| ActivateError::Device("virtio-rng worker panicked".into()))?;
        Ok(vec![queue])
    }
}

/// Fills chains with host randomness on the worker thread.
struct EntropySource {
    limiter: Arc<Mutex<RateLimiter>>,
    /// The limiter's timer (fixed for the limiter's life).
    timer_fd: RawFd,
}

impl ChainHandler for EntropySource {
    fn serve(&mut self, mem: &GuestMemoryMmap, chain: DescriptorChain<&GuestMemoryMmap>) -> Served {
        // What the chain asks for, as the bytes the limiter charges (at most
        // what one chain gets).
        let asked = chain
            .clone()
            .filter(Descriptor::is_write_only)
            .fold(0u64, |n, d| n.saturating_add(u64::from(d.len())))
            .min(u64::from(MAX_BYTES_PER_CHAIN));
        if !lock(&self.limiter).consume(asked) {
            return Served::Deferred;
        }
        Served::Used(fill_chain(chain, mem))
    }

    fn wake_fds(&self) -> Vec<RawFd> {
        vec![self.timer_fd]
    }

    fn on_wake(&mut self, _which: usize, _mem: &GuestMemoryMmap) -> Vec<(u16, u32)> {
        lock(&self.limiter).on_timer();
        Vec::new()
    }
}

/// Fills the device-writable descriptors of a chain, in order, with up to
/// [`MAX_BYTES_PER_CHAIN`] random bytes; returns how many were written.
/// Stops at the first buffer outside guest memory (or a getrandom failure):
/// the used length then covers exactly the bytes that were filled.
fn fill_chain(descriptors: impl Iterator<Item = Descriptor>, mem: &GuestMemoryMmap) -> u32 {
    let mut buf = [0u8; CHUNK];
    let mut written: u32 = 0;
    // Readable descriptors carry nothing for this device; skip them.
    for d in descriptors.filter(Descriptor::is_write_only) {
        let mut done: u32 = 0;
        while done < d.len() && written < MAX_BYTES_PER_CHAIN {
            let n = (d.len() - done)
                .min(MAX_BYTES_PER_CHAIN - written)
                .min(u32::try_from(CHUNK).unwrap_or(u32::MAX));
            let Some(addr) = d.addr().checked_add(u64::from(done)) else {
                return written;
            };
            let chunk = &mut buf[..n as usize];
            if let Err(e) = getrandom::fill(chunk) {
                tracing::error!("virtio-rng: host randomness unavailable: {e}");
                return written;
            }
            if let Err(e) = mem.write_slice(chunk, addr) {
                tracing::debug!("virtio-rng: buffer at {addr:?} not in guest memory: {e}");
                return written;
            }
            done += n;
            written += n;
        }
        if written >= MAX_BYTES_PER_CHAIN {
            break;
        }
    }
    written
}

#[cfg(test)]
#[path = "rng_tests.rs"]
mod tests;
