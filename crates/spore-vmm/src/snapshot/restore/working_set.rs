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
//! first) takes one of three ways, by where the data is now and the file's
//! version:
//! - the memory file's pages of the set are in the page cache (another VM
//!   of the snapshot ran, or a restore just did): RAM is the snapshot's
//!   layers mapped privately, as for a lazy restore, and a thread
//!   prefetches the runs into the mapping beside the guest
//!   ([`super::prefetch`]); the pages stay shared in the page cache, in
//!   huge pages where it holds them so, and the packed data is not read;
//! - otherwise, version 3: RAM is a fresh memfd served by the built-in
//!   userfaultfd handler, the guest starts at once, and a thread
//!   ([`BackgroundLoad`]) reads the packed data in one sequential pass,
//!   in the order the guest first touched it, verifies each chunk's CRC
//!   and copies its runs in with `UFFDIO_COPY` ahead of the guest. A page
//!   the guest reaches first is served by the handler from the snapshot
//!   (the same bytes); the copy then finds it there and moves on;
//! - otherwise, version 2 (one CRC over all the data, so nothing can be
//!   used before all of it is read): the packed data is read into a fresh
//!   memfd in one sequential pass, one iovec per run, its CRC verified,
//!   before the guest starts; the handler serves the rest.
//!
//! A file that is corrupt, truncated, for another memory size, names pages
//! outside guest memory or was recorded for another snapshot id (the
//! snapshot was re-created) is ignored with a warning and recorded anew. A
//! version-3 chunk that fails its CRC while the guest runs stops the
//! background load there (the handler serves the rest from the snapshot).
//!
//! File layout (little endian), version 3 (what spore writes):
//!
//! ```text
//! 0   magic "SPOREWS1"
//! 8   u32 version (3)         12  u32 page size (4096)
//! 16  u64 memory size         24  u64 run count N
//! 32  32 bytes snapshot id (ASCII, zero padded)
//! 64  u32 CRC-32 of the header (this field zero), the runs and the chunk CRCs
//! 68  u32 data pages P (the runs' total)
//! 72  N × (u64 first page, u64 page count), in first-touch order, disjoint
//! ..  M × u32 CRC-32 of each chunk of 256 data pages (M = ceil(P / 256))
//! ..  zero padding to a 4096-byte boundary
//! ..  4096 bytes per page of the runs, in list order (a hole's page as zeroes)
//! ```
//!
//! Version 2 had the runs sorted by address, no chunk table, and at 68 one
//! CRC-32 of all the data. Version 1 (spore before that) listed every page
//! in first-touch order (`N × u64`, bit 63 for an all-zero page) followed
//! by each data page's 4 KiB, with one CRC over everything. Both still
//! load; a version-1 file's page list is bounds-checked and its length
//! checked against the header, and it is always replayed the first way
//! (its data, and so its CRC, is not read).

use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::uffd::{Fill, PageSource, ServeLog, Uffd};
use crate::memory::GuestRam;

const MAGIC: &[u8; 8] = b"SPOREWS1";
/// The version spore writes.
const VERSION: u32 = 3;
const PAGE: u64 = 4096;
const HEADER: usize = 72;
/// Version 1: bit 63 of a page entry marks an all-zero page.
const V1_ZERO_BIT: u64 = 1 << 63;
const ID_LEN: usize = 32;
/// Version 3: data pages per CRC chunk (1 MiB): what the background load
/// reads, verifies and copies in at a time.
const CHUNK_PAGES: u64 = 256;

/// Version 3: where the packed data starts, for `count` runs of `pages`.
fn v3_data_offset(count: u64, pages: u64) -> u64 {
    data_offset(count * 16 + pages.div_ceil(CHUNK_PAGES) * 4)
}

/// Why a working set was not loaded.
#[derive(Debug, PartialEq, Eq)]
pub enum WsLoad {
    /// No file yet.
    Absent,
    /// Present but unusable (the reason).
    Ignored(String),
}

/// Where a set's packed data lies and how it is checked.
#[derive(Debug)]
enum Data {
    /// Version 1: the file's data is not used.
    None,
    /// Version 2: one CRC over all the data at `start`.
    Whole { file: File, start: u64, crc: u32 },
    /// Version 3: one CRC per chunk of [`CHUNK_PAGES`] pages.
    Chunked {
        file: File,
        start: u64,
        crcs: Vec<u32>,
    },
}

