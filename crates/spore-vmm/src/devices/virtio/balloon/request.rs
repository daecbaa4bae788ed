//! What the balloon driver sends, parsed and validated in one place.
//!
//! Three kinds of buffers reach the device, all guest-controlled:
//!
//! - inflate / deflate: arrays of little-endian u32 page frame numbers, in
//!   4 KiB units whatever the guest's page size (virtio 1.2, §5.5.6);
//! - statistics: packed `{le16 tag; le64 val}` entries (§5.5.6.3);
//! - free page reports: each descriptor names a free range by its address
//!   and length (§5.5.6.4).
//!
//! Everything is turned into [`GuestRange`]s that lie wholly inside one guest
//! RAM region, or refused. A PFN in the MMIO hole, past the end of RAM, or a
//! report that straddles a region boundary never becomes a range, so nothing
//! a guest sends can make the host release memory it does not own.

use serde::Serialize;
use virtio_queue::desc::split::Descriptor;
use vm_memory::{Address, Bytes, GuestMemoryBackend, GuestMemoryRegion};

use crate::devices::virtio::GuestMemoryMmap;

/// The balloon's page size: PFNs are always in 4 KiB units.
pub const PAGE_SHIFT: u32 = 12;
pub const PAGE_SIZE: u64 = 1 << PAGE_SHIFT;
/// Most PFN bytes read from one chain (16384 PFNs, 64 MiB). Linux sends 256
/// PFNs per chain; the bound keeps a hostile chain's cost small.
pub const MAX_PFN_BYTES: u32 = 64 * 1024;
/// Most statistics bytes read from one chain (Linux sends 16 entries, 160 bytes).
pub const MAX_STATS_BYTES: u32 = 4096;
/// Size of one statistics entry on the wire.
pub const STAT_ENTRY_SIZE: usize = 10;

/// A page-aligned range of guest RAM inside a single memory region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GuestRange {
    pub addr: u64,
    pub len: u64,
}

/// The outcome of validating a buffer of PFNs.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct PfnBatch {
    /// Valid pages, sorted, deduplicated and coalesced into ranges.
    pub ranges: Vec<GuestRange>,
    /// Valid pages (after deduplication).
    pub pages: u64,
    /// PFNs refused: outside guest RAM (MMIO hole, past the end).
    pub refused: u64,
    /// Bytes ignored: beyond [`MAX_PFN_BYTES`] or a trailing partial PFN.
    pub ignored_bytes: u64,
}

/// Reads the device-readable bytes of a chain, at most `max` of them.
/// Returns the bytes and how many more the chain offered than were read.
/// A buffer outside guest memory ends the read.
pub fn read_readable(
    mem: &GuestMemoryMmap,
    descriptors: impl Iterator<Item = Descriptor>,
    max: u32,
) -> (Vec<u8>, u64) {
    let mut out = Vec::new();
    let skipped = read_readable_into(mem, descriptors, max, &mut out);
    (out, skipped)
}

/// [`read_readable`] into `out` (cleared first; its allocation is reused
/// from one request to the next). Returns the bytes skipped.
pub fn read_readable_into(
    mem: &GuestMemoryMmap,
    descriptors: impl Iterator<Item = Descriptor>,
    max: u32,
    out: &mut Vec<u8>,
) -> u64 {
    out.clear();
    let mut skipped = 0u64;
    for d in descriptors.filter(|d| !d.is_write_only()) {
        let room = max as usize - out.len();
        let take = (d.len() as usize).min(room);
        skipped += u64::from(d.len()) - take as u64;
        if take == 0 {
            continue;
        }
        let start = out.len();
        out.resize(start + take, 0);
        if let Err(e) = mem.read_slice(&mut out[start..], d.addr()) {
            tracing::debug!(
                "virtio-balloon: buffer at {:?} not in guest memory: {e}",
                d.addr()
            );
            out.truncate(start);
            break;
        }
    }
    skipped
}

