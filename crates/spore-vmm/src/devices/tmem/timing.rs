//! Optional per-operation timing of tmem calls: how long the VMM spends
//! handling each call on the vCPU thread (parse, validate, copy, pool), from
//! the port write to the status written back.
//!
//! Off unless the VM's `tmem.timing` is set (`spore run --tmem-timing`):
//! `spore bench tmem` subtracts it from the guest's own timing of the same
//! calls to split a call into VMM handling and exit + guest overhead. When
//! off, a call pays one `Option` check; when on, two clock reads, four
//! relaxed atomic updates and (for the first [`MAX_SAMPLES`] calls of an
//! operation) one uncontended lock to keep the sample for the median.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use serde::Serialize;
use spore_abi::tmem::op;

use crate::host::lock;

/// Samples kept per operation for the median (8 bytes each).
pub const MAX_SAMPLES: usize = 1 << 16;

/// Accumulated handling time of one operation (whole calls; a BATCH's
/// entries count under `batch`, not under their own operations).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct OpTiming {
    pub calls: u64,
    pub total_ns: u64,
    pub min_ns: u64,
    pub max_ns: u64,
    /// Median of the first [`MAX_SAMPLES`] calls.
    pub median_ns: u64,
}

/// `GET /tmem` → `timing`, when enabled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CallTiming {
    pub put: OpTiming,
    pub get: OpTiming,
    pub invalidate: OpTiming,
    pub flush: OpTiming,
    pub stats: OpTiming,
    pub batch: OpTiming,
}

#[derive(Default)]
struct OpTimer {
    calls: AtomicU64,
    total_ns: AtomicU64,
    /// Stored as `u64::MAX - min` so that the zero start value means "none".
    inv_min_ns: AtomicU64,
    max_ns: AtomicU64,
    samples: Mutex<Vec<u64>>,
}

impl OpTimer {
    fn record(&self, ns: u64) {
        {
            let mut s = lock(&self.samples);
            if s.len() < MAX_SAMPLES {
                s.push(ns);
            }
        }
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.total_ns.fetch_add(ns, Ordering::Relaxed);
        self.inv_min_ns.fetch_max(u64::MAX - ns, Ordering::Relaxed);
        self.max_ns.fetch_max(ns, Ordering::Relaxed);
    }

    fn read(&self) -> OpTiming {
        let calls = self.calls.load(Ordering::Relaxed);
        OpTiming {
            calls,
            total_ns: self.total_ns.load(Ordering::Relaxed),
            min_ns: if calls == 0 {
                0
            } else {
                u64::MAX - self.inv_min_ns.load(Ordering::Relaxed)
            },
            max_ns: self.max_ns.load(Ordering::Relaxed),
            median_ns: {
                let mut s = lock(&self.samples).clone();
                s.sort_unstable();
                s.get(s.len() / 2).copied().unwrap_or(0)
            },
        }
    }
}

/// Per-operation timers of one device; shared by its vCPUs.
#[derive(Default)]
pub struct CallTimer {
    ops: [OpTimer; 6],
}

impl CallTimer {
    /// Records a call of operation `op` (as the guest wrote it) that started
    /// at `start`. Unknown operations are not recorded.
    pub fn record(&self, op: u32, start: Instant) {
        let ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let idx = match op {
            op::PUT => 0,
            op::GET => 1,
            op::INVALIDATE => 2,
            op::FLUSH => 3,
            op::STATS => 4,
            op::BATCH => 5,
            _ => return,
        };
        self.ops[idx].record(ns);
    }

    pub fn read(&self) -> CallTiming {
        CallTiming {
            put: self.ops[0].read(),
            get: self.ops[1].read(),
            invalidate: self.ops[2].read(),
            flush: self.ops[3].read(),
            stats: self.ops[4].read(),
            batch: self.ops[5].read(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_per_operation() {
        let t = CallTimer::default();
        assert_eq!(t.read(), CallTiming::default());
        let start = Instant::now();
        t.record(op::PUT, start);
        t.record(op::PUT, start);
        t.record(op::BATCH, start);
        t.record(99, start);
        let r = t.read();
        assert_eq!((r.put.calls, r.batch.calls, r.get.calls), (2, 1, 0));
        assert!(r.put.min_ns <= r.put.max_ns && r.put.max_ns <= r.put.total_ns);
        assert!(r.put.min_ns <= r.put.median_ns && r.put.median_ns <= r.put.max_ns);
        assert_eq!(r.get, OpTiming::default());
    }
}
