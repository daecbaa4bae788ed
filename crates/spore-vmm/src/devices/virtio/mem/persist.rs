//! Snapshot state of the virtio-mem device.
//!
//! The state is what the device model holds beyond its transport: the
//! region's geometry, the requested size and the plugged bitmap. The
//! region's memory goes into the snapshot's memory file (plugged blocks as
//! data, unplugged blocks as holes, at the file offset right after boot RAM;
//! [`MemHandle::write_memory`]). No host address is saved: a restore maps
//! the region afresh from the memory file ([`HotplugMemory::from_snapshot_file`])
//! and derives every pointer and KVM slot from that mapping.

use std::fs::File;
use std::os::unix::fs::FileExt;

use serde::{Deserialize, Serialize};

use super::blocks::BlockMap;
use super::device::{MemHandle, State, VirtioMem};
use crate::host_usize;
use crate::memory::hotplug::{HotplugError, HotplugMemory, RegionChanges};
use crate::memory::pages::{data_ranges_in, merge, resident_ranges, write_nonzero};
use crate::memory::{GuestRam, MemoryError};
use crate::persist::Persist;

/// The device's snapshot state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VirtioMemState {
    /// Guest-physical start of the region.
    pub addr: u64,
    pub region_size: u64,
    pub block_size: u64,
    pub slot_size: u64,
    /// The host's target (`requested_size`), bytes.
    pub requested_size: u64,
    /// One bit per block, set when plugged.
    pub plugged: Vec<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum MemStateError {
    #[error("the snapshot's virtio-mem {field} is {saved:#x}, this VM's is {actual:#x}")]
    Mismatch {
        field: &'static str,
        saved: u64,
        actual: u64,
    },
    #[error("the snapshot's virtio-mem block map is malformed (length or bits past the region)")]
    Bitmap,
    #[error(
        "the snapshot's virtio-mem requested size {0:#x} is not a block multiple within the region"
    )]
    Requested(u64),
    #[error("virtio-mem restore: {0}")]
    Slot(#[from] HotplugError),
    #[error("a microVM with virtio-mem memory restores only through the lazy or eager File path (its region is mapped from the snapshot's memory file)")]
    NotFromFile,
    #[error("the snapshot memory file: {0}")]
    File(#[source] std::io::Error),
    #[error("virtio-mem region: {0}")]
    Memory(#[from] MemoryError),
}

/// Maps a restored VM's hotplug region from the snapshot memory file its
/// boot RAM (`ram`) was mapped from: the region follows boot RAM there;
/// with a chain of layers, the newer layers' ranges of it on top.
pub fn map_snapshot_region(
    ram: &GuestRam,
    addr: u64,
    size: u64,
    slot_size: u64,
) -> Result<HotplugMemory, MemStateError> {
    if !ram.is_private() {
        return Err(MemStateError::NotFromFile);
    }
    let file = ram.memfd().try_clone().map_err(MemStateError::File)?;
    let len = file.metadata().map_err(MemStateError::File)?.len();
    if len < ram.size().saturating_add(size) {
        return Err(MemStateError::NotFromFile);
    }
    let mut region = HotplugMemory::from_snapshot_file(file, ram.size(), addr, size, slot_size)?;
    // A chain's newer layers, newest winning, over the base's region.
    let mut ranges = Vec::with_capacity(ram.region_layers().len());
    for (file_off, len, file) in ram.region_layers() {
        let off = file_off
            .checked_sub(ram.size())
            .ok_or(MemStateError::NotFromFile)?;
        ranges.push((off, *len, &**file, *file_off));
    }
    if !ranges.is_empty() {
        region.overlay_layers(&ranges)?;
    }
    Ok(region)
}

impl MemHandle {
    /// The device's state; take it while the device is quiesced (or the VM
    /// paused with no request in flight).
    pub fn save(&self) -> VirtioMemState {
        let s = self.shared.lock();
        VirtioMemState {
            addr: s.backing.addr(),
            region_size: s.region_size(),
            block_size: s.blocks.block_size(),
            slot_size: s.slot_size,
            requested_size: s.requested,
            plugged: s.blocks.bits().to_vec(),
        }
    }

    /// Writes the plugged blocks' contents into `out` at `file_offset`
    /// (growing the file to `file_offset` + region size; unplugged blocks
    /// and zero pages stay holes). Returns the bytes written.
    pub fn write_memory(&self, out: &std::fs::File, file_offset: u64) -> std::io::Result<u64> {
        let s = self.shared.lock();
        let bs = s.blocks.block_size();
        let runs: Vec<(u64, u64)> = s
            .blocks
            .plugged_runs()
            .into_iter()
            .map(|r| (r.first * bs, r.count * bs))
            .collect();
        write_plugged(&s.backing, &runs, out, file_offset)
    }

    /// Reads and clears the region's pages written and ranges released
    /// since the last call ([`HotplugMemory::take_dirty`]).
    pub fn take_dirty(&self) -> RegionChanges {
        self.shared.lock().backing.take_dirty()
    }

    /// A diff's share of the region: writes every page set in `dirty` (bit
    /// `i` = page `i` of the region) that lies in a plugged block into
    /// `out` at `file_offset` onward, zero or not (in a diff a hole means
    /// "unchanged"). The file is sized to `file_offset` + region size.
    /// Pages of unplugged blocks are not written: they read as zero, which
    /// the diff's `released` ranges (or, for blocks unplugged since before
    /// the parent, the parent) say. The guest must be paused and the device
    /// quiesced.
    pub fn write_diff(
        &self,
        out: &File,
        file_offset: u64,
        dirty: &[u64],
    ) -> std::io::Result<RegionDiff> {
        let s = self.shared.lock();
        let bs = s.blocks.block_size();
        let hp = &s.backing;
        out.set_len(file_offset + hp.size())?;
        // SAFETY: as in write_plugged: a live, paused mapping owned by `hp`.
        let bytes =
            unsafe { std::slice::from_raw_parts(hp.host_addr(), host_usize::from_u64(hp.size())) };
        let mut diff = RegionDiff::default();
        for run in s.blocks.plugged_runs() {
            let (first, end) = (run.first * bs / PAGE, (run.first + run.count) * bs / PAGE);
            let mut page = first;
            while page < end {
                if !bit(dirty, page) {
                    page += 1;
                    continue;
                }
                let start = page;
                while page < end && bit(dirty, page) {
                    page += 1;
                }
                let (lo, hi) = (
                    host_usize::from_u64(start * PAGE),
                    host_usize::from_u64(page * PAGE),
                );
                out.write_all_at(&bytes[lo..hi], file_offset + lo as u64)?;
                diff.data_bytes += (hi - lo) as u64;
                for (i, p) in bytes[lo..hi].chunks(host_usize::from_u64(PAGE)).enumerate() {
                    if p.iter().all(|&b| b == 0) {
                        let off = file_offset + (lo + i * host_usize::from_u64(PAGE)) as u64;
                        match diff.zero_runs.last_mut() {
                            Some([o, l]) if *o + *l == off => *l += PAGE,
                            _ => diff.zero_runs.push([off, PAGE]),
                        }
                    }
                }
            }
        }
        Ok(diff)
    }

    /// Plugged bytes right now.
    pub fn plugged_bytes(&self) -> u64 {
        let s = self.shared.lock();
        s.blocks.plugged_blocks() * s.blocks.block_size()
    }
}

impl VirtioMem {
    /// Rebuilds the device over `backing` (the region mapped from the
    /// snapshot file, with the VM attached) from `state`: the block map,
    /// the target, and a KVM slot for every chunk holding plugged blocks.
    /// The geometry must match the VM's configuration.
    pub fn restore(
        mut backing: HotplugMemory,
        block_size: u64,
        slot_size: u64,
        state: &VirtioMemState,
    ) -> Result<(Self, MemHandle), MemStateError> {
        for (field, saved, actual) in [
            ("region address", state.addr, backing.addr()),
            ("region size", state.region_size, backing.size()),
            ("block size", state.block_size, block_size),
            ("slot size", state.slot_size, slot_size),
        ] {
            if saved != actual {
                return Err(MemStateError::Mismatch {
                    field,
                    saved,
                    actual,
                });
            }
        }
        if block_size == 0 || slot_size < block_size {
            return Err(MemStateError::Mismatch {
                field: "block size",
                saved: block_size,
                actual: slot_size,
            });
        }
        let nb_blocks = backing.size() / block_size;
        let blocks = BlockMap::from_bits(
            backing.addr(),
            block_size,
            nb_blocks,
            slot_size / block_size,
            &state.plugged,
        )
        .ok_or(MemStateError::Bitmap)?;
        if state.requested_size > backing.size() || !state.requested_size.is_multiple_of(block_size)
        {
            return Err(MemStateError::Requested(state.requested_size));
        }
        for chunk in 0..blocks.nb_chunks() {
            if blocks.chunk_plugged(chunk) > 0 {
                backing.add_slot(chunk)?;
            }
        }
        Ok(Self::from_state(State::new(
            blocks,
            backing,
            state.requested_size,
            slot_size,
        )))
    }
}

/// What [`MemHandle::write_diff`] wrote.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RegionDiff {
    /// Bytes written (every dirty page of a plugged block).
    pub data_bytes: u64,
    /// Written pages that were all zero, as `[file offset, len]` runs.
    pub zero_runs: Vec<[u64; 2]>,
}

const PAGE: u64 = 4096;

fn bit(bits: &[u64], page: u64) -> bool {
    bits.get((page / 64) as usize)
        .is_some_and(|w| w & (1 << (page % 64)) != 0)
}

/// Writes the data of the `plugged` byte ranges (region offsets, sorted)
/// of `hp` into `out` at `file_offset` onward; the file is sized to
/// `file_offset + hp.size()` first. The guest must be paused and the device
/// quiesced. Returns the bytes written.
fn write_plugged(
    hp: &HotplugMemory,
    plugged: &[(u64, u64)],
    out: &File,
    file_offset: u64,
) -> std::io::Result<u64> {
    out.set_len(file_offset + hp.size())?;
    if plugged.is_empty() {
        return Ok(0);
    }
    let (file, start) = hp.file();
    let mut ranges = data_ranges_in(file, start, start + hp.size())?;
    if hp.is_private() {
        ranges.extend(resident_ranges(
            hp.host_addr(),
            host_usize::from_u64(hp.size()),
        )?);
        // Ranges mapped from newer layers are data too, resident or not.
        ranges.extend_from_slice(hp.overlays());
        ranges = merge(ranges);
    }
    // SAFETY: the region's mapping lives as long as `hp`; the guest is
    // paused and the device's worker stopped, so nobody writes it now.
    let bytes =
        unsafe { std::slice::from_raw_parts(hp.host_addr(), host_usize::from_u64(hp.size())) };
    let mut written = 0;
    let mut i = 0;
    for &(ps, pl) in plugged {
        let pe = ps + pl;
        // Both lists are sorted: skip data ranges wholly before this run.
        while i < ranges.len() && ranges[i].0 + ranges[i].1 <= ps {
            i += 1;
        }
        let mut j = i;
        while j < ranges.len() && ranges[j].0 < pe {
            let lo = ranges[j].0.max(ps);
            let hi = (ranges[j].0 + ranges[j].1).min(pe);
            if lo < hi {
                written += write_nonzero(
                    &bytes[host_usize::from_u64(lo)..host_usize::from_u64(hi)],
                    out,
                    file_offset + lo,
                )?;
            }
            j += 1;
        }
    }
    Ok(written)
}

impl Persist for VirtioMem {
    type State = VirtioMemState;
    /// The region (mapped from the snapshot, with the VM attached), the
    /// block size and the slot size.
    type Args = (HotplugMemory, u64, u64);
    type Error = MemStateError;

    /// See [`MemHandle::save`].
    fn save(&self) -> VirtioMemState {
        self.handle().save()
    }

    fn restore(
        (backing, block_size, slot_size): Self::Args,
        state: &VirtioMemState,
    ) -> Result<Self, MemStateError> {
        VirtioMem::restore(backing, block_size, slot_size, state).map(|(device, _)| device)
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{FileExt, MetadataExt};

    use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

    use super::*;
    use crate::devices::virtio::mem::request::{Request, RESP_ACK};
    use crate::devices::virtio::VirtioDevice;

    const MIB: u64 = 1 << 20;
    const BASE: u64 = 4 << 30;
    const BS: u64 = 2 * MIB;

    fn config(dev: &VirtioMem) -> Vec<u8> {
        let mut c = vec![0u8; 56];
        dev.read_config(0, &mut c);
        c
    }

    /// Plug, write, save + write memory, restore from the file: same
    /// config, same contents, and unplugging afterwards frees the memory and
    /// reads back zeros on a re-plug.
    #[test]
    fn save_write_restore_unplug() {
        let boot = 4 * MIB; // stands for boot RAM before the region in the file
        let backing = HotplugMemory::new(BASE, 32 * BS, 8 * BS).unwrap();
        let (dev, h) = VirtioMem::new(backing, BS, 8 * BS);
        h.set_requested_mib(16).unwrap();
        let plug = |h: &MemHandle, first: u64, n: u64| {
            h.handle_request(Request::Plug {
                addr: BASE + first * BS,
                nb_blocks: n,
            })
            .resp_type
        };
        assert_eq!(plug(&h, 1, 2), RESP_ACK);
        assert_eq!(plug(&h, 20, 1), RESP_ACK);
        let region = {
            let s = h.shared.lock();
            crate::devices::virtio::GuestMemoryMmap::from_arc_regions(vec![s.backing.region()])
                .unwrap()
        };
        region
            .write_slice(&[0xab; 4096], GuestAddress(BASE + BS + 8192))
            .unwrap();
        region
            .write_obj(0x1234_5678u32, GuestAddress(BASE + 20 * BS))
            .unwrap();
        let state = h.save();
        let dir = std::env::temp_dir().join(format!("spore-memstate-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("mem");
        let rw = |p: &std::path::Path| {
            std::fs::File::options()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(p)
                .unwrap()
        };
        let out = rw(&path);
        out.set_len(boot).unwrap();
        let n = h.write_memory(&out, boot).unwrap();
        assert_eq!(n, 2 * 4096, "only the written pages");
        let md = std::fs::metadata(&path).unwrap();
        assert_eq!(md.len(), boot + 32 * BS);
        assert!(md.blocks() * 512 <= 64 * 1024);
        let mut b = [0u8; 4];
        out.read_exact_at(&mut b, boot + 20 * BS).unwrap();
        assert_eq!(u32::from_le_bytes(b), 0x1234_5678);
        let cfg = config(&dev);
        drop((dev, h));

        let bytes = bincode::serialize(&state).unwrap();
        let state: VirtioMemState = bincode::deserialize(&bytes).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let backing = HotplugMemory::from_snapshot_file(file, boot, BASE, 32 * BS, 8 * BS).unwrap();
        let (dev, h) = VirtioMem::restore(backing, BS, 8 * BS, &state).unwrap();
        assert_eq!(config(&dev), cfg);
        assert_eq!(h.save(), state);
        assert_eq!(h.registered_slots(), 2);
        let region = {
            let s = h.shared.lock();
            crate::devices::virtio::GuestMemoryMmap::from_arc_regions(vec![s.backing.region()])
                .unwrap()
        };
        let mut page = [0u8; 4096];
        region
            .read_slice(&mut page, GuestAddress(BASE + BS + 8192))
            .unwrap();
        assert!(page.iter().all(|&x| x == 0xab));
        let v: u32 = region.read_obj(GuestAddress(BASE + 20 * BS)).unwrap();
        assert_eq!(v, 0x1234_5678);
        // Dirty a whole block privately, then unplug: memory goes back.
        region
            .write_slice(
                &vec![7u8; host_usize::from_u64(BS)],
                GuestAddress(BASE + 2 * BS),
            )
            .unwrap();
        assert!(h.resident_bytes() >= BS);
        let r = h.handle_request(Request::Unplug {
            addr: BASE + BS,
            nb_blocks: 2,
        });
        assert_eq!(r.resp_type, RESP_ACK);
        assert!(h.resident_bytes() < BS, "{}", h.resident_bytes());
        // The file was never written.
        out.read_exact_at(&mut b, boot + 2 * BS).unwrap();
        assert_eq!(b, [0; 4]);
        // Plugged again, the blocks read as zeros (not the file's old data).
        assert_eq!(plug(&h, 1, 2), RESP_ACK);
        region
            .read_slice(&mut page, GuestAddress(BASE + BS + 8192))
            .unwrap();
        assert!(page.iter().all(|&x| x == 0));
        // Unchanged block still maps the file.
        let v: u32 = region.read_obj(GuestAddress(BASE + 20 * BS)).unwrap();
        assert_eq!(v, 0x1234_5678);
        // A restored region snapshots again: the file's blocks plus its own.
        region
            .write_obj(0x99u8, GuestAddress(BASE + BS + 5))
            .unwrap();
        let path2 = dir.join("mem2");
        let out2 = rw(&path2);
        let n = h.write_memory(&out2, 0).unwrap();
        assert_eq!(n, 2 * 4096);
        let mut x = [0u8; 1];
        out2.read_exact_at(&mut x, BS + 5).unwrap();
        assert_eq!(x[0], 0x99);
        out2.read_exact_at(&mut b, 20 * BS).unwrap();
        assert_eq!(u32::from_le_bytes(b), 0x1234_5678);
        assert!(region.find_region(GuestAddress(BASE)).is_some());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A full layer, then a diff of the region (the VMM's writes and a
    /// released block, tracked as with `track_dirty_pages`), mapped back as
    /// a chain: the diff's pages win, the base shows elsewhere, and the
    /// released block reads zero although the base holds data there.
    #[test]
    fn region_diffs_hold_changed_pages_and_released_blocks() {
        use crate::memory::layers::MemoryLayers;
        let boot = 4 * MIB;
        let dir = std::env::temp_dir().join(format!("spore-memdiff-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let rw = |name: &str| {
            std::fs::File::options()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(dir.join(name))
                .unwrap()
        };
        let mut backing = HotplugMemory::new(BASE, 32 * BS, 8 * BS).unwrap();
        backing.set_dirty_log(true);
        let (_dev, h) = VirtioMem::new(backing, BS, 8 * BS);
        h.set_requested_mib(16).unwrap();
        for (first, n) in [(1, 2), (20, 1)] {
            let r = h.handle_request(Request::Plug {
                addr: BASE + first * BS,
                nb_blocks: n,
            });
            assert_eq!(r.resp_type, RESP_ACK);
        }
        let region = {
            let s = h.shared.lock();
            crate::devices::virtio::GuestMemoryMmap::from_arc_regions(vec![s.backing.region()])
                .unwrap()
        };
        let page = |b: u64, p: u64| GuestAddress(BASE + b * BS + p * 4096);
        region.write_slice(&[0xab; 4096], page(1, 2)).unwrap();
        region.write_slice(&[0xab; 4096], page(2, 0)).unwrap();
        region.write_obj(0x1234_5678u32, page(20, 0)).unwrap();
        let base = rw("base");
        base.set_len(boot).unwrap();
        h.write_memory(&base, boot).unwrap();
        // The full layer resets the tracking.
        h.take_dirty();

        region.write_slice(&[0xcd; 4096], page(1, 3)).unwrap();
        region.write_slice(&[0; 4096], page(2, 0)).unwrap();
        // 64 KiB: a run the restore maps rather than reads in.
        region.write_slice(&[0xef; 16 * 4096], page(2, 4)).unwrap();
        let r = h.handle_request(Request::Unplug {
            addr: BASE + 20 * BS,
            nb_blocks: 1,
        });
        assert_eq!(r.resp_type, RESP_ACK);
        let changes = h.take_dirty();
        // The block, then its whole chunk as its slot was retired.
        assert_eq!(changes.released, vec![(16 * BS, 8 * BS)]);
        let diff_file = rw("diff");
        diff_file.set_len(boot).unwrap();
        let diff = h.write_diff(&diff_file, boot, &changes.written).unwrap();
        // Only the pages written (one of them zero, written as data).
        assert_eq!(diff.data_bytes, 18 * 4096);
        assert_eq!(diff.zero_runs, vec![[boot + 2 * BS, 4096]]);
        // Read and cleared: nothing left for the next diff.
        let again = h.take_dirty();
        assert!(again.written.iter().all(|&w| w == 0) && again.released.is_empty());

        let mut layers = MemoryLayers::new(vec![base, diff_file], boot).with_region(boot, 32 * BS);
        layers.add_ranges(1, vec![(boot + 16 * BS, 8 * BS)]);
        assert!(layers.extents().unwrap().is_empty(), "RAM has no data");
        let ranges: Vec<_> = layers
            .region_extents()
            .unwrap()
            .into_iter()
            .filter(|e| e.layer > 0)
            .map(|e| (e.offset - boot, e.len, &layers.files()[e.layer], e.offset))
            .collect();
        let mut back = HotplugMemory::from_snapshot_file(
            layers.files()[0].try_clone().unwrap(),
            boot,
            BASE,
            32 * BS,
            8 * BS,
        )
        .unwrap();
        back.overlay_layers(&ranges).unwrap();
        let mem =
            crate::devices::virtio::GuestMemoryMmap::from_arc_regions(vec![back.region()]).unwrap();
        let byte = |b: u64, p: u64| mem.read_obj::<u8>(page(b, p)).unwrap();
        assert_eq!(
            (byte(1, 2), byte(1, 3), byte(2, 0), byte(20, 0)),
            (0xab, 0xcd, 0, 0)
        );
        // A range outside the region is refused, not mapped.
        let f = &layers.files()[1];
        assert!(back.overlay_layers(&[(31 * BS, 2 * BS, f, 0)]).is_err());
        // A full snapshot of the restored region holds the newer layer's
        // pages, although they were mapped, never touched, and the base
        // file has none there.
        let (_dev2, h2) = VirtioMem::restore(back, BS, 8 * BS, &h.save()).unwrap();
        let full = rw("full");
        assert_eq!(h2.write_memory(&full, 0).unwrap(), 18 * 4096);
        let mut b = [0u8; 1];
        for (blk, p, v) in [(1, 2, 0xab), (1, 3, 0xcd), (2, 0, 0), (2, 10, 0xef)] {
            full.read_exact_at(&mut b, blk * BS + p * 4096).unwrap();
            assert_eq!(b[0], v, "block {blk} page {p}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn mismatched_state_is_refused() {
        let backing = HotplugMemory::new(BASE, 32 * BS, 8 * BS).unwrap();
        let (_dev, h) = VirtioMem::new(backing, BS, 8 * BS);
        let good = h.save();
        let fresh = || HotplugMemory::new(BASE, 32 * BS, 8 * BS).unwrap();
        let mut s = good.clone();
        s.block_size = 4 * MIB;
        assert!(VirtioMem::restore(fresh(), BS, 8 * BS, &s).is_err());
        let mut s = good.clone();
        s.plugged.push(0);
        assert!(matches!(
            VirtioMem::restore(fresh(), BS, 8 * BS, &s),
            Err(MemStateError::Bitmap)
        ));
        let mut s = good.clone();
        s.requested_size = BS + 1;
        assert!(VirtioMem::restore(fresh(), BS, 8 * BS, &s).is_err());
        let mut s = good.clone();
        s.addr += BS;
        assert!(VirtioMem::restore(fresh(), BS, 8 * BS, &s).is_err());
        assert!(VirtioMem::restore(fresh(), BS, 8 * BS, &good).is_ok());
    }
}