/// A loaded working set: disjoint runs of memory-file pages (first page,
/// page count), each inside guest memory, in the file's order (sorted for
/// version 2, first-touch order for versions 1 and 3).
#[derive(Debug)]
pub struct WorkingSet {
    pub runs: Vec<(u64, u64)>,
    /// The runs sorted by address, when `runs` are not (version 3).
    sorted: Option<Vec<(u64, u64)>>,
    /// The file's format version (1, 2 or 3).
    pub version: u32,
    data: Data,
}

impl WorkingSet {
    pub fn pages(&self) -> u64 {
        self.runs.iter().map(|r| r.1).sum()
    }

    /// The runs sorted by address.
    pub fn sorted_runs(&self) -> &[(u64, u64)] {
        self.sorted.as_deref().unwrap_or(&self.runs)
    }
}

struct Header {
    version: u32,
    mem_size: u64,
    count: u64,
    id: String,
}

fn encode_header(h: &Header, crc: u32, word68: u32) -> [u8; HEADER] {
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
    b[68..72].copy_from_slice(&word68.to_le_bytes());
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

/// Runs of pages in first-touch order: each page once (its first touch),
/// pages below `limit` only; a page right after the previous run's last
/// one extends it (a sequential access stays one run).
pub fn touch_runs(order: &[u64], limit: u64) -> Vec<(u64, u64)> {
    let mut seen = vec![0u64; limit.div_ceil(64) as usize];
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for &p in order {
        if p >= limit {
            continue;
        }
        let (word, bit) = ((p / 64) as usize, 1u64 << (p % 64));
        if seen[word] & bit != 0 {
            continue;
        }
        seen[word] |= bit;
        match runs.last_mut() {
            Some((s, n)) if *s + *n == p => *n += 1,
            _ => runs.push((p, 1)),
        }
    }
    runs
}

/// One bit per page of guest memory.
struct PageBitmap {
    words: Vec<u64>,
}

impl PageBitmap {
    fn new(pages: u64) -> Self {
        Self {
            words: vec![0; pages.div_ceil(64) as usize],
        }
    }

    /// Marks pages `[s, s + n)` (inside the bitmap); false if one of them
    /// was marked already.
    fn mark(&mut self, s: u64, n: u64) -> bool {
        let (mut p, end) = (s, s + n);
        while p < end {
            let (w, bit) = ((p / 64) as usize, p % 64);
            let take = (64 - bit).min(end - p);
            let mask = if take == 64 {
                u64::MAX
            } else {
                ((1u64 << take) - 1) << bit
            };
            if self.words[w] & mask != 0 {
                return false;
            }
            self.words[w] |= mask;
            p += take;
        }
        true
    }

    /// The marked pages as sorted runs (first page, count), touching
    /// ones merged.
    fn runs(&self) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        for (i, &w) in self.words.iter().enumerate() {
            let mut w = w;
            let base = i as u64 * 64;
            while w != 0 {
                let lo = u64::from(w.trailing_zeros());
                let len = u64::from((!(w >> lo)).trailing_zeros());
                let start = base + lo;
                match out.last_mut() {
                    Some((ps, pn)) if *ps + *pn == start => *pn += len,
                    _ => out.push((start, len)),
                }
                w = if lo + len >= 64 {
                    0
                } else {
                    w & !(((1u64 << len) - 1) << lo)
                };
            }
        }
        out
    }
}

