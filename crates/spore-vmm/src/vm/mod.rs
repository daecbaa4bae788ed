//! The VM: KVM handles, memory slots, irqchip and vCPU threads.

pub mod wake;
