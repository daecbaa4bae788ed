//! Filling RAM from a working set's packed data: a version-2 file read in
//! one pass before the guest starts ([`WorkingSet::read_into`]), a
//! version-3 file a CRC-checked chunk at a time on a thread beside the
//! guest, copied in with `UFFDIO_COPY` ([`BackgroundLoad`]).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::format::{CHUNK_PAGES, PAGE};
use super::read::{Data, Pending, WorkingSet, WsLoad};
use crate::memory::GuestRam;
use crate::snapshot::restore::spans;
use crate::snapshot::restore::uffd::{Fill, Uffd};

/// Host ranges (address, length) of memory-file byte range `[lo, hi)` in
/// RAM laid out as `spans` (regions back to back in the file).
fn host_pieces(spans: &[(u64, *mut u8, usize)], lo: u64, hi: u64, out: &mut Vec<(u64, u64)>) {
    for &(so, ptr, len) in spans {
        let (a, b) = (lo.max(so), hi.min(so + len as u64));
        if a < b {
            out.push((ptr as u64 + (a - so), b - a));
        }
    }
}

impl WorkingSet {
    /// Whether the file holds the set's data (version 2 or 3).
    pub fn has_data(&self) -> bool {
        !matches!(self.data, Data::None)
    }

    /// Version 2: reads the packed data into `ram` (a fresh memfd RAM,
    /// before userfaultfd registration) in one sequential pass, one iovec
    /// per run, and verifies its CRC; on failure the pages are freed again.
    pub fn read_into(&self, ram: &GuestRam) -> Result<(), WsLoad> {
        let Data::Whole {
            file: f,
            start,
            crc,
        } = &self.data
        else {
            return Err(WsLoad::Ignored(
                "its data is not one block with one CRC (version 2)".into(),
            ));
        };
        let spans = spans(ram);
        // Host ranges in file order (a run crossing regions is split).
        let mut pieces: Vec<(u64, u64)> = Vec::with_capacity(self.runs.len());
        for &(s, n) in &self.runs {
            host_pieces(&spans, s * PAGE, (s + n) * PAGE, &mut pieces);
        }
        let iov: Vec<libc::iovec> = pieces
            .iter()
            .map(|&(a, l)| libc::iovec {
                iov_base: a as *mut libc::c_void,
                iov_len: crate::host_usize::from_u64(l),
            })
            .collect();
        let undo = |why: String| {
            self.punch(ram);
            WsLoad::Ignored(why)
        };
        let mut off = *start;
        let mut hasher = crc32fast::Hasher::new();
        let mut i = 0;
        let mut part = 0usize;
        while i < iov.len() {
            let mut batch: Vec<libc::iovec> = iov[i..(i + 1024).min(iov.len())].to_vec();
            // Resume a short read inside the first iovec.
            // SAFETY: part < iov_len: still inside that iovec's range.
            batch[0].iov_base = unsafe { batch[0].iov_base.cast::<u8>().add(part) }.cast();
            batch[0].iov_len -= part;
            #[allow(
                clippy::cast_possible_truncation,
                reason = "a batch holds at most 1024 iovecs"
            )]
            // SAFETY: every iovec is guest RAM owned by `ram` (nothing runs
            // in the guest yet, nothing else maps it); preadv writes only there.
            let n = unsafe {
                libc::preadv(
                    f.as_raw_fd(),
                    batch.as_ptr(),
                    batch.len() as libc::c_int,
                    off as libc::off_t,
                )
            };
            if n <= 0 {
                return Err(undo(format!(
                    "reading its data failed: {}",
                    if n == 0 {
                        "unexpected end of file".to_string()
                    } else {
                        std::io::Error::last_os_error().to_string()
                    }
                )));
            }
            off += n as u64;
            let mut left = n as usize;
            while left > 0 {
                let v = iov[i];
                let take = (v.iov_len - part).min(left);
                // SAFETY: bytes preadv just wrote.
                hasher.update(unsafe {
                    std::slice::from_raw_parts((v.iov_base as *const u8).add(part), take)
                });
                left -= take;
                part += take;
                if part == v.iov_len {
                    part = 0;
                    i += 1;
                }
            }
        }
        if hasher.finalize() != *crc {
            return Err(undo("checksum mismatch (corrupt file)".into()));
        }
        Ok(())
    }

    /// Frees the set's pages of `ram` after a failed load, so the handler
    /// serves them again.
    fn punch(&self, ram: &GuestRam) {
        for &(s, n) in &self.runs {
            // SAFETY: punching a hole in our memfd within its size.
            unsafe {
                libc::fallocate(
                    ram.memfd().as_raw_fd(),
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    (s * PAGE) as i64,
                    (n * PAGE) as i64,
                )
            };
        }
    }
}

