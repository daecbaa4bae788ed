//! The KVM objects every build makes, in the order that keeps it fast:
//! the VM, then (the caller registers RAM here) the irqchip and the PIT,
//! then vCPUs; and [`PreparedKvm`], the same objects made ahead of a
//! restore whose RAM is not known yet.

use kvm_bindings::{kvm_pit_config, KVM_PIT_SPEAKER_DUMMY};
use kvm_ioctls::{Kvm, VcpuFd, VmFd};

use super::{kvm_setup, BuildError};
use crate::arch::x86_64::layout;
use crate::arch::GuestKind;
use crate::config::VmConfig;
use crate::memory::GuestRam;
use crate::snapshot::MicrovmState;

/// KVM objects made ahead of time for a restore whose RAM is not known yet
/// (a standby clone process): the VM, its memory slots over a placeholder
/// mapping of the final size, the irqchip and the vCPUs. Creating and
/// registering these is most of a restore's cost and grows with memory
/// size; the RAM is later mapped over the same host addresses.
pub struct PreparedKvm {
    pub(super) kvm: Kvm,
    pub(super) vm_fd: VmFd,
    pub(super) irqchip: bool,
    pub(super) vcpus: Vec<VcpuFd>,
    pub(super) mem_bytes: u64,
}

impl PreparedKvm {
    pub fn mem_bytes(&self) -> u64 {
        self.mem_bytes
    }

    /// Whether a VM with this configuration and state can be restored on it.
    pub fn fits(&self, config: &VmConfig, state: &MicrovmState) -> bool {
        self.mem_bytes == config.machine.mem_bytes()
            && self.vcpus.len() as u64 == config.machine.vcpu_count
            && !config.machine.track_dirty_pages
            && config.memory_hotplug.is_none()
            && (self.irqchip || state.vm.irqchips.is_empty())
    }
}

/// Creates the VM and registers `ram` (a placeholder of the final size,
/// without dirty logging) before the irqchip, as a build would.
pub fn prepare_kvm(ram: &GuestRam, vcpus: u8) -> Result<PreparedKvm, BuildError> {
    let (kvm, vm_fd) = create_vm()?;
    ram.register(&vm_fd, false)?;
    let irqchip = vm_fd.create_irq_chip().is_ok();
    let vcpus = create_vcpus(&vm_fd, vcpus, Vec::new())?;
    Ok(PreparedKvm {
        kvm,
        vm_fd,
        irqchip,
        vcpus,
        mem_bytes: ram.size(),
    })
}

/// A new VM with its TSS placed. Register guest RAM next, before the irqchip.
pub(super) fn create_vm() -> Result<(Kvm, VmFd), BuildError> {
    let kvm = Kvm::new().map_err(BuildError::Kvm)?;
    let vm_fd = kvm.create_vm().map_err(kvm_setup("KVM_CREATE_VM"))?;
    vm_fd
        .set_tss_address(layout::KVM_TSS_ADDR as usize)
        .map_err(kvm_setup("KVM_SET_TSS_ADDR"))?;
    Ok((kvm, vm_fd))
}

/// Creates the in-kernel irqchip; returns whether the VM has one. Linux
/// needs it (and so does a snapshot taken with one); a unikernel polls and
/// can do without.
pub(super) fn create_irqchip(
    vm_fd: &VmFd,
    kind: GuestKind,
    snapshot_has_one: bool,
) -> Result<bool, BuildError> {
    match (vm_fd.create_irq_chip(), kind) {
        (Ok(()), _) => Ok(true),
        (Err(e), _) if snapshot_has_one => {
            Err(kvm_setup("KVM_CREATE_IRQCHIP (the snapshot has one)")(e))
        }
        (Err(e), GuestKind::Linux) => Err(kvm_setup("KVM_CREATE_IRQCHIP")(e)),
        (Err(e), GuestKind::Unikernel) => {
            tracing::debug!("no in-kernel irqchip for the unikernel: {e}");
            Ok(false)
        }
    }
}

/// The PIT, for Linux guests (its speaker port stubbed).
pub(super) fn create_pit(vm_fd: &VmFd, kind: GuestKind) -> Result<(), BuildError> {
    if kind != GuestKind::Linux {
        return Ok(());
    }
    let pit = kvm_pit_config {
        flags: KVM_PIT_SPEAKER_DUMMY,
        ..Default::default()
    };
    vm_fd.create_pit2(pit).map_err(kvm_setup("KVM_CREATE_PIT2"))
}

/// vCPUs 0..count: those made ahead (`premade`, in id order) first, then new ones.
pub(super) fn create_vcpus(
    vm_fd: &VmFd,
    count: u8,
    premade: Vec<VcpuFd>,
) -> Result<Vec<VcpuFd>, BuildError> {
    let mut premade = premade.into_iter();
    (0..count)
        .map(|id| match premade.next() {
            Some(fd) => Ok(fd),
            None => vm_fd
                .create_vcpu(u64::from(id))
                .map_err(kvm_setup("KVM_CREATE_VCPU")),
        })
        .collect()
}

/// Applies the snapshot's vCPU and VM-wide KVM state to the new VM.
pub(super) fn restore_cpus(
    vm_fd: &VmFd,
    fds: &[VcpuFd],
    state: &MicrovmState,
) -> Result<(), BuildError> {
    if fds.len() != state.vcpus.len() {
        return Err(BuildError::Device {
            what: "vCPUs",
            detail: format!(
                "the snapshot has {} vCPUs, the VM {}",
                state.vcpus.len(),
                fds.len()
            ),
        });
    }
    for (fd, vcpu) in fds.iter().zip(&state.vcpus) {
        vcpu.restore(fd).map_err(|e| BuildError::Device {
            what: "vCPU state",
            detail: e.to_string(),
        })?;
    }
    state.vm.restore(vm_fd).map_err(|e| BuildError::Device {
        what: "VM state",
        detail: e.to_string(),
    })
}
