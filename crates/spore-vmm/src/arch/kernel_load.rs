//! What a kernel loader (`load_kernel`) is given: the VM's KVM objects, its
//! RAM, its configuration and its devices' places. Apart from the rest of
//! the arch API because it is the one part that takes `memory`'s types,
//! while `memory` takes `layout` from here.

use std::fs::File;

use kvm_ioctls::{Kvm, VcpuFd};

use super::{GuestKind, Irqchip, MmioPlacement};
use crate::config::VmConfig;
use crate::memory::GuestMemoryMmap;

/// A kernel to load into a new VM, and what it must be told.
pub struct KernelLoad<'a> {
    pub kvm: &'a Kvm,
    pub vcpus: &'a [VcpuFd],
    pub irqchip: &'a Irqchip,
    pub mem: &'a GuestMemoryMmap,
    pub config: &'a VmConfig,
    pub kind: GuestKind,
    pub kernel: File,
    pub initrd: Option<File>,
    /// The command line without devices (the architecture adds what its
    /// guests need to find them).
    pub cmdline: String,
    /// Every virtio-mmio device, in slot order.
    pub placed: &'a [MmioPlacement],
    /// Where the hotplug region ends (the unikernel's identity map must reach it), or 0.
    pub hotplug_end: u64,
}
