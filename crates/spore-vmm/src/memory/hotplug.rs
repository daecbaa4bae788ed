//! Backing memory of the virtio-mem hotplug region.
//!
//! A booted VM's region is anonymous private memory ([`HotplugMemory::anonymous`]),
//! for the same reason as boot RAM (`memory` module docs): plugged memory
//! the guest touches first is faulted in with transparent huge pages where
//! the host allows them. It is mapped once for the VM's whole life; its
//! unplugged blocks are given back like a restored region's (below).
//!
//! [`HotplugMemory::new`] gives the region its own memfd instead, mapped shared into the VMM once for its
//! whole life (so devices can reach guest buffers that live in plugged
//! memory, and no host pointer ever goes stale). What the guest can reach is
//! decided by KVM memory slots, one per `slot_size` chunk, which exist only
//! while the chunk has plugged blocks: the guest touching a chunk with no
//! plugged block gets an MMIO exit, not fresh host memory. Unplugged blocks
//! are given back with `fallocate(PUNCH_HOLE)`, which frees the memfd's pages
//! and zaps every mapping of them (the VMM's and, through KVM's MMU
//! notifier, the guest's).
//!
//! A VM restored from a snapshot maps the region privately from the
//! snapshot's memory file instead (at the file offset right after boot RAM),
//! so plugged blocks fault in lazily from the page cache and restore costs
//! no copy. Such a region cannot punch holes in a file it does not own:
//! unplugged blocks are replaced by fresh anonymous memory (`mmap` with
//! `MAP_FIXED` over the range), which frees the copy-on-write pages and
//! drops the file's pages from the mapping, and reads as zeros when the
//! block is plugged again — the same contract as a punched memfd. A chain
//! of snapshot layers maps the base that way and each newer layer's
//! ranges of the region on top ([`HotplugMemory::overlay_layers`]), as
//! boot RAM does.
//!
//! For diff snapshots (`track_dirty_pages`), every slot is created with
//! KVM's dirty log on, and the region remembers what it released since
//! the last snapshot ([`HotplugMemory::take_dirty`]): a slot is deleted
//! only once its chunk is empty, so the log lost with it covered pages
//! that were released anyway, and a diff makes every released range its
//! own (zero unless written since), so nothing of it is read from an older
//! layer again.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use kvm_bindings::kvm_userspace_memory_region;
use kvm_ioctls::VmFd;
use vm_memory::{FileOffset, GuestAddress, MmapRegion};

use super::{create_memfd, AlignedAnonymous, GuestRegionMmap, MemoryError};
use crate::host_usize;

/// First KVM slot id of the hotplug region; boot RAM uses slots 0 and 1.
pub const FIRST_SLOT: u32 = 16;

/// The KVM slot of hotplug chunk `chunk`. KVM has at most a few thousand
/// slots: a chunk number past u32 saturates to a slot KVM refuses rather
/// than wrapping onto another chunk's.
fn kvm_slot(chunk: u64) -> u32 {
    FIRST_SLOT.saturating_add(u32::try_from(chunk).unwrap_or(u32::MAX))
}

#[derive(Debug, thiserror::Error)]
pub enum HotplugError {
    #[error("KVM refused to {what} memory slot {slot}: {source}")]
    Slot {
        what: &'static str,
        slot: u32,
        #[source]
        source: kvm_ioctls::Error,
    },
    #[error("cannot release {len} bytes at offset {offset:#x} of the hotplug memory: {source}")]
    Discard {
        offset: u64,
        len: u64,
        #[source]
        source: std::io::Error,
    },
    #[error("chunk {0} is outside the hotplug region")]
    Chunk(u64),
}

/// What changed in the region since the last snapshot
/// ([`HotplugMemory::take_dirty`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RegionChanges {
    /// Pages written: bit `i` is page `i` of the region.
    pub written: Vec<u64>,
    /// Ranges released (region offsets, sorted, merged).
    pub released: Vec<(u64, u64)>,
}

