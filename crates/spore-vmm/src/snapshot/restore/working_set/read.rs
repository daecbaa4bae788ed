//! Opening a working-set file: its header checked against the snapshot
//! and the VM's memory, its runs bounds-checked and its CRCs verified
//! before a restore uses any of it; a version-3 file's list is finished on
//! the thread that loads it ([`Pending::finish`]).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::format::{
    data_offset, encode_header, runs_of, u32_at, u64_at, v1_data_offset, v3_data_offset, Header,
    PageBitmap, CHUNK_PAGES, HEADER, MAGIC, PAGE, PAGE_FIELD, V1_ZERO_BIT, VERSION,
};

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
pub(super) enum Data {
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
    pub(super) sorted: Option<Vec<(u64, u64)>>,
    /// The file's format version (1, 2 or 3).
    pub version: u32,
    pub(super) data: Data,
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
    if !(1..=VERSION).contains(&version) || u32_at(&hb, 12) != PAGE_FIELD {
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
        let mut first = vec![0u8; crate::host_usize::from_u64(n * 16)];
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

/// A version-1 file's page list (`list`, `count` entries), bounds-checked,
/// and its length checked against it; its data is never used.
fn read_v1(list: &[u8], len: u64, count: u64, mem_pages: u64) -> Result<WorkingSet, WsLoad> {
    let mut pages = Vec::with_capacity(crate::host_usize::from_u64(count));
    let mut data = 0u64;
    for c in list.chunks_exact(8) {
        let e = u64_at(c, 0);
        let p = e & !V1_ZERO_BIT;
        if p >= mem_pages {
            return Err(WsLoad::Ignored(format!(
                "page {p} lies outside guest memory"
            )));
        }
        data += u64::from(e & V1_ZERO_BIT == 0);
        pages.push(p);
    }
    let expected = v1_data_offset(count) + data * PAGE;
    if len != expected {
        return Err(WsLoad::Ignored(format!(
            "it has {len} bytes, its header says {expected} (truncated?)"
        )));
    }
    Ok(WorkingSet {
        runs: runs_of(pages),
        sorted: None,
        version: 1,
        data: Data::None,
    })
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
    let mut list = vec![0u8; crate::host_usize::from_u64(count * entry)];
    f.read_exact_at(&mut list, HEADER as u64)
        .map_err(|_| bad("truncated page list".into()))?;
    let outside = |p: u64| bad(format!("page {p} lies outside guest memory"));
    if version == 1 {
        return read_v1(&list, len, count, mem_pages);
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
        let mut table =
            vec![0u8; crate::host_usize::from_u64(total.min(mem_pages).div_ceil(CHUNK_PAGES) * 4)];
        f.read_exact_at(&mut table, HEADER as u64 + list.len() as u64)
            .map_err(|_| bad("truncated chunk table".into()))?;
        table
    } else {
        Vec::new()
    };
    // The header's CRC covers the runs and the table: check it first, so
    // a damaged file says so.
    let mut hasher = crc32fast::Hasher::new();
    let word68 = if version == 3 { u32_at(hb, 68) } else { 0 };
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
