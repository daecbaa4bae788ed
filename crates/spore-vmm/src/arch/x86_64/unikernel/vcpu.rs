//! vCPU state for the ring-3 protocol: long mode with paging, CPL 3 segments,
//! IOPL 3, interrupts off, RIP/RSP/RDI from the loader.

use kvm_bindings::{kvm_fpu, kvm_segment, kvm_sregs, KVM_MAX_CPUID_ENTRIES};
use kvm_ioctls::{Kvm, VcpuFd};
use spore_abi::boot::{GDT_ADDR, PML4_ADDR};

use super::tables::{GDT_LIMIT, TSS_ADDR, TSS_LIMIT, TSS_SEL, USER_CODE_SEL, USER_DATA_SEL};
use super::{UnikernelEntry, UnikernelError};
use crate::arch::x86_64::cpu_template::apply_cpuid;
use crate::config::CpuConfig;

const CR0_PE: u64 = 1 << 0;
const CR0_MP: u64 = 1 << 1;
const CR0_ET: u64 = 1 << 4;
const CR0_NE: u64 = 1 << 5;
const CR0_WP: u64 = 1 << 16;
const CR0_PG: u64 = 1 << 31;
const CR4_PAE: u64 = 1 << 5;
const CR4_OSFXSR: u64 = 1 << 9;
const CR4_OSXMMEXCPT: u64 = 1 << 10;
const EFER_LME: u64 = 1 << 8;
const EFER_LMA: u64 = 1 << 10;

/// RFLAGS: bit 1 is always set; IOPL 3 lets CPL 3 do port I/O; IF clear.
/// (kvm_pvm drops IOPL while the guest runs and checks the TSS I/O bitmap
/// instead, which `tables::write_gdt` opens for every port.)
pub const RFLAGS: u64 = 0x2 | (3 << 12);

fn user_segment(selector: u16, code: bool) -> kvm_segment {
    kvm_segment {
        base: 0,
        limit: 0xFFFF_FFFF,
        selector,
        // Code: execute/read, accessed. Data: read/write, accessed.
        type_: if code { 0xB } else { 0x3 },
        present: 1,
        dpl: 3,
        db: u8::from(!code),
        s: 1,
        l: u8::from(code),
        g: 1,
        avl: 0,
        unusable: 0,
        padding: 0,
    }
}

/// Special registers of the ring-3 protocol, built on `base` (what KVM
/// reports for a fresh vCPU, so fields this code does not own keep KVM's
/// defaults, e.g. the APIC base).
pub fn ring3_sregs(base: kvm_sregs) -> kvm_sregs {
    let mut sregs = base;
    let data = user_segment(USER_DATA_SEL, false);
    sregs.cs = user_segment(USER_CODE_SEL, true);
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    // A present, busy 64-bit TSS. On kvm_pvm it is required: port I/O at
    // CPL 3 is allowed through its I/O bitmap, and with TR unusable the first
    // `out` faults (a triple fault here, as there is no IDT).
    sregs.tr = kvm_segment {
        base: TSS_ADDR,
        limit: TSS_LIMIT,
        selector: TSS_SEL,
        type_: 0xB,
        present: 1,
        dpl: 0,
        db: 0,
        s: 0,
        l: 0,
        g: 0,
        avl: 0,
        unusable: 0,
        padding: 0,
    };
    sregs.ldt = kvm_segment {
        selector: 0,
        type_: 0x2,
        unusable: 1,
        ..Default::default()
    };
    sregs.gdt.base = GDT_ADDR;
    sregs.gdt.limit = GDT_LIMIT;
    // No IDT: the unikernel takes no interrupts, and a fault it should
    // never raise becomes a triple fault (KVM_EXIT_SHUTDOWN) the VMM sees.
    sregs.idt.base = 0;
    sregs.idt.limit = 0;
    sregs.cr0 = CR0_PE | CR0_MP | CR0_ET | CR0_NE | CR0_WP | CR0_PG;
    sregs.cr3 = PML4_ADDR;
    sregs.cr4 = CR4_PAE | CR4_OSFXSR | CR4_OSXMMEXCPT;
    sregs.efer = EFER_LME | EFER_LMA;
    sregs
}

/// Puts `vcpu` at the unikernel's entry, in 64-bit mode at CPL 3.
pub fn configure_vcpu(vcpu: &VcpuFd, entry: &UnikernelEntry) -> Result<(), UnikernelError> {
    let kvm_err = |what: &'static str| move |source| UnikernelError::Kvm { what, source };
    let sregs = vcpu.get_sregs().map_err(kvm_err("KVM_GET_SREGS"))?;
    vcpu.set_sregs(&ring3_sregs(sregs))
        .map_err(kvm_err("KVM_SET_SREGS"))?;
    // x87 and SSE in their reset state (FCW 0x37f, MXCSR 0x1f80), as a CPU
    // leaves them and as compiled code expects.
    let fpu = kvm_fpu {
        fcw: 0x37f,
        mxcsr: 0x1f80,
        ..Default::default()
    };
    vcpu.set_fpu(&fpu).map_err(kvm_err("KVM_SET_FPU"))?;
    let mut regs = vcpu.get_regs().map_err(kvm_err("KVM_GET_REGS"))?;
    regs.rip = entry.entry;
    regs.rsp = entry.stack_top;
    regs.rdi = entry.boot_info;
    regs.rflags = RFLAGS;
    vcpu.set_regs(&regs).map_err(kvm_err("KVM_SET_REGS"))
}

/// Gives `vcpu` the CPUID KVM supports on this host, unfiltered but for a
/// CPU template's modifiers. Enough for a unikernel (rdtsc, SSE); the Linux
/// boot path filters CPUID further.
pub fn set_supported_cpuid(
    kvm: &Kvm,
    vcpu: &VcpuFd,
    template: Option<&CpuConfig>,
) -> Result<(), UnikernelError> {
    let mut cpuid = kvm
        .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
        .map_err(|source| UnikernelError::Kvm {
            what: "KVM_GET_SUPPORTED_CPUID",
            source,
        })?;
    if let Some(t) = template {
        apply_cpuid(&mut cpuid, t).map_err(|e| UnikernelError::CpuTemplate(e.to_string()))?;
    }
    vcpu.set_cpuid2(&cpuid)
        .map_err(|source| UnikernelError::Kvm {
            what: "KVM_SET_CPUID2",
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sregs_are_ring3_long_mode() {
        let s = ring3_sregs(kvm_sregs::default());
        assert_eq!(s.cs.selector & 3, 3);
        assert_eq!((s.cs.dpl, s.cs.l, s.cs.db), (3, 1, 0));
        assert_eq!((s.ss.dpl, s.ss.selector & 3), (3, 3));
        assert_eq!(s.cr0 & (CR0_PE | CR0_PG), CR0_PE | CR0_PG);
        assert_eq!(s.efer & EFER_LMA, EFER_LMA);
        assert_eq!(s.cr3, PML4_ADDR);
        assert_eq!(RFLAGS & (1 << 9), 0, "interrupts must be off");
    }
}
