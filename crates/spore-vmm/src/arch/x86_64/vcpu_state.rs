//! The complete architectural state of one x86_64 vCPU, as KVM exposes it,
//! for snapshots: registers, FPU/xsave, XCRs, every MSR KVM lists as
//! saveable, LAPIC, MP state, pending events, debug registers, CPUID and the
//! TSC frequency.
//!
//! Capture runs while the vCPU is parked outside `KVM_RUN` (after its last
//! I/O exit was completed); restore runs on a fresh vCPU before it first runs.

use kvm_bindings::{
    kvm_cpuid_entry2, kvm_debugregs, kvm_lapic_state, kvm_mp_state, kvm_msr_entry, kvm_regs,
    kvm_sregs, kvm_vcpu_events, kvm_xcrs, kvm_xsave, CpuId, Msrs,
};
use kvm_ioctls::{Kvm, VcpuFd};
use serde::{Deserialize, Serialize};

/// MSRs read or written per `KVM_GET_MSRS`/`KVM_SET_MSRS` call.
const MSR_CHUNK: usize = 64;
/// Upper bound on CPUID entries KVM returns.
const MAX_CPUID_ENTRIES: usize = 256;

#[derive(Debug, thiserror::Error)]
pub enum VcpuStateError {
    #[error("cannot {what} of vCPU {id}: {source}")]
    Kvm {
        what: &'static str,
        id: u8,
        #[source]
        source: kvm_ioctls::Error,
    },
    #[error("vCPU {id}: {detail}")]
    Invalid { id: u8, detail: String },
}

/// Everything KVM holds for one vCPU.
#[derive(Debug, Serialize, Deserialize)]
pub struct VcpuState {
    pub id: u8,
    pub cpuid: Vec<kvm_cpuid_entry2>,
    pub regs: kvm_regs,
    pub sregs: kvm_sregs,
    pub xsave: kvm_xsave,
    pub xcrs: kvm_xcrs,
    /// (index, value) of every MSR in `KVM_GET_MSR_INDEX_LIST` that KVM
    /// could read back.
    pub msrs: Vec<(u32, u64)>,
    /// Absent when the VM has no in-kernel irqchip.
    pub lapic: Option<kvm_lapic_state>,
    pub mp_state: kvm_mp_state,
    pub events: kvm_vcpu_events,
    pub debug_regs: kvm_debugregs,
    /// Guest TSC frequency; `None` where KVM cannot report it.
    pub tsc_khz: Option<u32>,
}

impl VcpuState {
    /// Reads the state of a parked vCPU. `msr_list` is the host's
    /// `KVM_GET_MSR_INDEX_LIST` (see [`saveable_msrs`]).
    pub fn save(
        id: u8,
        fd: &VcpuFd,
        msr_list: &[u32],
        irqchip: bool,
    ) -> Result<Self, VcpuStateError> {
        let kvm = |what| move |source| VcpuStateError::Kvm { what, id, source };
        let cpuid = fd
            .get_cpuid2(MAX_CPUID_ENTRIES)
            .map_err(kvm("read the CPUID"))?
            .as_slice()
            .to_vec();
        let lapic = if irqchip {
            Some(fd.get_lapic().map_err(kvm("read the LAPIC"))?)
        } else {
            None
        };
        Ok(Self {
            id,
            cpuid,
            regs: fd.get_regs().map_err(kvm("read the registers"))?,
            sregs: fd.get_sregs().map_err(kvm("read the system registers"))?,
            xsave: fd.get_xsave().map_err(kvm("read the xsave area"))?,
            xcrs: fd.get_xcrs().map_err(kvm("read the XCRs"))?,
            msrs: read_msrs(id, fd, msr_list)?,
            lapic,
            mp_state: fd.get_mp_state().map_err(kvm("read the MP state"))?,
            events: fd.get_vcpu_events().map_err(kvm("read the vCPU events"))?,
            debug_regs: fd
                .get_debug_regs()
                .map_err(kvm("read the debug registers"))?,
            tsc_khz: fd.get_tsc_khz().ok(),
        })
    }

