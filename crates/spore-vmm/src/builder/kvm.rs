//! The KVM objects every build makes, in the order that keeps it fast and
//! that every architecture accepts: the VM, then (the caller registers RAM
//! here) the irqchip and platform timer, then the vCPUs, then the
//! irqchip's last step; and [`PreparedKvm`], the same objects made ahead of
//! a restore whose RAM is not known yet.

use std::sync::Mutex;
use std::thread::JoinHandle;

use kvm_ioctls::{Kvm, VcpuFd, VmFd};

use super::{kvm_setup, BuildError};
use crate::arch::{self, GuestKind, Irqchip};
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
    pub(super) irqchip: Irqchip,
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
            && (self.irqchip.present() || !state.vm.has_irqchip())
    }
}

/// Creates the VM and registers `ram` (a placeholder of the final size,
/// without dirty logging) before the irqchip, as a build would.
pub fn prepare_kvm(ram: &GuestRam, vcpus: u8) -> Result<PreparedKvm, BuildError> {
    let (kvm, vm_fd) = create_vm()?;
    ram.register(&vm_fd, false)?;
    let mut irqchip = arch::create_irqchip(&vm_fd, false, vcpus)?;
    let vcpus = create_vcpus(&vm_fd, vcpus, Vec::new())?;
    irqchip.finish(&vcpus)?;
    Ok(PreparedKvm {
        kvm,
        vm_fd,
        irqchip,
        vcpus,
        mem_bytes: ram.size(),
    })
}

type MadeVm = Result<(Kvm, VmFd), BuildError>;

/// This process's first VM, being made ahead ([`make_vm_ahead`]).
static AHEAD: Mutex<Option<JoinHandle<MadeVm>>> = Mutex::new(None);

/// Starts making this process's first VM on a thread of its own while the
/// process waits for its requests: `KVM_CREATE_VM` is a cost every build
/// pays (0.2 ms on a host, tens of ms under nested emulation) and needs
/// nothing from the configuration. The first build takes it. Only for a
/// process that builds its own VM: a VM belongs to the process that made
/// it, so a clone factory, which forks its clones, must not.
pub fn make_vm_ahead() {
    match crate::seccomp::spawn(crate::seccomp::ThreadKind::Vmm, "vm-ahead".into(), make_vm) {
        Ok(h) => *AHEAD.lock().unwrap_or_else(|e| e.into_inner()) = Some(h),
        Err(e) => tracing::debug!("cannot make the VM ahead: {e}"),
    }
}

/// A new VM, with what its architecture sets up first (the one made ahead
/// if there is one). Register guest RAM next, before the irqchip.
pub(super) fn create_vm() -> MadeVm {
    let ahead = AHEAD.lock().unwrap_or_else(|e| e.into_inner()).take();
    match ahead.map(JoinHandle::join) {
        Some(Ok(Ok(made))) => return Ok(made),
        Some(Ok(Err(e))) => tracing::debug!("the VM made ahead failed ({e}); trying again"),
        Some(Err(_)) => tracing::debug!("the thread making the VM ahead panicked"),
        None => {}
    }
    make_vm()
}

fn make_vm() -> MadeVm {
    let kvm = crate::privilege::kvm().map_err(BuildError::Kvm)?;
    let vm_fd = kvm.create_vm().map_err(kvm_setup("KVM_CREATE_VM"))?;
    arch::prepare_vm(&vm_fd)?;
    Ok((kvm, vm_fd))
}

/// Creates the in-kernel irqchip and the platform timer. Linux needs the
/// irqchip (and so does a snapshot taken with one); a unikernel polls and
/// can do without.
pub(super) fn create_irqchip(
    vm_fd: &VmFd,
    kind: GuestKind,
    snapshot_has_one: bool,
    vcpu_count: u8,
) -> Result<Irqchip, BuildError> {
    let required = snapshot_has_one || kind == GuestKind::Linux;
    let irqchip = arch::create_irqchip(vm_fd, required, vcpu_count)?;
    arch::create_platform_timer(vm_fd, kind)?;
    Ok(irqchip)
}

/// vCPUs 0..count: those made ahead (`premade`, in id order) first, then
/// new ones, each set up as its architecture wants before anything else.
pub(super) fn create_vcpus(
    vm_fd: &VmFd,
    count: u8,
    premade: Vec<VcpuFd>,
) -> Result<Vec<VcpuFd>, BuildError> {
    let mut premade = premade.into_iter();
    (0..count)
        .map(|id| match premade.next() {
            Some(fd) => Ok(fd),
            None => {
                let fd = vm_fd
                    .create_vcpu(u64::from(id))
                    .map_err(kvm_setup("KVM_CREATE_VCPU"))?;
                arch::init_vcpu(vm_fd, &fd, id)?;
                Ok(fd)
            }
        })
        .collect()
}

/// Applies the snapshot's vCPU and VM-wide KVM state to the new VM.
pub(super) fn restore_cpus(
    vm_fd: &VmFd,
    irqchip: &Irqchip,
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
    arch::restore_state(vm_fd, irqchip, fds, &state.vcpus, &state.vm).map_err(|e| {
        BuildError::Device {
            what: "CPU state",
            detail: e.to_string(),
        }
    })
}
