//! Working-set prefetch: brings a recorded working set's pages into a
//! lazily mapped guest RAM, in sorted runs, on a thread of its own while
//! the guest already runs (as REAP and FaaSnap do).
//!
//! Safe to run beside the vCPUs: RAM is the snapshot's memory file mapped
//! privately, and `MADV_POPULATE_READ` / `MADV_WILLNEED` only read it. A
//! page the guest already wrote (its private copy) is left alone, and one
//! the guest reads first is simply faulted in by whichever thread gets
//! there first; the guest sees the same bytes either way. The thread holds
//! its own reference to the mappings, so RAM outlives it; it is stopped
//! (between runs) and joined when the restore session ends.
//!
//! Per run, one `madvise` over the run's host range. `SPORE_WS_PREFETCH`
//! picks how (a tuning knob for `spore bench snapshot`; the default is the
//! fastest measured here):
//! - `populate` (default): `MADV_POPULATE_READ` per run, in file order;
//! - `willneed`: `MADV_WILLNEED` over every run first (asynchronous reads
//!   the block layer can merge), then `MADV_POPULATE_READ` per run;
//! - `sync`: as `populate`, but before the guest runs (no thread);
//! - `none`: nothing (the restore is then a plain lazy one).
//!
//! `SPORE_WS_GAP=N` (pages, default 0) merges runs closer than N pages:
//! fewer, larger requests for a few pages read that were not recorded.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};

use crate::memory::GuestMemoryMmap;

const PAGE: u64 = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrefetchMethod {
    Populate,
    WillNeed,
    Sync,
    None,
}

impl PrefetchMethod {
    pub fn from_env() -> Self {
        match std::env::var("SPORE_WS_PREFETCH").as_deref() {
            Ok("willneed") => Self::WillNeed,
            Ok("sync") => Self::Sync,
            Ok("none") => Self::None,
            _ => Self::Populate,
        }
    }
}

fn gap_from_env() -> u64 {
    std::env::var("SPORE_WS_GAP")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// Merges runs separated by fewer than `gap` pages.
pub fn merge_gaps(runs: &[(u64, u64)], gap: u64) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(runs.len());
    for &(s, n) in runs {
        match out.last_mut() {
            Some((ps, pn)) if s.saturating_sub(*ps + *pn) < gap.max(1) => {
                *pn = (s + n).max(*ps + *pn) - *ps;
            }
            _ => out.push((s, n)),
        }
    }
    out
}

/// Host ranges (address, length) of memory-file page runs in `mem`
/// (regions back to back in the file); a run crossing regions is split.
fn host_ranges(mem: &GuestMemoryMmap, runs: &[(u64, u64)]) -> Vec<(usize, usize)> {
    let mut spans = Vec::new();
    let mut off = 0u64;
    for r in mem.iter() {
        spans.push((off, r.as_ptr() as usize, r.len()));
        off += r.len();
    }
    let mut out = Vec::with_capacity(runs.len());
    for &(s, n) in runs {
        let (lo, hi) = (s * PAGE, (s + n) * PAGE);
        for &(so, ptr, len) in &spans {
            let (a, b) = (lo.max(so), hi.min(so + len));
            if a < b {
                out.push((ptr + (a - so) as usize, (b - a) as usize));
            }
        }
    }
    out
}

