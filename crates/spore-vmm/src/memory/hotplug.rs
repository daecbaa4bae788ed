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
//! block is plugged again — the same contract as a punched memfd.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use kvm_bindings::kvm_userspace_memory_region;
use kvm_ioctls::VmFd;
use vm_memory::{FileOffset, GuestAddress, MmapRegion};

use super::GuestRegionMmap;

use super::{create_memfd, AlignedAnonymous, MemoryError};

/// First KVM slot id of the hotplug region; boot RAM uses slots 0 and 1.
pub const FIRST_SLOT: u32 = 16;

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
            size as usize,
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
            registered: vec![false; chunks as usize],
            _anonymous: None,
        })
    }

    /// Gives the region the VM whose slots it manages (a duplicate of the
    /// VM fd, usable from the device's thread).
    pub fn attach_vm(&mut self, vm: VmFd) {
        self.vm = Some(vm);
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
            .get(chunk as usize)
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
        self.registered[chunk as usize] = true;
        Ok(())
    }

    /// Takes chunk `chunk` away from the guest (KVM deletes a slot set to size 0).
    pub fn remove_slot(&mut self, chunk: u64) -> Result<(), HotplugError> {
        let (offset, _) = self.chunk_bounds(chunk)?;
        self.set_slot(chunk, offset, 0, "remove")?;
        self.registered[chunk as usize] = false;
        Ok(())
    }

    fn chunk_bounds(&self, chunk: u64) -> Result<(u64, u64), HotplugError> {
        if chunk as usize >= self.registered.len() {
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
        let slot = FIRST_SLOT + chunk as u32;
        let r = kvm_userspace_memory_region {
            slot,
            flags: 0,
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
    pub fn discard(&self, offset: u64, len: u64) -> Result<(), HotplugError> {
        let err = |source| HotplugError::Discard {
            offset,
            len,
            source,
        };
        if offset.checked_add(len).is_none_or(|end| end > self.size) {
            return Err(err(std::io::Error::from(std::io::ErrorKind::InvalidInput)));
        }
        if self.private {
            return self.replace_with_anonymous(offset, len).map_err(err);
        }
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
            return Err(err(std::io::Error::last_os_error()));
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
                self.region.as_ptr().add(offset as usize).cast(),
                len as usize,
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

    /// Bytes of host memory the region holds (for tests and accounting):
    /// the memfd's allocated blocks, or for a private mapping its resident
    /// pages (copy-on-write copies and file pages it maps).
    pub fn resident_bytes(&self) -> u64 {
        use std::os::unix::fs::MetadataExt;
        if self.private {
            return super::pages::resident_ranges(self.region.as_ptr(), self.size as usize)
                .map(|r| r.iter().map(|(_, l)| l).sum())
                .unwrap_or(0);
        }
        self.memfd.metadata().map(|m| m.blocks() * 512).unwrap_or(0)
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
    use super::*;
    use vm_memory::{Bytes, GuestMemoryBackend};

    #[test]
    fn discard_returns_memory() {
        let mib = 1u64 << 20;
        let hp = HotplugMemory::new(4 << 30, 64 * mib, 16 * mib).unwrap();
        let mem = crate::memory::GuestMemoryMmap::from_arc_regions(vec![hp.region()]).unwrap();
        let buf = vec![0x5au8; (8 * mib) as usize];
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
