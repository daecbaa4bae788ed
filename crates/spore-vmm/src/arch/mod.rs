//! Architecture-specific code, behind one API.
//!
//! Exactly one of [`x86_64`](self) and `aarch64` is compiled, the host's,
//! and re-exported here; the rest of the VMM names only `crate::arch::*`.
//! Each architecture module provides:
//!
//! - `NAME` (what snapshots record and check) and `layout`: where RAM,
//!   the virtio-mmio windows and the legacy devices are, and their IRQs;
//! - `DEFAULT_LINUX_CMDLINE`;
//! - the VM-wide KVM objects: `prepare_vm` (right after `KVM_CREATE_VM`),
//!   `create_irqchip` (after RAM, before vCPUs), `create_platform_timer`,
//!   `init_vcpu` (each vCPU after it is created), `Irqchip::finish`
//!   (after every vCPU), `on_pause` (each parked vCPU);
//! - `detect_unikernel` and `load_kernel` (a [`KernelLoad`]), with `BootError`;
//! - `VcpuState`, `VmState`, `save_state` and `restore_state` for snapshots,
//!   with `StateError`.

#[cfg(target_arch = "x86_64")]
pub mod x86_64;
#[cfg(target_arch = "x86_64")]
pub use self::x86_64::*;

#[cfg(target_arch = "aarch64")]
pub mod aarch64;
#[cfg(target_arch = "aarch64")]
pub use self::aarch64::*;

/// The aarch64 layout, device tree and register-id arithmetic are plain
/// data: their unit tests run on x86_64 hosts (CI) as well.
#[cfg(all(test, target_arch = "x86_64"))]
#[path = "aarch64"]
#[allow(dead_code)] // only their tests run here
mod aarch64_data {
    pub mod fdt;
    pub mod layout;
    pub mod regs;
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!("spore runs on x86_64 and aarch64 hosts only");

mod kernel_load;

pub use kernel_load::KernelLoad;

/// What runs in the VM: a Linux kernel, or a spore unikernel in ring 3;
/// it decides how the VM boots and which legacy devices it gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum GuestKind {
    Linux,
    Unikernel,
}

/// Which bus a legacy device sits on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BusKind {
    /// x86 port I/O.
    Pio,
    Mmio,
}

/// Where a legacy device sits (`layout::SERIAL` and friends).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LegacyPlace {
    pub bus: BusKind,
    pub base: u64,
    pub len: u64,
    /// Its interrupt, as `layout` numbers them.
    pub irq: u32,
}

/// One virtio-mmio device as the guest must be told of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmioPlacement {
    /// Guest-physical address of its window (`layout::VIRTIO_MMIO_SIZE` long).
    pub addr: u64,
    /// Its interrupt, as `layout` numbers them.
    pub irq: u32,
    /// The virtio device type.
    pub device_type: u32,
}