/// The hotplug region's memfd, its mapping, and its KVM slots.
pub struct HotplugMemory {
    /// The memfd (shared mapping), or the snapshot memory file the region
    /// is mapped from privately.
    memfd: File,
    /// Where the region starts in `memfd` (non-zero for a snapshot file,
    /// which holds boot RAM first).
    file_offset: u64,
    /// Mapped copy-on-write from a snapshot file (see the module docs).
    private: bool,
    region: Arc<GuestRegionMmap>,
    addr: u64,
    size: u64,
    slot_size: u64,
    /// The VM the slots belong to; `None` for a region not (yet) given to a
    /// VM, where slot changes are only recorded.
    vm: Option<VmFd>,
    registered: Vec<bool>,
    /// Slots are made with KVM's dirty log on (diff snapshots).
    dirty_log: bool,
    /// Region ranges released since the last [`Self::take_dirty`] (only
    /// recorded with `dirty_log`).
    released: Vec<(u64, u64)>,
    /// Released ranges whose release failed (see `note_released`).
    unsure: Vec<(u64, u64)>,
    /// Region ranges mapped from newer snapshot layers over the base file:
    /// data a later snapshot must read through the mapping although the
    /// base file has holes there.
    overlays: Vec<(u64, u64)>,
    /// The 2 MiB-aligned anonymous mapping `region` lives in
    /// ([`HotplugMemory::anonymous`]), unmapped when this is dropped. The
    /// region's other holders (the VM's memory view, device workers) are
    /// the VM's, which stops its vCPUs and devices before its devices, this
    /// one included, are dropped.
    _anonymous: Option<AlignedAnonymous>,
}

impl HotplugMemory {
    /// Creates `size` bytes at guest address `addr`, in chunks of `slot_size`
    /// (`size` is a multiple of it; the config checks).
    pub fn new(addr: u64, size: u64, slot_size: u64) -> Result<Self, MemoryError> {
        let memfd = create_memfd("spore-hotplug-mem")?;
        memfd
            .set_len(size)
            .map_err(|source| MemoryError::Truncate { size, source })?;
        Self::map(memfd, 0, false, addr, size, slot_size)
    }

    /// `size` bytes of anonymous private memory at guest address `addr`
    /// (see the module docs), with an empty memfd as the file a snapshot's
    /// offsets refer to: its contents are read through the mapping.
    pub fn anonymous(addr: u64, size: u64, slot_size: u64) -> Result<Self, MemoryError> {
        let memfd = create_memfd("spore-hotplug-mem")?;
        memfd
            .set_len(size)
            .map_err(|source| MemoryError::Truncate { size, source })?;
        let map = AlignedAnonymous::new(size)?;
        let mut hp = Self::with_mapping(memfd, 0, true, map.region()?, addr, size, slot_size)?;
        hp._anonymous = Some(map);
        Ok(hp)
    }

    /// Maps the region privately from a snapshot's memory file, where it
    /// starts at `file_offset` (the file must be at least that plus `size`
    /// bytes long; the snapshot loader checks). Nothing is read or copied:
    /// plugged blocks fault in from the file when the guest touches them.
    pub fn from_snapshot_file(
        file: File,
        file_offset: u64,
        addr: u64,
        size: u64,
        slot_size: u64,
    ) -> Result<Self, MemoryError> {
        Self::map(file, file_offset, true, addr, size, slot_size)
    }

    fn map(
        memfd: File,
        file_offset: u64,
        private: bool,
        addr: u64,
        size: u64,
        slot_size: u64,
    ) -> Result<Self, MemoryError> {
        let fd = memfd.try_clone().map_err(MemoryError::Memfd)?;
        let share = if private {
            libc::MAP_PRIVATE
        } else {
            libc::MAP_SHARED
        };
        let mapping = MmapRegion::build(
            Some(FileOffset::new(fd, file_offset)),
            host_usize::from_u64(size),
            libc::PROT_READ | libc::PROT_WRITE,
            share | libc::MAP_NORESERVE,
        )
        .map_err(|source| MemoryError::Mmap { size, source })?;
        Self::with_mapping(memfd, file_offset, private, mapping, addr, size, slot_size)
    }

    fn with_mapping(
        memfd: File,
        file_offset: u64,
        private: bool,
        mapping: MmapRegion<super::DirtyBitmap>,
        addr: u64,
        size: u64,
        slot_size: u64,
    ) -> Result<Self, MemoryError> {
        let region =
            GuestRegionMmap::new(mapping, GuestAddress(addr)).ok_or(MemoryError::Region(addr))?;
        let chunks = size.div_ceil(slot_size.max(1));
        Ok(Self {
            memfd,
            file_offset,
            private,
            region: Arc::new(region),
            addr,
            size,
            slot_size: slot_size.max(1),
            vm: None,
            registered: vec![false; host_usize::from_u64(chunks)],
            dirty_log: false,
            released: Vec::new(),
            unsure: Vec::new(),
            overlays: Vec::new(),
            _anonymous: None,
        })
    }

