//! x86_64: boot protocols, CPU setup and firmware tables.

pub mod cpu_template;
pub mod cpuid;
pub mod layout;
pub mod linux;
pub mod linux_vcpu;
pub mod mptable;
pub mod msr;
pub mod regs;
pub mod unikernel;
pub mod vcpu_state;