/// Counts an array of little-endian u32 PFNs: (pages wholly in guest RAM,
/// PFNs refused). For a deflate request, which the host has nothing to do
/// for (a deflated page is backed again on the guest's next touch), so its
/// pages are only counted, not sorted or merged: a PFN listed twice counts
/// twice.
pub fn count_pfns(mem: &GuestMemoryMmap, bytes: &[u8]) -> (u64, u64) {
    let (mut pages, mut refused) = (0u64, 0u64);
    let mut last_region: Option<(usize, u64, u64)> = None;
    for c in bytes.chunks_exact(4) {
        let addr = u64::from(u32::from_le_bytes([c[0], c[1], c[2], c[3]])) << PAGE_SHIFT;
        let page_inside =
            |&(_, start, end): &(usize, u64, u64)| addr >= start && addr + PAGE_SIZE <= end;
        let found = last_region
            .filter(page_inside)
            .or_else(|| region_of(mem, addr).filter(page_inside));
        if found.is_some() {
            last_region = found;
            pages += 1;
        } else {
            refused += 1;
        }
    }
    (pages, refused)
}

/// The index and bounds `[start, end)` of the RAM region holding `addr`.
fn region_of(mem: &GuestMemoryMmap, addr: u64) -> Option<(usize, u64, u64)> {
    mem.iter().enumerate().find_map(|(i, r)| {
        let start = r.start_addr().raw_value();
        let end = start.checked_add(r.len())?;
        (start..end).contains(&addr).then_some((i, start, end))
    })
}

/// Validates an array of little-endian u32 PFNs: each page must lie wholly
/// in guest RAM. Valid pages are sorted and coalesced into ranges, never
/// across a region boundary, so the host can release each with one call.
///
/// The driver's answer waits for this (the guest sits halted meanwhile), so
/// the common batch stays linear: Linux hands pages over in allocation
/// order, runs going down or up, which needs no sort (only a reversal), and
/// consecutive pages nearly always share the region found for the last one.
pub fn parse_pfns(mem: &GuestMemoryMmap, bytes: &[u8]) -> PfnBatch {
    let mut batch = PfnBatch {
        ignored_bytes: (bytes.len() % 4) as u64,
        ..Default::default()
    };
    let mut pfns: Vec<u32> = bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    if !pfns.is_sorted() {
        if pfns.iter().rev().is_sorted() {
            pfns.reverse();
        } else {
            pfns.sort_unstable();
        }
    }
    pfns.dedup();
    // (region index, range) of the range being grown.
    let mut current: Option<(usize, GuestRange)> = None;
    // The region of the last valid page: (index, start, end).
    let mut last_region: Option<(usize, u64, u64)> = None;
    for pfn in pfns {
        let addr = u64::from(pfn) << PAGE_SHIFT;
        let page_inside =
            |&(_, start, end): &(usize, u64, u64)| addr >= start && addr + PAGE_SIZE <= end;
        let found = last_region
            .filter(page_inside)
            .or_else(|| region_of(mem, addr).filter(page_inside));
        let Some((region, _, _)) = found else {
            batch.refused += 1;
            continue;
        };
        last_region = found;
        batch.pages += 1;
        match &mut current {
            Some((r, range)) if *r == region && range.addr + range.len == addr => {
                range.len += PAGE_SIZE;
            }
            _ => {
                if let Some((_, done)) = current.take() {
                    batch.ranges.push(done);
                }
                current = Some((
                    region,
                    GuestRange {
                        addr,
                        len: PAGE_SIZE,
                    },
                ));
            }
        }
    }
    if let Some((_, done)) = current {
        batch.ranges.push(done);
    }
    batch
}

/// Why a free page report descriptor was refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReportError {
    #[error("range {addr:#x}+{len:#x} is empty or not page-aligned")]
    Unaligned { addr: u64, len: u64 },
    #[error("range {addr:#x}+{len:#x} is not wholly inside one guest RAM region")]
    OutsideRam { addr: u64, len: u64 },
}

/// Validates one reported free range (a descriptor of the reporting queue).
pub fn parse_report(mem: &GuestMemoryMmap, d: &Descriptor) -> Result<GuestRange, ReportError> {
    let addr = d.addr().raw_value();
    let len = u64::from(d.len());
    if len == 0 || !addr.is_multiple_of(PAGE_SIZE) || !len.is_multiple_of(PAGE_SIZE) {
        return Err(ReportError::Unaligned { addr, len });
    }
    let inside = region_of(mem, addr)
        .zip(addr.checked_add(len))
        .is_some_and(|((_, _, end), last)| last <= end);
    if !inside {
        return Err(ReportError::OutsideRam { addr, len });
    }
    Ok(GuestRange { addr, len })
}

