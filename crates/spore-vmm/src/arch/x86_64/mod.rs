//! x86_64: boot protocols, CPU setup, firmware tables, and the VM-wide and
//! per-vCPU state of snapshots.

mod boot;
pub mod cpu_template;
pub mod cpuid;
pub mod layout;
pub mod linux;
pub mod linux_vcpu;
pub mod mptable;
pub mod msr;
mod platform;
pub mod regs;
pub mod unikernel;
pub mod vcpu_state;
pub mod vm_state;

pub use boot::{detect_unikernel, load_kernel, BootError, DEFAULT_LINUX_CMDLINE};
#[cfg(test)]
pub use platform::empty_state;
pub use platform::{
    crash_report, create_irqchip, create_platform_timer, init_vcpu, on_pause, prepare_vm,
    restore_state, save_state, Irqchip, PlatformError, StateError, NAME, UNIKERNEL_SUPPORTED,
};
pub use vcpu_state::VcpuState;
pub use vm_state::VmState;
