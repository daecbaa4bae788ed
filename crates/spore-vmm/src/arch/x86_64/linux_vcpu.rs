//! Per-vCPU setup for a Linux guest: ties together CPUID, MSRs, FPU, LAPIC
//! and, on the bootstrap vCPU, the long-mode registers of the 64-bit boot
//! protocol. Runs after [`super::linux::load_linux`] and before the vCPU first
//! runs; it never creates VMs or vCPUs and never runs them.

use kvm_ioctls::{Kvm, VcpuFd};

use super::cpu_template::{apply_cpuid, CpuSetup, CpuTemplateError};
use super::cpuid::{vcpu_cpuid, CpuidError, CpuidShape};
use super::linux::LinuxEntry;
use super::msr::{setup_msrs, MsrError};
use super::regs::{setup_fpu, setup_lapic, setup_linux_regs, setup_linux_sregs, RegsError};
use crate::memory::GuestMemoryMmap;

/// Errors configuring a vCPU for a Linux guest.
#[derive(Debug, thiserror::Error)]
pub enum LinuxVcpuError {
    #[error("KVM_GET_SUPPORTED_CPUID failed: {0}")]
    SupportedCpuid(#[source] kvm_ioctls::Error),
    #[error(transparent)]
    Cpuid(#[from] CpuidError),
    #[error("KVM_SET_CPUID2 failed: {0}")]
    SetCpuid(#[source] kvm_ioctls::Error),
    #[error(transparent)]
    Msrs(#[from] MsrError),
    #[error(transparent)]
    Template(#[from] CpuTemplateError),
    #[error(transparent)]
    Regs(#[from] RegsError),
}

/// Sets up vCPU `vcpu_id` of `num_vcpus` for a Linux guest loaded by
/// [`super::linux::load_linux`]. Every vCPU gets CPUID, MSRs, FPU and LAPIC state; only the
/// bootstrap vCPU (id 0) gets registers, since application processors start
/// from INIT/SIPI. The in-kernel irqchip must exist before the vCPU was made.
pub fn configure_linux_vcpu(
    kvm: &Kvm,
    vcpu: &VcpuFd,
    mem: &GuestMemoryMmap,
    vcpu_id: u8,
    num_vcpus: u8,
    entry: &LinuxEntry,
    cpu: &CpuSetup,
) -> Result<(), LinuxVcpuError> {
    let supported = kvm
        .get_supported_cpuid(kvm_bindings::KVM_MAX_CPUID_ENTRIES)
        .map_err(LinuxVcpuError::SupportedCpuid)?;
    let shape = CpuidShape {
        vcpu_id,
        num_vcpus,
        smt: cpu.smt,
        tsc_deadline: kvm.check_extension(kvm_ioctls::Cap::TscDeadlineTimer),
    };
    let mut cpuid = vcpu_cpuid(&supported, shape)?;
    if let Some(t) = &cpu.template {
        apply_cpuid(&mut cpuid, t)?;
    }
    vcpu.set_cpuid2(&cpuid).map_err(LinuxVcpuError::SetCpuid)?;
    setup_msrs(vcpu, cpu.template.as_ref())?;
    setup_fpu(vcpu)?;
    if vcpu_id == 0 {
        setup_linux_regs(vcpu, entry)?;
        setup_linux_sregs(mem, vcpu)?;
    }
    setup_lapic(vcpu)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use kvm_bindings::{
        kvm_pit_config, kvm_userspace_memory_region, KVM_MP_STATE_RUNNABLE,
        KVM_MP_STATE_UNINITIALIZED, KVM_PIT_SPEAKER_DUMMY,
    };
    use kvm_ioctls::{VcpuExit, VmFd};
    use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};

    use super::*;
    use crate::arch::x86_64::layout::KVM_TSS_ADDR;
    use crate::arch::x86_64::linux::tests::{file_with, mem, tiny_elf, ELF_ENTRY};
    use crate::arch::x86_64::linux::{load_linux, ZERO_PAGE_START};
    use crate::arch::x86_64::msr::{boot_msrs, MSR_IA32_MISC_ENABLE, MSR_MTRR_DEF_TYPE};
    use crate::arch::x86_64::regs::{BOOT_GDT_START, BOOT_IDT_START, PML4_START};
    use crate::host_usize;

    /// Tests named kvm_* need /dev/kvm; `make test` skips them, and says
    /// so, on a host without it.
    fn kvm() -> Kvm {
        Kvm::new().expect("this test needs /dev/kvm")
    }

    fn register_memory(vm: &VmFd, mem: &GuestMemoryMmap) {
        for (slot, r) in (0u32..).zip(mem.iter()) {
            let region = kvm_userspace_memory_region {
                slot,
                flags: 0,
                guest_phys_addr: r.start_addr().0,
                memory_size: r.len(),
                userspace_addr: r.as_ptr() as u64,
            };
            // SAFETY: the mapping belongs to `mem`, which outlives the VM in
            // this test.
            unsafe { vm.set_user_memory_region(region) }.unwrap();
        }
    }

    #[test]
    fn kvm_configures_bsp_and_ap() {
        let kvm = kvm();
        let vm = kvm.create_vm().unwrap();
        vm.set_tss_address(host_usize::from_u64(KVM_TSS_ADDR))
            .unwrap();
        vm.create_irq_chip().unwrap();
        let pit = kvm_pit_config {
            flags: KVM_PIT_SPEAKER_DUMMY,
            ..Default::default()
        };
        vm.create_pit2(pit).unwrap();
        let m = mem(256 << 20);
        register_memory(&vm, &m);
        let entry = load_linux(&m, &mut file_with(&tiny_elf()), None, "console=ttyS0", 2).unwrap();

        let vcpus: Vec<_> = (0..2u8)
            .map(|id| {
                let vcpu = vm.create_vcpu(u64::from(id)).unwrap();
                configure_linux_vcpu(&kvm, &vcpu, &m, id, 2, &entry, &CpuSetup::default()).unwrap();
                vcpu
            })
            .collect();

        let regs = vcpus[0].get_regs().unwrap();
        assert_eq!((regs.rip, regs.rsi), (ELF_ENTRY, ZERO_PAGE_START));
        assert_eq!((regs.rsp, regs.rbp, regs.rflags), (0x8ff0, 0x8ff0, 2));

        let s = vcpus[0].get_sregs().unwrap();
        assert_eq!(
            s.cr0 & 0x8000_0011,
            0x8000_0011,
            "PG|ET|PE in cr0 {:#x}",
            s.cr0
        );
        assert_eq!(s.cr0 & 0x6000_0000, 0, "caches enabled: cr0 {:#x}", s.cr0);
        assert_eq!(s.cr3, PML4_START);
        assert_ne!(s.cr4 & 0x20, 0, "PAE in cr4 {:#x}", s.cr4);
        assert_eq!(s.efer & 0x500, 0x500, "LME|LMA in efer {:#x}", s.efer);
        assert_eq!((s.gdt.base, s.gdt.limit), (BOOT_GDT_START, 31));
        assert_eq!((s.idt.base, s.idt.limit), (BOOT_IDT_START, 7));
        assert_eq!(
            (s.cs.selector, s.cs.l, s.cs.db, s.cs.present),
            (0x8, 1, 0, 1)
        );
        for seg in [s.ds, s.es, s.fs, s.gs, s.ss] {
            assert_eq!((seg.selector, seg.type_, seg.present), (0x10, 3, 1));
        }
        assert_eq!((s.tr.selector, s.tr.type_), (0x18, 0xb));

        // The AP keeps its reset state: real mode, waiting for INIT/SIPI.
        let ap = vcpus[1].get_sregs().unwrap();
        assert_eq!(ap.cr0 & 1, 0);
        assert_eq!(ap.efer & 0x400, 0);
        assert_eq!(
            vcpus[0].get_mp_state().unwrap().mp_state,
            KVM_MP_STATE_RUNNABLE
        );
        assert_eq!(
            vcpus[1].get_mp_state().unwrap().mp_state,
            KVM_MP_STATE_UNINITIALIZED
        );

        for (id, vcpu) in vcpus.iter().enumerate() {
            let cpuid = vcpu
                .get_cpuid2(kvm_bindings::KVM_MAX_CPUID_ENTRIES)
                .unwrap();
            let leaf1 = cpuid.as_slice().iter().find(|e| e.function == 1).unwrap();
            assert_eq!(leaf1.ebx >> 24, u32::try_from(id).unwrap());
            assert_ne!(leaf1.ecx & (1 << 31), 0);

            let mut msrs = kvm_bindings::Msrs::from_entries(&boot_msrs()).unwrap();
            assert_eq!(vcpu.get_msrs(&mut msrs).unwrap(), boot_msrs().len());
            let get = |i: u32| msrs.as_slice().iter().find(|e| e.index == i).unwrap().data;
            assert_eq!(get(MSR_MTRR_DEF_TYPE), 0x806);
            assert_ne!(get(MSR_IA32_MISC_ENABLE) & 1, 0);

            // KVM_GET_FPU does not report MXCSR (KVM never copies it back
            // out), so only the control word can be checked here.
            assert_eq!(vcpu.get_fpu().unwrap().fcw, 0x37f);

            let lapic = vcpu.get_lapic().unwrap();
            let reg = |off: usize| {
                let b = &lapic.regs[off..off + 4];
                u32::from_le_bytes([b[0] as u8, b[1] as u8, b[2] as u8, b[3] as u8])
            };
            assert_eq!((reg(0x350) >> 8) & 7, 7, "LINT0 ExtINT");
            assert_eq!((reg(0x360) >> 8) & 7, 4, "LINT1 NMI");
        }

        // The test kernel runs in long mode at ring 0 through the identity
        // map, reads the zero page through RSI, uses the stack and reports
        // the "HdrS" magic on the serial port.
        let mut vcpu0 = vcpus.into_iter().next().unwrap();
        match vcpu0.run().unwrap() {
            VcpuExit::IoOut(port, data) => {
                assert_eq!((port, data), (0x3f8, &b"HdrS"[..]));
            }
            other => panic!("unexpected exit {other:?}"),
        }
    }
}
