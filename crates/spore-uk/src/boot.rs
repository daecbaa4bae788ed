//! The boot-info block the VMM passes in RDI, validated once at start.
//!
//! The VMM is trusted to follow the protocol, but a block from another VMM
//! version (or a stray jump to `_start`) must produce a clear error rather than
//! a heap built over garbage: magic, version and size are checked, and counts
//! and lengths are clamped to what the protocol allows.

use core::fmt;

pub use spore_abi::boot::{BootInfo, MemRegion, MmioDevice, MEM_FREE, MEM_RESERVED};
use spore_abi::boot::{
    BOOT_INFO_MAGIC, CMDLINE_MAX, MAX_MEM_REGIONS, MAX_MMIO_DEVICES, PROTOCOL_VERSION,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BootInfoError {
    /// RDI was 0 or not 8-byte aligned.
    BadAddress(u64),
    BadMagic(u64),
    BadVersion(u32),
    /// The VMM's block is smaller than this runtime's `BootInfo`.
    TooSmall(u32),
}

impl fmt::Display for BootInfoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::BadAddress(a) => write!(f, "boot info address {a:#x} is null or misaligned"),
            Self::BadMagic(m) => {
                write!(f, "boot info magic {m:#x} is not {BOOT_INFO_MAGIC:#x}: not booted by spore?")
            }
            Self::BadVersion(v) => write!(
                f,
                "boot protocol version {v} is not {PROTOCOL_VERSION}: rebuild the app against this VMM's spore-abi"
            ),
            Self::TooSmall(s) => write!(
                f,
                "boot info size {s} is smaller than {}",
                core::mem::size_of::<BootInfo>()
            ),
        }
    }
}

/// Checks a boot-info block and returns a copy whose counts and lengths are
/// within the protocol's limits and whose regions do not wrap around.
pub fn validate(raw: &BootInfo) -> Result<BootInfo, BootInfoError> {
    if raw.magic != BOOT_INFO_MAGIC {
        return Err(BootInfoError::BadMagic(raw.magic));
    }
    if raw.version != PROTOCOL_VERSION {
        return Err(BootInfoError::BadVersion(raw.version));
    }
    // A larger block is a newer VMM appending fields; this runtime reads its prefix.
    if (raw.size as usize) < core::mem::size_of::<BootInfo>() {
        return Err(BootInfoError::TooSmall(raw.size));
    }
    let mut info = *raw;
    info.mem_region_count = info.mem_region_count.min(MAX_MEM_REGIONS as u32);
    info.mmio_device_count = info.mmio_device_count.min(MAX_MMIO_DEVICES as u32);
    info.cmdline_len = info.cmdline_len.min(CMDLINE_MAX as u64 - 1);
    for r in &mut info.mem_regions[..info.mem_region_count as usize] {
        if r.addr.checked_add(r.size).is_none() {
            r.size = u64::MAX - r.addr;
        }
    }
    Ok(info)
}

static BOOT_INFO: spin::Once<BootInfo> = spin::Once::new();

/// Reads and validates the block at `addr` (the VMM's RDI) and keeps a copy.
///
/// # Safety
/// `addr` must be readable for `size_of::<BootInfo>()` bytes; the protocol
/// guarantees that for the value the VMM put in RDI.
pub(crate) unsafe fn init(addr: u64) -> Result<&'static BootInfo, BootInfoError> {
    if addr == 0 || !addr.is_multiple_of(8) {
        return Err(BootInfoError::BadAddress(addr));
    }
    // SAFETY: the caller guarantees the block is readable; read_volatile so the
    // compiler makes no assumption about memory written by the VMM.
    let raw = unsafe { core::ptr::read_volatile(addr as *const BootInfo) };
    let info = validate(&raw)?;
    Ok(BOOT_INFO.call_once(|| info))
}

/// The validated boot info (None before the runtime's start code ran).
pub fn boot_info() -> Option<&'static BootInfo> {
    BOOT_INFO.get()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_default_and_clamps() {
        let mut raw = BootInfo {
            mem_region_count: 1000,
            mmio_device_count: 33,
            cmdline_len: 1 << 40,
            ..BootInfo::default()
        };
        raw.mem_regions[0] = MemRegion {
            addr: u64::MAX - 10,
            size: 100,
            kind: MEM_FREE,
            _pad: 0,
        };
        let info = validate(&raw).unwrap();
        assert_eq!(info.mem_region_count as usize, MAX_MEM_REGIONS);
        assert_eq!(info.mmio_device_count as usize, MAX_MMIO_DEVICES);
        assert_eq!(info.cmdline_len, CMDLINE_MAX as u64 - 1);
        assert_eq!(info.mem_regions[0].size, 10);
    }

    #[test]
    fn rejects_bad_headers() {
        let good = BootInfo::default();
        assert_eq!(
            validate(&BootInfo { magic: 1, ..good }),
            Err(BootInfoError::BadMagic(1))
        );
        assert_eq!(
            validate(&BootInfo { version: 9, ..good }),
            Err(BootInfoError::BadVersion(9))
        );
        assert_eq!(
            validate(&BootInfo { size: 8, ..good }),
            Err(BootInfoError::TooSmall(8))
        );
        assert!(validate(&BootInfo {
            size: 0x2000,
            ..good
        })
        .is_ok());
    }
}
