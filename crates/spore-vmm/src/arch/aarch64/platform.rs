//! The VM-wide KVM objects of an aarch64 VM (the in-kernel GIC; the
//! architected timer needs no setup), and saving and restoring the CPU
//! state of a snapshot: every vCPU register KVM lists and the GIC.

use kvm_ioctls::{Kvm, VcpuFd, VmFd};
use serde::{Deserialize, Serialize};

use super::gic::{Gic, GicError, GicState};
use super::vcpu::{self, VcpuError, VcpuState};
use crate::arch::GuestKind;

/// What snapshots record as the architecture they were taken on.
pub const NAME: &str = "aarch64";

/// The spore unikernel is an x86_64 program.
pub const UNIKERNEL_SUPPORTED: bool = false;

/// A KVM call that set up the VM failed.
#[derive(Debug, thiserror::Error)]
pub enum PlatformError {
    #[error("GIC: {0}")]
    Gic(#[from] GicError),
    #[error("vCPU {id}: {source}")]
    Vcpu {
        id: u8,
        #[source]
        source: VcpuError,
    },
}

/// The in-kernel GIC (every aarch64 VM has one).
pub struct Irqchip {
    gic: Gic,
}

impl Irqchip {
    pub fn present(&self) -> bool {
        true
    }

    /// Initializes the GIC once every vCPU exists (KVM sizes the
    /// redistributors by the vCPUs it sees then).
    pub fn finish(&mut self, _vcpus: &[VcpuFd]) -> Result<(), PlatformError> {
        Ok(self.gic.finalize()?)
    }

    /// What the device tree says of the GIC.
    pub fn desc(&self) -> super::fdt::GicDesc {
        self.gic.desc()
    }
}

/// Nothing to place before RAM on aarch64.
pub fn prepare_vm(_vm_fd: &VmFd) -> Result<(), PlatformError> {
    Ok(())
}

/// The GIC (GICv3, else GICv2), made before the vCPUs and initialized by
/// [`Irqchip::finish`] after them. `required` does not matter: Linux cannot
/// run without it and there is nothing else to run.
pub fn create_irqchip(
    vm_fd: &VmFd,
    _required: bool,
    vcpu_count: u8,
) -> Result<Irqchip, PlatformError> {
    Ok(Irqchip {
        gic: Gic::create(vm_fd, vcpu_count)?,
    })
}

/// The architected timer is part of every vCPU: nothing to create.
pub fn create_platform_timer(_vm_fd: &VmFd, _kind: GuestKind) -> Result<(), PlatformError> {
    Ok(())
}

/// `KVM_ARM_VCPU_INIT` with PSCI; vCPUs other than 0 start powered off.
pub fn init_vcpu(vm_fd: &VmFd, fd: &VcpuFd, id: u8) -> Result<(), PlatformError> {
    vcpu::init_vcpu(vm_fd, fd, id).map_err(|source| PlatformError::Vcpu { id, source })
}

/// A pause needs no word to an arm64 guest (its timer is virtual).
pub fn on_pause(_kind: GuestKind, _fd: &VcpuFd) {}

/// VM-wide state: the GIC.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct VmState {
    pub gic: GicState,
}

impl VmState {
    pub fn has_irqchip(&self) -> bool {
        true
    }

    /// Advancing the guest clock to the host's wall clock at restore is an
    /// x86 kvmclock feature.
    pub fn set_clock_realtime(&mut self) -> Result<(), &'static str> {
        Err("clock_realtime is not supported on aarch64")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("vCPU {id}: {source}")]
    Vcpu {
        id: u8,
        #[source]
        source: VcpuError,
    },
    #[error("GIC: {0}")]
    Gic(#[from] GicError),
}

/// Reads every parked vCPU's registers, then the GIC (whose redistributor
/// and CPU-interface state is addressed by each vCPU's MPIDR).
pub fn save_state(
    _kvm: &Kvm,
    _vm_fd: &VmFd,
    irqchip: &Irqchip,
    _kind: GuestKind,
    vcpus: &[&VcpuFd],
) -> Result<(Vec<VcpuState>, VmState), StateError> {
    let mut states = Vec::with_capacity(vcpus.len());
    let mut mpidrs = Vec::with_capacity(vcpus.len());
    for (id, fd) in (0..=u8::MAX).zip(vcpus) {
        let err = |source| StateError::Vcpu { id, source };
        states.push(VcpuState::save(fd).map_err(err)?);
        mpidrs.push(vcpu::mpidr(fd).map_err(err)?);
    }
    let gic = irqchip.gic.save(&mpidrs)?;
    Ok((states, VmState { gic }))
}

/// Applies a snapshot's registers to fresh vCPUs (same count), then the GIC.
pub fn restore_state(
    _vm_fd: &VmFd,
    irqchip: &Irqchip,
    vcpus: &[VcpuFd],
    states: &[VcpuState],
    vm: &VmState,
) -> Result<(), StateError> {
    let mut mpidrs = Vec::with_capacity(vcpus.len());
    for (id, (fd, state)) in (0..=u8::MAX).zip(vcpus.iter().zip(states)) {
        let err = |source| StateError::Vcpu { id, source };
        state.restore(fd).map_err(err)?;
        mpidrs.push(vcpu::mpidr(fd).map_err(err)?);
    }
    irqchip.gic.restore(&vm.gic, &mpidrs)?;
    Ok(())
}

/// The CPU state of a VM that never ran, for tests that write state files.
#[cfg(test)]
pub fn empty_state(vcpus: usize) -> (Vec<VcpuState>, VmState) {
    let vcpu = || VcpuState {
        regs: Vec::new(),
        mp_state: 0,
    };
    let gic = GicState {
        version: super::fdt::GicVersion::V3,
        nr_irqs: 32 + super::layout::GIC_NR_SPIS,
        dist: Vec::new(),
        spi_levels: Vec::new(),
        vcpus: Vec::new(),
    };
    ((0..vcpus).map(|_| vcpu()).collect(), VmState { gic })
}

/// Where a vCPU stopped, in one line, for a guest that crashed past its own
/// handling: its program counter, if KVM gives it.
pub fn crash_report(fd: &VcpuFd) -> String {
    let mut pc = [0u8; 8];
    match fd.get_one_reg(super::regs::core_reg_id(super::regs::PC_OFFSET), &mut pc) {
        Ok(_) => format!("pc {:#x}", u64::from_ne_bytes(pc)),
        Err(_) => String::new(),
    }
}
