//! A snapshot's memory as a stack of layer files: a full base and zero or
//! more diffs on top, base first.
//!
//! Every layer file has the guest memory layout (see `memory`): a page holds
//! data in a layer only if the layer wrote it, and holes elsewhere. The
//! memory of the chain is, page by page, the newest layer that holds data
//! there, or zero where none does. Every restore path (lazy, layered, eager,
//! working set, userfaultfd) and `snapshot merge` read memory through this
//! one resolution, so they cannot disagree about which layer wins.
//!
//! A virtio-mem VM's files hold its hotplug region after boot RAM
//! ([`MemoryLayers::with_region`]); it resolves the same way, apart from
//! RAM ([`MemoryLayers::region_extents`]): RAM restore paths size guest
//! RAM from [`MemoryLayers::size`] and must not see the region.

use std::collections::BTreeMap;
use std::fs::File;

use super::pages::{data_ranges_in, merge as merge_ranges};

/// A byte range of guest memory and the layer that supplies it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// Offset in the memory layout (= offset in every layer file).
    pub offset: u64,
    pub len: u64,
    /// Index into [`MemoryLayers::files`] (0 = base).
    pub layer: usize,
}

/// The layer files of one snapshot chain, base first, each holding `size`
/// bytes of boot RAM (then the hotplug region, if any).
pub struct MemoryLayers {
    files: Vec<File>,
    size: u64,
    /// Per layer, ranges that belong to it besides its file's data ranges
    /// (a diff's zero pages a copy turned into holes, and hotplug blocks
    /// unplugged since its parent; they read as zeros).
    extra: Vec<Vec<(u64, u64)>>,
    /// The hotplug region's (file offset, length), after boot RAM.
    region: Option<(u64, u64)>,
}

impl MemoryLayers {
    /// `files` base first. The caller has checked each file's size and
    /// identity against its manifest.
    pub fn new(files: Vec<File>, size: u64) -> Self {
        Self {
            files,
            size,
            extra: Vec::new(),
            region: None,
        }
    }

    /// Declares the hotplug region: `len` bytes at `offset` (right after
    /// boot RAM) in every layer file. The caller has checked the files'
    /// sizes.
    pub fn with_region(mut self, offset: u64, len: u64) -> Self {
        self.region = Some((offset, len));
        self
    }

    /// The hotplug region's (file offset, length), if the chain has one.
    pub fn region(&self) -> Option<(u64, u64)> {
        self.region
    }

    /// Declares `ranges` part of layer `layer` even where its file has
    /// holes (added to what was declared before).
    pub fn add_ranges(&mut self, layer: usize, ranges: Vec<(u64, u64)>) {
        if self.extra.len() <= layer {
            self.extra.resize_with(layer + 1, Vec::new);
        }
        let mine = &mut self.extra[layer];
        mine.extend(ranges);
        *mine = merge_ranges(std::mem::take(mine));
    }

    /// A single full snapshot.
    pub fn single(file: File, size: u64) -> Self {
        Self::new(vec![file], size)
    }

    pub fn files(&self) -> &[File] {
        &self.files
    }

