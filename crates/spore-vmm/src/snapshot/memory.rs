//! Writing guest RAM to a sparse memory file, and checking one before a
//! restore maps it.
//!
//! The memory file has the memfd's layout: RAM regions back to back in
//! guest-physical order. Only data is written: ranges the memfd reports as
//! holes (`SEEK_DATA`/`SEEK_HOLE`, pages never touched) are skipped, and so
//! is every all-zero page inside data ranges, so the file's holes read as
//! zeros and cost no disk. A privately mapped RAM (a restored VM) has its
//! contents in two places: the snapshot file it maps (its data ranges) and
//! the anonymous copy-on-write pages the guest wrote since; the latter are
//! found with `mincore` (resident pages), so pages in the file's holes that
//! nobody touched are never read, which would fault them in.

use std::fs::File;
use std::os::unix::fs::FileExt;

use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};

use super::dirty::DirtyPages;
use crate::host_usize;
use crate::memory::pages::{data_ranges, merge, resident_ranges, write_nonzero, PAGE};
use crate::memory::GuestRam;

/// Where a data range lies: an offset in the memory file and the host
/// address of the same bytes.
fn region_spans(ram: &GuestRam) -> Vec<(u64, *const u8, usize)> {
    let mut spans = Vec::new();
    let mut offset = 0u64;
    for region in ram.memory().iter() {
        let len = host_usize::from_u64(region.len());
        spans.push((offset, region.as_ptr() as *const u8, len));
        offset += len as u64;
    }
    spans
}

/// Writes the non-zero pages of RAM into `out` (already sized by the caller
/// to the RAM size). The guest must be paused and devices quiesced. Returns
/// the bytes written.
pub fn write_sparse(ram: &GuestRam, out: &File) -> std::io::Result<u64> {
    out.set_len(ram.size())?;
    let spans = region_spans(ram);
    let mut ranges = data_ranges(ram.memfd(), ram.size())?;
    if ram.is_private() {
        for &(span_off, ptr, span_len) in &spans {
            ranges.extend(
                resident_ranges(ptr, span_len)?
                    .into_iter()
                    .map(|(o, l)| (span_off + o, l)),
            );
        }
        // Pages mapped from diff layers are data too, resident or not.
        ranges.extend_from_slice(ram.overlays());
        ranges = merge(ranges);
    }
    let mut written = 0u64;
    for (start, len) in ranges {
        for &(span_off, ptr, span_len) in &spans {
            let lo = start.max(span_off);
            let hi = (start + len).min(span_off + span_len as u64);
            if lo >= hi {
                continue;
            }
            // SAFETY: [ptr, ptr + span_len) is a live mapping of guest RAM
            // owned by `ram`; the guest is paused and device workers are
            // stopped, so nobody writes it while we read.
            let bytes = unsafe { std::slice::from_raw_parts(ptr, span_len) };
            let from = host_usize::from_u64(lo - span_off);
            let to = host_usize::from_u64(hi - span_off);
            written += write_nonzero(&bytes[from..to], out, lo)?;
        }
    }
    Ok(written)
}

/// Writes every dirty page of RAM into `out` (sized here to the RAM size),
/// zero or not: in a diff layer a hole means "unchanged, see the parent",
/// so a page the guest zeroed must be written as data. The guest must be
/// paused and devices quiesced. Returns the bytes written and the runs of
/// written pages that were all zero (`None` past [`MAX_ZERO_RUNS`]).
pub fn write_dirty(
    ram: &GuestRam,
    dirty: &DirtyPages,
    out: &File,
) -> std::io::Result<(u64, Option<Vec<[u64; 2]>>)> {
    out.set_len(ram.size())?;
    let mut written = 0u64;
    let mut zeros: Vec<[u64; 2]> = Vec::new();
    for (region, (span_off, ptr, span_len)) in region_spans(ram).into_iter().enumerate() {
        // SAFETY: as in write_sparse: a live, paused mapping owned by `ram`.
        let bytes = unsafe { std::slice::from_raw_parts(ptr, span_len) };
        for (first, n) in dirty.runs(region, (span_len / PAGE) as u64) {
            let from = host_usize::from_u64(first) * PAGE;
            let to = from + host_usize::from_u64(n) * PAGE;
            out.write_all_at(&bytes[from..to], span_off + from as u64)?;
            written += (to - from) as u64;
            for (i, page) in bytes[from..to].chunks(PAGE).enumerate() {
                if page.iter().all(|&b| b == 0) {
                    let off = span_off + (from + i * PAGE) as u64;
                    match zeros.last_mut() {
                        Some([o, l]) if *o + *l == off => *l += PAGE as u64,
                        _ => zeros.push([off, PAGE as u64]),
                    }
                }
            }
        }
    }
    Ok((written, (zeros.len() <= MAX_ZERO_RUNS).then_some(zeros)))
}

