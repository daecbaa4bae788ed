//! The working-set file's layout: header, runs, chunk CRCs, and the page
//! arithmetic both its writer (`record.rs`) and its reader (`read.rs`) use.
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

pub(super) const MAGIC: &[u8; 8] = b"SPOREWS1";
/// The version spore writes.
pub(super) const VERSION: u32 = 3;
pub(super) const PAGE: u64 = 4096;
/// `PAGE` as the header's 32-bit page-size field.
#[allow(clippy::cast_possible_truncation, reason = "PAGE is 4096")]
pub(super) const PAGE_FIELD: u32 = PAGE as u32;
pub(super) const HEADER: usize = 72;
/// Version 1: bit 63 of a page entry marks an all-zero page.
pub(super) const V1_ZERO_BIT: u64 = 1 << 63;
pub(super) const ID_LEN: usize = 32;
/// Version 3: data pages per CRC chunk (1 MiB): what the background load
/// reads, verifies and copies in at a time.
pub(super) const CHUNK_PAGES: u64 = 256;

/// Version 3: where the packed data starts, for `count` runs of `pages`.
pub(super) fn v3_data_offset(count: u64, pages: u64) -> u64 {
    data_offset(count * 16 + pages.div_ceil(CHUNK_PAGES) * 4)
}

/// The header's fields (its CRC and word 68 are given when encoding).
pub(super) struct Header {
    pub(super) version: u32,
    pub(super) mem_size: u64,
    pub(super) count: u64,
    pub(super) id: String,
}

/// The header's bytes, with `crc` at 64 and `word68` at 68.
pub(super) fn encode_header(h: &Header, crc: u32, word68: u32) -> [u8; HEADER] {
    let mut b = [0u8; HEADER];
    b[0..8].copy_from_slice(MAGIC);
    b[8..12].copy_from_slice(&h.version.to_le_bytes());
    b[12..16].copy_from_slice(&PAGE_FIELD.to_le_bytes());
    b[16..24].copy_from_slice(&h.mem_size.to_le_bytes());
    b[24..32].copy_from_slice(&h.count.to_le_bytes());
    let id = h.id.as_bytes();
    let n = id.len().min(ID_LEN);
    b[32..32 + n].copy_from_slice(&id[..n]);
    b[64..68].copy_from_slice(&crc.to_le_bytes());
    b[68..72].copy_from_slice(&word68.to_le_bytes());
    b
}

/// The little-endian u64 at byte `at`.
pub(super) fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

/// The little-endian u32 at byte `at`.
pub(super) fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut x = [0u8; 4];
    x.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(x)
}

/// Where the packed page data starts after a list of `bytes`.
pub(super) fn data_offset(bytes: u64) -> u64 {
    (HEADER as u64 + bytes).div_ceil(PAGE) * PAGE
}

/// Version 1: where the packed page data started.
pub(super) fn v1_data_offset(count: u64) -> u64 {
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
    let mut seen = vec![0u64; crate::host_usize::from_u64(limit.div_ceil(64))];
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
pub(super) struct PageBitmap {
    words: Vec<u64>,
}

impl PageBitmap {
    pub(super) fn new(pages: u64) -> Self {
        Self {
            words: vec![0; crate::host_usize::from_u64(pages.div_ceil(64))],
        }
    }

    /// Marks pages `[s, s + n)` (inside the bitmap); false if one of them
    /// was marked already.
    pub(super) fn mark(&mut self, s: u64, n: u64) -> bool {
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
    pub(super) fn runs(&self) -> Vec<(u64, u64)> {
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

/// The run list's bytes: (first page, count) as two u64 each.
pub(super) fn encode_runs(runs: &[(u64, u64)]) -> Vec<u8> {
    runs.iter()
        .flat_map(|&(s, n)| s.to_le_bytes().into_iter().chain(n.to_le_bytes()))
        .collect()
}