/// The share (0 to 1) of up to `samples` pages, spread evenly over
/// `runs`, that the page cache holds for `mem` (a lazy mapping of the
/// layers): `mincore` on a file mapping reports the page cache.
pub fn resident_share(mem: &GuestMemoryMmap, runs: &[(u64, u64)], samples: u64) -> f64 {
    let total: u64 = runs.iter().map(|r| r.1).sum();
    if total == 0 || samples == 0 {
        return 1.0;
    }
    let step = total.div_ceil(samples).max(1);
    let mut picked = Vec::new();
    let mut seen = 0u64;
    for &(s, n) in runs {
        // Indexes k*step that fall inside this run.
        let mut k = seen.div_ceil(step) * step;
        while k < seen + n {
            picked.push((s + (k - seen), 1));
            k += step;
        }
        seen += n;
    }
    let ranges = host_ranges(mem, &picked);
    let mut hit = 0usize;
    for &(a, _) in &ranges {
        let mut v = 0u8;
        // SAFETY: one page of a live mapping of guest RAM; mincore writes
        // one byte to `v`.
        let r = unsafe { libc::mincore(a as *mut libc::c_void, PAGE as usize, &mut v) };
        hit += usize::from(r == 0 && v & 1 == 1);
    }
    hit as f64 / ranges.len().max(1) as f64
}

fn advise(addr: usize, len: usize, advice: libc::c_int) {
    // SAFETY: a range inside a live mapping of guest RAM (the caller holds
    // the regions); these advices only read the file into it.
    let r = unsafe { libc::madvise(addr as *mut libc::c_void, len, advice) };
    if r != 0 {
        tracing::debug!(
            "working-set prefetch: madvise {advice} at {addr:#x}+{len:#x}: {}",
            std::io::Error::last_os_error()
        );
    }
}

fn run(ranges: &[(usize, usize)], method: PrefetchMethod, stop: &AtomicBool) {
    if method == PrefetchMethod::WillNeed {
        for &(a, l) in ranges {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            advise(a, l, libc::MADV_WILLNEED);
        }
    }
    for &(a, l) in ranges {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        advise(a, l, libc::MADV_POPULATE_READ);
    }
}

/// A working-set prefetch in progress.
pub struct Prefetch {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Prefetch {
    /// Prefetches `runs` (memory-file pages) into `mem`, a lazy mapping of
    /// the snapshot's layers: in the background unless the method is
    /// `sync`. Returns the requests it makes (runs after merging).
    pub fn start(mem: &GuestMemoryMmap, runs: &[(u64, u64)]) -> (Self, u64) {
        let method = PrefetchMethod::from_env();
        let ranges = host_ranges(mem, &merge_gaps(runs, gap_from_env()));
        let n = ranges.len() as u64;
        let stop = Arc::new(AtomicBool::new(false));
        let mut me = Self {
            stop: stop.clone(),
            thread: None,
        };
        match method {
            PrefetchMethod::None => {}
            PrefetchMethod::Sync => run(&ranges, method, &stop),
            _ => {
                // The thread's own reference keeps the mappings alive.
                let mem = mem.clone();
                let spawned = crate::seccomp::spawn(
                    crate::seccomp::ThreadKind::Vmm,
                    "ws-prefetch".into(),
                    move || {
                        let t = Instant::now();
                        run(&ranges, method, &stop);
                        tracing::debug!(
                            "working-set prefetch: {} requests in {:?}",
                            ranges.len(),
                            t.elapsed()
                        );
                        drop(mem);
                    },
                );
                match spawned {
                    Ok(h) => me.thread = Some(h),
                    Err(e) => tracing::warn!(
                        "cannot start the working-set prefetch: {e}; pages fault in lazily"
                    ),
                }
            }
        }
        (me, n)
    }

    /// Stops the prefetch between two runs and waits for it.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.thread.take() {
            let _ = h.join();
        }
    }
}

impl Drop for Prefetch {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_merge_only_below_the_limit() {
        let runs = [(0, 2), (2, 1), (10, 1), (13, 2)];
        assert_eq!(merge_gaps(&runs, 0), vec![(0, 3), (10, 1), (13, 2)]);
        assert_eq!(merge_gaps(&runs, 3), vec![(0, 3), (10, 5)]);
        assert_eq!(merge_gaps(&runs, 7), vec![(0, 3), (10, 5)]);
        assert_eq!(merge_gaps(&runs, 8), vec![(0, 15)]);
    }
}