/// Memory statistics as the guest last reported them (virtio 1.2, §5.5.6.3),
/// under Firecracker's field names. A tag the guest did not send stays unset.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct GuestStats {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub swap_in: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub swap_out: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub major_faults: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub minor_faults: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub free_memory: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total_memory: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub available_memory: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk_caches: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hugetlb_allocations: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hugetlb_failures: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oom_kill: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alloc_stall: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub async_scan: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub direct_scan: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub async_reclaim: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub direct_reclaim: Option<u64>,
}

/// A parsed statistics buffer.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct StatsBatch {
    pub stats: GuestStats,
    /// Entries with a tag this device does not know (skipped).
    pub unknown_tags: u32,
    /// Bytes of a trailing partial entry (skipped).
    pub truncated_bytes: u32,
}

/// Parses packed `{le16 tag; le64 val}` entries. Unknown tags and a trailing
/// partial entry are skipped; a repeated tag keeps its last value.
pub fn parse_stats(bytes: &[u8]) -> StatsBatch {
    #[allow(
        clippy::cast_possible_truncation,
        reason = "a remainder below STAT_ENTRY_SIZE (10)"
    )]
    let mut batch = StatsBatch {
        truncated_bytes: (bytes.len() % STAT_ENTRY_SIZE) as u32,
        ..Default::default()
    };
    for entry in bytes.chunks_exact(STAT_ENTRY_SIZE) {
        let tag = u16::from_le_bytes([entry[0], entry[1]]);
        let mut v = [0u8; 8];
        v.copy_from_slice(&entry[2..]);
        let val = Some(u64::from_le_bytes(v));
        let s = &mut batch.stats;
        let slot = match tag {
            0 => &mut s.swap_in,
            1 => &mut s.swap_out,
            2 => &mut s.major_faults,
            3 => &mut s.minor_faults,
            4 => &mut s.free_memory,
            5 => &mut s.total_memory,
            6 => &mut s.available_memory,
            7 => &mut s.disk_caches,
            8 => &mut s.hugetlb_allocations,
            9 => &mut s.hugetlb_failures,
            10 => &mut s.oom_kill,
            11 => &mut s.alloc_stall,
            12 => &mut s.async_scan,
            13 => &mut s.direct_scan,
            14 => &mut s.async_reclaim,
            15 => &mut s.direct_reclaim,
            _ => {
                batch.unknown_tags += 1;
                continue;
            }
        };
        *slot = val;
    }
    batch
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(tag: u16, val: u64) -> Vec<u8> {
        let mut v = tag.to_le_bytes().to_vec();
        v.extend_from_slice(&val.to_le_bytes());
        v
    }

    #[test]
    fn stats_known_unknown_and_truncated() {
        let mut buf = stat(4, 100 << 20);
        buf.extend(stat(5, 512 << 20));
        buf.extend(stat(999, 7));
        buf.extend(stat(6, 300 << 20));
        buf.extend(stat(4, 101 << 20)); // repeated: last wins
        buf.extend(&stat(0, 1)[..6]); // truncated entry
        let b = parse_stats(&buf);
        assert_eq!(b.stats.free_memory, Some(101 << 20));
        assert_eq!(b.stats.total_memory, Some(512 << 20));
        assert_eq!(b.stats.available_memory, Some(300 << 20));
        assert_eq!(b.stats.swap_in, None, "the truncated entry is not taken");
        assert_eq!(b.unknown_tags, 1);
        assert_eq!(b.truncated_bytes, 6);
        let json = serde_json::to_value(&b.stats).unwrap();
        assert_eq!(json.as_object().unwrap().len(), 3, "{json}");
        assert_eq!(json["free_memory"], 101u64 << 20);
    }

    #[test]
    fn stats_every_tag_and_empty() {
        let buf: Vec<u8> = (0..16u16).flat_map(|t| stat(t, u64::from(t) + 1)).collect();
        let s = parse_stats(&buf).stats;
        assert_eq!(s.swap_in, Some(1));
        assert_eq!(s.hugetlb_failures, Some(10));
        assert_eq!(s.direct_reclaim, Some(16));
        assert_eq!(parse_stats(&[]), StatsBatch::default());
        assert_eq!(parse_stats(&[1, 2, 3]).truncated_bytes, 3);
    }
}
