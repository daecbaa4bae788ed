//! Working-set prefetch: brings a recorded working set's pages into a
//! lazily mapped guest RAM, in sorted runs, on a thread of its own while
//! the guest already runs (as REAP and FaaSnap do). The thread waits for
//! the guest to start, so a restore is as quick as a lazy one.
//!
//! Safe to run beside the vCPUs: RAM is the snapshot's memory file mapped
//! privately, and `MADV_POPULATE_READ` / `MADV_WILLNEED` only read it. A
//! page the guest already wrote (its private copy) is left alone, and one
//! the guest reads first is simply faulted in by whichever thread gets
//! there first; the guest sees the same bytes either way. The thread holds
//! its own reference to the mappings, so RAM outlives it; it is stopped
//! (between runs) and joined when the restore session ends.
//!
//! Per run, one `madvise` per 8 MiB of the run's host range. `SPORE_WS_PREFETCH`
//! picks how (a tuning knob for `spore bench snapshot`; the default is the
//! fastest measured here):
//! - `populate` (default): `MADV_POPULATE_READ` per run, in file order;
//! - `willneed`: `MADV_WILLNEED` over every run first (asynchronous reads
//!   the block layer can merge), then `MADV_POPULATE_READ` per run;
//! - `sync`: as `populate`, but before the guest runs (no thread);
//! - `none`: nothing (the restore is then a plain lazy one).
//!
//! Runs are widened to aligned blocks of `SPORE_WS_ALIGN` pages (a power
//! of two, default 512: 2 MiB) and merged: where the page cache holds the
//! file in 2 MiB folios, one request maps a whole huge page (the guest
//! then takes one fault per 2 MiB, not per 4 KiB page), and there are far
//! fewer requests than pages when the set is scattered. This path runs
//! only when the set's pages are already cached (or for a version-1 set),
//! so the widening costs page-table entries, not reads.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Instant;

use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};

use crate::host_usize;
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

/// Pages per prefetch block (see the module doc).
const ALIGN: u64 = 512;

fn align_from_env() -> u64 {
    std::env::var("SPORE_WS_ALIGN")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .filter(|n| n.is_power_of_two())
        .unwrap_or(ALIGN)
}

/// Widens sorted runs to whole aligned blocks of `align` pages (a power
/// of two) and merges the ones that touch or overlap.
pub fn align_runs(runs: &[(u64, u64)], align: u64) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(runs.len());
    for &(s, n) in runs {
        let lo = s & !(align - 1);
        let hi = (s + n).div_ceil(align) * align;
        match out.last_mut() {
            Some((ps, pn)) if lo <= *ps + *pn => *pn = hi.max(*ps + *pn) - *ps,
            _ => out.push((lo, hi - lo)),
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
                out.push((
                    ptr + host_usize::from_u64(a - so),
                    host_usize::from_u64(b - a),
                ));
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
        let r =
            unsafe { libc::mincore(a as *mut libc::c_void, host_usize::from_u64(PAGE), &mut v) };
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
        // In pieces: a populate holds the process's mmap lock for reading,
        // and the restore still maps and unmaps (vCPUs, buffers) beside it.
        let mut done = 0;
        while done < l {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            let n = (l - done).min(PIECE);
            advise(a + done, n, libc::MADV_POPULATE_READ);
            done += n;
        }
    }
}

/// Bytes per populate request at most.
const PIECE: usize = 8 << 20;

/// Reads a set's runs (sorted), or says why it cannot.
pub type ReadRuns = Box<dyn FnOnce() -> Result<Vec<(u64, u64)>, String> + Send>;

/// The runs to prefetch: known now, or read by the prefetch thread itself
/// (a version-3 set's list, read once the guest runs).
pub enum Runs {
    Now(Vec<(u64, u64)>),
    Later(ReadRuns),
}

impl Runs {
    fn resolve(self) -> Result<Vec<(u64, u64)>, String> {
        match self {
            Runs::Now(r) => Ok(r),
            Runs::Later(f) => f(),
        }
    }
}

/// A working-set prefetch: a thread that waits for the guest to start
/// ([`Prefetch::release`]), so that it does not slow the restore down
/// (it would hold the mmap lock and a CPU), then brings the runs in.
pub struct Prefetch {
    stop: Arc<AtomicBool>,
    go: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Prefetch {
    /// Prefetches `runs` (memory-file pages, sorted) into `mem`, a lazy
    /// mapping of the snapshot's layers: in the background once released,
    /// or now if the method is `sync`.
    pub fn start(mem: &GuestMemoryMmap, runs: Runs) -> Self {
        let method = PrefetchMethod::from_env();
        let stop = Arc::new(AtomicBool::new(false));
        let mut me = Self {
            stop: stop.clone(),
            go: None,
            thread: None,
        };
        let align = align_from_env();
        match method {
            PrefetchMethod::None => {}
            PrefetchMethod::Sync => match runs.resolve() {
                Ok(r) => run(&host_ranges(mem, &align_runs(&r, align)), method, &stop),
                Err(e) => tracing::warn!("working set not prefetched: {e}"),
            },
            _ => {
                let (tx, rx) = mpsc::channel::<()>();
                // The thread's own reference keeps the mappings alive.
                let mem = mem.clone();
                let spawned = crate::seccomp::spawn(
                    crate::seccomp::ThreadKind::Vmm,
                    "ws-prefetch".into(),
                    move || {
                        // Released, or dropped (the VM went away unstarted).
                        if rx.recv().is_err() || stop.load(Ordering::Relaxed) {
                            return;
                        }
                        let t = Instant::now();
                        let runs = match runs.resolve() {
                            Ok(r) => r,
                            Err(e) => {
                                tracing::warn!("working set not prefetched: {e}");
                                return;
                            }
                        };
                        // host_ranges cuts the widened runs to guest memory.
                        let ranges = host_ranges(&mem, &align_runs(&runs, align));
                        run(&ranges, method, &stop);
                        tracing::debug!(
                            "working-set prefetch: {} runs, {} requests in {:?}",
                            runs.len(),
                            ranges.len(),
                            t.elapsed()
                        );
                        drop(mem);
                    },
                );
                match spawned {
                    Ok(h) => {
                        me.thread = Some(h);
                        me.go = Some(tx);
                    }
                    Err(e) => tracing::warn!(
                        "cannot start the working-set prefetch: {e}; pages fault in lazily"
                    ),
                }
            }
        }
        me
    }

    /// Lets the prefetch run (the guest started).
    pub fn release(&mut self) {
        if let Some(go) = self.go.take() {
            let _ = go.send(());
        }
    }

    /// Stops the prefetch between two requests and waits for it.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.go.take();
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
    fn runs_widen_to_blocks_and_merge() {
        let runs = [(0, 2), (2, 1), (10, 1), (13, 2), (40, 1)];
        assert_eq!(
            align_runs(&runs, 1),
            vec![(0, 3), (10, 1), (13, 2), (40, 1)]
        );
        assert_eq!(align_runs(&runs, 4), vec![(0, 4), (8, 8), (40, 4)]);
        assert_eq!(align_runs(&runs, 16), vec![(0, 16), (32, 16)]);
        assert_eq!(align_runs(&runs, 64), vec![(0, 64)]);
    }
}