    /// Gives the region the VM whose slots it manages (a duplicate of the
    /// VM fd, usable from the device's thread).
    pub fn attach_vm(&mut self, vm: VmFd) {
        self.vm = Some(vm);
    }

    /// Makes every slot created from now on log dirty pages (set before
    /// the first slot: existing slots keep their flags).
    pub fn set_dirty_log(&mut self, on: bool) {
        self.dirty_log = on;
    }

    /// Ranges (region offsets) mapped from newer layers, see `overlays`.
    pub fn overlays(&self) -> &[(u64, u64)] {
        &self.overlays
    }

    /// Puts newer snapshot layers' ranges of the region over the base
    /// mapping (private mappings only): each `(region offset, len, file,
    /// file offset)` mapped from its file, or read in when short. Call
    /// before the guest runs.
    pub fn overlay_layers(&mut self, ranges: &[(u64, u64, &File, u64)]) -> Result<(), MemoryError> {
        if !self.private {
            return Err(MemoryError::Layers(std::io::Error::other(
                "layers overlay only a private mapping",
            )));
        }
        let mut maps = 0;
        for &(off, len, file, file_off) in ranges {
            if off.checked_add(len).is_none_or(|end| end > self.size) {
                return Err(MemoryError::Layers(std::io::Error::other(format!(
                    "a layer range at {off:#x}+{len:#x} lies outside the {:#x}-byte hotplug region",
                    self.size
                ))));
            }
            let map = len >= super::MIN_OVERLAY_MAP && maps < super::MAX_OVERLAY_MAPS;
            maps += usize::from(map);
            let host = self.region.as_ptr() as u64 + off;
            super::overlay(file, file_off, host, len, map).map_err(MemoryError::Layers)?;
            self.overlays.push((off, len));
        }
        self.overlays = super::pages::merge(std::mem::take(&mut self.overlays));
        Ok(())
    }

    /// The mapping, to add to the guest memory devices see.
    pub fn region(&self) -> Arc<GuestRegionMmap> {
        self.region.clone()
    }

