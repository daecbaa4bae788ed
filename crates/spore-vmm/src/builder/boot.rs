//! What only a booted VM needs: which boot protocol its kernel speaks, and
//! loading the kernel (Linux: image, initrd, command line, vCPU setup;
//! unikernel: ELF, page tables, boot info). A restored VM's memory already
//! holds its kernel.

use std::fs::File;

use kvm_ioctls::{Kvm, VcpuFd};

use super::{BuildError, DEFAULT_LINUX_CMDLINE};
use crate::arch::x86_64::cpu_template::{self, apply_msrs, CpuSetup};
use crate::arch::x86_64::layout;
use crate::arch::x86_64::linux::load_linux;
use crate::arch::x86_64::linux_vcpu::configure_linux_vcpu;
use crate::arch::x86_64::msr;
use crate::arch::x86_64::unikernel::{
    configure_vcpu as configure_unikernel_vcpu, is_spore_unikernel, load_unikernel_mapping,
    set_supported_cpuid,
};
use crate::arch::GuestKind;
use crate::config::{BootProtocol, VmConfig};
use crate::memory::GuestMemoryMmap;

/// The guest kind the boot source asks for, or finds in the kernel's ELF note.
pub(super) fn guest_kind(
    protocol: BootProtocol,
    kernel: &mut File,
) -> Result<GuestKind, BuildError> {
    Ok(match protocol {
        BootProtocol::Linux => GuestKind::Linux,
        BootProtocol::Unikernel => GuestKind::Unikernel,
        BootProtocol::Auto if is_spore_unikernel(kernel)? => GuestKind::Unikernel,
        BootProtocol::Auto => GuestKind::Linux,
    })
}

/// Refuses what the unikernel protocol cannot do.
pub(super) fn check_guest(config: &VmConfig, kind: GuestKind) -> Result<(), BuildError> {
    if kind == GuestKind::Unikernel {
        if config.machine.vcpu_count != 1 {
            return Err(BuildError::UnikernelVcpus(config.machine.vcpu_count));
        }
        if config
            .boot_source
            .as_ref()
            .is_some_and(|b| b.initrd_path.is_some())
        {
            return Err(BuildError::UnikernelInitrd);
        }
    }
    Ok(())
}

/// A kernel to load into a new VM, and what it must be told.
pub(super) struct KernelLoad<'a> {
    pub kvm: &'a Kvm,
    pub vcpus: &'a [VcpuFd],
    pub mem: &'a GuestMemoryMmap,
    pub config: &'a VmConfig,
    pub kind: GuestKind,
    pub kernel: File,
    pub initrd: Option<File>,
    /// (window address, IRQ, device type) of each virtio-mmio device.
    pub placed: &'a [(u64, u32, u32)],
    /// Where the hotplug region ends (the unikernel's identity map must reach it), or 0.
    pub hotplug_end: u64,
}

/// Loads the kernel and sets up the vCPUs to enter it.
pub(super) fn load_kernel(k: KernelLoad<'_>) -> Result<(), BuildError> {
    let KernelLoad {
        kvm,
        vcpus,
        mem,
        config,
        kind,
        mut kernel,
        mut initrd,
        placed,
        hotplug_end,
    } = k;
    let num_vcpus = vcpus.len() as u8;
    let cpu = cpu_setup(kvm, config)?;
    match kind {
        GuestKind::Linux => {
            let cmdline = linux_cmdline(config, placed);
            let entry = load_linux(mem, &mut kernel, initrd.as_mut(), &cmdline, num_vcpus)?;
            for (id, fd) in vcpus.iter().enumerate() {
                configure_linux_vcpu(kvm, fd, mem, id as u8, num_vcpus, &entry, &cpu)?;
            }
        }
        GuestKind::Unikernel => {
            let Some(bsp) = vcpus.first() else {
                return Err(BuildError::UnikernelVcpus(0));
            };
            let devices: Vec<spore_abi::boot::MmioDevice> = placed
                .iter()
                .map(|&(base, irq, device_id)| spore_abi::boot::MmioDevice {
                    base,
                    size: layout::VIRTIO_MMIO_SIZE,
                    device_id,
                    irq,
                })
                .collect();
            let tsc_khz = bsp.get_tsc_khz().map(u64::from).unwrap_or(0);
            let cmdline = config
                .boot_source
                .as_ref()
                .and_then(|b| b.boot_args.as_deref())
                .unwrap_or("");
            let entry =
                load_unikernel_mapping(mem, &mut kernel, cmdline, &devices, tsc_khz, hotplug_end)?;
            set_supported_cpuid(kvm, bsp, cpu.template.as_ref())?;
            if let Some(t) = &cpu.template {
                let mut msrs = Vec::new();
                apply_msrs(bsp, &mut msrs, t)?;
                msr::set_all(bsp, &msrs)?;
            }
            configure_unikernel_vcpu(bsp, &entry)?;
        }
    }
    Ok(())
}

/// The CPU template and topology every vCPU gets; a static template on a
/// CPU it was not made for, or a capability KVM lacks, refuses the build.
fn cpu_setup(kvm: &Kvm, config: &VmConfig) -> Result<CpuSetup, BuildError> {
    let template = cpu_template::resolve(&config.machine, config.cpu_config.as_ref())?;
    if let Some(t) = &template {
        cpu_template::check_capabilities(kvm, t)?;
    }
    Ok(CpuSetup {
        smt: config.machine.smt,
        template,
    })
}

/// The guest command line: the user's (or the default), the root device, and
/// one `virtio_mmio.device=` per device.
pub(super) fn linux_cmdline(config: &VmConfig, placed: &[(u64, u32, u32)]) -> String {
    let boot_args = config
        .boot_source
        .as_ref()
        .and_then(|b| b.boot_args.as_deref())
        .unwrap_or(DEFAULT_LINUX_CMDLINE);
    let mut cmdline = boot_args.trim().to_string();
    if let Some(root) = config.drives.iter().find(|d| d.is_root_device) {
        if !cmdline.split_whitespace().any(|w| w.starts_with("root=")) {
            let mode = if root.is_read_only { "ro" } else { "rw" };
            cmdline.push_str(&format!(" root=/dev/vda {mode}"));
        }
    }
    for (addr, irq, _) in placed {
        cmdline.push_str(&format!(
            " virtio_mmio.device={}K@{addr:#x}:{irq}",
            layout::VIRTIO_MMIO_SIZE >> 10
        ));
    }
    cmdline
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{BootSourceConfig, DriveConfig};

    #[test]
    fn cmdline_lists_devices_and_root() {
        let mut c = VmConfig {
            boot_source: Some(BootSourceConfig {
                kernel_image_path: "/k".into(),
                boot_args: Some("console=ttyS0".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        c.drives.push(DriveConfig {
            drive_id: "root".into(),
            path_on_host: "/d".into(),
            is_root_device: true,
            is_read_only: true,
            partuuid: None,
            cache_type: None,
            io_engine: None,
            cow_overlay: None,
            rate_limiter: None,
            socket: None,
        });
        let s = linux_cmdline(&c, &[(0xd000_0000, 5, 2), (0xd000_1000, 6, 4)]);
        assert_eq!(
            s,
            "console=ttyS0 root=/dev/vda ro virtio_mmio.device=4K@0xd0000000:5 \
             virtio_mmio.device=4K@0xd0001000:6"
        );
    }
}
