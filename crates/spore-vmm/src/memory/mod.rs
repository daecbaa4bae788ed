//! Guest RAM: the host memory behind the guest's physical memory, and the
//! file it is (or could be) read from, registered with KVM.
//!
//! A booted VM's RAM is anonymous private memory ([`GuestRam::anonymous`]):
//! the kernel backs it with transparent huge pages where the host's policy
//! allows (`/sys/kernel/mm/transparent_hugepage/enabled`), so a guest touching
//! fresh memory takes one fault per 2 MiB instead of one per 4 KiB page and
//! KVM maps it with large pages. Measured in the nested harness (L1 with THP
//! `always`), this is what made a Linux guest reach `init` as fast as under
//! Firecracker, which maps anonymous memory too; the shared memfd spore used
//! before (shmem gets huge pages only with `shmem_enabled`, `never` by
//! default) faulted 4 KiB at a time. Such RAM is handled as a private
//! mapping of an empty memfd: a snapshot reads it through the mapping, and a
//! clone template copies the pages the VM touched into a memfd layer once,
//! when the VM is first cloned ([`template`]).
//!
//! Restores that fill RAM themselves (eager, working set, userfaultfd) use a
//! shared memfd ([`GuestRam::new`]), written through the file; lazy restores
//! and clones map memory files privately.

pub mod hotplug;
pub mod hugetlb;
pub mod layers;
pub mod pages;
pub mod template;

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};

use kvm_bindings::kvm_userspace_memory_region;
use kvm_ioctls::VmFd;
use layers::MemoryLayers;
use template::MemoryLayer;
use vm_memory::{FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryRegion, MmapRegion};

use crate::arch::layout;
use crate::host_usize;