    /// Writes the state into a fresh vCPU. The order follows KVM's
    /// dependencies: CPUID first (it decides which MSRs and xsave features
    /// exist), the TSC frequency before the TSC, the LAPIC before MSRs (the
    /// TSC deadline lives in the LAPIC timer), pending events last.
    pub fn restore(&self, fd: &VcpuFd) -> Result<(), VcpuStateError> {
        let id = self.id;
        let kvm = |what| move |source| VcpuStateError::Kvm { what, id, source };
        let cpuid = CpuId::from_entries(&self.cpuid).map_err(|e| VcpuStateError::Invalid {
            id,
            detail: format!("bad CPUID table: {e:?}"),
        })?;
        fd.set_cpuid2(&cpuid).map_err(kvm("set the CPUID"))?;
        if let Some(khz) = self.tsc_khz {
            if fd.get_tsc_khz().ok() != Some(khz) {
                // A host with another TSC rate: scale the guest's, or warn that
                // guest time may drift if this KVM cannot.
                if let Err(e) = fd.set_tsc_khz(khz) {
                    tracing::warn!("vCPU {id}: cannot set the TSC to {khz} kHz: {e}");
                }
            }
        }
        let mut sregs = self.sregs;
        if host_is_qemu_tcg() && sregs.tr.type_ == TSS_BUSY {
            sregs.tr.type_ = TSS_AVAILABLE;
        }
        fd.set_sregs(&sregs)
            .map_err(kvm("set the system registers"))?;
        fd.set_regs(&self.regs).map_err(kvm("set the registers"))?;
        // SAFETY: the xsave area comes from KVM_GET_XSAVE of a vCPU with the
        // same CPUID (restored above), which is what KVM_SET_XSAVE expects.
        unsafe { fd.set_xsave(&self.xsave) }.map_err(kvm("set the xsave area"))?;
        fd.set_xcrs(&self.xcrs).map_err(kvm("set the XCRs"))?;
        fd.set_debug_regs(&self.debug_regs)
            .map_err(kvm("set the debug registers"))?;
        if let Some(lapic) = &self.lapic {
            fd.set_lapic(lapic).map_err(kvm("set the LAPIC"))?;
        }
        write_msrs(id, fd, &self.msrs)?;
        fd.set_mp_state(self.mp_state)
            .map_err(kvm("set the MP state"))?;
        fd.set_vcpu_events(&self.events)
            .map_err(kvm("set the vCPU events"))?;
        Ok(())
    }
}

/// 64-bit TSS descriptor types: busy (what a loaded TR always is, and what
/// KVM reports) and available.
const TSS_BUSY: u8 = 0xb;
const TSS_AVAILABLE: u8 = 0x9;

/// Whether this VMM runs on QEMU's TCG (CPUID hypervisor leaf
/// "TCGTCGTCGTCG"), i.e. inside the nested test harness, whose KVM runs on
/// QEMU's emulated SVM. QEMU's emulation of a user-mode `in`/`out` checks
/// the I/O permission bitmap only if the cached TR type is *available*
/// (it keeps that type after `ltr`); hardware never looks at the type. A
/// restored TR (busy, as KVM reports it) therefore made every user-space
/// port access of a restored Linux guest fault (#GP) there. On TCG the
/// restored TR gets the type QEMU expects; everywhere else nothing changes
/// (Intel's VM entry requires the busy type).
fn host_is_qemu_tcg() -> bool {
    static TCG: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *TCG.get_or_init(|| {
        // The hypervisor leaves mean something only with CPUID.1:ECX[31].
        if std::arch::x86_64::__cpuid(1).ecx & (1 << 31) == 0 {
            return false;
        }
        let r = std::arch::x86_64::__cpuid(0x4000_0000);
        let mut vendor = [0u8; 12];
        vendor[..4].copy_from_slice(&r.ebx.to_le_bytes());
        vendor[4..8].copy_from_slice(&r.ecx.to_le_bytes());
        vendor[8..].copy_from_slice(&r.edx.to_le_bytes());
        &vendor == b"TCGTCGTCGTCG"
    })
}

/// The MSRs KVM says it can save and restore (`KVM_GET_MSR_INDEX_LIST`),
/// kvmclock, TSC and TSC deadline included.
pub fn saveable_msrs(kvm: &Kvm) -> Result<Vec<u32>, kvm_ioctls::Error> {
    Ok(kvm.get_msr_index_list()?.as_slice().to_vec())
}

fn msr_entry(index: u32, data: u64) -> kvm_msr_entry {
    kvm_msr_entry {
        index,
        data,
        ..Default::default()
    }
}

