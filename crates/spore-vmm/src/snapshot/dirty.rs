//! Which guest pages changed since the last snapshot, for diff snapshots.
//!
//! Two writers change guest memory: the guest itself (vCPUs, through KVM's
//! page tables; KVM logs these in a per-slot dirty bitmap when the slot has
//! `KVM_MEM_LOG_DIRTY_PAGES`) and the VMM (virtio devices filling guest
//! buffers, the balloon discarding pages; these go through vm-memory, whose
//! per-region [`DirtyBitmap`](crate::devices::virtio::DirtyBitmap) records
//! them). KVM never sees the VMM's writes, so a diff built from KVM's log
//! alone would miss every buffer a device filled. [`collect`] reads and
//! clears both and ORs them together.
//!
//! Both sources are cleared when read. A snapshot that then fails must not
//! lose what it collected, or the next diff would silently miss pages: the
//! caller keeps a [`DirtyPages`] accumulator, merges every collection into
//! it and clears it only once a snapshot is safely on disk.
//!
//! The virtio-mem hotplug region is tracked beside RAM: its pages written
//! (KVM's log of each of its slots, and the VMM's bitmap) and the ranges
//! its device released since (unplugged blocks), which the device reads and
//! clears ([`crate::memory::hotplug::HotplugMemory::take_dirty`]).

use kvm_ioctls::VmFd;
use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};

use crate::host_usize;
use crate::memory::{pages, DirtyBitmap, GuestRam, GuestRegionMmap};

pub const PAGE: u64 = 4096;

/// A dirty bitmap per RAM region (region `i` is KVM slot `i` and lies at
/// file offset `sum of the lengths of regions before it` in a memory file).
/// Bit `j` of a region's bitmap is its page `j` (word `j / 64`, bit `j % 64`:
/// KVM's layout, and vm-memory's).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DirtyPages {
    regions: Vec<Vec<u64>>,
    /// The hotplug region's pages written (bit `i` = its page `i`).
    hotplug: Vec<u64>,
    /// The hotplug region's ranges released (region offsets, merged).
    released: Vec<(u64, u64)>,
}

impl DirtyPages {
    pub fn new() -> Self {
        Self::default()
    }

    /// ORs `bits` into region `region`'s bitmap, growing it as needed.
    pub fn merge_region(&mut self, region: usize, bits: &[u64]) {
        if self.regions.len() <= region {
            self.regions.resize_with(region + 1, Vec::new);
        }
        let mine = &mut self.regions[region];
        if mine.len() < bits.len() {
            mine.resize(bits.len(), 0);
        }
        for (m, b) in mine.iter_mut().zip(bits) {
            *m |= *b;
        }
    }

    /// ORs the hotplug region's written pages and adds its released ranges.
    pub fn merge_hotplug(&mut self, bits: &[u64], released: &[(u64, u64)]) {
        if self.hotplug.len() < bits.len() {
            self.hotplug.resize(bits.len(), 0);
        }
        for (m, b) in self.hotplug.iter_mut().zip(bits) {
            *m |= *b;
        }
        if !released.is_empty() {
            self.released.extend_from_slice(released);
            self.released = pages::merge(std::mem::take(&mut self.released));
        }
    }

    /// Keeps the released ranges to at most `max` runs (a diff's manifest
    /// lists them, and a manifest has a size limit) by joining the runs
    /// closest together: the pages between two joined runs count as
    /// written, so the diff holds what they read now and claiming the
    /// whole span changes nothing the chain resolves to.
    pub fn bound_released(&mut self, max: usize) {
        if self.released.len() <= max.max(1) {
            return;
        }
        let mut gaps: Vec<u64> = self
            .released
            .windows(2)
            .map(|w| w[1].0 - (w[0].0 + w[0].1))
            .collect();
        gaps.sort_unstable();
        // Joining every gap up to this one leaves at most `max` runs.
        let limit = gaps[self.released.len() - max.max(1) - 1];
        let mut out: Vec<(u64, u64)> = Vec::with_capacity(max);
        for &(o, l) in &self.released {
            match out.last_mut() {
                Some((po, pl)) if o - (*po + *pl) <= limit => {
                    let gap = (*po + *pl, o);
                    for page in gap.0 / PAGE..gap.1.div_ceil(PAGE) {
                        let w = (page / 64) as usize;
                        if self.hotplug.len() <= w {
                            self.hotplug.resize(w + 1, 0);
                        }
                        self.hotplug[w] |= 1 << (page % 64);
                    }
                    *pl = o + l - *po;
                }
                _ => out.push((o, l)),
            }
        }
        self.released = out;
    }

    /// ORs every region of `other` into `self`.
    pub fn merge(&mut self, other: &DirtyPages) {
        for (i, bits) in other.regions.iter().enumerate() {
            self.merge_region(i, bits);
        }
        self.merge_hotplug(&other.hotplug, &other.released);
    }

    pub fn clear(&mut self) {
        self.regions.clear();
        self.hotplug.clear();
        self.released.clear();
    }

    /// Number of dirty pages in all regions (the hotplug region's too).
    pub fn count(&self) -> u64 {
        self.regions
            .iter()
            .flatten()
            .chain(&self.hotplug)
            .map(|w| u64::from(w.count_ones()))
            .sum()
    }

    /// The hotplug region's written pages (bit `i` = its page `i`).
    pub fn hotplug(&self) -> &[u64] {
        &self.hotplug
    }

    /// The hotplug region's ranges released since the parent (region
    /// offsets, sorted, merged).
    pub fn released(&self) -> &[(u64, u64)] {
        &self.released
    }

