//! The ring-3 unikernel boot protocol.
//!
//! The VMM loads a static ELF marked with the [`NOTE_NAME`] note, identity-maps
//! all guest RAM with 2 MiB user+writable pages, and enters the ELF entry point
//! in 64-bit mode at CPL 3 with IOPL 3 and interrupts off. RDI holds the
//! guest-physical (= virtual) address of a [`BootInfo`] block; RSP points to the
//! top of a stack of [`STACK_SIZE`] bytes. Everything is little-endian `repr(C)`.
//!
//! Guest-physical layout chosen by the VMM (below the ELF image):
//!
//! | range                      | what                          |
//! |----------------------------|-------------------------------|
//! | `GDT_ADDR`                 | GDT                           |
//! | `PML4_ADDR`, `PDPT_ADDR`   | PML4 and PDPT (one page each) |
//! | `BOOT_INFO_ADDR`           | [`BootInfo`] (one page)       |
//! | `CMDLINE_ADDR`             | command line, NUL-terminated  |
//! | `PD_ADDR` ..               | page directories, one per GiB |
//! | `STACK_TOP - STACK_SIZE` ..| stack                         |
//!
//! The ELF image must be linked at or above [`MIN_IMAGE_ADDR`]. Free RAM for the
//! heap is listed in [`BootInfo::mem_regions`] with kind [`MEM_FREE`].

/// Name of the ELF note (in a `PT_NOTE` segment) that marks a spore unikernel.
pub const NOTE_NAME: &[u8] = b"spore";
/// Type of that note. Its descriptor is a 4-byte protocol version.
pub const NOTE_TYPE: u32 = 0x5350_0001;
/// Protocol version carried in the note and in [`BootInfo::version`].
pub const PROTOCOL_VERSION: u32 = 1;

/// "SPOREUK1" as a little-endian u64.
pub const BOOT_INFO_MAGIC: u64 = u64::from_le_bytes(*b"SPOREUK1");

pub const GDT_ADDR: u64 = 0x1000;
pub const PML4_ADDR: u64 = 0x2000;
pub const PDPT_ADDR: u64 = 0x3000;
pub const BOOT_INFO_ADDR: u64 = 0x4000;
/// The VM's clone generation (little-endian u64, 0 at boot), in the last
/// 8 bytes of the boot-info page: the VMM rewrites it when it clones the VM
/// (see `signal` for the contract).
pub const GENERATION_ADDR: u64 = BOOT_INFO_ADDR + 0x1000 - 8;
/// The VM's clone number (little-endian u64): 0 for a booted VM, the
/// number its source gave it (1, 2, ... per source, what a guest `FORK`
/// returns to it) in a clone. Below the network identity block (`net`);
/// the VMM writes it with the generation, before the clone first runs.
pub const CLONE_INDEX_ADDR: u64 = GENERATION_ADDR - 40;
pub const CMDLINE_ADDR: u64 = 0x5000;
pub const CMDLINE_MAX: usize = 0x1000;
/// Page directories for up to 64 GiB of identity map (64 pages).
pub const PD_ADDR: u64 = 0x1_0000;
pub const MAX_IDENTITY_GIB: u64 = 64;
/// The stack sits right below the lowest image address.
pub const STACK_SIZE: u64 = 0x4_0000;
pub const STACK_TOP: u64 = 0x10_0000;
/// Lowest address an image may be loaded at (1 MiB).
pub const MIN_IMAGE_ADDR: u64 = 0x10_0000;

pub const MAX_MEM_REGIONS: usize = 16;
pub const MAX_MMIO_DEVICES: usize = 32;

/// RAM the guest may use freely (heap).
pub const MEM_FREE: u32 = 1;
/// RAM the VMM used for the image, page tables, boot info or stack.
pub const MEM_RESERVED: u32 = 2;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemRegion {
    pub addr: u64,
    pub size: u64,
    pub kind: u32,
    pub _pad: u32,
}

/// One virtio-mmio device: the guest probes its registers at `base`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MmioDevice {
    pub base: u64,
    pub size: u64,
    /// Virtio device id (2 = block, 4 = rng, 19 = vsock, ...).
    pub device_id: u32,
    pub irq: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BootInfo {
    pub magic: u64,
    pub version: u32,
    /// `size_of::<BootInfo>()` as written by the VMM.
    pub size: u32,
    /// TSC frequency in kHz as KVM reports it, 0 if unknown.
    pub tsc_khz: u64,
    /// Total guest RAM in bytes.
    pub mem_size: u64,
    pub cmdline_addr: u64,
    /// Length of the command line without its NUL.
    pub cmdline_len: u64,
    pub mem_region_count: u32,
    pub mmio_device_count: u32,
    pub mem_regions: [MemRegion; MAX_MEM_REGIONS],
    pub mmio_devices: [MmioDevice; MAX_MMIO_DEVICES],
}

/// `size_of::<BootInfo>()`, the `size` field's value.
#[allow(
    clippy::cast_possible_truncation,
    reason = "the block fits below CLONE_INDEX_ADDR (asserted at the end of this file), far below 4 GiB"
)]
const BOOT_INFO_SIZE: u32 = core::mem::size_of::<BootInfo>() as u32;

impl Default for BootInfo {
    fn default() -> Self {
        Self {
            magic: BOOT_INFO_MAGIC,
            version: PROTOCOL_VERSION,
            size: BOOT_INFO_SIZE,
            tsc_khz: 0,
            mem_size: 0,
            cmdline_addr: CMDLINE_ADDR,
            cmdline_len: 0,
            mem_region_count: 0,
            mmio_device_count: 0,
            mem_regions: [MemRegion::default(); MAX_MEM_REGIONS],
            mmio_devices: [MmioDevice::default(); MAX_MMIO_DEVICES],
        }
    }
}

impl BootInfo {
    /// The block as bytes, for the VMM to copy into guest memory.
    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: BootInfo is repr(C), made of integers with explicit padding
        // fields, so every byte is initialised.
        unsafe {
            core::slice::from_raw_parts(
                core::ptr::from_ref(self).cast::<u8>(),
                core::mem::size_of::<Self>(),
            )
        }
    }

    pub fn mem_regions(&self) -> &[MemRegion] {
        let n = (self.mem_region_count as usize).min(MAX_MEM_REGIONS);
        &self.mem_regions[..n]
    }

    pub fn mmio_devices(&self) -> &[MmioDevice] {
        let n = (self.mmio_device_count as usize).min(MAX_MMIO_DEVICES);
        &self.mmio_devices[..n]
    }
}

// The last 48 bytes of the page: the clone number, the network identity
// block (`net`) and the generation.
const _: () = assert!(BOOT_INFO_ADDR + core::mem::size_of::<BootInfo>() as u64 <= CLONE_INDEX_ADDR);
const _: () = assert!(CLONE_INDEX_ADDR + 8 == GENERATION_ADDR - 32);
const _: () = assert!(PD_ADDR + MAX_IDENTITY_GIB * 0x1000 <= STACK_TOP - STACK_SIZE);
