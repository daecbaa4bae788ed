//! CPU tables for the ring-3 protocol: the identity page tables and the GDT
//! (with a TSS), written into guest memory at the addresses of
//! [`spore_abi::boot`].

use spore_abi::boot::{
    CMDLINE_ADDR, CMDLINE_MAX, GDT_ADDR, MAX_IDENTITY_GIB, PDPT_ADDR, PD_ADDR, PML4_ADDR,
};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

use super::UnikernelError;
use crate::host_usize;

const PAGE: usize = 0x1000;
const GIB: u64 = 1 << 30;

// Page-table entry bits. No NX bit anywhere: EFER.NXE stays clear.
const PTE_PRESENT: u64 = 1 << 0;
const PTE_WRITABLE: u64 = 1 << 1;
const PTE_USER: u64 = 1 << 2;
const PTE_HUGE: u64 = 1 << 7;
const PTE_TABLE: u64 = PTE_PRESENT | PTE_WRITABLE | PTE_USER;

/// GDT selectors. Ring-3 selectors carry RPL 3. User data comes before user
/// code as `sysret` expects, should the runtime ever use it.
pub const KERNEL_CODE_SEL: u16 = 0x08;
pub const KERNEL_DATA_SEL: u16 = 0x10;
pub const USER_DATA_SEL: u16 = 0x18 | 3;
pub const USER_CODE_SEL: u16 = 0x20 | 3;
pub const TSS_SEL: u16 = 0x28;

/// GDT entries: null, kernel code, kernel data, user data, user code, and the
/// two-slot 64-bit TSS descriptor.
const GDT_ENTRIES: usize = 7;
#[allow(
    clippy::cast_possible_truncation,
    reason = "7 entries of 8 bytes, minus one: 55"
)]
pub const GDT_LIMIT: u16 = (GDT_ENTRIES * 8 - 1) as u16;
/// The TSS and its I/O permission bitmap, in VMM-owned RAM between the
/// command line and the page directories (everything below `STACK_TOP` is
/// reserved in the boot-info memory map).
pub const TSS_ADDR: u64 = CMDLINE_ADDR + CMDLINE_MAX as u64;
/// The 64-bit TSS proper is 104 bytes; the I/O bitmap follows it.
const TSS_SIZE: u64 = 104;
/// One bit per port (65536 ports), all clear: every port allowed.
const IO_BITMAP_SIZE: u64 = 0x2000;
/// TSS limit covering the bitmap plus the all-ones byte the CPU expects after
/// it (an access reads two bitmap bytes).
#[allow(clippy::cast_possible_truncation, reason = "104 + 0x2000 bytes")]
pub const TSS_LIMIT: u32 = (TSS_SIZE + IO_BITMAP_SIZE) as u32;
/// Where the I/O bitmap starts in the TSS: right after the TSS proper.
#[allow(clippy::cast_possible_truncation, reason = "104")]
const IO_MAP_BASE: u16 = TSS_SIZE as u16;

/// Flat segment descriptors (base 0, limit 4 GiB, granularity 4 KiB).
/// Access byte: P | DPL | S | type; flags: G and L (code) or D/B (data).
const fn flat_descriptor(access: u8, flags: u8) -> u64 {
    0xFFFF | (0xF << 48) | ((access as u64) << 40) | ((flags as u64 & 0xF) << 52)
}
pub const KERNEL_CODE: u64 = flat_descriptor(0x9B, 0xA); // DPL0, exec/read, G|L
pub const KERNEL_DATA: u64 = flat_descriptor(0x93, 0xC); // DPL0, read/write, G|D
pub const USER_DATA: u64 = flat_descriptor(0xF3, 0xC); // DPL3, read/write, G|D
pub const USER_CODE: u64 = flat_descriptor(0xFB, 0xA); // DPL3, exec/read, G|L

/// The 16-byte 64-bit TSS descriptor (type 0xB, busy, as KVM requires for TR).
fn tss_descriptor(base: u64, limit: u32) -> [u64; 2] {
    let low = (limit as u64 & 0xFFFF)
        | ((base & 0xFF_FFFF) << 16)
        | (0x8B << 40)
        | (((limit as u64 >> 16) & 0xF) << 48)
        | (((base >> 24) & 0xFF) << 56);
    [low, base >> 32]
}

/// The GDT as it is written to guest memory.
pub fn gdt() -> [u64; GDT_ENTRIES] {
    let [tss_low, tss_high] = tss_descriptor(TSS_ADDR, TSS_LIMIT);
    [
        0,
        KERNEL_CODE,
        KERNEL_DATA,
        USER_DATA,
        USER_CODE,
        tss_low,
        tss_high,
    ]
}