    pub fn addr(&self) -> u64 {
        self.addr
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// Whether the region is a private mapping of a snapshot file (its
    /// contents are then readable only through the mapping).
    pub fn is_private(&self) -> bool {
        self.private
    }

    /// The file behind the mapping and where the region starts in it.
    pub fn file(&self) -> (&File, u64) {
        (&self.memfd, self.file_offset)
    }

    /// Host address of the region's first byte.
    pub fn host_addr(&self) -> *mut u8 {
        self.region.as_ptr()
    }

    /// Slot size in bytes.
    pub fn slot_size(&self) -> u64 {
        self.slot_size
    }

    /// Whether chunk `chunk` currently has a KVM slot.
    pub fn is_registered(&self, chunk: u64) -> bool {
        self.registered
            .get(host_usize::from_u64(chunk))
            .copied()
            .unwrap_or(false)
    }

    /// Number of chunks with a KVM slot.
    pub fn registered_slots(&self) -> usize {
        self.registered.iter().filter(|r| **r).count()
    }

    /// Makes chunk `chunk` reachable by the guest.
    pub fn add_slot(&mut self, chunk: u64) -> Result<(), HotplugError> {
        let (offset, len) = self.chunk_bounds(chunk)?;
        self.set_slot(chunk, offset, len, "add")?;
        self.registered[host_usize::from_u64(chunk)] = true;
        Ok(())
    }

    /// Takes chunk `chunk` away from the guest (KVM deletes a slot set to size 0).
    pub fn remove_slot(&mut self, chunk: u64) -> Result<(), HotplugError> {
        let (offset, _) = self.chunk_bounds(chunk)?;
        self.set_slot(chunk, offset, 0, "remove")?;
        self.registered[host_usize::from_u64(chunk)] = false;
        Ok(())
    }

    fn chunk_bounds(&self, chunk: u64) -> Result<(u64, u64), HotplugError> {
        if host_usize::from_u64(chunk) >= self.registered.len() {
            return Err(HotplugError::Chunk(chunk));
        }
        let offset = chunk * self.slot_size;
        Ok((offset, self.slot_size.min(self.size - offset)))
    }

    fn set_slot(
        &self,
        chunk: u64,
        offset: u64,
        len: u64,
        what: &'static str,
    ) -> Result<(), HotplugError> {
        let Some(vm) = &self.vm else {
            return Ok(());
        };
        let slot = kvm_slot(chunk);
        let r = kvm_userspace_memory_region {
            slot,
            flags: if self.dirty_log {
                kvm_bindings::KVM_MEM_LOG_DIRTY_PAGES
            } else {
                0
            },
            guest_phys_addr: self.addr + offset,
            memory_size: len,
            userspace_addr: self.region.as_ptr() as u64 + offset,
        };
        let t = std::time::Instant::now();
        // SAFETY: the range lies inside the mapping `self.region` keeps
        // alive, and `Drop` deletes every slot before that Arc is released,
        // so KVM never holds a slot over unmapped (or remapped) host memory.
        let result = unsafe { vm.set_user_memory_region(r) };
        tracing::debug!(
            "hotplug memory: {what} slot {slot}: {} us",
            t.elapsed().as_micros()
        );
        result.map_err(|source| HotplugError::Slot { what, slot, source })
    }

    /// Releases `len` bytes at `offset` in the region to the host.
    pub fn discard(&mut self, offset: u64, len: u64) -> Result<(), HotplugError> {
        let err = |source| HotplugError::Discard {
            offset,
            len,
            source,
        };
        if offset.checked_add(len).is_none_or(|end| end > self.size) {
            return Err(err(std::io::Error::from(std::io::ErrorKind::InvalidInput)));
        }
        let done = if self.private {
            self.replace_with_anonymous(offset, len)
        } else {
            self.punch_hole(offset, len)
        };
        self.note_released(offset, len, done.is_err());
        done.map_err(err)
    }

    fn punch_hole(&self, offset: u64, len: u64) -> std::io::Result<()> {
        // SAFETY: plain syscall on a file we own; it changes no memory this
        // process relies on (punched pages read back as zeros).
        let rc = unsafe {
            libc::fallocate(
                self.memfd.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                offset as libc::off_t,
                len as libc::off_t,
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Private mappings: swaps `[offset, offset + len)` of the mapping for
    /// fresh anonymous memory. `MADV_DONTNEED` would free the copy-on-write
    /// pages too, but the guest would then read the snapshot file's old
    /// contents when the block is plugged again, not zeros.
    fn replace_with_anonymous(&self, offset: u64, len: u64) -> std::io::Result<()> {
        if len == 0 {
            return Ok(());
        }
        // SAFETY: the range lies inside the mapping `self.region` owns
        // (checked by the caller), so MAP_FIXED replaces only our own pages;
        // the mapping stays valid (same address, same protection), so
        // neither vm-memory's view nor KVM's slots go stale: KVM's MMU
        // notifier drops the old pages from the guest.
        let p = unsafe {
            libc::mmap(
                self.region
                    .as_ptr()
                    .add(host_usize::from_u64(offset))
                    .cast(),
                host_usize::from_u64(len),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Records a release for the next diff. One that failed may have
    /// dropped part of the range or nothing (the block then stays plugged
    /// with its data): its pages are counted as written too, so the diff
    /// holds whatever they read now.
    fn note_released(&mut self, offset: u64, len: u64, failed: bool) {
        if !self.dirty_log || len == 0 {
            return;
        }
        self.released.push((offset, len));
        if failed {
            self.unsure.push((offset, len));
        }
        // A guest plugging and unplugging in a loop must not grow this
        // without bound: merged, it is at most one range per block.
        if self.released.len() > 1024 {
            self.released = super::pages::merge(std::mem::take(&mut self.released));
        }
        if self.unsure.len() > 1024 {
            self.unsure = super::pages::merge(std::mem::take(&mut self.unsure));
        }
    }

    /// Reads and clears what changed in the region since the last call: a
    /// bitmap of the pages written (KVM's log of every slot, which needs
    /// `dirty_log`, and the VMM's own writes through vm-memory), bit `i` =
    /// page `i` of the region, and the ranges released (merged, region
    /// offsets). Call with the vCPUs paused and the device quiesced. It
    /// cannot fail: what cannot be read counts as written.
    pub fn take_dirty(&mut self) -> RegionChanges {
        let pages = self.size.div_ceil(PAGE);
        let mut bits = vec![0u64; host_usize::from_u64(pages.div_ceil(64))];
        let mapping: &MmapRegion<super::DirtyBitmap> = &self.region;
        or_bits(&mut bits, 0, &mapping.bitmap().get_and_reset());
        let mut whole = std::mem::take(&mut self.unsure);
        if let Some(vm) = &self.vm {
            for chunk in 0..self.registered.len() as u64 {
                if !self.is_registered(chunk) {
                    continue;
                }
                let offset = chunk * self.slot_size;
                let len = self.slot_size.min(self.size - offset);
                let slot = kvm_slot(chunk);
                match vm.get_dirty_log(slot, host_usize::from_u64(len)) {
                    Ok(log) => or_bits(&mut bits, offset / PAGE, &log),
                    // Failing the snapshot here would lose what was read
                    // and cleared already: the whole chunk counts instead.
                    Err(e) => {
                        tracing::warn!(
                            "hotplug memory: cannot read the dirty log of slot {slot} ({e}): \
                             its whole chunk goes into the next diff"
                        );
                        whole.push((offset, len));
                    }
                }
            }
        }
        for (offset, len) in whole {
            for page in offset / PAGE..(offset + len).div_ceil(PAGE) {
                if let Some(w) = bits.get_mut((page / 64) as usize) {
                    *w |= 1 << (page % 64);
                }
            }
        }
        let released = super::pages::merge(std::mem::take(&mut self.released));
        RegionChanges {
            written: bits,
            released,
        }
    }

    /// Bytes of host memory the region holds (for tests and accounting):
    /// the memfd's allocated blocks, or for a private mapping its resident
    /// pages (copy-on-write copies and file pages it maps).
    pub fn resident_bytes(&self) -> u64 {
        use std::os::unix::fs::MetadataExt;
        if self.private {
            return super::pages::resident_ranges(
                self.region.as_ptr(),
                host_usize::from_u64(self.size),
            )
            .map(|r| r.iter().map(|(_, l)| l).sum())
            .unwrap_or(0);
        }
        self.memfd.metadata().map(|m| m.blocks() * 512).unwrap_or(0)
    }
}

const PAGE: u64 = 4096;

/// ORs `src` (bit `j` = page `first + j`) into `dst` (bit `i` = page `i`),
/// dropping bits past `dst`'s end.
fn or_bits(dst: &mut [u64], first: u64, src: &[u64]) {
    for (w, &word) in src.iter().enumerate() {
        let mut bits = word;
        while bits != 0 {
            let b = u64::from(bits.trailing_zeros());
            bits &= bits - 1;
            let page = first + w as u64 * 64 + b;
            if let Some(d) = dst.get_mut((page / 64) as usize) {
                *d |= 1 << (page % 64);
            }
        }
    }
}

impl Drop for HotplugMemory {
    fn drop(&mut self) {
        for chunk in 0..self.registered.len() as u64 {
            if self.is_registered(chunk) {
                if let Err(e) = self.remove_slot(chunk) {
                    tracing::error!("hotplug memory: {e}");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use vm_memory::{Bytes, GuestMemoryBackend};

    use super::*;

    #[test]
    fn discard_returns_memory() {
        let mib = 1u64 << 20;
        let mut hp = HotplugMemory::new(4 << 30, 64 * mib, 16 * mib).unwrap();
        let mem = crate::memory::GuestMemoryMmap::from_arc_regions(vec![hp.region()]).unwrap();
        let buf = vec![0x5au8; host_usize::from_u64(8 * mib)];
        mem.write_slice(&buf, GuestAddress((4 << 30) + 16 * mib))
            .unwrap();
        assert!(hp.resident_bytes() >= 8 * mib);
        hp.discard(16 * mib, 8 * mib).unwrap();
        assert!(hp.resident_bytes() < mib);
        let v: u8 = mem.read_obj(GuestAddress((4 << 30) + 16 * mib)).unwrap();
        assert_eq!(v, 0, "punched memory reads back as zeros");
        assert!(hp.discard(60 * mib, 8 * mib).is_err());
        assert!(mem.find_region(GuestAddress(4 << 30)).is_some());
    }
}
