//! Working sets (REAP): the pages a restored guest touched on its first
//! run, stored beside the snapshot as sorted runs of pages, so a later
//! restore prefetches them from the snapshot's memory file in a few large
//! requests while the guest already runs.
//!
//! Recording: the first `working_set` restore of a snapshot serves every
//! page through the built-in userfaultfd handler, which logs each page the
//! guest (or a device) touches for the first time. Recording ends when the
//! VM stops, or `record_for` after the guest started if that was given;
//! then the file is written under a temporary name, synced, and renamed
//! into place.
//!
//! Loading (the set's runs are bounds-checked against the memory size
//! first) takes one of two ways, by where the data is now:
//! - the memory file's pages of the set are in the page cache (another VM
//!   of the snapshot ran, or a restore just did): RAM is the snapshot's
//!   layers mapped privately, as for a lazy restore, and a thread
//!   prefetches the runs into the mapping beside the guest
//!   ([`super::prefetch`]); the pages stay shared in the page cache, in
//!   huge pages where it holds them so, and the packed data is not read;
//! - otherwise (REAP): RAM is a fresh memfd, the packed data is read in
//!   one sequential pass, one iovec per run, straight into it, its CRC is
//!   verified, and the built-in userfaultfd handler serves the rest.
//!
//! A file that is corrupt, truncated, for another memory size, names pages
//! outside guest memory or was recorded for another snapshot id (the
//! snapshot was re-created) is ignored with a warning and recorded anew.
//!
//! File layout (little endian), version 2:
//!
//! ```text
//! 0   magic "SPOREWS1"
//! 8   u32 version (2)         12  u32 page size (4096)
//! 16  u64 memory size         24  u64 run count N
//! 32  32 bytes snapshot id (ASCII, zero padded)
//! 64  u32 CRC-32 of the header (both CRC fields zero) and the runs
//! 68  u32 CRC-32 of the data
//! 72  N × (u64 first page, u64 page count), sorted, disjoint
//! ..  zero padding to a 4096-byte boundary
//! ..  4096 bytes per page of the runs, in order (a hole's page as zeroes)
//! ```
//!
//! Version 1 (spore before this layout) listed every page in first-touch
//! order (`N × u64`, bit 63 for an all-zero page) followed by each data
//! page's 4 KiB, with one CRC over everything. A version-1 file still
//! loads: its page list is bounds-checked and its length checked against
//! the header, and it is always replayed the first way (its data, and so
//! its CRC, is not read).

use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::uffd::{PageSource, ServeLog};
use crate::memory::GuestRam;

const MAGIC: &[u8; 8] = b"SPOREWS1";
const VERSION: u32 = 2;
const PAGE: u64 = 4096;
const HEADER: usize = 72;
/// Version 1: bit 63 of a page entry marks an all-zero page.
const V1_ZERO_BIT: u64 = 1 << 63;
const ID_LEN: usize = 32;

/// Why a working set was not loaded.
#[derive(Debug, PartialEq, Eq)]
pub enum WsLoad {
    /// No file yet.
    Absent,
    /// Present but unusable (the reason).
    Ignored(String),
}

/// A loaded working set: sorted, disjoint runs of memory-file pages
/// (first page, page count), each inside guest memory.
#[derive(Debug)]
pub struct WorkingSet {
    pub runs: Vec<(u64, u64)>,
    /// The file's format version (1 or 2).
    pub version: u32,
    /// Version 2: the file, where its packed data starts, and its CRC.
    data: Option<(File, u64, u32)>,
}

impl WorkingSet {
    pub fn pages(&self) -> u64 {
        self.runs.iter().map(|r| r.1).sum()
    }
}

struct Header {
    version: u32,
    mem_size: u64,
    count: u64,
    id: String,
}

