//! Loading a kernel into a new x86_64 VM: a Linux kernel (bzImage or ELF
//! vmlinux with a PVH note, initrd, command line with one
//! `virtio_mmio.device=` per device, MP table) or a spore unikernel (ELF,
//! page tables, boot info), and the vCPUs set up to enter it.

use std::fs::File;

use kvm_ioctls::Kvm;

use super::cpu_template::{self, apply_msrs, CpuSetup, CpuTemplateError};
use super::layout;
use super::linux::{load_linux, LinuxBootError};
use super::linux_vcpu::{configure_linux_vcpu, LinuxVcpuError};
use super::msr::{self, MsrError};
use super::unikernel::{
    configure_vcpu as configure_unikernel_vcpu, is_spore_unikernel, load_unikernel_mapping,
    set_supported_cpuid, UnikernelError,
};
use crate::arch::{GuestKind, KernelLoad, MmioPlacement};
use crate::config::VmConfig;

/// Command line used when `/boot-source` gives none (Firecracker's, plus the
/// console): reboot through the keyboard controller, no PCI probing.
pub const DEFAULT_LINUX_CMDLINE: &str =
    "console=ttyS0 reboot=k panic=1 pci=off i8042.noaux i8042.nomux i8042.dumbkbd";

/// Why a kernel could not be loaded or its vCPUs set up.
#[derive(Debug, thiserror::Error)]
pub enum BootError {
    #[error("Linux boot: {0}")]
    Linux(#[from] LinuxBootError),
    #[error("Linux vCPU setup: {0}")]
    LinuxVcpu(#[from] LinuxVcpuError),
    #[error(transparent)]
    CpuTemplate(#[from] CpuTemplateError),
    #[error("CPU template MSRs: {0}")]
    Msrs(#[from] MsrError),
    #[error("unikernel boot: {0}")]
    Unikernel(#[from] UnikernelError),
    #[error("the VM has no vCPU")]
    NoVcpu,
}

/// Whether the kernel image is a spore unikernel (its ELF note says so).
pub fn detect_unikernel(kernel: &mut File) -> Result<bool, BootError> {
    Ok(is_spore_unikernel(kernel)?)
}

/// Loads the kernel and sets up the vCPUs to enter it.
pub fn load_kernel(k: KernelLoad<'_>) -> Result<(), BootError> {
    let KernelLoad {
        kvm,
        vcpus,
        mem,
        config,
        kind,
        mut kernel,
        mut initrd,
        cmdline,
        placed,
        hotplug_end,
        irqchip: _,
    } = k;
    // create_vcpus made at most u8::MAX of them (its count is a u8).
    let num_vcpus = u8::try_from(vcpus.len()).unwrap_or(u8::MAX);
    let cpu = cpu_setup(kvm, config)?;
    match kind {
        GuestKind::Linux => {
            let cmdline = with_mmio_devices(cmdline, placed);
            let entry = load_linux(mem, &mut kernel, initrd.as_mut(), &cmdline, num_vcpus)?;
            for (id, fd) in (0..=u8::MAX).zip(vcpus) {
                configure_linux_vcpu(kvm, fd, mem, id, num_vcpus, &entry, &cpu)?;
            }
        }
        GuestKind::Unikernel => {
            let bsp = vcpus.first().ok_or(BootError::NoVcpu)?;
            let devices: Vec<spore_abi::boot::MmioDevice> = placed
                .iter()
                .map(|p| spore_abi::boot::MmioDevice {
                    base: p.addr,
                    size: layout::VIRTIO_MMIO_SIZE,
                    device_id: p.device_type,
                    irq: p.irq,
                })
                .collect();
            let tsc_khz = bsp.get_tsc_khz().map(u64::from).unwrap_or(0);
            let entry =
                load_unikernel_mapping(mem, &mut kernel, &cmdline, &devices, tsc_khz, hotplug_end)?;
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
fn cpu_setup(kvm: &Kvm, config: &VmConfig) -> Result<CpuSetup, BootError> {
    let template = cpu_template::resolve(&config.machine, config.cpu_config.as_ref())?;
    if let Some(t) = &template {
        cpu_template::check_capabilities(kvm, t)?;
    }
    Ok(CpuSetup {
        smt: config.machine.smt,
        template,
    })
}

/// Linux on x86 finds virtio-mmio devices on its command line (there is no
/// device tree): one `virtio_mmio.device=SIZE@ADDR:IRQ` per device.
pub fn with_mmio_devices(mut cmdline: String, placed: &[MmioPlacement]) -> String {
    for p in placed {
        cmdline.push_str(&format!(
            " virtio_mmio.device={}K@{:#x}:{}",
            layout::VIRTIO_MMIO_SIZE >> 10,
            p.addr,
            p.irq
        ));
    }
    cmdline
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cmdline_lists_devices() {
        let placed = [
            MmioPlacement {
                addr: 0xd000_0000,
                irq: 5,
                device_type: 2,
            },
            MmioPlacement {
                addr: 0xd000_1000,
                irq: 6,
                device_type: 4,
            },
        ];
        assert_eq!(
            with_mmio_devices("console=ttyS0".into(), &placed),
            "console=ttyS0 virtio_mmio.device=4K@0xd0000000:5 \
             virtio_mmio.device=4K@0xd0001000:6"
        );
    }
}
