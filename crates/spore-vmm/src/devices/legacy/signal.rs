//! The signal port's VMM side: decodes guest → VMM events (see
//! `spore_abi::signal` for the encoding).
//!
//! This is not a [`BusDevice`](crate::devices::bus::BusDevice): `WAIT` blocks
//! the calling vCPU thread, so the vCPU loop calls [`SignalPort`] directly
//! without holding any bus lock, and each vCPU keeps its own last result.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use spore_abi::signal::{decode, SignalOp, FORK_FAILED, RESTORED, WAIT_TIMED_OUT, WAIT_WOKEN};

use crate::devices::wake::GuestWake;
use crate::host::{lock, monotonic_ns};

/// A timestamped `MARK` from the guest.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
pub struct Mark {
    pub mark: u32,
    pub vcpu: u8,
    /// Host CLOCK_MONOTONIC in nanoseconds when the VMM saw the mark.
    pub monotonic_ns: u64,
}

/// What the vCPU loop must do after a signal.
#[derive(Debug, PartialEq, Eq)]
pub enum SignalAction {
    Continue,
    /// The guest asked to stop with this exit code.
    Exit(u8),
    /// The guest asked to be cloned this many times (0: the configured
    /// count). The vCPU parks itself; the fork handler does the rest.
    Fork(u32),
    /// The guest asked for a snapshot with this tag; the vCPU loop hands it
    /// to the VMM (see `RunControl::request_guest_snapshot`).
    Snapshot(u32),
}

/// Called (on the vCPU thread) when the guest signals `FORK`: vCPU id and
/// requested count. It must not block on the VM: the vCPU parks after it
/// if it returns true (the fork is under way); false refuses the fork (the
/// guest reads [`FORK_FAILED`] at once).
pub type ForkHandler = Box<dyn Fn(u8, u32) -> bool + Send + Sync>;

/// Per-VM signal port state.
pub struct SignalPort {
    wake: Arc<GuestWake>,
    marks: Mutex<Vec<Mark>>,
    ignored: AtomicU64,
    /// The VM's clone generation (`GENERATION`).
    generation: AtomicU64,
    /// One bit per vCPU id (< 64) whose next `in` reads [`RESTORED`].
    restored: AtomicU64,
    fork: Mutex<Option<ForkHandler>>,
    /// A result the VMM sets for one vCPU's next `in` (bit 63: set, bits
    /// 32..40: vCPU id, low 32 bits: value): what `FORK` returns in a clone
    /// and in its source.
    pending: AtomicU64,
}

/// Keeps a guest that floods `MARK` from growing VMM memory without bound.
const MAX_MARKS: usize = 4096;