fn encode_runs(runs: &[(u64, u64)]) -> Vec<u8> {
    runs.iter()
        .flat_map(|&(s, n)| s.to_le_bytes().into_iter().chain(n.to_le_bytes()))
        .collect()
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
    let runs = touch_runs(order, size / PAGE);
    let pages: u64 = runs.iter().map(|r| r.1).sum();
    let header = Header {
        version: VERSION,
        mem_size: size,
        count: runs.len() as u64,
        id: id.to_string(),
    };
    let list = encode_runs(&runs);
    let chunks = pages.div_ceil(CHUNK_PAGES) as usize;
    let total = u32::try_from(pages)
        .map_err(|_| std::io::Error::other("a working set of more than 2^32 pages"))?;
    let table_len = chunks * 4;

    crate::files::check_target(path)?;
    let tmp = crate::files::temp_path(path)?;
    crate::files::remove_stale_temps(crate::files::dir_of(path));
    let _ = std::fs::remove_file(&tmp);
    let result = (|| -> std::io::Result<()> {
        let file = crate::files::create_new_private(&tmp)?;
        let mut f = std::io::BufWriter::with_capacity(1 << 20, file);
        // Header and chunk-CRC placeholders, rewritten at the end.
        f.write_all(&[0u8; HEADER])?;
        f.write_all(&list)?;
        f.write_all(&vec![0u8; table_len])?;
        let pad =
            data_offset((list.len() + table_len) as u64) as usize - HEADER - list.len() - table_len;
        f.write_all(&vec![0u8; pad])?;
        let mut crcs: Vec<u32> = Vec::with_capacity(chunks);
        let mut chunk_crc = crc32fast::Hasher::new();
        let mut in_chunk = 0u64;
        let mut buf = vec![0u8; PAGE as usize];
        for &(first, n) in &runs {
            for p in first..first + n {
                if !source.read_page(p * PAGE, &mut buf)? {
                    buf.fill(0);
                }
                chunk_crc.update(&buf);
                f.write_all(&buf)?;
                in_chunk += 1;
                if in_chunk == CHUNK_PAGES {
                    crcs.push(std::mem::take(&mut chunk_crc).finalize());
                    in_chunk = 0;
                }
            }
        }
        if in_chunk > 0 {
            crcs.push(chunk_crc.finalize());
        }
        let table: Vec<u8> = crcs.iter().flat_map(|c| c.to_le_bytes()).collect();
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&encode_header(&header, 0, total));
        hasher.update(&list);
        hasher.update(&table);
        let f = f.into_inner().map_err(|e| e.into_error())?;
        f.write_all_at(&table, (HEADER + list.len()) as u64)?;
        f.write_all_at(&encode_header(&header, hasher.finalize(), total), 0)?;
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

/// A working-set file opened: read whole (versions 1 and 2), or with its
/// header checked and its first runs read (version 3), the rest left for
/// the thread that uses it ([`Pending::finish`]), so that a restore does
/// not wait for a list it does not need before the guest runs.
pub enum Opened {
    Ready(WorkingSet),
    Pending(Pending),
}

/// Runs of a version-3 file read up front: enough to sample the page cache.
const SAMPLE_RUNS: u64 = 64;

/// A version-3 file whose header was checked; see [`Opened`].
pub struct Pending {
    file: File,
    header: [u8; HEADER],
    len: u64,
    count: u64,
    mem_pages: u64,
    id: String,
    /// Its first runs that lie inside memory (not yet checked against the
    /// header's CRC: they only choose how to restore, never what data).
    sample: Vec<(u64, u64)>,
}

impl Pending {
    pub fn sample(&self) -> &[(u64, u64)] {
        &self.sample
    }

    /// The set's pages, as its header says (checked by [`Self::finish`]).
    pub fn pages(&self) -> u64 {
        u64::from(u32_at(&self.header, 68))
    }

    /// Reads and checks the rest: the run list, its CRC, the chunk table.
    pub fn finish(self) -> Result<WorkingSet, WsLoad> {
        read_rest(
            self.file,
            &self.header,
            self.len,
            self.count,
            self.mem_pages,
            &self.id,
        )
    }
}

/// Reads the working set for snapshot `id` of a VM with `mem_size` bytes
/// of memory (checked: every page lies inside it).
pub fn load(path: &Path, id: &str, mem_size: u64) -> Result<WorkingSet, WsLoad> {
    match open(path, id, mem_size)? {
        Opened::Ready(ws) => Ok(ws),
        Opened::Pending(p) => p.finish(),
    }
}

/// Opens the working set for snapshot `id` of a VM with `mem_size` bytes
/// of memory: its header checked, and all of it read unless version 3.
pub fn open(path: &Path, id: &str, mem_size: u64) -> Result<Opened, WsLoad> {
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
    if version == 3 {
        // The file's length follows from the header: a truncated file is
        // refused here, before the restore depends on it.
        let total = u64::from(u32_at(&hb, 68));
        if total > mem_pages || count > total {
            return Err(bad(format!(
                "it lists {count} runs of {total} pages, for {mem_pages} pages of memory"
            )));
        }
        let expected = v3_data_offset(count, total) + total * PAGE;
        if len != expected {
            return Err(bad(format!(
                "it has {len} bytes, its header says {expected} (truncated?)"
            )));
        }
        let n = count.min(SAMPLE_RUNS);
        let mut first = vec![0u8; (n * 16) as usize];
        f.read_exact_at(&mut first, HEADER as u64)
            .map_err(|_| bad("truncated page list".into()))?;
        let sample = first
            .chunks_exact(16)
            .map(|c| (u64_at(c, 0), u64_at(c, 8)))
            .filter(|&(s, n)| n > 0 && s.checked_add(n).is_some_and(|e| e <= mem_pages))
            .collect();
        return Ok(Opened::Pending(Pending {
            file: f,
            header: hb,
            len,
            count,
            mem_pages,
            id: file_id,
            sample,
        }));
    }
    read_rest(f, &hb, len, count, mem_pages, &file_id).map(Opened::Ready)
}

/// The rest of [`open`]: the run list and what follows it, checked.
fn read_rest(
    f: File,
    hb: &[u8; HEADER],
    len: u64,
    count: u64,
    mem_pages: u64,
    file_id: &str,
) -> Result<WorkingSet, WsLoad> {
    let bad = |s: String| WsLoad::Ignored(s);
    let version = u32_at(hb, 8);
    let file_mem = u64_at(hb, 16);
    let entry = if version == 1 { 8 } else { 16 };
    let mut list = vec![0u8; (count * entry) as usize];
    f.read_exact_at(&mut list, HEADER as u64)
        .map_err(|_| bad("truncated page list".into()))?;
    let outside = |p: u64| bad(format!("page {p} lies outside guest memory"));
    if version == 1 {
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
        return Ok(WorkingSet {
            runs: runs_of(pages),
            sorted: None,
            version,
            data: Data::None,
        });
    }
    let runs: Vec<(u64, u64)> = list
        .chunks_exact(16)
        .map(|c| (u64_at(c, 0), u64_at(c, 8)))
        .collect();
    let pages = runs.iter().fold(0u64, |a, r| a.saturating_add(r.1));
    // Version 3: the chunk-CRC table, as long as the header's total says
    // (which the runs must add up to).
    let total = u64::from(u32_at(hb, 68));
    let table = if version == 3 {
        let mut table = vec![0u8; (total.min(mem_pages).div_ceil(CHUNK_PAGES) * 4) as usize];
        f.read_exact_at(&mut table, HEADER as u64 + list.len() as u64)
            .map_err(|_| bad("truncated chunk table".into()))?;
        table
    } else {
        Vec::new()
    };
    // The header's CRC covers the runs and the table: check it first, so
    // a damaged file says so.
    let mut hasher = crc32fast::Hasher::new();
    let word68 = if version == 3 { total as u32 } else { 0 };
    hasher.update(&encode_header(
        &Header {
            version,
            mem_size: file_mem,
            count,
            id: file_id.to_string(),
        },
        0,
        word68,
    ));
    hasher.update(&list);
    hasher.update(&table);
    if hasher.finalize() != u32_at(hb, 64) {
        return Err(bad("checksum mismatch (corrupt file)".into()));
    }
    for (i, &(s, n)) in runs.iter().enumerate() {
        match s.checked_add(n) {
            Some(e) if n > 0 && e <= mem_pages => {}
            _ => return Err(outside(s.saturating_add(n.saturating_sub(1)))),
        }
        if version == 2 && i > 0 && runs[i - 1].0 + runs[i - 1].1 > s {
            return Err(bad("its runs are not sorted (corrupt file)".into()));
        }
    }
    if pages > mem_pages || (version == 3 && pages != total) {
        return Err(bad(format!(
            "its runs hold {pages} pages, its header says {} (corrupt file)",
            if version == 3 { total } else { mem_pages }
        )));
    }
    let sorted = if version == 3 {
        // Disjoint (first-touch order): each page marked once, in a bitmap
        // of memory's pages whose scan also gives the runs sorted.
        let mut map = PageBitmap::new(mem_pages);
        if runs.iter().any(|&(s, n)| !map.mark(s, n)) {
            return Err(bad("its runs overlap (corrupt file)".into()));
        }
        Some(map.runs())
    } else {
        None
    };
    let start = data_offset(list.len() as u64 + table.len() as u64);
    if len != start + pages * PAGE {
        return Err(bad(format!(
            "it has {len} bytes, its runs say {} (truncated?)",
            start + pages * PAGE
        )));
    }
    let data = if version == 3 {
        Data::Chunked {
            file: f,
            start,
            crcs: table.chunks_exact(4).map(|c| u32_at(c, 0)).collect(),
        }
    } else {
        Data::Whole {
            file: f,
            start,
            crc: u32_at(hb, 68),
        }
    };
    Ok(WorkingSet {
        runs,
        sorted,
        version,
        data,
    })
}

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
        let spans = super::spans(ram);
        // Host ranges in file order (a run crossing regions is split).
        let mut pieces: Vec<(u64, u64)> = Vec::with_capacity(self.runs.len());
        for &(s, n) in &self.runs {
            host_pieces(&spans, s * PAGE, (s + n) * PAGE, &mut pieces);
        }
        let iov: Vec<libc::iovec> = pieces
            .iter()
            .map(|&(a, l)| libc::iovec {
                iov_base: a as *mut libc::c_void,
                iov_len: l as usize,
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
        let spans: Vec<(u64, usize, usize)> = super::spans(ram)
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
        let mut buf = vec![0u8; (CHUNK_PAGES * PAGE) as usize];
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
            let data = &mut buf[..(pages * PAGE) as usize];
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
                    let src = &data[off as usize..(off + len) as usize];
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
        for o in (from..len).step_by(PAGE as usize) {
            let page = &src[o as usize..(o + PAGE) as usize];
            match self.uffd.copy(addr + o, page.as_ptr(), PAGE)? {
                Fill::Done => stats.copied += 1,
                _ => stats.present += 1,
            }
        }
        Ok(())
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
pub(crate) mod tests {
    use super::*;
    use crate::memory::layers::MemoryLayers;
    use crate::memory::GuestRam;
    use crate::snapshot::restore::uffd::regions_of;
    use vm_memory::{Bytes, GuestAddress};

    /// A version-1 file as spore wrote it before version 2: entries in
    /// first-touch order, then the data pages.
    pub(crate) fn v1_file(mem_size: u64, id: &str, entries: &[u64]) -> Vec<u8> {
        let h = Header {
            version: 1,
            mem_size,
            count: entries.len() as u64,
            id: id.into(),
        };
        let list: Vec<u8> = entries.iter().flat_map(|e| e.to_le_bytes()).collect();
        let mut b = encode_header(&h, 0, 0).to_vec();
        b.extend_from_slice(&list);
        let data = entries.iter().filter(|&&e| e & V1_ZERO_BIT == 0).count() as u64;
        b.resize((v1_data_offset(h.count) + data * PAGE) as usize, 7);
        b
    }

    /// A version-2 file as spore wrote it before version 3: sorted runs,
    /// then their pages (`fill(page)` each), one CRC over the data.
    pub(crate) fn v2_file(
        mem_size: u64,
        id: &str,
        runs: &[(u64, u64)],
        fill: impl Fn(u64) -> u8,
    ) -> Vec<u8> {
        let h = Header {
            version: 2,
            mem_size,
            count: runs.len() as u64,
            id: id.into(),
        };
        let list = encode_runs(runs);
        let data = packed(runs, fill);
        let mut c = crc32fast::Hasher::new();
        c.update(&encode_header(&h, 0, 0));
        c.update(&list);
        let mut b = encode_header(&h, c.finalize(), crc32fast::hash(&data)).to_vec();
        b.extend_from_slice(&list);
        b.resize(data_offset(list.len() as u64) as usize, 0);
        b.extend_from_slice(&data);
        b
    }

    /// The pages of `runs` in order, `fill(page)` each.
    fn packed(runs: &[(u64, u64)], fill: impl Fn(u64) -> u8) -> Vec<u8> {
        let mut data = Vec::new();
        for &(s, n) in runs {
            for p in s..s + n {
                data.extend_from_slice(&[fill(p); PAGE as usize]);
            }
        }
        data
    }

    /// A version-3 file as [`write`] makes it: `runs` in this order, then
    /// their pages (`fill(page)` each), a CRC per chunk.
    pub(crate) fn v3_file(
        mem_size: u64,
        id: &str,
        runs: &[(u64, u64)],
        fill: impl Fn(u64) -> u8,
    ) -> Vec<u8> {
        let total: u64 = runs.iter().map(|r| r.1).sum();
        let h = Header {
            version: 3,
            mem_size,
            count: runs.len() as u64,
            id: id.into(),
        };
        let list = encode_runs(runs);
        let data = packed(runs, fill);
        let table: Vec<u8> = data
            .chunks((CHUNK_PAGES * PAGE) as usize)
            .flat_map(|c| crc32fast::hash(c).to_le_bytes())
            .collect();
        let mut c = crc32fast::Hasher::new();
        c.update(&encode_header(&h, 0, total as u32));
        c.update(&list);
        c.update(&table);
        let mut b = encode_header(&h, c.finalize(), total as u32).to_vec();
        b.extend_from_slice(&list);
        b.extend_from_slice(&table);
        b.resize(v3_data_offset(h.count, total) as usize, 0);
        b.extend_from_slice(&data);
        b
    }

    #[test]
    fn a_hand_made_version_3_file_matches_what_write_makes() {
        let dir = std::env::temp_dir().join(format!("spore-ws3h-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let size = 8u64 << 20;
        let order: Vec<u64> = (0..300u64).map(|i| (i * 5) % 1500 + 1).collect();
        let mem = mem_file(&dir, size, &order);
        let source = source_of(&mem, size);
        let ws = dir.join("ws");
        write(&ws, "abc", &order, &source).unwrap();
        let runs = touch_runs(&order, size / PAGE);
        assert_eq!(
            std::fs::read(&ws).unwrap(),
            v3_file(size, "abc", &runs, |p| p as u8)
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The pages of memory file `mem` as [`write`] reads them (the layers
    /// only: the RAM that gave the layout is gone, so not for serving).
    fn source_of(mem: &Path, size: u64) -> PageSource {
        let ram = GuestRam::new(size).unwrap();
        PageSource::new(
            MemoryLayers::single(File::open(mem).unwrap(), size),
            regions_of(&ram),
        )
        .unwrap()
    }

    /// A snapshot memory file of `size` with `pages` holding their number.
    fn mem_file(dir: &Path, size: u64, pages: &[u64]) -> PathBuf {
        let mem = dir.join("mem");
        let f = File::create(&mem).unwrap();
        f.set_len(size).unwrap();
        for &p in pages {
            f.write_all_at(&[p as u8; 4096], p * PAGE).unwrap();
        }
        mem
    }

    #[test]
    fn a_page_bitmap_finds_overlaps_and_sorted_runs() {
        let mut m = PageBitmap::new(300);
        for (s, n) in [(70u64, 60u64), (5, 1), (0, 3), (3, 2), (199, 101), (64, 6)] {
            assert!(m.mark(s, n), "{s}+{n}");
        }
        assert_eq!(m.runs(), vec![(0, 6), (64, 66), (199, 101)]);
        assert!(!m.mark(129, 1));
        assert!(!m.mark(150, 60));
        let mut full = PageBitmap::new(128);
        assert!(full.mark(0, 128));
        assert_eq!(full.runs(), vec![(0, 128)]);
    }

    #[test]
    fn version_3_loads_beside_a_running_guest() {
        use crate::snapshot::restore::uffd::{register_ram, UffdServer};
        let dir = std::env::temp_dir().join(format!("spore-ws3-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let size = 8u64 << 20;
        // 600 data pages (more than two chunks), touched out of order.
        let touched: Vec<u64> = (0..600u64).map(|i| (i * 7) % 1800 + 10).collect();
        let mem = mem_file(&dir, size, &touched);
        let layers = || MemoryLayers::single(File::open(&mem).unwrap(), size);
        let ws = dir.join("ws");
        write(&ws, "abc", &touched, &source_of(&mem, size)).unwrap();

        for case in ["whole", "bad chunk", "bad list"] {
            let mut b = std::fs::read(&ws).unwrap();
            let data = b.len() - 600 * PAGE as usize;
            match case {
                // A data byte of the second chunk: the load stops there.
                "bad chunk" => b[data + 300 * PAGE as usize + 5] ^= 0x40,
                // A run's page count (past the sampled runs): the list
                // fails the header's CRC on the loading thread, nothing
                // is loaded, the handler serves every page.
                "bad list" => {
                    b[data + 300 * PAGE as usize + 5] ^= 0x40;
                    b[HEADER + 100 * 16 + 8] ^= 0x02;
                }
                _ => {}
            }
            std::fs::write(&ws, &b).unwrap();
            let corrupt = case != "whole";
            let Ok(Opened::Pending(set)) = open(&ws, "abc", size) else {
                panic!("a version-3 file opens pending");
            };
            assert_eq!(set.pages(), 600);
            assert_eq!(set.sample().len(), 64);
            let ram = GuestRam::new(size).unwrap();
            let uffd = register_ram(&ram).unwrap();
            let loader_uffd = uffd.try_clone().unwrap();
            let source = PageSource::new(layers(), regions_of(&ram)).unwrap();
            let mut server = UffdServer::start(uffd, Arc::new(source), false).unwrap();
            // The guest gets to two pages of the set before the load does.
            let m = ram.memory().clone();
            within(20, move || {
                assert_eq!(
                    m.read_obj::<u8>(GuestAddress(1200 * PAGE)).unwrap(),
                    1200u64 as u8
                );
                assert_eq!(m.read_obj::<u8>(GuestAddress(17 * PAGE)).unwrap(), 17);
            });
            let load = set.load_in_background(&ram, loader_uffd).unwrap();
            load.join();
            let faults_before = server.log().faults.load(Ordering::Relaxed);
            let m = ram.memory().clone();
            let touched2 = touched.clone();
            within(20, move || {
                for p in touched2.iter().chain(&[5, 1815, 2047]) {
                    let v: u8 = m.read_obj(GuestAddress(p * PAGE)).unwrap();
                    let want = if touched2.contains(p) { *p as u8 } else { 0 };
                    assert_eq!(v, want, "page {p}");
                }
            });
            let faults = server.log().faults.load(Ordering::Relaxed) - faults_before;
            if corrupt {
                // Pages past the bad chunk's start came through the handler.
                assert!(faults > 0);
            } else {
                // The whole set was there: only the 3 pages outside it fault
                // (fewer when a handler's run already covered them).
                assert!(faults <= 3, "{faults} faults");
            }
            assert!(server.stop().is_none());
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Runs `f` on a thread and fails the test if it does not end in time.
    fn within(secs: u64, f: impl FnOnce() + Send + 'static) {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            f();
            let _ = tx.send(());
        });
        rx.recv_timeout(Duration::from_secs(secs))
            .expect("guest memory accesses hung or failed");
    }

    #[test]
    fn round_trip_old_files_and_refusals() {
        let dir = std::env::temp_dir().join(format!("spore-ws-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let size = 8u64 << 20;
        let mem = mem_file(&dir, size, &[3, 4, 100, 1500]);
        let source = source_of(&mem, size);
        let ws = dir.join("ws");
        // First-touch order in and out; 100 twice is one page, a page past
        // the memory is dropped, 3 then 4 is one run.
        let (n, r) = write(&ws, "abc", &[100, 3, 4, 7, 1500, 100, 101, 5000], &source).unwrap();
        assert_eq!((n, r), (6, 5));
        let set = load(&ws, "abc", size).unwrap();
        assert_eq!(
            set.runs,
            vec![(100, 1), (3, 2), (7, 1), (1500, 1), (101, 1)]
        );
        assert_eq!(set.sorted_runs(), [(3, 2), (7, 1), (100, 2), (1500, 1)]);
        assert_eq!((set.pages(), set.version), (6, 3));
        // The runs and one chunk CRC, then each page's data from the snapshot.
        assert_eq!(std::fs::metadata(&ws).unwrap().len(), PAGE + 6 * PAGE);

        // Version 2 still loads, read in whole before the guest runs.
        let v2 = dir.join("v2");
        let runs2 = [(3u64, 2u64), (7, 1), (100, 2), (1500, 1)];
        let fill = |p: u64| if p == 7 || p == 101 { 0 } else { p as u8 };
        std::fs::write(&v2, v2_file(size, "abc", &runs2, fill)).unwrap();
        let set = load(&v2, "abc", size).unwrap();
        assert_eq!((&set.runs[..], set.version), (&runs2[..], 2));
        assert!(set.has_data());
        let ram = GuestRam::new(size).unwrap();
        set.read_into(&ram).unwrap();
        for p in [3u64, 4, 7, 100, 101, 1500] {
            let v: u8 = ram.memory().read_obj(GuestAddress(p * PAGE)).unwrap();
            assert_eq!(v, fill(p), "page {p}");
        }
        let resident = crate::memory::pages::data_ranges(ram.memfd(), size).unwrap();
        assert_eq!(resident.iter().map(|r| r.1 / PAGE).sum::<u64>(), 6);
        // Corrupt data: refused at read time, and nothing is left behind.
        let mut b = std::fs::read(&v2).unwrap();
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
        future[8] = 4;
        std::fs::write(&bad, &future).unwrap();
        assert!(
            matches!(load(&bad, "abc", size), Err(WsLoad::Ignored(w)) if w.contains("unsupported version 4"))
        );
        // A flipped chunk CRC fails the header's CRC.
        let mut table = bytes.clone();
        table[HEADER + 5 * 16] ^= 1;
        std::fs::write(&bad, &table).unwrap();
        assert!(
            matches!(load(&bad, "abc", size), Err(WsLoad::Ignored(w)) if w.contains("checksum"))
        );
        // Well-formed files (valid CRC) naming pages beyond guest memory,
        // or overflowing, or unsorted.
        // A file with a valid header CRC, of `version`, listing `runs`,
        // with zeroed data for them (3: and a zero chunk-CRC table).
        let signed = |version: u32, runs: &[(u64, u64)]| {
            let h = Header {
                version,
                mem_size: size,
                count: runs.len() as u64,
                id: "abc".into(),
            };
            let list = encode_runs(runs);
            let pages = runs.iter().fold(0u64, |a, r| a.saturating_add(r.1));
            let table = if version == 3 {
                vec![0u8; pages.min(size / PAGE).div_ceil(CHUNK_PAGES) as usize * 4]
            } else {
                Vec::new()
            };
            let word68 = if version == 3 {
                pages.min(u64::from(u32::MAX)) as u32
            } else {
                0
            };
            let mut c = crc32fast::Hasher::new();
            c.update(&encode_header(&h, 0, word68));
            c.update(&list);
            c.update(&table);
            let mut b = encode_header(&h, c.finalize(), word68).to_vec();
            b.extend_from_slice(&list);
            b.extend_from_slice(&table);
            b.resize(data_offset((list.len() + table.len()) as u64) as usize, 0);
            if pages < 4096 {
                b.resize(b.len() + (pages * PAGE) as usize, 0);
            }
            b
        };
        for version in [2, 3] {
            for runs in [
                vec![(2048u64, 1u64)],
                vec![(2040, 9)],
                vec![((1 << 62) + 5, 1)],
                vec![(5, u64::MAX)],
                vec![(3, 0)],
            ] {
                std::fs::write(&bad, signed(version, &runs)).unwrap();
                // Version 3 may already refuse its header's page total.
                assert!(
                    matches!(load(&bad, "abc", size), Err(WsLoad::Ignored(w))
                        if w.contains("outside guest memory") || (version == 3 && w.contains("pages, for"))),
                    "v{version} {runs:?}"
                );
            }
        }
        std::fs::write(&bad, signed(2, &[(10, 2), (11, 1)])).unwrap();
        assert!(
            matches!(load(&bad, "abc", size), Err(WsLoad::Ignored(w)) if w.contains("not sorted"))
        );
        // Version 3 keeps first-touch order, but its runs must not overlap.
        std::fs::write(&bad, signed(3, &[(20, 1), (10, 2)])).unwrap();
        assert_eq!(
            load(&bad, "abc", size).unwrap().runs,
            vec![(20, 1), (10, 2)]
        );
        std::fs::write(&bad, signed(3, &[(10, 2), (11, 1)])).unwrap();
        assert!(
            matches!(load(&bad, "abc", size), Err(WsLoad::Ignored(w)) if w.contains("overlap"))
        );
        std::fs::write(&bad, b"garbage").unwrap();
        assert!(matches!(load(&bad, "abc", size), Err(WsLoad::Ignored(_))));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