/// Most zero-page runs a diff's manifest lists (keeps it well under the
/// manifest size limit).
pub const MAX_ZERO_RUNS: usize = 16384;

/// Bytes of `file` (of `size` bytes) that hold data, per SEEK_DATA.
pub fn data_bytes(file: &File, size: u64) -> std::io::Result<u64> {
    Ok(data_ranges(file, size)?.iter().map(|r| r.1).sum())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use vm_memory::{Bytes, GuestAddress};

    use super::*;

    #[test]
    fn only_touched_pages_take_disk() {
        let ram = GuestRam::new(64 << 20).unwrap();
        ram.memory()
            .write_slice(&[0xaa; 8192], GuestAddress(0x10_0000))
            .unwrap();
        ram.memory()
            .write_obj(0x55u8, GuestAddress(0x300_0000))
            .unwrap();
        // A touched but zero page is not written either.
        ram.memory()
            .write_obj(0u8, GuestAddress(0x200_0000))
            .unwrap();
        let path = std::env::temp_dir().join(format!("spore-mem-{}", std::process::id()));
        let f = File::create(&path).unwrap();
        let n = write_sparse(&ram, &f).unwrap();
        assert_eq!(n, 3 * 4096);
        let md = std::fs::metadata(&path).unwrap();
        assert_eq!(md.len(), 64 << 20);
        assert!(md.blocks() * 512 <= 64 * 1024, "{} blocks", md.blocks());
        // Map it back privately: same bytes.
        let back = GuestRam::from_snapshot_file(File::open(&path).unwrap(), 64 << 20).unwrap();
        let mut buf = [0u8; 8192];
        back.memory()
            .read_slice(&mut buf, GuestAddress(0x10_0000))
            .unwrap();
        assert!(buf.iter().all(|&b| b == 0xaa));
        let v: u8 = back.memory().read_obj(GuestAddress(0x300_0000)).unwrap();
        assert_eq!(v, 0x55);
        // Writes stay private to the mapping.
        back.memory().write_obj(1u8, GuestAddress(0)).unwrap();
        let f2 = File::open(&path).unwrap();
        let mut b = [9u8];
        f2.read_exact_at(&mut b, 0).unwrap();
        assert_eq!(b[0], 0);
        // And a private RAM writes out its own view: the file's data plus
        // its own writes, without reading the file's untouched holes.
        back.memory()
            .write_obj(2u8, GuestAddress(0x380_0000))
            .unwrap();
        let path2 = path.with_extension("2");
        let n2 = write_sparse(&back, &File::create(&path2).unwrap()).unwrap();
        assert_eq!(n2, 5 * 4096);
        let f3 = File::open(&path2).unwrap();
        f3.read_exact_at(&mut b, 0x380_0000).unwrap();
        assert_eq!(b[0], 2);
        f3.read_exact_at(&mut b, 0x300_0000).unwrap();
        assert_eq!(b[0], 0x55);
        std::fs::remove_file(&path).unwrap();
        std::fs::remove_file(&path2).unwrap();
    }

    /// A device's write into guest memory (a virtio-blk read, which the
    /// guest's vCPUs never touch) reaches a diff: KVM's log misses it, the
    /// VMM's bitmap has it, and `write_dirty` writes it out.
    #[test]
    fn kvm_device_writes_reach_the_diff() {
        use crate::devices::virtio::blk::backend::DiskImage;
        use crate::devices::virtio::blk::request::Segment;
        use crate::snapshot::dirty::{collect, PAGE};

        let dir = std::env::temp_dir().join(format!("spore-dirty-dev-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let disk = dir.join("disk");
        std::fs::write(&disk, [0x5au8; 4096]).unwrap();
        let kvm = kvm_ioctls::Kvm::new().expect("this test needs /dev/kvm");
        let vm = kvm.create_vm().unwrap();
        let ram = GuestRam::new(8 << 20).unwrap();
        ram.register(&vm, true).unwrap();
        // Whatever was written before (a loader) is the base's business.
        collect(&vm, &ram).unwrap();
        let image = DiskImage::open(&disk, true, false).unwrap();
        let seg = Segment {
            addr: GuestAddress(7 * PAGE),
            len: 4096,
        };
        image.read_into(ram.memory(), 0, &[seg]).unwrap();
        let d = collect(&vm, &ram).unwrap();
        assert_eq!(d.runs(0, 2048), vec![(7, 1)]);
        let out = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.join("diff"))
            .unwrap();
        assert_eq!(write_dirty(&ram, &d, &out).unwrap(), (4096, Some(vec![])));
        let mut b = [0u8; 4096];
        out.read_exact_at(&mut b, 7 * PAGE).unwrap();
        assert!(b.iter().all(|&x| x == 0x5a));
        // Both logs were cleared.
        assert_eq!(collect(&vm, &ram).unwrap().count(), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[cfg(test)]
mod layer_tests {
    use std::fs::File;
    use std::os::unix::fs::FileExt;

    use vm_memory::{Bytes, GuestAddress};

    use super::*;
    use crate::memory::layers::MemoryLayers;
    use crate::memory::{GuestRam, MAX_OVERLAY_MAPS};

    /// (Here rather than in `memory/`, which must not import `snapshot/`.)
    /// A base with pages 0..4 set to 1, a diff that zeroes page 1 and sets
    /// page 2 and page 9 to 2: mapped or read in, the RAM shows the diff's
    /// pages (a zero page too) and the base elsewhere.
    #[test]
    fn layers_overlay_the_base_newest_wins() {
        let dir = std::env::temp_dir().join(format!("spore-ram-layers-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let size = 4u64 << 20;
        let mk = |name: &str, pages: &[(u64, u8)]| {
            let f = File::options()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(dir.join(name))
                .unwrap();
            f.set_len(size).unwrap();
            for &(p, v) in pages {
                f.write_all_at(&[v; 4096], p * 4096).unwrap();
            }
            f
        };
        let base = mk("base", &[(0, 1), (1, 1), (2, 1), (3, 1)]);
        let mut diff_pages = vec![(1, 0), (2, 2), (9, 2)];
        diff_pages.extend((32..48).map(|p| (p, 4)));
        let diff = mk("diff", &diff_pages);
        let layers = MemoryLayers::new(vec![base, diff], size);
        for max_maps in [MAX_OVERLAY_MAPS, 0] {
            let ram = GuestRam::from_layers_with(&layers, max_maps).unwrap();
            let page = |p: u64| {
                let mut b = [0u8; 4096];
                ram.memory()
                    .read_slice(&mut b, GuestAddress(p * 4096))
                    .unwrap();
                assert!(b.iter().all(|&x| x == b[0]), "page {p} mixed");
                b[0]
            };
            assert_eq!(
                (0..11).map(page).collect::<Vec<_>>(),
                [1, 0, 2, 1, 0, 0, 0, 0, 0, 2, 0],
                "max_maps {max_maps}"
            );
            // Writes stay private: the layer files keep their bytes.
            ram.memory().write_obj(7u8, GuestAddress(2 * 4096)).unwrap();
            let mut b = [0u8];
            layers.files()[1].read_exact_at(&mut b, 2 * 4096).unwrap();
            assert_eq!(b[0], 2);
            assert_eq!(page(32), 4);
            assert_eq!(page(47), 4);
            assert_eq!(page(48), 0);
            assert!(ram.overlays().contains(&(9 * 4096, 4096)));
            assert!(ram.overlays().contains(&(32 * 4096, 16 * 4096)));
            // A full snapshot of this RAM holds the diff's pages, although
            // the base file has holes there and nothing touched them.
            let path = dir.join(format!("full-{max_maps}"));
            let out = File::options()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(&path)
                .unwrap();
            write_sparse(&ram, &out).unwrap();
            let mut b = [0u8];
            for (p, v) in [(0, 1), (1, 0), (2, 7), (9, 2), (40, 4), (100, 0)] {
                out.read_exact_at(&mut b, p * 4096).unwrap();
                assert_eq!(b[0], v, "page {p}");
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