    pub fn base(&self) -> Option<&File> {
        self.files.first()
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// Every range of boot RAM that holds data in some layer, attributed
    /// to the newest layer holding it, sorted by offset and non-overlapping.
    /// Ranges not listed read as zero.
    pub fn extents(&self) -> std::io::Result<Vec<Extent>> {
        self.extents_in(0, self.size)
    }

    /// [`Self::extents`] of the hotplug region (file offsets; empty without
    /// a region).
    pub fn region_extents(&self) -> std::io::Result<Vec<Extent>> {
        match self.region {
            Some((offset, len)) => self.extents_in(offset, offset.saturating_add(len)),
            None => Ok(Vec::new()),
        }
    }

    /// Resolved extents within `[lo, hi)` of the layout: declared ranges
    /// are clipped to it, so a range naming the region never leaks into
    /// RAM's extents (nor one past the file into either).
    fn extents_in(&self, lo: u64, hi: u64) -> std::io::Result<Vec<Extent>> {
        let mut per_layer = Vec::with_capacity(self.files.len());
        for (i, f) in self.files.iter().enumerate() {
            let mut ranges: Vec<(u64, u64)> = data_ranges_in(f, lo, hi)?
                .into_iter()
                .map(|(o, l)| (lo + o, l))
                .collect();
            if let Some(extra) = self.extra.get(i) {
                for &(o, l) in extra {
                    let (s, e) = (o.max(lo), o.saturating_add(l).min(hi));
                    if s < e {
                        ranges.push((s, e - s));
                    }
                }
                ranges = merge_ranges(ranges);
            }
            per_layer.push(ranges);
        }
        Ok(resolve(&per_layer))
    }
}

/// Newest-wins resolution of per-layer data ranges (`(offset, len)`, each
/// layer's list sorted and non-overlapping, base first).
pub fn resolve(per_layer: &[Vec<(u64, u64)>]) -> Vec<Extent> {
    // Covered intervals so far (start -> end), from newer layers.
    let mut covered: BTreeMap<u64, u64> = BTreeMap::new();
    let mut out = Vec::new();
    for (layer, ranges) in per_layer.iter().enumerate().rev() {
        let mut added = Vec::new();
        for &(start, len) in ranges {
            let end = start.saturating_add(len);
            let mut pos = start;
            // The first covered interval that may overlap [start, end).
            let from = covered
                .range(..=start)
                .next_back()
                .map(|(&s, _)| s)
                .unwrap_or(start);
            for (&cs, &ce) in covered.range(from..) {
                if cs >= end {
                    break;
                }
                if ce <= pos {
                    continue;
                }
                if cs > pos {
                    out.push(Extent {
                        offset: pos,
                        len: cs - pos,
                        layer,
                    });
                    added.push((pos, cs));
                }
                pos = pos.max(ce);
                if pos >= end {
                    break;
                }
            }
            if pos < end {
                out.push(Extent {
                    offset: pos,
                    len: end - pos,
                    layer,
                });
                added.push((pos, end));
            }
        }
        for (s, e) in added {
            covered.insert(s, e);
        }
    }
    out.sort_by_key(|e| e.offset);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ext(offset: u64, len: u64, layer: usize) -> Extent {
        Extent { offset, len, layer }
    }

    #[test]
    fn newest_layer_wins_and_gaps_fall_through() {
        let base = vec![(0, 100)];
        let diff1 = vec![(10, 10), (50, 20)];
        let diff2 = vec![(15, 40), (90, 20)];
        let got = resolve(&[base, diff1, diff2]);
        assert_eq!(
            got,
            vec![
                ext(0, 10, 0),
                ext(10, 5, 1),
                ext(15, 40, 2),
                ext(55, 15, 1),
                ext(70, 20, 0),
                ext(90, 20, 2),
            ]
        );
    }

    #[test]
    fn single_layer_is_its_own_ranges() {
        let got = resolve(&[vec![(0, 4096), (8192, 4096)]]);
        assert_eq!(got, vec![ext(0, 4096, 0), ext(8192, 4096, 0)]);
        assert!(resolve(&[]).is_empty());
        assert!(resolve(&[vec![], vec![]]).is_empty());
    }

    /// The hotplug region resolves apart from RAM: a declared range there
    /// (a released block) wins over the base's data, and neither leaks
    /// into RAM's extents.
    #[test]
    fn the_region_resolves_apart_from_ram() {
        use std::os::unix::fs::FileExt;
        let dir = std::env::temp_dir().join(format!("spore-layers-rg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (ram, region) = (1u64 << 20, 1u64 << 20);
        let mk = |name: &str, pages: &[u64]| {
            let f = File::options()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(dir.join(name))
                .unwrap();
            f.set_len(ram + region).unwrap();
            for &p in pages {
                f.write_all_at(&[1; 4096], p * 4096).unwrap();
            }
            f
        };
        // Base: RAM page 0, region pages 0..4 (file pages 256..260).
        let base = mk("base", &[0, 256, 257, 258, 259]);
        let diff = mk("diff", &[]);
        let mut layers = MemoryLayers::new(vec![base, diff], ram).with_region(ram, region);
        // The diff released region pages 1..3, and a bogus run past the end.
        layers.add_ranges(1, vec![(ram + 4096, 2 * 4096), (ram + region, 4096)]);
        let owner = |ext: &[Extent], off: u64| {
            ext.iter()
                .find(|e| e.offset <= off && off < e.offset + e.len)
                .map(|e| e.layer)
        };
        let r = layers.extents().unwrap();
        assert!(r.iter().all(|e| e.offset + e.len <= ram), "{r:?}");
        assert_eq!(owner(&r, 0), Some(0));
        let g = layers.region_extents().unwrap();
        assert!(g
            .iter()
            .all(|e| e.offset >= ram && e.offset + e.len <= ram + region));
        let pages: Vec<_> = (0..5).map(|p| owner(&g, ram + p * 4096)).collect();
        assert_eq!(pages, [Some(0), Some(1), Some(1), Some(0), None]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn layer_files_resolve_through_seek_data() {
        use std::os::unix::fs::FileExt;
        let dir = std::env::temp_dir().join(format!("spore-layers-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let size = 1u64 << 20;
        let mk = |name: &str, pages: &[u64]| {
            let f = File::options()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(dir.join(name))
                .unwrap();
            f.set_len(size).unwrap();
            for &p in pages {
                f.write_all_at(&[(p & 0xff) as u8 + 1; 4096], p * 4096)
                    .unwrap();
            }
            f
        };
        let layers = MemoryLayers::new(vec![mk("base", &[0, 1, 2]), mk("diff", &[1, 200])], size);
        let got = layers.extents().unwrap();
        // Filesystems may report data at a coarser granularity than a page;
        // check attribution page by page instead of exact extents.
        let owner = |page: u64| {
            got.iter()
                .find(|e| e.offset <= page * 4096 && page * 4096 < e.offset + e.len)
                .map(|e| e.layer)
        };
        assert_eq!(owner(0), Some(0));
        assert_eq!(owner(1), Some(1));
        assert_eq!(owner(2), Some(0));
        assert_eq!(owner(200), Some(1));
        assert_eq!(owner(100), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