fn encode_header(h: &Header, crc: u32) -> [u8; HEADER] {
    let mut b = [0u8; HEADER];
    b[0..8].copy_from_slice(MAGIC);
    b[8..12].copy_from_slice(&h.version.to_le_bytes());
    b[12..16].copy_from_slice(&(PAGE as u32).to_le_bytes());
    b[16..24].copy_from_slice(&h.mem_size.to_le_bytes());
    b[24..32].copy_from_slice(&h.count.to_le_bytes());
    let id = h.id.as_bytes();
    let n = id.len().min(ID_LEN);
    b[32..32 + n].copy_from_slice(&id[..n]);
    b[64..68].copy_from_slice(&crc.to_le_bytes());
    b
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut x = [0u8; 4];
    x.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(x)
}

/// Where the packed page data starts after a list of `bytes`.
fn data_offset(bytes: u64) -> u64 {
    (HEADER as u64 + bytes).div_ceil(PAGE) * PAGE
}

/// Version 1: where the packed page data started.
fn v1_data_offset(count: u64) -> u64 {
    data_offset(count * 8)
}

/// Sorts pages and merges them into disjoint runs (first page, count).
pub fn runs_of(mut pages: Vec<u64>) -> Vec<(u64, u64)> {
    pages.sort_unstable();
    pages.dedup();
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for p in pages {
        match runs.last_mut() {
            Some((s, n)) if *s + *n == p => *n += 1,
            _ => runs.push((p, 1)),
        }
    }
    runs
}

