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
use spore_abi::signal::{decode, SignalOp, WAIT_TIMED_OUT, WAIT_WOKEN};

use crate::devices::bus::lock;
use crate::vm::wake::GuestWake;

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
    /// The guest asked for a snapshot with this tag; the vCPU loop hands it
    /// to the VMM (see `RunControl::request_guest_snapshot`).
    Snapshot(u32),
}

/// Per-VM signal port state.
pub struct SignalPort {
    wake: Arc<GuestWake>,
    marks: Mutex<Vec<Mark>>,
    ignored: AtomicU64,
}

/// Keeps a guest that floods `MARK` from growing VMM memory without bound.
const MAX_MARKS: usize = 4096;

impl SignalPort {
    pub fn new(wake: Arc<GuestWake>) -> Self {
        Self {
            wake,
            marks: Mutex::new(Vec::new()),
            ignored: AtomicU64::new(0),
        }
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
            SignalOp::Exit => return SignalAction::Exit(arg as u8),
            SignalOp::Mark => {
                let mut marks = lock(&self.marks);
                if marks.len() < MAX_MARKS {
                    marks.push(Mark {
                        mark: arg,
                        vcpu,
                        monotonic_ns: monotonic_ns(),
                    });
                }
                tracing::debug!(mark = arg, vcpu, "guest mark");
            }
            SignalOp::Wait => {
                let woken = self.wake.wait(Duration::from_micros(arg as u64));
                *last_result = if woken { WAIT_WOKEN } else { WAIT_TIMED_OUT };
            }
            SignalOp::Snapshot => return SignalAction::Snapshot(arg),
            SignalOp::Fork | SignalOp::Done => {
                self.ignore(vcpu, format_args!("{op:?} is not supported yet"));
            }
        }
        SignalAction::Continue
    }

    /// Handles an `in` from the port.
    pub fn read(&self, data: &mut [u8], last_result: u32) {
        let bytes = last_result.to_le_bytes();
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

    /// Logs a `SNAPSHOT` the VMM did not take up (rate-limited like
    /// malformed writes: a guest may ask in a loop).
    pub fn snapshot_refused(&self, vcpu: u8, tag: u32, why: &str) {
        self.ignore(vcpu, format_args!("SNAPSHOT tag {tag}: {why}"));
    }

    fn ignore(&self, vcpu: u8, what: std::fmt::Arguments) {
        // Log the first few only: a hostile guest must not flood the host log.
        if self.ignored.fetch_add(1, Ordering::Relaxed) < 8 {
            tracing::warn!("signal port: ignored {what} from vCPU {vcpu}");
        }
    }
}

/// Host CLOCK_MONOTONIC in nanoseconds (comparable across processes).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use spore_abi::signal::encode;

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
        // Garbage: wrong width, unknown opcode, reserved opcode.
        assert_eq!(p.write(0, &[1], &mut r), SignalAction::Continue);
        assert_eq!(p.write(0, &w(0xff00_0000), &mut r), SignalAction::Continue);
        assert_eq!(
            p.write(0, &w(encode(SignalOp::Fork, 1)), &mut r),
            SignalAction::Continue
        );
        assert_eq!(p.ignored(), 3);
        assert_eq!(
            p.write(0, &w(encode(SignalOp::Snapshot, 0x12_3456)), &mut r),
            SignalAction::Snapshot(0x12_3456)
        );
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
        p.read(&mut out, r);
        assert_eq!(u32::from_le_bytes(out), WAIT_WOKEN);
    }
}