/// Reads `list` in chunks. `KVM_GET_MSRS` stops at the first MSR it cannot
/// read (listed but unsupported on this CPU, or write-only); that one is
/// skipped and the rest of the chunk retried.
fn read_msrs(id: u8, fd: &VcpuFd, list: &[u32]) -> Result<Vec<(u32, u64)>, VcpuStateError> {
    let mut out = Vec::with_capacity(list.len());
    let mut rest = list;
    while !rest.is_empty() {
        let chunk = &rest[..rest.len().min(MSR_CHUNK)];
        let entries: Vec<_> = chunk.iter().map(|&i| msr_entry(i, 0)).collect();
        let mut msrs = Msrs::from_entries(&entries).map_err(|e| VcpuStateError::Invalid {
            id,
            detail: format!("MSR list: {e:?}"),
        })?;
        let n = fd
            .get_msrs(&mut msrs)
            .map_err(|source| VcpuStateError::Kvm {
                what: "read the MSRs",
                id,
                source,
            })?;
        out.extend(msrs.as_slice()[..n].iter().map(|e| (e.index, e.data)));
        if n < chunk.len() {
            tracing::debug!("vCPU {id}: KVM cannot read MSR {:#x}; not saved", chunk[n]);
            rest = &rest[n + 1..];
        } else {
            rest = &rest[chunk.len()..];
        }
    }
    Ok(out)
}

/// Writes `msrs` in chunks; an MSR this KVM refuses is skipped with a
/// warning (it was readable on the source host, so the hosts differ).
fn write_msrs(id: u8, fd: &VcpuFd, msrs: &[(u32, u64)]) -> Result<(), VcpuStateError> {
    let mut rest = msrs;
    while !rest.is_empty() {
        let chunk = &rest[..rest.len().min(MSR_CHUNK)];
        let entries: Vec<_> = chunk.iter().map(|&(i, d)| msr_entry(i, d)).collect();
        let list = Msrs::from_entries(&entries).map_err(|e| VcpuStateError::Invalid {
            id,
            detail: format!("MSR list: {e:?}"),
        })?;
        let n = fd.set_msrs(&list).map_err(|source| VcpuStateError::Kvm {
            what: "set the MSRs",
            id,
            source,
        })?;
        if n < chunk.len() {
            tracing::warn!(
                "vCPU {id}: KVM refused MSR {:#x} = {:#x}; skipped",
                chunk[n].0,
                chunk[n].1
            );
            rest = &rest[n + 1..];
        } else {
            rest = &rest[chunk.len()..];
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_round_trips_through_bincode() {
        let mut s = VcpuState {
            id: 0,
            cpuid: vec![kvm_cpuid_entry2 {
                function: 1,
                eax: 0x1234,
                ..Default::default()
            }],
            regs: kvm_regs {
                rip: 0xdead_beef,
                rax: 7,
                ..Default::default()
            },
            sregs: Default::default(),
            xsave: Default::default(),
            xcrs: Default::default(),
            msrs: vec![(0x10, 99), (0x4b56_4d01, 0x1000)],
            lapic: Some(Default::default()),
            mp_state: Default::default(),
            events: Default::default(),
            debug_regs: Default::default(),
            tsc_khz: Some(2_000_000),
        };
        s.sregs.cr3 = 0x5000;
        s.xsave.region[3] = 0xabcd;
        let bytes = bincode::serialize(&s).unwrap();
        let back: VcpuState = bincode::deserialize(&bytes).unwrap();
        assert_eq!(back.regs.rip, 0xdead_beef);
        assert_eq!(back.sregs.cr3, 0x5000);
        assert_eq!(back.xsave.region[3], 0xabcd);
        assert_eq!(back.msrs, s.msrs);
        assert_eq!(back.cpuid[0].eax, 0x1234);
        assert_eq!(back.tsc_khz, Some(2_000_000));
    }

    #[test]
    fn kvm_state_round_trips_through_a_vcpu() {
        // Named kvm_*: `make test` skips these, and says so, without /dev/kvm.
        let kvm = Kvm::new().expect("this test needs /dev/kvm");
        let vm = kvm.create_vm().unwrap();
        let fd = vm.create_vcpu(0).unwrap();
        let cpuid = kvm.get_supported_cpuid(MAX_CPUID_ENTRIES).unwrap();
        fd.set_cpuid2(&cpuid).unwrap();
        let mut regs = fd.get_regs().unwrap();
        regs.rip = 0x1234;
        regs.rbx = 42;
        fd.set_regs(&regs).unwrap();
        let list = saveable_msrs(&kvm).unwrap();
        let saved = VcpuState::save(0, &fd, &list, false).unwrap();
        assert!(!saved.msrs.is_empty());
        let fd2 = vm.create_vcpu(1).unwrap();
        saved.restore(&fd2).unwrap();
        let r2 = fd2.get_regs().unwrap();
        assert_eq!((r2.rip, r2.rbx), (0x1234, 42));
    }
}
