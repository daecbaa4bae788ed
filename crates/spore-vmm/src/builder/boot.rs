//! What only a booted VM needs: which boot protocol its kernel speaks, and
//! the Linux command line; loading the kernel is the architecture's
//! ([`crate::arch::load_kernel`]). A restored VM's memory already holds its
//! kernel.

use std::fs::File;

use super::BuildError;
use crate::arch::{self, GuestKind};
use crate::config::{BootProtocol, VmConfig};

/// The guest kind the boot source asks for, or finds in the kernel's ELF note.
pub(super) fn guest_kind(
    protocol: BootProtocol,
    kernel: &mut File,
) -> Result<GuestKind, BuildError> {
    Ok(match protocol {
        BootProtocol::Linux => GuestKind::Linux,
        BootProtocol::Unikernel => GuestKind::Unikernel,
        BootProtocol::Auto if arch::detect_unikernel(kernel)? => GuestKind::Unikernel,
        BootProtocol::Auto => GuestKind::Linux,
    })
}

/// Refuses what the unikernel protocol cannot do.
pub(super) fn check_guest(config: &VmConfig, kind: GuestKind) -> Result<(), BuildError> {
    if kind == GuestKind::Unikernel {
        if !arch::UNIKERNEL_SUPPORTED {
            return Err(BuildError::UnikernelArch(arch::NAME));
        }
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

/// The guest command line: the user's (or the default), and the root
/// device. The architecture adds how the guest finds its devices.
pub(super) fn linux_cmdline(config: &VmConfig) -> String {
    let boot_args = config
        .boot_source
        .as_ref()
        .and_then(|b| b.boot_args.as_deref())
        .unwrap_or(arch::DEFAULT_LINUX_CMDLINE);
    let mut cmdline = boot_args.trim().to_string();
    if let Some(root) = config.drives.iter().find(|d| d.is_root_device) {
        if !cmdline.split_whitespace().any(|w| w.starts_with("root=")) {
            let mode = if root.is_read_only { "ro" } else { "rw" };
            cmdline.push_str(&format!(" root=/dev/vda {mode}"));
        }
    }
    cmdline
}

/// The command line a unikernel gets: the user's, or nothing.
pub(super) fn unikernel_cmdline(config: &VmConfig) -> String {
    config
        .boot_source
        .as_ref()
        .and_then(|b| b.boot_args.as_deref())
        .unwrap_or("")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{BootSourceConfig, DriveConfig};

    #[test]
    fn cmdline_names_the_root_device() {
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
        assert_eq!(linux_cmdline(&c), "console=ttyS0 root=/dev/vda ro");
    }
}