/// Writes a working set for `order` (page numbers, first-touch order),
/// with the snapshot's data for each page. Returns (pages, runs).
pub fn write(
    path: &Path,
    id: &str,
    order: &[u64],
    source: &PageSource,
) -> std::io::Result<(u64, u64)> {
    let size = source.layers().size();
    let runs = runs_of(order.iter().copied().filter(|&p| p < size / PAGE).collect());
    let pages = runs.iter().map(|r| r.1).sum();
    let header = Header {
        version: VERSION,
        mem_size: size,
        count: runs.len() as u64,
        id: id.to_string(),
    };
    let list: Vec<u8> = runs
        .iter()
        .flat_map(|&(s, n)| s.to_le_bytes().into_iter().chain(n.to_le_bytes()))
        .collect();
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&encode_header(&header, 0));
    hasher.update(&list);

    crate::files::check_target(path)?;
    let tmp = crate::files::temp_path(path)?;
    crate::files::remove_stale_temps(crate::files::dir_of(path));
    let _ = std::fs::remove_file(&tmp);
    let result = (|| -> std::io::Result<()> {
        let file = crate::files::create_new_private(&tmp)?;
        let mut f = std::io::BufWriter::with_capacity(1 << 20, file);
        // Header placeholder, rewritten with the CRCs at the end.
        f.write_all(&[0u8; HEADER])?;
        f.write_all(&list)?;
        let pad = data_offset(list.len() as u64) as usize - HEADER - list.len();
        f.write_all(&vec![0u8; pad])?;
        let mut data_crc = crc32fast::Hasher::new();
        let mut buf = vec![0u8; PAGE as usize];
        for &(first, n) in &runs {
            for p in first..first + n {
                if !source.read_page(p * PAGE, &mut buf)? {
                    buf.fill(0);
                }
                data_crc.update(&buf);
                f.write_all(&buf)?;
            }
        }
        let f = f.into_inner().map_err(|e| e.into_error())?;
        let mut h = encode_header(&header, hasher.finalize());
        h[68..72].copy_from_slice(&data_crc.finalize().to_le_bytes());
        f.write_all_at(&h, 0)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        if let Some(dir) = path.parent().and_then(|d| File::open(d).ok()) {
            let _ = dir.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map(|()| (pages, header.count))
}

/// Reads the working set for snapshot `id` of a VM with `mem_size` bytes
/// of memory (checked: every page lies inside it).
pub fn load(path: &Path, id: &str, mem_size: u64) -> Result<WorkingSet, WsLoad> {
    let f = match crate::files::open_regular(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(WsLoad::Absent),
        Err(e) => return Err(WsLoad::Ignored(format!("cannot open it: {e}"))),
    };
    let bad = |s: String| WsLoad::Ignored(s);
    let len = f.metadata().map_err(|e| bad(e.to_string()))?.len();
    let mut hb = [0u8; HEADER];
    f.read_exact_at(&mut hb, 0)
        .map_err(|_| bad("too short for a working-set header".into()))?;
    if &hb[0..8] != MAGIC {
        return Err(bad("not a spore working-set file".into()));
    }
    let version = u32_at(&hb, 8);
    if !(1..=VERSION).contains(&version) || u32_at(&hb, 12) != PAGE as u32 {
        return Err(bad(format!(
            "unsupported version {version} / page size {}",
            u32_at(&hb, 12)
        )));
    }
    let file_mem = u64_at(&hb, 16);
    let count = u64_at(&hb, 24);
    let file_id = String::from_utf8_lossy(&hb[32..64])
        .trim_end_matches('\0')
        .to_string();
    if file_id != id {
        return Err(bad(format!(
            "it was recorded for snapshot {file_id}, this is snapshot {id}"
        )));
    }
    if file_mem != mem_size {
        return Err(bad(format!(
            "it is for {file_mem} bytes of memory, the VM has {mem_size}"
        )));
    }
    let mem_pages = mem_size / PAGE;
    if count > mem_pages {
        return Err(bad(format!(
            "it lists {count} entries, more than the memory has pages"
        )));
    }
    let entry = if version == 1 { 8 } else { 16 };
    let mut list = vec![0u8; (count * entry) as usize];
    f.read_exact_at(&mut list, HEADER as u64)
        .map_err(|_| bad("truncated page list".into()))?;
    let outside = |p: u64| bad(format!("page {p} lies outside guest memory"));
    let (runs, data) = if version == 1 {
        let mut pages = Vec::with_capacity(count as usize);
        let mut data = 0u64;
        for c in list.chunks_exact(8) {
            let e = u64_at(c, 0);
            let p = e & !V1_ZERO_BIT;
            if p >= mem_pages {
                return Err(outside(p));
            }
            data += u64::from(e & V1_ZERO_BIT == 0);
            pages.push(p);
        }
        let expected = v1_data_offset(count) + data * PAGE;
        if len != expected {
            return Err(bad(format!(
                "it has {len} bytes, its header says {expected} (truncated?)"
            )));
        }
        (runs_of(pages), None)
    } else {
        let expected = data_offset(count * entry);
        if len < expected {
            return Err(bad(format!(
                "it has {len} bytes, its header says {expected} (truncated?)"
            )));
        }
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&encode_header(
            &Header {
                version,
                mem_size: file_mem,
                count,
                id: file_id.clone(),
            },
            0,
        ));
        hasher.update(&list);
        if hasher.finalize() != u32_at(&hb, 64) {
            return Err(bad("checksum mismatch (corrupt file)".into()));
        }
        let mut runs: Vec<(u64, u64)> = Vec::with_capacity(count as usize);
        for c in list.chunks_exact(16) {
            let (s, n) = (u64_at(c, 0), u64_at(c, 8));
            match s.checked_add(n) {
                Some(e) if n > 0 && e <= mem_pages => {}
                _ => return Err(outside(s.saturating_add(n.saturating_sub(1)))),
            }
            if runs.last().is_some_and(|&(ps, pn)| ps + pn > s) {
                return Err(bad("its runs are not sorted (corrupt file)".into()));
            }
            runs.push((s, n));
        }
        let pages: u64 = runs.iter().map(|r| r.1).sum();
        if pages > mem_pages || len != expected + pages * PAGE {
            return Err(bad(format!(
                "it has {len} bytes, its runs say {} (truncated?)",
                expected + pages.min(mem_pages) * PAGE
            )));
        }
        (runs, Some((f, expected, u32_at(&hb, 68))))
    };
    Ok(WorkingSet {
        runs,
        version,
        data,
    })
}

impl WorkingSet {
    /// Whether the file holds the set's data (version 2).
    pub fn has_data(&self) -> bool {
        self.data.is_some()
    }

    /// Reads the packed data into `ram` (a fresh memfd RAM, before
    /// userfaultfd registration) in one sequential pass, one iovec per
    /// run, and verifies its CRC; on failure the pages are freed again.
    pub fn read_into(&self, ram: &GuestRam) -> Result<(), WsLoad> {
        let Some((f, start, crc)) = &self.data else {
            return Err(WsLoad::Ignored("it holds no data (version 1)".into()));
        };
        let spans = super::spans(ram);
        // Host ranges in file order (a run crossing regions is split).
        let mut iov: Vec<libc::iovec> = Vec::with_capacity(self.runs.len());
        for &(s, n) in &self.runs {
            let (lo, hi) = (s * PAGE, (s + n) * PAGE);
            for &(so, ptr, len) in &spans {
                let (a, b) = (lo.max(so), hi.min(so + len as u64));
                if a < b {
                    iov.push(libc::iovec {
                        // SAFETY: a - so < len: inside the span's mapping.
                        iov_base: unsafe { ptr.add((a - so) as usize) } as *mut libc::c_void,
                        iov_len: (b - a) as usize,
                    });
                }
            }
        }
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
            batch[0].iov_base = unsafe { (batch[0].iov_base as *mut u8).add(part) } as *mut _;
            batch[0].iov_len -= part;
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

/// Records a working set while the built-in handler serves faults.
pub struct Recorder {
    path: PathBuf,
    id: String,
    log: Arc<ServeLog>,
    source: Arc<PageSource>,
    record_for: Option<Duration>,
    timer: Option<(mpsc::Sender<()>, JoinHandle<()>)>,
    /// The guest ran: a VM that never ran has no working set to keep.
    started: bool,
}

impl Recorder {
    pub fn new(
        path: PathBuf,
        id: String,
        log: Arc<ServeLog>,
        source: Arc<PageSource>,
        record_for: Option<Duration>,
    ) -> Self {
        Self {
            path,
            id,
            log,
            source,
            record_for,
            timer: None,
            started: false,
        }
    }

    /// Starts the `record_for` timer (when the guest starts running).
    pub fn start_timer(&mut self) {
        self.started = true;
        let Some(d) = self.record_for else { return };
        if self.timer.is_some() {
            return;
        }
        let (tx, rx) = mpsc::channel::<()>();
        let (path, id, log, source) = (
            self.path.clone(),
            self.id.clone(),
            self.log.clone(),
            self.source.clone(),
        );
        let spawned = crate::seccomp::spawn(
            crate::seccomp::ThreadKind::Vmm,
            "ws-record".into(),
            move || {
                if let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(d) {
                    end(&path, &id, &log, &source);
                }
            },
        );
        match spawned {
            Ok(h) => self.timer = Some((tx, h)),
            Err(e) => tracing::warn!(
                "cannot start the working-set timer: {e}; recording until the VM stops"
            ),
        }
    }

    /// Ends recording now (if the timer did not) and writes the file.
    pub fn finish(mut self) {
        if let Some((tx, h)) = self.timer.take() {
            let _ = tx.send(());
            let _ = h.join();
        }
        if self.started {
            end(&self.path, &self.id, &self.log, &self.source);
        } else {
            self.cancel();
        }
    }

    /// Ends recording without writing anything (the restore failed).
    pub fn cancel(self) {
        self.log.recording.store(false, Ordering::Relaxed);
        self.log
            .order
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
    }
}

/// Stops recording and writes the set, once (whoever takes the log).
fn end(path: &Path, id: &str, log: &ServeLog, source: &PageSource) {
    log.recording.store(false, Ordering::Relaxed);
    let order = log.order.lock().unwrap_or_else(|e| e.into_inner()).take();
    let Some(order) = order.filter(|o| !o.is_empty()) else {
        return;
    };
    match write(path, id, &order, source) {
        Ok((n, r)) => tracing::info!(
            "working set recorded: {n} pages in {r} runs in {}",
            path.display()
        ),
        Err(e) => tracing::warn!("cannot write the working set {}: {e}", path.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::layers::MemoryLayers;
    use crate::memory::GuestRam;
    use crate::snapshot::restore::uffd::regions_of;
    use vm_memory::{Bytes, GuestAddress};

    /// A version-1 file as spore wrote it before version 2: entries in
    /// first-touch order, then the data pages.
    fn v1_file(mem_size: u64, id: &str, entries: &[u64]) -> Vec<u8> {
        let h = Header {
            version: 1,
            mem_size,
            count: entries.len() as u64,
            id: id.into(),
        };
        let list: Vec<u8> = entries.iter().flat_map(|e| e.to_le_bytes()).collect();
        let mut b = encode_header(&h, 0).to_vec();
        b.extend_from_slice(&list);
        let data = entries.iter().filter(|&&e| e & V1_ZERO_BIT == 0).count() as u64;
        b.resize((v1_data_offset(h.count) + data * PAGE) as usize, 7);
        b
    }

    #[test]
    fn round_trip_old_files_and_refusals() {
        let dir = std::env::temp_dir().join(format!("spore-ws-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let size = 8u64 << 20;
        let mem = dir.join("mem");
        let f = File::create(&mem).unwrap();
        f.set_len(size).unwrap();
        for p in [3u64, 4, 100, 1500] {
            f.write_all_at(&[p as u8; 4096], p * PAGE).unwrap();
        }
        let ram0 = GuestRam::new(size).unwrap();
        let source = PageSource::new(
            MemoryLayers::single(File::open(&mem).unwrap(), size),
            regions_of(&ram0),
        )
        .unwrap();
        let ws = dir.join("ws");
        // First-touch order in, sorted runs out; 100 twice is one page,
        // a page past the memory is dropped.
        let (n, r) = write(&ws, "abc", &[100, 3, 7, 4, 1500, 100, 101, 5000], &source).unwrap();
        assert_eq!((n, r), (6, 4));
        let set = load(&ws, "abc", size).unwrap();
        assert_eq!(set.runs, vec![(3, 2), (7, 1), (100, 2), (1500, 1)]);
        assert_eq!((set.pages(), set.version), (6, 2));
        // The runs, then each page's data from the snapshot.
        assert_eq!(std::fs::metadata(&ws).unwrap().len(), PAGE + 6 * PAGE);
        let ram = GuestRam::new(size).unwrap();
        set.read_into(&ram).unwrap();
        for p in [3u64, 4, 7, 100, 101, 1500] {
            let v: u8 = ram.memory().read_obj(GuestAddress(p * PAGE)).unwrap();
            assert_eq!(v, if p == 7 || p == 101 { 0 } else { p as u8 }, "page {p}");
        }
        let resident = crate::memory::pages::data_ranges(ram.memfd(), size).unwrap();
        assert_eq!(resident.iter().map(|r| r.1 / PAGE).sum::<u64>(), 6);
        // Corrupt data: refused at read time, and nothing is left behind.
        let mut b = std::fs::read(&ws).unwrap();
        let n = b.len();
        b[n - 10] ^= 1;
        let flipped = dir.join("flipped");
        std::fs::write(&flipped, &b).unwrap();
        let set2 = load(&flipped, "abc", size).unwrap();
        let ram = GuestRam::new(size).unwrap();
        assert!(matches!(set2.read_into(&ram), Err(WsLoad::Ignored(w)) if w.contains("checksum")));
        assert!(crate::memory::pages::data_ranges(ram.memfd(), size)
            .unwrap()
            .is_empty());

        // A version-1 file still loads (its page list; data not read).
        let old = dir.join("old");
        std::fs::write(&old, v1_file(size, "abc", &[100, 3, 7 | V1_ZERO_BIT, 4])).unwrap();
        let set = load(&old, "abc", size).unwrap();
        assert_eq!(
            (&set.runs[..], set.version),
            (&[(3, 2), (7, 1), (100, 1)][..], 1)
        );
        assert!(!set.has_data());
        let mut cut = v1_file(size, "abc", &[100, 3]);
        cut.truncate(cut.len() - 100);
        std::fs::write(&old, &cut).unwrap();
        assert!(
            matches!(load(&old, "abc", size), Err(WsLoad::Ignored(w)) if w.contains("truncated"))
        );
        std::fs::write(&old, v1_file(size, "abc", &[3, 2048 | V1_ZERO_BIT])).unwrap();
        assert!(
            matches!(load(&old, "abc", size), Err(WsLoad::Ignored(w)) if w.contains("outside guest memory"))
        );

        // Another snapshot's set, another memory size, a missing one, a
        // flipped byte, a truncated one, a future version.
        assert!(
            matches!(load(&ws, "other", size), Err(WsLoad::Ignored(w)) if w.contains("recorded for snapshot abc"))
        );
        assert!(
            matches!(load(&ws, "abc", size * 2), Err(WsLoad::Ignored(w)) if w.contains("bytes of memory"))
        );
        assert!(matches!(
            load(&dir.join("none"), "abc", size),
            Err(WsLoad::Absent)
        ));
        let bytes = std::fs::read(&ws).unwrap();
        let bad = dir.join("bad");
        let mut flipped = bytes.clone();
        flipped[HEADER + 3] ^= 1;
        std::fs::write(&bad, &flipped).unwrap();
        assert!(
            matches!(load(&bad, "abc", size), Err(WsLoad::Ignored(w)) if w.contains("checksum"))
        );
        std::fs::write(&bad, &bytes[..bytes.len() - 4]).unwrap();
        assert!(
            matches!(load(&bad, "abc", size), Err(WsLoad::Ignored(w)) if w.contains("truncated"))
        );
        let mut future = bytes.clone();
        future[8] = 3;
        std::fs::write(&bad, &future).unwrap();
        assert!(
            matches!(load(&bad, "abc", size), Err(WsLoad::Ignored(w)) if w.contains("unsupported version 3"))
        );
        // Well-formed files (valid CRC) naming pages beyond guest memory,
        // or overflowing, or unsorted.
        let signed = |runs: &[(u64, u64)]| {
            let h = Header {
                version: VERSION,
                mem_size: size,
                count: runs.len() as u64,
                id: "abc".into(),
            };
            let list: Vec<u8> = runs
                .iter()
                .flat_map(|&(s, n)| s.to_le_bytes().into_iter().chain(n.to_le_bytes()))
                .collect();
            let mut c = crc32fast::Hasher::new();
            c.update(&encode_header(&h, 0));
            c.update(&list);
            let mut b = encode_header(&h, c.finalize()).to_vec();
            b.extend_from_slice(&list);
            b.resize(data_offset(list.len() as u64) as usize, 0);
            b
        };
        for runs in [
            vec![(2048u64, 1u64)],
            vec![(2040, 9)],
            vec![((1 << 62) + 5, 1)],
            vec![(5, u64::MAX)],
            vec![(3, 0)],
        ] {
            std::fs::write(&bad, signed(&runs)).unwrap();
            assert!(
                matches!(load(&bad, "abc", size), Err(WsLoad::Ignored(w)) if w.contains("outside guest memory")),
                "{runs:?}"
            );
        }
        std::fs::write(&bad, signed(&[(10, 2), (11, 1)])).unwrap();
        assert!(
            matches!(load(&bad, "abc", size), Err(WsLoad::Ignored(w)) if w.contains("not sorted"))
        );
        std::fs::write(&bad, b"garbage").unwrap();
        assert!(matches!(load(&bad, "abc", size), Err(WsLoad::Ignored(_))));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