impl SignalPort {
    pub fn new(wake: Arc<GuestWake>) -> Self {
        Self {
            wake,
            marks: Mutex::new(Vec::new()),
            ignored: AtomicU64::new(0),
            generation: AtomicU64::new(0),
            restored: AtomicU64::new(0),
            fork: Mutex::new(None),
            pending: AtomicU64::new(0),
        }
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Sets the clone generation and wakes a `WAIT` (the guest's cue to
    /// check it).
    pub fn set_generation(&self, generation: u64) {
        self.generation.store(generation, Ordering::Release);
        self.wake.notify();
    }

    /// Makes the next `in` of every vCPU read [`RESTORED`] (a VM restored
    /// from a snapshot, before its vCPUs run).
    pub fn set_restored(&self, vcpus: u8) {
        let mask = if vcpus >= 64 {
            u64::MAX
        } else {
            (1u64 << vcpus) - 1
        };
        self.restored.store(mask, Ordering::Relaxed);
    }

    /// Installs what a guest `FORK` does; without one, `FORK` fails at once
    /// (the guest reads [`FORK_FAILED`]).
    pub fn set_fork_handler(&self, handler: ForkHandler) {
        *lock(&self.fork) = Some(handler);
    }

    /// Sets what vCPU `vcpu` reads from its next `in` on the port, replacing
    /// its last result (a restored clone's `FORK` result, or a source's).
    pub fn set_pending_result(&self, vcpu: u8, value: u32) {
        let v = 1u64 << 63 | u64::from(vcpu) << 32 | u64::from(value);
        self.pending.store(v, Ordering::SeqCst);
    }

    /// The pending result for `vcpu`, taken once (see [`Self::set_pending_result`]).
    pub fn take_pending_result(&self, vcpu: u8) -> Option<u32> {
        let v = self.pending.load(Ordering::Relaxed);
        if v >> 63 == 0 || ((v >> 32) & 0xff) as u8 != vcpu {
            return None;
        }
        let taken = self
            .pending
            .compare_exchange(v, 0, Ordering::SeqCst, Ordering::Relaxed)
            .ok()
            .map(|v| (v & 0xffff_ffff) as u32);
        if taken.is_some() {
            // A clone reads its FORK result, not RESTORED: that result is
            // how it learns it is a clone.
            let bit = 1u64.checked_shl(u32::from(vcpu)).unwrap_or(0);
            self.restored.fetch_and(!bit, Ordering::Relaxed);
        }
        taken
    }

    /// Handles an `out` to the port. `last_result` is the vCPU's own result register.
    pub fn write(&self, vcpu: u8, data: &[u8], last_result: &mut u32) -> SignalAction {
        let Ok(bytes) = <[u8; 4]>::try_from(data) else {
            self.ignore(vcpu, format_args!("{}-byte write", data.len()));
            return SignalAction::Continue;
        };
        let value = u32::from_le_bytes(bytes);
        let Some((op, arg)) = decode(value) else {
            self.ignore(vcpu, format_args!("unknown value {value:#010x}"));
            return SignalAction::Continue;
        };
        match op {
            SignalOp::Exit => return SignalAction::Exit((arg & 0xff) as u8),
            SignalOp::Mark => {
                let mut marks = lock(&self.marks);
                if marks.len() < MAX_MARKS {
                    marks.push(Mark {
                        mark: arg,
                        vcpu,
                        monotonic_ns: monotonic_ns(),
                    });
                }
                drop(marks);
                crate::boot_timer::guest_mark();
                tracing::debug!(mark = arg, vcpu, "guest mark");
            }
            SignalOp::Wait => {
                let woken = self.wake.wait(Duration::from_micros(arg as u64));
                *last_result = if woken { WAIT_WOKEN } else { WAIT_TIMED_OUT };
            }
            // The guest sees the low 32 bits; unikernels read all 64 in memory.
            SignalOp::Generation => *last_result = (self.generation() & 0xffff_ffff) as u32,
            SignalOp::Fork => {
                let handler = lock(&self.fork);
                match handler.as_ref() {
                    Some(h) if h(vcpu, arg) => return SignalAction::Fork(arg),
                    _ => *last_result = FORK_FAILED,
                }
            }
            // A clone's work is done: end it like an exit with status 0,
            // without a guest shutdown.
            SignalOp::Done => return SignalAction::Exit(0),
            SignalOp::Snapshot => return SignalAction::Snapshot(arg),
        }
        SignalAction::Continue
    }

    /// Handles an `in` from the port.
    pub fn read(&self, vcpu: u8, data: &mut [u8], last_result: u32) {
        let bit = 1u64.checked_shl(u32::from(vcpu)).unwrap_or(0);
        let restored = bit != 0 && self.restored.fetch_and(!bit, Ordering::Relaxed) & bit != 0;
        let value = if restored { RESTORED } else { last_result };
        let bytes = value.to_le_bytes();
        for (i, b) in data.iter_mut().enumerate() {
            *b = bytes.get(i).copied().unwrap_or(0);
        }
    }

    /// Marks recorded so far, in arrival order.
    pub fn marks(&self) -> Vec<Mark> {
        lock(&self.marks).clone()
    }

    /// How many writes were ignored as malformed.
    pub fn ignored(&self) -> u64 {
        self.ignored.load(Ordering::Relaxed)
    }

    /// Logs a `SNAPSHOT` the VMM did not take up (rate limited like every
    /// log line: a guest may ask in a loop).
    pub fn snapshot_refused(&self, vcpu: u8, tag: u32, why: &str) {
        self.ignore(vcpu, format_args!("SNAPSHOT tag {tag}: {why}"));
    }

    fn ignore(&self, vcpu: u8, what: std::fmt::Arguments) {
        // A hostile guest may repeat this in a loop: the log's per-call-site
        // rate limit (crate::log_limit) keeps that off the host's disk.
        self.ignored.fetch_add(1, Ordering::Relaxed);
        tracing::warn!("signal port: ignored {what} from vCPU {vcpu}");
    }
}

#[cfg(test)]
mod tests {
    use spore_abi::signal::encode;

    use super::*;

    fn port() -> SignalPort {
        SignalPort::new(Arc::new(GuestWake::new().unwrap()))
    }

    #[test]
    fn exit_mark_and_garbage() {
        let p = port();
        let mut r = 0;
        let w = |v: u32| v.to_le_bytes();
        assert_eq!(
            p.write(0, &w(encode(SignalOp::Exit, 7)), &mut r),
            SignalAction::Exit(7)
        );
        assert_eq!(
            p.write(0, &w(encode(SignalOp::Mark, 3)), &mut r),
            SignalAction::Continue
        );
        assert_eq!(p.marks().len(), 1);
        assert_eq!(p.marks()[0].mark, 3);
        // Garbage: wrong width, unknown opcode.
        assert_eq!(p.write(0, &[1], &mut r), SignalAction::Continue);
        assert_eq!(p.write(0, &w(0xff00_0000), &mut r), SignalAction::Continue);
        assert_eq!(p.ignored(), 2);
        assert_eq!(
            p.write(0, &w(encode(SignalOp::Snapshot, 0x12_3456)), &mut r),
            SignalAction::Snapshot(0x12_3456)
        );
    }

    #[test]
    fn generation_is_read_back_and_wakes_a_wait() {
        let p = port();
        let mut r = 99;
        p.write(0, &encode(SignalOp::Generation, 0).to_le_bytes(), &mut r);
        assert_eq!(r, 0);
        p.set_generation(0x1_0000_0007);
        p.write(0, &encode(SignalOp::Generation, 5).to_le_bytes(), &mut r);
        assert_eq!(r, 7);
        p.write(0, &encode(SignalOp::Wait, 1_000_000).to_le_bytes(), &mut r);
        assert_eq!(r, WAIT_WOKEN);
    }

    #[test]
    fn fork_needs_a_handler_and_done_ends_the_vm() {
        let p = port();
        let mut r = 0;
        let w = |v: u32| v.to_le_bytes();
        assert_eq!(
            p.write(0, &w(encode(SignalOp::Fork, 3)), &mut r),
            SignalAction::Continue
        );
        assert_eq!(r, FORK_FAILED);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s2 = seen.clone();
        p.set_fork_handler(Box::new(move |vcpu, n| {
            lock(&s2).push((vcpu, n));
            n != 4
        }));
        assert_eq!(
            p.write(1, &w(encode(SignalOp::Fork, 3)), &mut r),
            SignalAction::Fork(3)
        );
        // A handler that refuses: the guest reads the failure at once.
        r = 0;
        assert_eq!(
            p.write(1, &w(encode(SignalOp::Fork, 4)), &mut r),
            SignalAction::Continue
        );
        assert_eq!(r, FORK_FAILED);
        assert_eq!(*lock(&seen), vec![(1, 3), (1, 4)]);
        assert_eq!(
            p.write(0, &w(encode(SignalOp::Done, 0)), &mut r),
            SignalAction::Exit(0)
        );
        // A pending result reaches only its vCPU, once.
        p.set_pending_result(1, 7);
        assert_eq!(p.take_pending_result(0), None);
        assert_eq!(p.take_pending_result(1), Some(7));
        assert_eq!(p.take_pending_result(1), None);
    }

    #[test]
    fn wait_reports_timeout_or_wake() {
        let p = port();
        let mut r = 99;
        p.write(0, &encode(SignalOp::Wait, 1000).to_le_bytes(), &mut r);
        assert_eq!(r, WAIT_TIMED_OUT);
        p.wake.notify();
        p.write(0, &encode(SignalOp::Wait, 1_000_000).to_le_bytes(), &mut r);
        assert_eq!(r, WAIT_WOKEN);
        let mut out = [0u8; 4];
        p.read(0, &mut out, r);
        assert_eq!(u32::from_le_bytes(out), WAIT_WOKEN);
    }

    #[test]
    fn first_read_after_restore_says_restored_once_per_vcpu() {
        let p = port();
        p.set_restored(2);
        let mut r = 0;
        // A WAIT in between does not hide it.
        p.write(1, &encode(SignalOp::Wait, 10).to_le_bytes(), &mut r);
        let mut out = [0u8; 4];
        p.read(1, &mut out, r);
        assert_eq!(u32::from_le_bytes(out), RESTORED);
        p.read(1, &mut out, r);
        assert_eq!(u32::from_le_bytes(out), WAIT_TIMED_OUT);
        p.read(0, &mut out, WAIT_WOKEN);
        assert_eq!(u32::from_le_bytes(out), RESTORED);
        p.read(0, &mut out, WAIT_WOKEN);
        assert_eq!(u32::from_le_bytes(out), WAIT_WOKEN);
        p.read(200, &mut out, 7);
        assert_eq!(u32::from_le_bytes(out), 7);
    }
}
