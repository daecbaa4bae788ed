//! Booting arm64 Linux: the `Image` at the start of RAM (linux-loader's PE
//! loader reads its header), the initrd and the device tree at the end of
//! RAM, vCPU 0 entering the kernel with the device tree's address in X0
//! (Documentation/arch/arm64/booting.rst); the other vCPUs wait powered off
//! until the guest starts them through PSCI.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};

use linux_loader::loader::pe::PE;
use linux_loader::loader::KernelLoader;
use vm_memory::{Bytes, GuestAddress};

use super::fdt::{create_fdt, FdtError, FdtParams};
use super::layout;
use super::vcpu::{mpidr, set_boot_regs, VcpuError};
use crate::arch::{GuestKind, KernelLoad};

/// Command line used when `/boot-source` gives none: the console on the
/// UART (and as early console, before the driver is up), PSCI resets.
pub const DEFAULT_LINUX_CMDLINE: &str = "console=ttyS0 reboot=k panic=1";

#[derive(Debug, thiserror::Error)]
pub enum BootError {
    #[error("the kernel is not an arm64 Linux Image (an x86 bzImage or vmlinux, or a compressed Image.gz, is not accepted): {0}")]
    NotAnImage(String),
    #[error("cannot read the {what}: {source}")]
    Read {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("the {what} ({size} bytes) does not fit in guest RAM")]
    TooBig { what: &'static str, size: u64 },
    #[error("cannot write the {0} into guest memory")]
    GuestWrite(&'static str),
    #[error("device tree: {0}")]
    Fdt(#[from] FdtError),
    #[error("vCPU setup: {0}")]
    Vcpu(#[from] VcpuError),
    #[error("the spore unikernel runs on x86_64 only")]
    Unikernel,
    #[error(
        "CPU templates are x86_64 only (cpu_template / cpu-config is not supported on aarch64)"
    )]
    CpuTemplate,
    #[error("the VM has no vCPU")]
    NoVcpu,
}

/// There is no aarch64 spore unikernel: every image is taken as Linux.
pub fn detect_unikernel(_kernel: &mut File) -> Result<bool, BootError> {
    Ok(false)
}

/// Loads the kernel, initrd and device tree and points vCPU 0 at them.
pub fn load_kernel(k: KernelLoad<'_>) -> Result<(), BootError> {
    let KernelLoad {
        vcpus,
        irqchip,
        mem,
        config,
        kind,
        mut kernel,
        initrd,
        cmdline,
        placed,
        ..
    } = k;
    if kind != GuestKind::Linux {
        return Err(BootError::Unikernel);
    }
    if config.machine.cpu_template.is_some() || config.cpu_config.is_some() {
        return Err(BootError::CpuTemplate);
    }
    let bsp = vcpus.first().ok_or(BootError::NoVcpu)?;
    let ram_size = config.machine.mem_bytes();
    let ram_end = layout::RAM_START + ram_size;

    let loaded = PE::load(
        mem,
        Some(GuestAddress(layout::RAM_START)),
        &mut kernel,
        None,
    )
    .map_err(|e| BootError::NotAnImage(e.to_string()))?;
    let kernel_end = loaded.kernel_end;

    // The device tree in the last 2 MiB, the initrd right below it (page
    // aligned), both above the kernel.
    let fdt_addr = ram_end
        .checked_sub(layout::FDT_MAX_SIZE)
        .filter(|&a| a >= kernel_end)
        .ok_or(BootError::TooBig {
            what: "kernel",
            size: kernel_end - layout::RAM_START,
        })?;
    let initrd_place = match initrd {
        Some(mut f) => {
            let size = f
                .seek(SeekFrom::End(0))
                .and_then(|s| f.seek(SeekFrom::Start(0)).map(|_| s))
                .map_err(|source| BootError::Read {
                    what: "initrd",
                    source,
                })?;
            let addr = fdt_addr
                .checked_sub(size)
                .map(|a| a & !0xfff)
                .filter(|&a| a >= kernel_end)
                .ok_or(BootError::TooBig {
                    what: "initrd",
                    size,
                })?;
            let mut bytes = Vec::with_capacity(crate::host_usize::from_u64(size));
            f.read_to_end(&mut bytes)
                .map_err(|source| BootError::Read {
                    what: "initrd",
                    source,
                })?;
            mem.write_slice(&bytes, GuestAddress(addr))
                .map_err(|_| BootError::GuestWrite("initrd"))?;
            Some((addr, size))
        }
        None => None,
    };

    let mut mpidrs = Vec::with_capacity(vcpus.len());
    for fd in vcpus {
        mpidrs.push(mpidr(fd)?);
    }
    let fdt = create_fdt(&FdtParams {
        mem_regions: layout::ram_regions(ram_size),
        vcpu_mpidrs: mpidrs,
        cmdline: with_earlycon(cmdline),
        initrd: initrd_place,
        gic: irqchip.desc(),
        serial: Some((layout::SERIAL_MMIO_BASE, layout::SERIAL_IRQ)),
        rtc: Some((layout::RTC_MMIO_BASE, layout::RTC_IRQ)),
        virtio: placed
            .iter()
            .map(|p| (p.addr, layout::VIRTIO_MMIO_SIZE, p.irq))
            .collect(),
    })?;
    if fdt.len() as u64 > layout::FDT_MAX_SIZE {
        return Err(BootError::TooBig {
            what: "device tree",
            size: fdt.len() as u64,
        });
    }
    mem.write_slice(&fdt, GuestAddress(fdt_addr))
        .map_err(|_| BootError::GuestWrite("device tree"))?;
    set_boot_regs(bsp, loaded.kernel_load.0, fdt_addr)?;
    Ok(())
}

/// Adds the UART as early console unless the user chose one: the kernel's
/// first lines (before the 8250 driver is up) then reach the console too.
fn with_earlycon(cmdline: String) -> String {
    if cmdline
        .split_whitespace()
        .any(|w| w.starts_with("earlycon"))
    {
        return cmdline;
    }
    format!(
        "{cmdline} earlycon=uart,mmio,{:#x}",
        layout::SERIAL_MMIO_BASE
    )
}
