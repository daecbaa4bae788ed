//! vCPU register state for the Linux 64-bit boot protocol.
//!
//! The bootstrap vCPU enters the kernel already in long mode: a flat boot GDT
//! (null, 64-bit code, data, TSS) and an empty IDT in low memory, identity
//! page tables over the first 1 GiB with 2 MiB pages (covering the kernel's
//! load address, the zero page and the command line), RIP at the kernel's
//! 64-bit entry and RSI pointing at the zero page. Linux replaces the GDT,
//! IDT and page tables almost at once; they only have to be valid until then.
//!
//! Every vCPU also gets a reset FPU/SSE control state and a local APIC whose
//! LINT0 delivers ExtINT (the 8259) and LINT1 delivers NMI, as a BIOS leaves
//! them in virtual wire mode. Application processors need nothing else: the
//! in-kernel irqchip holds them until the guest sends INIT/SIPI.

use kvm_bindings::{kvm_fpu, kvm_lapic_state, kvm_regs, kvm_segment};
use kvm_ioctls::VcpuFd;
use vm_memory::{Bytes, GuestAddress};

use super::linux::LinuxEntry;
use crate::host_usize;
use crate::memory::GuestMemoryMmap;

/// Boot GDT: null, code, data, TSS (8 bytes each).
pub const BOOT_GDT_START: u64 = 0x500;
/// Boot IDT: a single null entry.
pub const BOOT_IDT_START: u64 = 0x520;
/// Initial stack pointer, just below the page tables.
pub const BOOT_STACK_POINTER: u64 = 0x8ff0;
/// Identity page tables for the first 1 GiB.
pub const PML4_START: u64 = 0x9000;
pub const PDPT_START: u64 = 0xa000;
pub const PD_START: u64 = 0xb000;

const X86_CR0_PE: u64 = 1 << 0;
const X86_CR0_ET: u64 = 1 << 4;
const X86_CR0_NW: u64 = 1 << 29;
const X86_CR0_CD: u64 = 1 << 30;
const X86_CR0_PG: u64 = 1 << 31;
const X86_CR4_PAE: u64 = 1 << 5;
const EFER_LME: u64 = 1 << 8;
const EFER_LMA: u64 = 1 << 10;

const PTE_PRESENT: u64 = 1 << 0;
const PTE_WRITABLE: u64 = 1 << 1;
const PDE_PAGE_SIZE: u64 = 1 << 7;
const PAGE_TABLE_ENTRIES: u64 = 512;

/// GDT descriptor flags: G, D/B, L, AVL in the high nibble, the access byte in
/// the low byte (P, DPL, S, type).
const GDT_FLAGS_CODE64: u16 = 0xa09b;
const GDT_FLAGS_DATA: u16 = 0xc093;
const GDT_FLAGS_TSS64_BUSY: u16 = 0x808b;
const GDT_CODE_INDEX: u8 = 1;
const GDT_DATA_INDEX: u8 = 2;
const GDT_TSS_INDEX: u8 = 3;

const RFLAGS_RESERVED_BIT1: u64 = 1 << 1;

/// x87 control word after FNINIT: all exceptions masked, 64-bit precision.
const FPU_FCW_RESET: u16 = 0x37f;
/// MXCSR after reset: all SSE exceptions masked.
const MXCSR_RESET: u32 = 0x1f80;

/// Local APIC register offsets and LVT delivery modes.
const APIC_LVT_LINT0: usize = 0x350;
const APIC_LVT_LINT1: usize = 0x360;
const APIC_DELIVERY_MODE_MASK: u32 = 0x700;
const APIC_MODE_NMI: u32 = 0x4;
const APIC_MODE_EXTINT: u32 = 0x7;