    /// Runs of consecutive dirty pages of region `region`, as
    /// (first page, page count), in order, limited to `pages` pages.
    pub fn runs(&self, region: usize, pages: u64) -> Vec<(u64, u64)> {
        let Some(bits) = self.regions.get(region) else {
            return Vec::new();
        };
        let mut out: Vec<(u64, u64)> = Vec::new();
        for (wi, &word) in bits.iter().enumerate() {
            let mut w = word;
            while w != 0 {
                let bit = u64::from(w.trailing_zeros());
                w &= w - 1;
                let page = wi as u64 * 64 + bit;
                if page >= pages {
                    return out;
                }
                match out.last_mut() {
                    Some((start, n)) if *start + *n == page => *n += 1,
                    _ => out.push((page, 1)),
                }
            }
        }
        out
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DirtyError {
    #[error("KVM_GET_DIRTY_LOG on memory slot {slot} failed: {source} (is track_dirty_pages on?)")]
    KvmLog {
        slot: u32,
        #[source]
        source: kvm_ioctls::Error,
    },
}

/// Reads and clears KVM's dirty log of every RAM slot and the VMM's own
/// dirty bitmap of every region. Call with the vCPUs paused and device
/// workers quiesced, or pages written meanwhile may be missed.
pub fn collect(vm: &VmFd, ram: &GuestRam) -> Result<DirtyPages, DirtyError> {
    let mut out = DirtyPages::new();
    for (i, (slot, region)) in (0u32..).zip(ram.memory().iter()).enumerate() {
        let kvm = vm
            .get_dirty_log(slot, host_usize::from_u64(region.len()))
            .map_err(|source| DirtyError::KvmLog { slot, source })?;
        out.merge_region(i, &kvm);
        out.merge_region(i, &vmm_bitmap(region).get_and_reset());
    }
    Ok(out)
}

/// The VMM-write bitmap of a region (vm-memory's trait method returns a
/// slice view; the whole bitmap is on the mapping).
fn vmm_bitmap(region: &GuestRegionMmap) -> &DirtyBitmap {
    let mapping: &vm_memory::MmapRegion<DirtyBitmap> = region;
    mapping.bitmap()
}

#[cfg(test)]
mod tests {
    use vm_memory::{Bytes, GuestAddress};

    use super::*;

    #[test]
    fn merging_ors_and_grows() {
        let mut a = DirtyPages::new();
        a.merge_region(0, &[0b0101]);
        let mut b = DirtyPages::new();
        b.merge_region(0, &[0b0011, 1 << 63]);
        b.merge_region(2, &[1]);
        a.merge(&b);
        assert_eq!(a.regions, vec![vec![0b0111, 1 << 63], vec![], vec![1]]);
        assert_eq!(a.count(), 5);
        // Merging is idempotent: a failed snapshot's pages merged twice
        // still count once.
        let before = a.clone();
        a.merge(&b);
        assert_eq!(a, before);
        a.clear();
        assert_eq!(a.count(), 0);
        assert!(a.runs(0, 1000).is_empty());
    }

    #[test]
    fn released_runs_are_bounded_by_joining_the_nearest() {
        let mut d = DirtyPages::new();
        let p = PAGE;
        // Runs at pages 0, 2, 10, 11 (touching 10: merged on entry), 30.
        d.merge_hotplug(
            &[],
            &[(0, p), (2 * p, p), (10 * p, p), (11 * p, p), (30 * p, p)],
        );
        assert_eq!(d.released().len(), 4);
        d.bound_released(10);
        assert_eq!(d.released().len(), 4);
        // Down to 2: the gaps of 1 and 7 pages are joined, not that of 18.
        d.bound_released(2);
        assert_eq!(d.released(), &[(0, 12 * p), (30 * p, p)]);
        // The joined gaps' pages count as written, and only those.
        let written: Vec<u64> = (0..64)
            .filter(|&i| d.hotplug()[0] & (1 << i) != 0)
            .collect();
        assert_eq!(written, [1, 3, 4, 5, 6, 7, 8, 9]);
        d.bound_released(1);
        assert_eq!(d.released(), &[(0, 31 * p)]);
    }

    #[test]
    fn runs_cross_words_and_stop_at_the_region_end() {
        let mut d = DirtyPages::new();
        // Pages 62..=65 (across a word boundary), 70, and 127.
        d.merge_region(0, &[0b11 << 62, 0b11 | 1 << 6 | 1 << 63]);
        assert_eq!(d.runs(0, 128), vec![(62, 4), (70, 1), (127, 1)]);
        // A region of 100 pages never reports page 127 (bitmaps are rounded
        // up to whole words).
        assert_eq!(d.runs(0, 100), vec![(62, 4), (70, 1)]);
        assert!(d.runs(1, 128).is_empty());
    }

    #[test]
    fn vmm_writes_are_collected_from_the_bitmap() {
        let ram = GuestRam::new(8 << 20).unwrap();
        // A write through vm-memory, as a device makes it.
        ram.memory()
            .write_slice(&[1u8; 10], GuestAddress(3 * PAGE + 4090))
            .unwrap();
        let mut d = DirtyPages::new();
        for (i, region) in ram.memory().iter().enumerate() {
            d.merge_region(i, &vmm_bitmap(region).get_and_reset());
        }
        // 10 bytes from 4090 into page 3 straddle pages 3 and 4.
        assert_eq!(d.runs(0, 2048), vec![(3, 2)]);
        // Read-and-clear: a second read finds nothing.
        let again: u64 = ram
            .memory()
            .iter()
            .flat_map(|r| vmm_bitmap(r).get_and_reset())
            .map(|w| u64::from(w.count_ones()))
            .sum();
        assert_eq!(again, 0);
    }
}
