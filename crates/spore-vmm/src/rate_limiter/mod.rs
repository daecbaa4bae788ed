//! I/O rate limiting shared by devices: Firecracker's `RateLimiter`.
//!
//! A limiter has up to two [`TokenBucket`]s: `bandwidth` (bytes) and `ops`
//! (requests). A device asks [`RateLimiter::consume`] before serving a
//! request; when a bucket is short, the request is refused, the limiter arms
//! its timerfd for the moment the bucket will hold enough, and the device
//! stops taking requests from its queue until [`RateLimiter::on_timer`]
//! (the device's worker watches [`RateLimiter::timer_fd`] in its epoll).
//! Nothing ticks: buckets refill from elapsed time when looked at.
//!
//! virtio-blk, the entropy device and virtio-net (one limiter each way)
//! use it. A limiter's buckets are part of its device's snapshot state.

mod bucket;
#[cfg(test)]
mod tests;

use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

pub use bucket::{TokenBucket, TokenBucketState};
use serde::{Deserialize, Serialize};
use vmm_sys_util::timerfd::TimerFd;

use crate::config::{RateLimiterConfig, TokenBucketConfig};
use crate::host::monotonic_ns;

/// Shortest timer armed: a refusal never turns into a busy loop.
const MIN_WAIT: Duration = Duration::from_millis(1);

pub struct RateLimiter {
    bandwidth: Option<TokenBucket>,
    ops: Option<TokenBucket>,
    timer: TimerFd,
    /// A request was refused and the timer is armed: the device waits.
    blocked: bool,
}

impl std::fmt::Debug for RateLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimiter")
            .field("bandwidth", &self.bandwidth)
            .field("ops", &self.ops)
            .field("blocked", &self.blocked)
            .finish()
    }
}

/// A limiter's snapshot state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateLimiterState {
    pub bandwidth: Option<TokenBucketState>,
    pub ops: Option<TokenBucketState>,
}

impl RateLimiter {
    /// A limiter with the buckets `cfg` enables (none: unlimited).
    pub fn new(cfg: Option<&RateLimiterConfig>) -> std::io::Result<RateLimiter> {
        let now = monotonic_ns();
        let bucket = |b: Option<&TokenBucketConfig>| b.and_then(|b| TokenBucket::new(b, now));
        Ok(RateLimiter {
            bandwidth: bucket(cfg.and_then(|c| c.bandwidth.as_ref())),
            ops: bucket(cfg.and_then(|c| c.ops.as_ref())),
            timer: TimerFd::new()?,
            blocked: false,
        })
    }

    pub fn is_unlimited(&self) -> bool {
        self.bandwidth.is_none() && self.ops.is_none()
    }

    /// Whether the device must wait for the timer before taking requests.
    pub fn is_blocked(&self) -> bool {
        self.blocked
    }

    /// The timerfd a device's worker watches (readable: try again).
    pub fn timer_fd(&self) -> RawFd {
        self.timer.as_raw_fd()
    }

    /// Takes one op and `bytes` bytes, or neither: on refusal the timer is
    /// armed for when both buckets can pay and the limiter is blocked.
    pub fn consume(&mut self, bytes: u64) -> bool {
        self.consume_at(bytes, monotonic_ns())
    }

    fn consume_at(&mut self, bytes: u64, now: u64) -> bool {
        if self.blocked {
            return false;
        }
        if let Some(b) = self.bandwidth.as_mut() {
            if bytes > 0 && !b.try_consume(bytes, now) {
                let wait = b.wait_ns(bytes, now);
                self.block_for(wait);
                return false;
            }
        }
        if let Some(o) = self.ops.as_mut() {
            if !o.try_consume(1, now) {
                let wait = o.wait_ns(1, now);
                if let Some(b) = self.bandwidth.as_mut() {
                    b.give_back(bytes);
                }
                self.block_for(wait);
                return false;
            }
        }
        true
    }

    fn block_for(&mut self, wait_ns: u64) {
        let wait = Duration::from_nanos(wait_ns).max(MIN_WAIT);
        match self.timer.reset(wait, None) {
            Ok(()) => self.blocked = true,
            // Without a timer nothing would wake the device: let the next
            // request try again instead of stalling the queue forever.
            Err(e) => tracing::warn!("rate limiter: cannot arm its timer: {e}"),
        }
    }

    /// The timer fired: drain it and let the device try again.
    pub fn on_timer(&mut self) {
        let mut buf = [0u8; 8];
        // SAFETY: reading 8 bytes into a local buffer from our timerfd; the
        // fd was made by TimerFd, which we own. EAGAIN (not expired) is fine:
        // the fd is only read after epoll said it is readable.
        let n = unsafe { libc::read(self.timer.as_raw_fd(), buf.as_mut_ptr().cast(), 8) };
        if n == 8 || !self.timer.is_armed().unwrap_or(false) {
            self.blocked = false;
        }
    }

    /// Applies a `PATCH`: a bucket given replaces the current one (size or
    /// refill time 0 removes it), a bucket left out is kept. Unblocks, so
    /// that the device re-checks against the new limits.
    pub fn update(&mut self, cfg: &RateLimiterConfig) {
        let now = monotonic_ns();
        if let Some(b) = &cfg.bandwidth {
            self.bandwidth = TokenBucket::new(b, now);
        }
        if let Some(o) = &cfg.ops {
            self.ops = TokenBucket::new(o, now);
        }
        let _ = self.timer.clear();
        self.blocked = false;
    }

    pub fn save(&self) -> RateLimiterState {
        RateLimiterState {
            bandwidth: self.bandwidth.as_ref().map(TokenBucket::save),
            ops: self.ops.as_ref().map(TokenBucket::save),
        }
    }

    pub fn restore(state: &RateLimiterState) -> std::io::Result<RateLimiter> {
        let now = monotonic_ns();
        Ok(RateLimiter {
            bandwidth: state
                .bandwidth
                .as_ref()
                .and_then(|b| TokenBucket::restore(b, now)),
            ops: state
                .ops
                .as_ref()
                .and_then(|o| TokenBucket::restore(o, now)),
            timer: TimerFd::new()?,
            blocked: false,
        })
    }

    /// The limits as a configuration (for `GET /vm/config`).
    pub fn config(&self) -> Option<RateLimiterConfig> {
        if self.is_unlimited() {
            return None;
        }
        let cfg = |b: &TokenBucket| {
            let s = b.save();
            TokenBucketConfig {
                size: s.size,
                one_time_burst: (s.one_time_burst > 0).then_some(s.one_time_burst),
                refill_time: s.refill_time_ms,
            }
        };
        Some(RateLimiterConfig {
            bandwidth: self.bandwidth.as_ref().map(cfg),
            ops: self.ops.as_ref().map(cfg),
        })
    }
}