fn write_words(
    mem: &impl GuestMemoryBackend,
    addr: u64,
    words: &[u64],
) -> Result<(), UnikernelError> {
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    mem.write_slice(&bytes, GuestAddress(addr))
        .map_err(|source| UnikernelError::GuestMemory { addr, source })
}

/// Writes the GDT, and a TSS whose I/O permission bitmap allows every port.
///
/// IOPL 3 in RFLAGS is what allows port I/O at CPL 3 on hardware KVM, but
/// kvm_pvm does not keep IOPL while the guest runs: there every `in`/`out`
/// traps and KVM's emulator checks the TSS I/O bitmap instead. An all-clear
/// bitmap gives the same permission as IOPL 3 on both.
pub fn write_gdt(mem: &impl GuestMemoryBackend) -> Result<(), UnikernelError> {
    let mut page = vec![0u64; PAGE / 8];
    page[..GDT_ENTRIES].copy_from_slice(&gdt());
    write_words(mem, GDT_ADDR, &page)?;

    let mut tss = vec![0u8; (TSS_LIMIT + 1) as usize];
    // The I/O map base is the u16 at byte 102 of the TSS.
    tss[102..104].copy_from_slice(&IO_MAP_BASE.to_le_bytes());
    tss[TSS_LIMIT as usize] = 0xFF;
    mem.write_slice(&tss, GuestAddress(TSS_ADDR))
        .map_err(|source| UnikernelError::GuestMemory {
            addr: TSS_ADDR,
            source,
        })
}

/// GiB of identity map needed to cover RAM up to `ram_end` and the MMIO hole
/// below 4 GiB (virtio-mmio registers live there).
pub fn identity_gib(ram_end: u64) -> Result<u64, UnikernelError> {
    let end = ram_end.max(4 * GIB);
    let gib = end.div_ceil(GIB);
    if gib > MAX_IDENTITY_GIB {
        return Err(UnikernelError::TooMuchMemory {
            ram_end,
            max_gib: MAX_IDENTITY_GIB,
        });
    }
    Ok(gib)
}

/// Writes PML4, PDPT and one page directory per GiB: an identity map of
/// `0..gib` GiB with 2 MiB pages, present, writable and user-accessible.
pub fn write_page_tables(mem: &impl GuestMemoryBackend, gib: u64) -> Result<(), UnikernelError> {
    let mut pml4 = vec![0u64; PAGE / 8];
    pml4[0] = PDPT_ADDR | PTE_TABLE;
    write_words(mem, PML4_ADDR, &pml4)?;

    let mut pdpt = vec![0u64; PAGE / 8];
    for (i, e) in pdpt.iter_mut().take(host_usize::from_u64(gib)).enumerate() {
        *e = (PD_ADDR + i as u64 * PAGE as u64) | PTE_TABLE;
    }
    write_words(mem, PDPT_ADDR, &pdpt)?;

    let pds: Vec<u64> = (0..gib * 512)
        .map(|i| (i << 21) | PTE_TABLE | PTE_HUGE)
        .collect();
    write_words(mem, PD_ADDR, &pds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_match_the_manual() {
        // Well-known encodings of flat 64-bit code and data segments.
        assert_eq!(KERNEL_CODE, 0x00AF_9B00_0000_FFFF);
        assert_eq!(KERNEL_DATA, 0x00CF_9300_0000_FFFF);
        assert_eq!(USER_CODE, 0x00AF_FB00_0000_FFFF);
        assert_eq!(USER_DATA, 0x00CF_F300_0000_FFFF);
        let [lo, hi] = tss_descriptor(0x1234_5678_9abc_def0, 0x67);
        assert_eq!(lo, 0x9a00_8bbc_def0_0067);
        assert_eq!(hi, 0x1234_5678);
        assert_eq!(
            gdt()[(TSS_SEL >> 3) as usize],
            tss_descriptor(TSS_ADDR, TSS_LIMIT)[0]
        );
        assert_eq!(gdt()[(USER_CODE_SEL >> 3) as usize], USER_CODE);
        assert_eq!(gdt()[(USER_DATA_SEL >> 3) as usize], USER_DATA);
    }

    #[test]
    fn tss_fits_below_the_page_directories() {
        assert!(TSS_ADDR + u64::from(TSS_LIMIT) < PD_ADDR);
    }

    #[test]
    fn identity_map_size() {
        assert_eq!(identity_gib(128 << 20).unwrap(), 4);
        assert_eq!(identity_gib(5 * GIB + 1).unwrap(), 6);
        assert_eq!(identity_gib(64 * GIB).unwrap(), 64);
        assert!(identity_gib(64 * GIB + 1).is_err());
    }
}
