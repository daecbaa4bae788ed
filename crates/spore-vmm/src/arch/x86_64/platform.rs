//! The VM-wide KVM objects of an x86_64 VM (TSS, in-kernel PIC/IOAPIC/LAPICs,
//! PIT), what a pause tells the guest, and saving and restoring the CPU
//! state of a snapshot.

use kvm_bindings::{kvm_pit_config, KVM_PIT_SPEAKER_DUMMY};
use kvm_ioctls::{Kvm, VcpuFd, VmFd};

use super::layout;
use super::vcpu_state::{saveable_msrs, VcpuState, VcpuStateError};
use super::vm_state::{VmState, VmStateError};
use crate::arch::GuestKind;
use crate::host_usize;

/// What snapshots record as the architecture they were taken on.
pub const NAME: &str = "x86_64";

/// The spore unikernel (ring 3 on x86_64) boots here.
pub const UNIKERNEL_SUPPORTED: bool = true;

/// A KVM call that set up the VM failed.
#[derive(Debug, thiserror::Error)]
#[error("KVM refused {what}: {source}")]
pub struct PlatformError {
    pub what: &'static str,
    #[source]
    pub source: kvm_ioctls::Error,
}

fn kvm(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> PlatformError {
    move |source| PlatformError { what, source }
}

/// The in-kernel interrupt controllers, if the VM has them (a unikernel
/// polls and can do without).
#[derive(Debug)]
pub struct Irqchip {
    present: bool,
}

impl Irqchip {
    pub fn present(&self) -> bool {
        self.present
    }

    /// Nothing to do once the vCPUs exist: KVM_CREATE_IRQCHIP made it all.
    pub fn finish(&mut self, _vcpus: &[VcpuFd]) -> Result<(), PlatformError> {
        Ok(())
    }
}

/// Right after `KVM_CREATE_VM`: places KVM's TSS at the top of the MMIO hole.
pub fn prepare_vm(vm_fd: &VmFd) -> Result<(), PlatformError> {
    vm_fd
        .set_tss_address(host_usize::from_u64(layout::KVM_TSS_ADDR))
        .map_err(kvm("KVM_SET_TSS_ADDR"))
}

/// The in-kernel PICs, IOAPIC and LAPICs (after RAM, before the vCPUs).
/// `required`: the guest cannot run without them (Linux, or a snapshot
/// taken with them); otherwise their absence is only logged.
pub fn create_irqchip(
    vm_fd: &VmFd,
    required: bool,
    _vcpu_count: u8,
) -> Result<Irqchip, PlatformError> {
    match vm_fd.create_irq_chip() {
        Ok(()) => Ok(Irqchip { present: true }),
        Err(e) if required => Err(kvm("KVM_CREATE_IRQCHIP")(e)),
        Err(e) => {
            tracing::debug!("no in-kernel irqchip: {e}");
            Ok(Irqchip { present: false })
        }
    }
}

/// The PIT, for Linux guests (its speaker port stubbed).
pub fn create_platform_timer(vm_fd: &VmFd, kind: GuestKind) -> Result<(), PlatformError> {
    if kind != GuestKind::Linux {
        return Ok(());
    }
    let pit = kvm_pit_config {
        flags: KVM_PIT_SPEAKER_DUMMY,
        ..Default::default()
    };
    vm_fd.create_pit2(pit).map_err(kvm("KVM_CREATE_PIT2"))
}

/// Nothing to do per vCPU on x86 before it is set up.
pub fn init_vcpu(_vm_fd: &VmFd, _fd: &VcpuFd, _id: u8) -> Result<(), PlatformError> {
    Ok(())
}

/// A parked vCPU of a paused VM: tell a kvmclock guest it was stopped on
/// purpose (PVCLOCK_GUEST_STOPPED), so its soft-lockup watchdog does not
/// fire after a long pause, or in a VM restored from a snapshot taken now.
/// Fails harmlessly where kvmclock is not in use.
pub fn on_pause(kind: GuestKind, fd: &VcpuFd) {
    if kind != GuestKind::Linux {
        return;
    }
    if let Err(e) = fd.kvmclock_ctrl() {
        tracing::debug!("KVM_KVMCLOCK_CTRL: {e}");
    }
}

/// Why the CPU state of a snapshot could not be read or applied.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("cannot read the MSR list: {0}")]
    MsrList(#[source] kvm_ioctls::Error),
    #[error(transparent)]
    Vcpu(#[from] VcpuStateError),
    #[error(transparent)]
    Vm(#[from] VmStateError),
}

/// Reads every parked vCPU's state and the VM-wide state (irqchip, PIT,
/// kvmclock).
pub fn save_state(
    kvm: &Kvm,
    vm_fd: &VmFd,
    irqchip: &Irqchip,
    kind: GuestKind,
    vcpus: &[&VcpuFd],
) -> Result<(Vec<VcpuState>, VmState), StateError> {
    let msr_list = saveable_msrs(kvm).map_err(StateError::MsrList)?;
    let mut states = Vec::with_capacity(vcpus.len());
    for (id, fd) in (0..=u8::MAX).zip(vcpus) {
        states.push(VcpuState::save(id, fd, &msr_list, irqchip.present)?);
    }
    let vm = VmState::save(vm_fd, irqchip.present, kind == GuestKind::Linux)?;
    Ok((states, vm))
}

/// Applies a snapshot's CPU state to fresh vCPUs (same count), then the
/// VM-wide state.
pub fn restore_state(
    vm_fd: &VmFd,
    _irqchip: &Irqchip,
    vcpus: &[VcpuFd],
    states: &[VcpuState],
    vm: &VmState,
) -> Result<(), StateError> {
    for (fd, vcpu) in vcpus.iter().zip(states) {
        vcpu.restore(fd)?;
    }
    vm.restore(vm_fd)?;
    Ok(())
}

/// The CPU state of a VM that never ran, for tests that write state files.
#[cfg(test)]
pub fn empty_state(vcpus: usize) -> (Vec<VcpuState>, VmState) {
    let vcpu = |id| VcpuState {
        id,
        cpuid: Vec::new(),
        regs: Default::default(),
        sregs: Default::default(),
        xsave: Default::default(),
        xcrs: Default::default(),
        msrs: Vec::new(),
        lapic: None,
        mp_state: Default::default(),
        events: Default::default(),
        debug_regs: Default::default(),
        tsc_khz: None,
    };
    let vm = VmState {
        irqchips: Vec::new(),
        pit: None,
        clock: Default::default(),
        advance_to_realtime: false,
    };
    ((0..=u8::MAX).take(vcpus).map(vcpu).collect(), vm)
}

/// Where a vCPU stopped, in one line, for a guest that crashed past its own
/// handling (a triple fault): instruction and stack pointers, the paging
/// state and the exception KVM was delivering. Read after the exit, so a
/// register KVM cannot give is left out rather than failing the report.
pub fn crash_report(fd: &VcpuFd) -> String {
    let mut parts = Vec::new();
    if let Ok(r) = fd.get_regs() {
        parts.push(format!(
            "rip {:#x} rsp {:#x} rflags {:#x}",
            r.rip, r.rsp, r.rflags
        ));
    }
    if let Ok(s) = fd.get_sregs() {
        parts.push(format!(
            "cs {:#x} cr0 {:#x} cr2 {:#x} cr3 {:#x} cr4 {:#x} efer {:#x}",
            s.cs.selector, s.cr0, s.cr2, s.cr3, s.cr4, s.efer
        ));
    }
    if let Ok(e) = fd.get_vcpu_events() {
        let ex = e.exception;
        if ex.injected != 0 || ex.pending != 0 {
            parts.push(format!(
                "exception {} (error code {:#x})",
                ex.nr, ex.error_code
            ));
        }
    }
    parts.join(", ")
}