#[derive(Debug, thiserror::Error)]
pub enum RegsError {
    #[error("cannot write the boot {what} at {addr:#x} into guest memory: {source}")]
    WriteGuest {
        what: &'static str,
        addr: u64,
        #[source]
        source: vm_memory::GuestMemoryError,
    },
    #[error("KVM_GET_SREGS failed: {0}")]
    GetSregs(#[source] kvm_ioctls::Error),
    #[error("KVM_SET_SREGS failed: {0}")]
    SetSregs(#[source] kvm_ioctls::Error),
    #[error("KVM_SET_REGS failed: {0}")]
    SetRegs(#[source] kvm_ioctls::Error),
    #[error("KVM_SET_FPU failed: {0}")]
    SetFpu(#[source] kvm_ioctls::Error),
    #[error("KVM_GET_LAPIC failed (was the in-kernel irqchip created before the vCPU?): {0}")]
    GetLapic(#[source] kvm_ioctls::Error),
    #[error("KVM_SET_LAPIC failed: {0}")]
    SetLapic(#[source] kvm_ioctls::Error),
}

/// Encodes a GDT descriptor.
pub fn gdt_entry(flags: u16, base: u32, limit: u32) -> u64 {
    let (flags, base, limit) = (u64::from(flags), u64::from(base), u64::from(limit));
    ((base & 0xff00_0000) << 32)
        | ((flags & 0xf0ff) << 40)
        | ((limit & 0x000f_0000) << 32)
        | ((base & 0x00ff_ffff) << 16)
        | (limit & 0x0000_ffff)
}

/// The KVM segment register state a selector for GDT entry `index` loads.
pub fn segment_from_gdt(entry: u64, index: u8) -> kvm_segment {
    let bit = |n: u32| ((entry >> n) & 1) as u8;
    let granular = bit(55) == 1;
    let raw_limit = (entry & 0xffff) as u32 | ((entry >> 32) & 0xf_0000) as u32;
    let present = bit(47);
    kvm_segment {
        base: ((entry >> 16) & 0xff_ffff) | ((entry >> 32) & 0xff00_0000),
        // KVM takes the limit in bytes: scale 4 KiB granules ourselves.
        limit: if granular {
            (raw_limit << 12) | 0xfff
        } else {
            raw_limit
        },
        selector: u16::from(index) * 8,
        type_: ((entry >> 40) & 0xf) as u8,
        present,
        dpl: ((entry >> 45) & 0x3) as u8,
        db: bit(54),
        s: bit(44),
        l: bit(53),
        g: bit(55),
        avl: bit(52),
        unusable: u8::from(present == 0),
        padding: 0,
    }
}

/// The boot GDT: null, 64-bit code, data, 64-bit TSS, all flat.
pub fn boot_gdt() -> [u64; 4] {
    [
        gdt_entry(0, 0, 0),
        gdt_entry(GDT_FLAGS_CODE64, 0, 0xfffff),
        gdt_entry(GDT_FLAGS_DATA, 0, 0xfffff),
        gdt_entry(GDT_FLAGS_TSS64_BUSY, 0, 0xfffff),
    ]
}

fn write_guest<T: vm_memory::ByteValued>(
    mem: &GuestMemoryMmap,
    what: &'static str,
    addr: u64,
    val: T,
) -> Result<(), RegsError> {
    mem.write_obj(val, GuestAddress(addr))
        .map_err(|source| RegsError::WriteGuest { what, addr, source })
}

/// Writes the identity map of the first 1 GiB: PML4[0] -> PDPT[0] -> PD of
/// 512 2 MiB pages. Whole tables are written so stale entries cannot remain.
fn write_page_tables(mem: &GuestMemoryMmap) -> Result<(), RegsError> {
    let table = host_usize::from_u64(PAGE_TABLE_ENTRIES);
    let mut pml4 = vec![0u64; table];
    pml4[0] = PDPT_START | PTE_PRESENT | PTE_WRITABLE;
    let mut pdpt = vec![0u64; table];
    pdpt[0] = PD_START | PTE_PRESENT | PTE_WRITABLE;
    let pd: Vec<u64> = (0..PAGE_TABLE_ENTRIES)
        .map(|i| (i << 21) | PTE_PRESENT | PTE_WRITABLE | PDE_PAGE_SIZE)
        .collect();
    for (what, addr, entries) in [
        ("PML4", PML4_START, pml4),
        ("PDPT", PDPT_START, pdpt),
        ("page directory", PD_START, pd),
    ] {
        let bytes: Vec<u8> = entries.iter().flat_map(|e| e.to_le_bytes()).collect();
        mem.write_slice(&bytes, GuestAddress(addr))
            .map_err(|source| RegsError::WriteGuest { what, addr, source })?;
    }
    Ok(())
}

/// General-purpose registers for the bootstrap vCPU.
pub fn linux_regs(entry: &LinuxEntry) -> kvm_regs {
    kvm_regs {
        rflags: RFLAGS_RESERVED_BIT1,
        rip: entry.entry,
        rsp: BOOT_STACK_POINTER,
        rbp: BOOT_STACK_POINTER,
        // Boot protocol: RSI holds the zero page (struct boot_params) address.
        rsi: entry.zero_page,
        ..Default::default()
    }
}

/// Sets the bootstrap vCPU's general-purpose registers.
pub fn setup_linux_regs(vcpu: &VcpuFd, entry: &LinuxEntry) -> Result<(), RegsError> {
    vcpu.set_regs(&linux_regs(entry))
        .map_err(RegsError::SetRegs)
}

/// Writes the boot GDT, IDT and page tables into guest memory and puts the
/// bootstrap vCPU in 64-bit long mode with them.
pub fn setup_linux_sregs(mem: &GuestMemoryMmap, vcpu: &VcpuFd) -> Result<(), RegsError> {
    let mut sregs = vcpu.get_sregs().map_err(RegsError::GetSregs)?;

    let gdt = boot_gdt();
    for (i, e) in gdt.iter().enumerate() {
        write_guest(mem, "GDT", BOOT_GDT_START + i as u64 * 8, *e)?;
    }
    write_guest(mem, "IDT", BOOT_IDT_START, 0u64)?;
    sregs.gdt.base = BOOT_GDT_START;
    sregs.gdt.limit =
        u16::try_from(std::mem::size_of_val(&gdt) - 1).expect("a GDT of a few entries");
    sregs.idt.base = BOOT_IDT_START;
    sregs.idt.limit = 7; // one 8-byte entry

    let code = segment_from_gdt(gdt[usize::from(GDT_CODE_INDEX)], GDT_CODE_INDEX);
    let data = segment_from_gdt(gdt[usize::from(GDT_DATA_INDEX)], GDT_DATA_INDEX);
    sregs.cs = code;
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    sregs.tr = segment_from_gdt(gdt[usize::from(GDT_TSS_INDEX)], GDT_TSS_INDEX);

    write_page_tables(mem)?;
    sregs.cr3 = PML4_START;
    sregs.cr4 |= X86_CR4_PAE;
    // Caches on (KVM's reset value has CD and NW set), protected mode, paging.
    sregs.cr0 = (sregs.cr0 & !(X86_CR0_CD | X86_CR0_NW)) | X86_CR0_PE | X86_CR0_ET | X86_CR0_PG;
    sregs.efer |= EFER_LME | EFER_LMA;

    vcpu.set_sregs(&sregs).map_err(RegsError::SetSregs)
}

/// Resets the x87 and SSE control state.
pub fn setup_fpu(vcpu: &VcpuFd) -> Result<(), RegsError> {
    let fpu = kvm_fpu {
        fcw: FPU_FCW_RESET,
        mxcsr: MXCSR_RESET,
        ..Default::default()
    };
    vcpu.set_fpu(&fpu).map_err(RegsError::SetFpu)
}

fn lapic_reg(lapic: &kvm_lapic_state, offset: usize) -> u32 {
    let b = &lapic.regs[offset..offset + 4];
    u32::from_le_bytes([b[0] as u8, b[1] as u8, b[2] as u8, b[3] as u8])
}

fn set_lapic_reg(lapic: &mut kvm_lapic_state, offset: usize, value: u32) {
    for (dst, src) in lapic.regs[offset..offset + 4]
        .iter_mut()
        .zip(value.to_le_bytes())
    {
        *dst = src as std::os::raw::c_char;
    }
}

fn with_delivery_mode(lvt: u32, mode: u32) -> u32 {
    (lvt & !APIC_DELIVERY_MODE_MASK) | (mode << 8)
}

/// LINT0 = ExtINT, LINT1 = NMI (virtual wire mode), other LVT bits kept.
pub fn virtual_wire_lapic(mut lapic: kvm_lapic_state) -> kvm_lapic_state {
    let lint0 = lapic_reg(&lapic, APIC_LVT_LINT0);
    set_lapic_reg(
        &mut lapic,
        APIC_LVT_LINT0,
        with_delivery_mode(lint0, APIC_MODE_EXTINT),
    );
    let lint1 = lapic_reg(&lapic, APIC_LVT_LINT1);
    set_lapic_reg(
        &mut lapic,
        APIC_LVT_LINT1,
        with_delivery_mode(lint1, APIC_MODE_NMI),
    );
    lapic
}

/// Programs the vCPU's local APIC LINT0/LINT1 for virtual wire mode. Needs
/// the in-kernel irqchip.
pub fn setup_lapic(vcpu: &VcpuFd) -> Result<(), RegsError> {
    let lapic = vcpu.get_lapic().map_err(RegsError::GetLapic)?;
    vcpu.set_lapic(&virtual_wire_lapic(lapic))
        .map_err(RegsError::SetLapic)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gdt_entries_encode_and_decode() {
        let gdt = boot_gdt();
        assert_eq!(gdt[0], 0);
        assert_eq!(gdt[1], 0x00af_9b00_0000_ffff);
        assert_eq!(gdt[2], 0x00cf_9300_0000_ffff);
        assert_eq!(gdt[3], 0x008f_8b00_0000_ffff);

        let cs = segment_from_gdt(gdt[1], 1);
        assert_eq!((cs.selector, cs.base, cs.limit), (0x8, 0, 0xffff_ffff));
        assert_eq!((cs.type_, cs.s, cs.present, cs.dpl), (0xb, 1, 1, 0));
        assert_eq!((cs.l, cs.db, cs.g, cs.unusable), (1, 0, 1, 0));
        let ds = segment_from_gdt(gdt[2], 2);
        assert_eq!(
            (ds.selector, ds.type_, ds.s, ds.l, ds.db, ds.g),
            (0x10, 3, 1, 0, 1, 1)
        );
        let tr = segment_from_gdt(gdt[3], 3);
        assert_eq!((tr.selector, tr.type_, tr.s, tr.present), (0x18, 0xb, 0, 1));
        let null = segment_from_gdt(gdt[0], 0);
        assert_eq!(null.unusable, 1);

        let odd = gdt_entry(0x4093, 0x1234_5678, 0xabcde);
        let s = segment_from_gdt(odd, 5);
        assert_eq!((s.base, s.limit, s.g, s.db), (0x1234_5678, 0xabcde, 0, 1));
    }

    #[test]
    fn page_tables_identity_map_first_gib() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        write_page_tables(&mem).unwrap();
        let rd = |a: u64| mem.read_obj::<u64>(GuestAddress(a)).unwrap();
        assert_eq!(rd(PML4_START), PDPT_START | 3);
        assert_eq!(rd(PML4_START + 8), 0);
        assert_eq!(rd(PDPT_START), PD_START | 3);
        assert_eq!(rd(PDPT_START + 8), 0);
        for i in [0u64, 1, 8, 511] {
            assert_eq!(rd(PD_START + i * 8), (i << 21) | 0x83);
        }
    }

    #[test]
    fn lapic_lint_modes() {
        let mut lapic = kvm_lapic_state::default();
        // Reset value of an LVT: masked, fixed delivery.
        set_lapic_reg(&mut lapic, APIC_LVT_LINT0, 0x0001_0000);
        set_lapic_reg(&mut lapic, APIC_LVT_LINT1, 0x0001_0000);
        let l = virtual_wire_lapic(lapic);
        assert_eq!(lapic_reg(&l, APIC_LVT_LINT0), 0x0001_0700);
        assert_eq!(lapic_reg(&l, APIC_LVT_LINT1), 0x0001_0400);
    }

    #[test]
    fn bsp_registers() {
        let r = linux_regs(&LinuxEntry {
            entry: 0x100_0000,
            zero_page: 0x7000,
        });
        assert_eq!(
            (r.rip, r.rsi, r.rsp, r.rbp, r.rflags),
            (0x100_0000, 0x7000, 0x8ff0, 0x8ff0, 2)
        );
    }
}
