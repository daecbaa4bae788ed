//! aarch64: the `virt`-like layout, the in-kernel GIC, PSCI vCPUs, the
//! device tree and the arm64 `Image` boot protocol, and the vCPU and GIC
//! state of snapshots.

mod boot;
pub mod fdt;
pub mod gic;
pub mod layout;
mod platform;
pub mod regs;
pub mod vcpu;

pub use boot::{detect_unikernel, load_kernel, BootError, DEFAULT_LINUX_CMDLINE};
#[cfg(test)]
pub use platform::empty_state;
pub use platform::{
    crash_report, create_irqchip, create_platform_timer, init_vcpu, on_pause, prepare_vm,
    restore_state, save_state, Irqchip, PlatformError, StateError, VmState, NAME,
    UNIKERNEL_SUPPORTED,
};
pub use vcpu::VcpuState;