#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    #[error("cannot create the guest memory file: {0}")]
    Memfd(#[source] std::io::Error),
    #[error("cannot size the guest memory file to {size} bytes: {source}")]
    Truncate {
        size: u64,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot map {size} bytes of guest memory: {source}")]
    Mmap {
        size: u64,
        #[source]
        source: vm_memory::mmap::MmapRegionError,
    },
    #[error("guest memory region at {0:#x} overlaps or overflows")]
    Region(u64),
    #[error("cannot overlay the snapshot layers onto guest memory: {0}")]
    Layers(#[source] std::io::Error),
    #[error("huge pages: {0}")]
    HugePages(String),
    #[error("cannot register guest memory slot {slot} with KVM: {source}")]
    Slot {
        slot: u32,
        #[source]
        source: kvm_ioctls::Error,
    },
}

/// Guest memory as the VMM maps it. Every region carries a dirty bitmap:
/// writes the VMM makes through vm-memory (a device filling a guest buffer)
/// are not in KVM's dirty log, and a diff snapshot must include them.
pub type GuestMemoryMmap = vm_memory::GuestMemoryMmap<DirtyBitmap>;
/// One region of [`GuestMemoryMmap`].
pub type GuestRegionMmap = vm_memory::GuestRegionMmap<DirtyBitmap>;
/// The per-region bitmap of pages the VMM wrote (one bit per 4 KiB page).
pub type DirtyBitmap = vm_memory::bitmap::AtomicBitmap;

/// Guest RAM and the file behind it.
pub struct GuestRam {
    memfd: File,
    mem: GuestMemoryMmap,
    size: u64,
    /// Mapped copy-on-write from a snapshot's memory file (or a clone
    /// template): the guest's writes live in anonymous memory, not in
    /// `memfd`. Set later when a running VM becomes a clone template.
    private: AtomicBool,
    /// Ranges (memory-file offsets) mapped from diff layers over `memfd`
    /// (the base layer): data a later snapshot must read through the
    /// mapping although `memfd` has holes there.
    overlays: Vec<(u64, u64)>,
    /// The files a private mapping was made from, as template layers (the
    /// base, then each diff layer's mapped runs): what a clone of this VM
    /// maps before the pages this VM wrote or read in itself.
    mapped_from: Vec<MemoryLayer>,
    /// The hotplug region's ranges that newer layers of the chain supply,
    /// as (file offset, len, layer file): the region is mapped later, by
    /// the virtio-mem device, from the base and these on top.
    region_layers: Vec<(u64, u64, std::sync::Arc<File>)>,
    /// Backed by 2 MiB hugetlbfs pages.
    hugetlb: bool,
    /// The anonymous mappings `mem`'s regions live in ([`GuestRam::anonymous`]),
    /// unmapped when this is dropped: declared after `mem`, so after it.
    _anonymous: Vec<AlignedAnonymous>,
}

impl GuestRam {
    /// Creates `size` bytes of guest RAM laid out around the MMIO hole.
    pub fn new(size: u64) -> Result<Self, MemoryError> {
        let memfd = create_memfd("spore-guest-ram")?;
        memfd
            .set_len(size)
            .map_err(|source| MemoryError::Truncate { size, source })?;
        Self::map(memfd, size, libc::MAP_SHARED, false, false)
    }

    /// `size` bytes of anonymous private RAM for a VM that boots (see the
    /// module docs): a private mapping over an empty memfd base, so that
    /// every path that reads or clones private RAM applies unchanged.
    pub fn anonymous(size: u64) -> Result<Self, MemoryError> {
        let base = create_memfd("spore-guest-ram")?;
        base.set_len(size)
            .map_err(|source| MemoryError::Truncate { size, source })?;
        let mut regions = Vec::new();
        let mut maps = Vec::new();
        for (gpa, len) in layout::ram_regions(size) {
            let map = AlignedAnonymous::new(len)?;
            let region = GuestRegionMmap::new(map.region()?, GuestAddress(gpa))
                .ok_or(MemoryError::Region(gpa))?;
            regions.push(region);
            maps.push(map);
        }
        let mem = GuestMemoryMmap::from_regions(regions).map_err(|_| MemoryError::Region(0))?;
        let mapped_from = vec![MemoryLayer {
            file: std::sync::Arc::new(base.try_clone().map_err(MemoryError::Memfd)?),
            runs: None,
        }];
        Ok(Self {
            memfd: base,
            mem,
            size,
            private: AtomicBool::new(true),
            overlays: Vec::new(),
            mapped_from,
            region_layers: Vec::new(),
            hugetlb: false,
            _anonymous: maps,
        })
    }

    /// [`GuestRam::new`] on 2 MiB hugetlbfs pages, all reserved now
    /// ([`hugetlb`]): fails cleanly when the host has too few free.
    pub fn new_hugetlb(size: u64) -> Result<Self, MemoryError> {
        let memfd = hugetlb::create(size)?;
        Self::map(memfd, size, libc::MAP_SHARED, false, true).map_err(|e| match e {
            MemoryError::Mmap { source, .. } => hugetlb::shortage(size, &source),
            other => other,
        })
    }

    /// Whether RAM is on hugetlbfs pages (a snapshot's memory cannot be
    /// mapped back that way, see `snapshot::restore`).
    pub fn is_hugetlb(&self) -> bool {
        self.hugetlb
    }

    /// Maps a snapshot's memory file privately (copy-on-write): pages fault
    /// in lazily from the page cache, are shared with every other VM mapping
    /// the same file, and the file itself is never written.
    pub fn from_snapshot_file(file: File, size: u64) -> Result<Self, MemoryError> {
        Self::map(file, size, libc::MAP_PRIVATE, true, false)
    }

    fn map(
        memfd: File,
        size: u64,
        share: i32,
        private: bool,
        hugetlb: bool,
    ) -> Result<Self, MemoryError> {
        // hugetlbfs RAM is reserved up front (no MAP_NORESERVE): see [`hugetlb`].
        let noreserve = if hugetlb { 0 } else { libc::MAP_NORESERVE };
        let mut regions = Vec::new();
        let mut file_offset = 0u64;
        for (gpa, len) in layout::ram_regions(size) {
            let fd = memfd.try_clone().map_err(MemoryError::Memfd)?;
            let mapping = MmapRegion::build(
                Some(FileOffset::new(fd, file_offset)),
                host_usize::from_u64(len),
                libc::PROT_READ | libc::PROT_WRITE,
                share | noreserve,
            )
            .map_err(|source| MemoryError::Mmap { size: len, source })?;
            let region =
                GuestRegionMmap::new(mapping, GuestAddress(gpa)).ok_or(MemoryError::Region(gpa))?;
            regions.push(region);
            file_offset += len;
        }
        let mem = GuestMemoryMmap::from_regions(regions).map_err(|_| MemoryError::Region(0))?;
        let mapped_from = if private {
            vec![MemoryLayer {
                file: std::sync::Arc::new(memfd.try_clone().map_err(MemoryError::Memfd)?),
                runs: None,
            }]
        } else {
            Vec::new()
        };
        Ok(Self {
            memfd,
            mem,
            size,
            private: AtomicBool::new(private),
            overlays: Vec::new(),
            mapped_from,
            region_layers: Vec::new(),
            hugetlb,
            _anonymous: Vec::new(),
        })
    }

    /// Maps a snapshot chain privately: the base layer lazily, as
    /// [`GuestRam::from_snapshot_file`], and every range a diff layer
    /// supplies (newest layer wins, see [`MemoryLayers::extents`]) mapped
    /// from that layer's file on top (`MAP_FIXED | MAP_PRIVATE`), so diff
    /// pages fault in lazily too and stay shared in the page cache. Short
    /// ranges (under 64 KiB), ranges that are not page-aligned, and ranges
    /// beyond `max_overlay_maps` (each mapping is a kernel VMA, and a
    /// process has a limited number) are read in instead.
    pub fn from_layers(layers: &MemoryLayers) -> Result<Self, MemoryError> {
        Self::from_layers_with(layers, MAX_OVERLAY_MAPS)
    }

    pub(crate) fn from_layers_with(
        layers: &MemoryLayers,
        max_overlay_maps: usize,
    ) -> Result<Self, MemoryError> {
        let base = layers
            .base()
            .ok_or_else(|| MemoryError::Layers(std::io::Error::other("no layers")))?
            .try_clone()
            .map_err(MemoryError::Layers)?;
        let mut ram = Self::from_snapshot_file(base, layers.size())?;
        if layers.files().len() < 2 {
            return Ok(ram);
        }
        for e in layers.region_extents().map_err(MemoryError::Layers)? {
            if e.layer > 0 {
                let file = layers.files()[e.layer]
                    .try_clone()
                    .map_err(MemoryError::Layers)?;
                ram.region_layers
                    .push((e.offset, e.len, std::sync::Arc::new(file)));
            }
        }
        let overlays: Vec<_> = layers
            .extents()
            .map_err(MemoryError::Layers)?
            .into_iter()
            .filter(|e| e.layer > 0)
            .collect();
        let mut maps = 0;
        let spans: Vec<(u64, u64, u64)> = {
            let mut off = 0;
            ram.mem
                .iter()
                .map(|r| {
                    let s = (off, r.as_ptr() as u64, r.len());
                    off += r.len();
                    s
                })
                .collect()
        };
        // Per diff layer, the runs mapped from its file (read-in ranges
        // become the mapping's own pages instead).
        let mut mapped_runs: Vec<Vec<(u64, u64)>> = vec![Vec::new(); layers.files().len()];
        for e in &overlays {
            let file = &layers.files()[e.layer];
            // An mmap costs a syscall and a VMA: worth it (and lazy) for
            // runs of pages; single scattered pages are cheaper read in.
            let map = e.len >= MIN_OVERLAY_MAP && maps < max_overlay_maps;
            maps += usize::from(map);
            for &(span_off, host, span_len) in &spans {
                let lo = e.offset.max(span_off);
                let hi = (e.offset + e.len).min(span_off + span_len);
                if lo < hi
                    && overlay(file, lo, host + (lo - span_off), hi - lo, map)
                        .map_err(MemoryError::Layers)?
                {
                    mapped_runs[e.layer].push((lo, hi - lo));
                }
            }
        }
        for (layer, runs) in mapped_runs.into_iter().enumerate() {
            if !runs.is_empty() {
                ram.mapped_from.push(MemoryLayer {
                    file: std::sync::Arc::new(
                        layers.files()[layer]
                            .try_clone()
                            .map_err(MemoryError::Layers)?,
                    ),
                    runs: Some(runs),
                });
            }
        }
        ram.overlays = overlays.iter().map(|e| (e.offset, e.len)).collect();
        Ok(ram)
    }

    /// The hotplug region's ranges newer layers supply (see `region_layers`).
    pub fn region_layers(&self) -> &[(u64, u64, std::sync::Arc<File>)] {
        &self.region_layers
    }

    /// Memory-file ranges mapped from diff layers (see `from_layers`).
    pub fn overlays(&self) -> &[(u64, u64)] {
        &self.overlays
    }

    /// The layers a private mapping was made from (empty for shared RAM);
    /// see [`GuestRam::private_layer`] for the pages on top of them.
    pub fn mapped_from(&self) -> &[MemoryLayer] {
        &self.mapped_from
    }

    /// Whether the guest's memory is a private (copy-on-write) mapping, so
    /// that its contents can only be read through the mapping.
    pub fn is_private(&self) -> bool {
        self.private.load(Ordering::SeqCst)
    }

    pub fn memory(&self) -> &GuestMemoryMmap {
        &self.mem
    }

    pub fn memfd(&self) -> &File {
        &self.memfd
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// Registers every region as a KVM memory slot (slots 0..n).
    pub fn register(&self, vm: &VmFd, dirty_log: bool) -> Result<(), MemoryError> {
        let flags = if dirty_log {
            kvm_bindings::KVM_MEM_LOG_DIRTY_PAGES
        } else {
            0
        };
        for (slot, region) in (0u32..).zip(self.mem.iter()) {
            let r = kvm_userspace_memory_region {
                slot,
                flags,
                guest_phys_addr: region.start_addr().0,
                memory_size: region.len(),
                userspace_addr: region.as_ptr() as u64,
            };
            // SAFETY: the region stays mapped for as long as the VM exists:
            // `GuestRam` outlives the VmFd in `Vm` (field order).
            unsafe { vm.set_user_memory_region(r) }
                .map_err(|source| MemoryError::Slot { slot, source })?;
        }
        Ok(())
    }
}

/// At most this many diff extents are mapped by `from_layers`; the rest are
/// read in (Linux's default limit is 65530 mappings per process).
pub(crate) const MAX_OVERLAY_MAPS: usize = 16384;
/// Diff extents shorter than this are read in rather than mapped: measured
/// on a 512 MiB guest with a 25 MiB diff, mapping 6400 single pages took
/// 121 ms against 90 ms to read them, while one 25 MiB run maps in 52 µs.
const MIN_OVERLAY_MAP: u64 = 64 << 10;

/// Puts `len` bytes of `file` at `file_off` at host address `host` (inside a
/// private guest RAM mapping): mapped there when `map` and everything is
/// page-aligned, else read in.
/// Puts a file range at `host`: mapped privately (returns true) when asked
/// and aligned, else read in (false).
fn overlay(file: &File, file_off: u64, host: u64, len: u64, map: bool) -> std::io::Result<bool> {
    const PAGE: u64 = 4096;
    if map && file_off.is_multiple_of(PAGE) && host.is_multiple_of(PAGE) && len.is_multiple_of(PAGE)
    {
        // SAFETY: [host, host + len) lies inside one guest RAM mapping owned
        // by the GuestRam being built (computed from its regions); replacing
        // part of it with another private file mapping keeps it valid memory
        // of the same size, and the region's munmap on drop covers it.
        let p = unsafe {
            libc::mmap(
                host as *mut libc::c_void,
                host_usize::from_u64(len),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_FIXED | libc::MAP_NORESERVE,
                file.as_raw_fd(),
                file_off as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        return Ok(true);
    }
    // SAFETY: as above, [host, host + len) is guest RAM we own, and nothing
    // runs in the guest yet.
    let buf = unsafe { std::slice::from_raw_parts_mut(host as *mut u8, host_usize::from_u64(len)) };
    file.read_exact_at(buf, file_off).map(|()| false)
}

/// Huge page size of transparent huge pages on x86_64.
const THP_SIZE: usize = 2 << 20;

/// An anonymous private mapping whose start is 2 MiB-aligned, unmapped on
/// drop. KVM maps guest memory with large pages only where the host address
/// and the guest-physical address agree modulo 2 MiB; `mmap` places a
/// mapping on any page (kernels before 6.7 do not align large anonymous
/// mappings), which left every guest access a 4 KiB fault in the nested
/// harness although the host had huge pages behind it. So the mapping is
/// made 2 MiB larger and trimmed to an aligned start. vm-memory maps only
/// at an address of the kernel's choosing, so its region borrows this one
/// ([`Self::region`]) and the owner of both keeps this alive as long.
pub(crate) struct AlignedAnonymous {
    addr: usize,
    len: usize,
}

impl AlignedAnonymous {
    pub(crate) fn new(len: u64) -> Result<Self, MemoryError> {
        let len = host_usize::from_u64(len);
        let fail = |source: std::io::Error| MemoryError::Mmap {
            size: len as u64,
            source: vm_memory::mmap::MmapRegionError::Mmap(source),
        };
        let reserve = len
            .checked_add(THP_SIZE)
            .ok_or_else(|| fail(std::io::Error::from(std::io::ErrorKind::InvalidInput)))?;
        // SAFETY: a new anonymous mapping at an address the kernel picks;
        // it touches no existing memory.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                reserve,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(fail(std::io::Error::last_os_error()));
        }
        let start = p as usize;
        let aligned = start.next_multiple_of(THP_SIZE);
        let head = aligned - start;
        let tail = reserve - head - len;
        // SAFETY: both ranges lie in the mapping just made and outside the
        // part kept; unmapping them frees address space only.
        unsafe {
            if head > 0 {
                libc::munmap(start as *mut libc::c_void, head);
            }
            if tail > 0 {
                libc::munmap((aligned + len) as *mut libc::c_void, tail);
            }
        }
        Ok(Self { addr: aligned, len })
    }

    /// A vm-memory region over this mapping (it does not own it).
    pub(crate) fn region(&self) -> Result<MmapRegion<DirtyBitmap>, MemoryError> {
        let bitmap = <DirtyBitmap as vm_memory::bitmap::NewBitmap>::with_len(self.len);
        // SAFETY: [addr, addr + len) is a live mapping this value owns, and
        // its owner keeps it alive as long as the region (see the type docs).
        unsafe {
            vm_memory::mmap::MmapRegionBuilder::new_with_bitmap(self.len, bitmap)
                .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE)
                .with_mmap_flags(libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE)
                .with_raw_mmap_pointer(self.addr as *mut u8)
        }
        .build()
        .map_err(|source| MemoryError::Mmap {
            size: self.len as u64,
            source,
        })
    }
}

impl Drop for AlignedAnonymous {
    fn drop(&mut self) {
        // SAFETY: the mapping this value made; its regions are gone (the
        // owner declares this after them).
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) };
    }
}

pub(crate) fn create_memfd(name: &str) -> Result<File, MemoryError> {
    let cname = std::ffi::CString::new(name)
        .map_err(|_| MemoryError::Memfd(std::io::Error::from(std::io::ErrorKind::InvalidInput)))?;
    // SAFETY: cname is a valid NUL-terminated string.
    let fd = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(MemoryError::Memfd(std::io::Error::last_os_error()));
    }
    // SAFETY: fd was just created and is owned by nobody else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use vm_memory::Bytes;

    use super::*;

    /// Anonymous RAM reads as zeros, holds what is written, and is a private
    /// mapping over an empty base: a snapshot finds the written page
    /// through the mapping, the base file stays empty.
    #[test]
    fn anonymous_ram_is_private_over_an_empty_base() {
        let size = 64 << 20;
        let ram = GuestRam::anonymous(size).unwrap();
        assert!(ram.is_private());
        assert_eq!(ram.mapped_from().len(), 1);
        let v: u32 = ram.memory().read_obj(GuestAddress(0x20_0000)).unwrap();
        assert_eq!(v, 0);
        ram.memory()
            .write_obj(0xdead_beefu32, GuestAddress(0x1000))
            .unwrap();
        let v: u32 = ram.memory().read_obj(GuestAddress(0x1000)).unwrap();
        assert_eq!(v, 0xdead_beef);
        assert_eq!(ram.memfd().metadata().unwrap().len(), size);
        assert_eq!(pages::data_ranges(ram.memfd(), size).unwrap(), vec![]);
        let runs = ram.private_runs().unwrap();
        assert!(runs.iter().any(|&(o, l)| o <= 0x1000 && 0x1000 < o + l));
        for region in ram.memory().iter() {
            assert_eq!(region.as_ptr() as usize % THP_SIZE, 0, "not 2 MiB-aligned");
        }
    }

    #[test]
    fn ram_is_backed_by_one_memfd() {
        let ram = GuestRam::new(64 << 20).unwrap();
        assert_eq!(ram.memfd().metadata().unwrap().len(), 64 << 20);
        ram.memory()
            .write_obj(0xdead_beefu32, GuestAddress(0x1000))
            .unwrap();
        let v: u32 = ram.memory().read_obj(GuestAddress(0x1000)).unwrap();
        assert_eq!(v, 0xdead_beef);
        assert!(ram.memory().write_obj(1u8, GuestAddress(64 << 20)).is_err());
    }
}
