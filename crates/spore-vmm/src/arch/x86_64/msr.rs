//! Model-specific registers every vCPU of a Linux guest starts with.
//!
//! The values are those of a freshly reset CPU that firmware has prepared:
//! the syscall MSRs cleared (Linux programs them), the TSC at 0, fast string
//! operations enabled, and MTRRs on with write-back as the default type (with
//! MTRRs off, Linux would treat all memory as uncacheable).

use kvm_bindings::{kvm_msr_entry, Msrs};
use kvm_ioctls::VcpuFd;

use super::cpu_template::{apply_msrs, CpuTemplateError};
use crate::config::CpuConfig;

pub const MSR_IA32_TSC: u32 = 0x10;
pub const MSR_IA32_SYSENTER_CS: u32 = 0x174;
pub const MSR_IA32_SYSENTER_ESP: u32 = 0x175;
pub const MSR_IA32_SYSENTER_EIP: u32 = 0x176;
pub const MSR_IA32_MISC_ENABLE: u32 = 0x1a0;
pub const MSR_MTRR_DEF_TYPE: u32 = 0x2ff;
pub const MSR_STAR: u32 = 0xc000_0081;
pub const MSR_LSTAR: u32 = 0xc000_0082;
pub const MSR_CSTAR: u32 = 0xc000_0083;
pub const MSR_SYSCALL_MASK: u32 = 0xc000_0084;
pub const MSR_KERNEL_GS_BASE: u32 = 0xc000_0102;

/// IA32_MISC_ENABLE bit 0: fast string operations (`rep movs/stos`).
pub const MISC_ENABLE_FAST_STRING: u64 = 1;
/// IA32_MTRR_DEF_TYPE bit 11: MTRRs enabled.
pub const MTRR_ENABLE: u64 = 1 << 11;
/// Memory type 6: write-back.
pub const MTRR_MEM_TYPE_WB: u64 = 0x6;

#[derive(Debug, thiserror::Error)]
pub enum MsrError {
    #[error(transparent)]
    Template(#[from] CpuTemplateError),
    #[error("cannot build the MSR list for KVM: {0:?}")]
    Build(vmm_sys_util::fam::Error),
    #[error("KVM_SET_MSRS failed: {0}")]
    SetMsrs(#[source] kvm_ioctls::Error),
    #[error(
        "KVM accepted only {written} of {total} boot MSRs; MSR {first_rejected:#x} was rejected"
    )]
    Partial {
        written: usize,
        total: usize,
        first_rejected: u32,
    },
}

fn entry(index: u32, data: u64) -> kvm_msr_entry {
    kvm_msr_entry {
        index,
        data,
        ..Default::default()
    }
}

/// The MSR values a Linux vCPU boots with.
pub fn boot_msrs() -> Vec<kvm_msr_entry> {
    vec![
        entry(MSR_IA32_SYSENTER_CS, 0),
        entry(MSR_IA32_SYSENTER_ESP, 0),
        entry(MSR_IA32_SYSENTER_EIP, 0),
        entry(MSR_STAR, 0),
        entry(MSR_CSTAR, 0),
        entry(MSR_KERNEL_GS_BASE, 0),
        entry(MSR_SYSCALL_MASK, 0),
        entry(MSR_LSTAR, 0),
        entry(MSR_IA32_TSC, 0),
        entry(MSR_IA32_MISC_ENABLE, MISC_ENABLE_FAST_STRING),
        entry(MSR_MTRR_DEF_TYPE, MTRR_ENABLE | MTRR_MEM_TYPE_WB),
    ]
}

/// Writes [`boot_msrs`] (with the CPU template's changes) to `vcpu`; every
/// one of them must be accepted.
pub fn setup_msrs(vcpu: &VcpuFd, template: Option<&CpuConfig>) -> Result<(), MsrError> {
    let mut entries = boot_msrs();
    if let Some(t) = template {
        apply_msrs(vcpu, &mut entries, t)?;
    }
    set_all(vcpu, &entries)
}

/// Sets `entries` on `vcpu`, all or an error naming the first refused.
pub fn set_all(vcpu: &VcpuFd, entries: &[kvm_msr_entry]) -> Result<(), MsrError> {
    let msrs = Msrs::from_entries(entries).map_err(MsrError::Build)?;
    let written = vcpu.set_msrs(&msrs).map_err(MsrError::SetMsrs)?;
    // KVM_SET_MSRS stops at the first MSR it rejects and returns how many it set.
    if written != entries.len() {
        return Err(MsrError::Partial {
            written,
            total: entries.len(),
            first_rejected: entries.get(written).map_or(0, |e| e.index),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_msr_values() {
        let msrs = boot_msrs();
        let get = |index: u32| msrs.iter().find(|e| e.index == index).map(|e| e.data);
        for zero in [
            MSR_IA32_SYSENTER_CS,
            MSR_IA32_SYSENTER_ESP,
            MSR_IA32_SYSENTER_EIP,
            MSR_STAR,
            MSR_LSTAR,
            MSR_CSTAR,
            MSR_SYSCALL_MASK,
            MSR_KERNEL_GS_BASE,
            MSR_IA32_TSC,
        ] {
            assert_eq!(get(zero), Some(0), "MSR {zero:#x}");
        }
        assert_eq!(get(MSR_IA32_MISC_ENABLE), Some(1));
        assert_eq!(get(MSR_MTRR_DEF_TYPE), Some(0x806));
        assert_eq!(msrs.len(), 11);
        assert!(Msrs::from_entries(&msrs).is_ok());
    }
}