impl Pending {
    /// Starts loading the set into `ram` (registered with `uffd`, whose
    /// handler serves whatever the guest reaches first) on a thread of its
    /// own: the rest of the file is read and checked there, then the
    /// packed data a chunk at a time. Fails only if the thread cannot
    /// start (the handler then serves everything).
    pub fn load_in_background(self, ram: &GuestRam, uffd: Uffd) -> std::io::Result<BackgroundLoad> {
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        // The thread's own reference keeps the mappings alive.
        let mem = ram.memory().clone();
        let spans: Vec<(u64, usize, usize)> = spans(ram)
            .into_iter()
            .map(|(o, p, l)| (o, p as usize, l))
            .collect();
        let thread = crate::seccomp::spawn(
            crate::seccomp::ThreadKind::Vmm,
            "ws-load".into(),
            move || {
                let t = Instant::now();
                let ws = match self.finish() {
                    Ok(ws) => ws,
                    Err(WsLoad::Ignored(why)) => {
                        tracing::warn!(
                            "working set not loaded: {why}; the snapshot serves every page"
                        );
                        return;
                    }
                    Err(WsLoad::Absent) => return,
                };
                let Data::Chunked { file, start, crcs } = &ws.data else {
                    return;
                };
                let spans: Vec<(u64, *mut u8, usize)> = spans
                    .into_iter()
                    .map(|(o, p, l)| (o, p as *mut u8, l))
                    .collect();
                let job = LoadJob {
                    file,
                    start: *start,
                    crcs,
                    runs: &ws.runs,
                    spans: &spans,
                    uffd: &uffd,
                    stop: &stop2,
                };
                match job.run() {
                    Ok(s) => tracing::debug!(
                        "working set loaded in {:?}: {} pages copied, {} already there",
                        t.elapsed(),
                        s.copied,
                        s.present
                    ),
                    Err(e) => tracing::warn!(
                        "working-set load stopped after {:?}: {e}; the snapshot serves \
                         the rest",
                        t.elapsed()
                    ),
                }
                drop(mem);
            },
        )?;
        Ok(BackgroundLoad {
            stop,
            thread: Some(thread),
        })
    }
}

/// A version-3 working set loading beside the guest.
pub struct BackgroundLoad {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl BackgroundLoad {
    /// Waits for the load to finish (tests).
    #[cfg(test)]
    pub fn join(mut self) {
        if let Some(h) = self.thread.take() {
            let _ = h.join();
        }
    }

    /// Stops the load between two chunks and waits for it.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.thread.take() {
            let _ = h.join();
        }
    }
}

impl Drop for BackgroundLoad {
    fn drop(&mut self) {
        self.stop();
    }
}

#[derive(Default)]
struct LoadStats {
    copied: u64,
    present: u64,
}

/// The background load's work: one chunk at a time, read, checked, copied.
struct LoadJob<'a> {
    file: &'a File,
    start: u64,
    crcs: &'a [u32],
    runs: &'a [(u64, u64)],
    spans: &'a [(u64, *mut u8, usize)],
    uffd: &'a Uffd,
    stop: &'a AtomicBool,
}

impl LoadJob<'_> {
    fn run(&self) -> Result<LoadStats, String> {
        let mut stats = LoadStats::default();
        let mut buf = vec![0u8; crate::host_usize::from_u64(CHUNK_PAGES * PAGE)];
        let (mut t_read, mut t_copy) = (Duration::ZERO, Duration::ZERO);
        // Position in the runs: run index and pages of it already done.
        let (mut ri, mut done) = (0usize, 0u64);
        let mut pieces: Vec<(u64, u64)> = Vec::new();
        for (k, &crc) in self.crcs.iter().enumerate() {
            if self.stop.load(Ordering::Relaxed) {
                return Ok(stats);
            }
            // Pages in this chunk: a full chunk, or what the runs have left.
            let mut want = CHUNK_PAGES;
            let mut plan: Vec<(u64, u64)> = Vec::new();
            while want > 0 && ri < self.runs.len() {
                let (s, n) = self.runs[ri];
                let take = (n - done).min(want);
                plan.push((s + done, take));
                want -= take;
                done += take;
                if done == n {
                    ri += 1;
                    done = 0;
                }
            }
            let pages: u64 = plan.iter().map(|p| p.1).sum();
            let data = &mut buf[..crate::host_usize::from_u64(pages * PAGE)];
            let at = self.start + k as u64 * CHUNK_PAGES * PAGE;
            let t = Instant::now();
            self.file
                .read_exact_at(data, at)
                .map_err(|e| format!("reading chunk {k}: {e}"))?;
            t_read += t.elapsed();
            let t = Instant::now();
            if crc32fast::hash(data) != crc {
                return Err(format!("chunk {k} fails its checksum (corrupt file)"));
            }
            let mut off = 0u64;
            for &(s, n) in &plan {
                pieces.clear();
                host_pieces(self.spans, s * PAGE, (s + n) * PAGE, &mut pieces);
                for &(addr, len) in &pieces {
                    let src = &data
                        [crate::host_usize::from_u64(off)..crate::host_usize::from_u64(off + len)];
                    self.copy(addr, src, &mut stats)
                        .map_err(|e| format!("copying into guest memory: {e}"))?;
                    off += len;
                }
            }
            t_copy += t.elapsed();
        }
        tracing::debug!("ws load: read {t_read:?}, check+copy {t_copy:?}");
        Ok(stats)
    }

    /// Copies a run in; where the guest got to some of its pages first
    /// (the handler served them), the rest page by page.
    fn copy(&self, addr: u64, src: &[u8], stats: &mut LoadStats) -> std::io::Result<()> {
        let len = src.len() as u64;
        let from = match self.uffd.copy(addr, src.as_ptr(), len)? {
            Fill::Done => {
                stats.copied += len / PAGE;
                return Ok(());
            }
            Fill::Partial(bytes) => {
                stats.copied += bytes / PAGE;
                bytes
            }
            Fill::Exists => 0,
        };
        for o in (from..len).step_by(crate::host_usize::from_u64(PAGE)) {
            let page = &src[crate::host_usize::from_u64(o)..crate::host_usize::from_u64(o + PAGE)];
            match self.uffd.copy(addr + o, page.as_ptr(), PAGE)? {
                Fill::Done => stats.copied += 1,
                _ => stats.present += 1,
            }
        }
        Ok(())
    }
}
