//! `spore run`: one microVM in the foreground.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::Args;
use spore_serve::vmm_exit::{self, ExitRecord};
use spore_vmm::config::{
    parse_size, AfterSnapshot, BootProtocol, BootSourceConfig, Compression, DriveConfig,
    GuestSnapshotConfig, MachineConfig, SnapshotType, TmemConfig, VmConfig, VsockConfig,
};
use spore_vmm::vm::control::StopReason;
use spore_vmm::vmm::Vmm;

use crate::host;

#[derive(Args, Debug)]
pub struct RunArgs {
    /// Kernel image: ELF vmlinux, bzImage, or a spore unikernel ELF.
    #[arg(long)]
    pub kernel: PathBuf,
    /// Initial ramdisk (Linux only).
    #[arg(long)]
    pub initrd: Option<PathBuf>,
    /// Kernel command line (Linux: replaces spore's default; unikernel: passed as is).
    #[arg(long)]
    pub cmdline: Option<String>,
    /// Guest memory, e.g. 256M or 1G.
    #[arg(long, default_value = "256M")]
    pub mem: String,
    /// Number of vCPUs.
    #[arg(long, default_value_t = 1)]
    pub vcpus: u64,
    /// A raw disk image; append `:ro` for read-only, `:cow` to keep the guest's writes
    /// in memory (the image is never written) or `:cow=FILE` to keep them in an overlay
    /// file. Repeatable; the first is /dev/vda.
    #[arg(long = "disk", value_name = "PATH[:ro|:cow|:cow=FILE]")]
    pub disks: Vec<String>,
    /// A vsock device: guest CID and host Unix socket path.
    #[arg(long, value_name = "CID:UDS_PATH")]
    pub vsock: Option<String>,
    /// Boot protocol (auto-detected by default).
    #[arg(long, value_enum, default_value = "auto")]
    pub boot_protocol: ProtocolArg,
    /// Write the guest's signal-port marks here as JSON when the VM stops.
    #[arg(long)]
    pub marks_file: Option<PathBuf>,
    /// tmem pool quota (VMM memory the guest may fill through tmem), e.g. 512M.
    #[arg(long, default_value = "256M")]
    pub tmem_quota: String,
    /// How the tmem pool stores values.
    #[arg(long, value_enum, default_value = "none")]
    pub tmem_compression: CompressionArg,
    /// Give the guest no tmem pool (calls answer DISABLED).
    #[arg(long)]
    pub no_tmem: bool,
    /// Time the VMM's handling of every tmem call (for benchmarks; reported
    /// in `GET /tmem` and `--tmem-stats-file` as `timing`).
    #[arg(long)]
    pub tmem_timing: bool,
    /// Cap the tmem memory of all VMMs on this host together (e.g. 2G),
    /// shared through $SPORE_TMEM_HOST_DIR (default /run/spore).
    #[arg(long)]
    pub tmem_host_cap: Option<String>,
    /// Write the tmem pool's final `GET /tmem` JSON here when the VM stops.
    #[arg(long)]
    pub tmem_stats_file: Option<PathBuf>,
    /// Let the guest clone this VM with the signal port's `FORK` (off by
    /// default: a `FORK` then fails in the guest). Its clones may not fork.
    #[arg(long)]
    pub guest_fork: bool,
    /// Serve the guest's snapshot points (signal `SNAPSHOT`): write them
    /// into this directory as tag-<T>.state and tag-<T>.mem.
    #[arg(long, value_name = "DIR")]
    pub guest_snapshot_dir: Option<PathBuf>,
    /// After a guest snapshot point: let the guest go on, or stop the VM
    /// (exit code 0).
    #[arg(
        long,
        value_enum,
        default_value = "resume",
        requires = "guest_snapshot_dir"
    )]
    pub guest_snapshot_after: AfterArg,
    /// Full snapshots, or diffs of what changed since the previous one.
    #[arg(
        long,
        value_enum,
        default_value = "full",
        requires = "guest_snapshot_dir"
    )]
    pub guest_snapshot_type: SnapshotTypeArg,
    #[command(flatten)]
    pub seccomp: host::SeccompArgs,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum AfterArg {
    Resume,
    Exit,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum SnapshotTypeArg {
    Full,
    Diff,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum CompressionArg {
    None,
    Lz4,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum ProtocolArg {
    Auto,
    Linux,
    Unikernel,
}

impl RunArgs {
    pub fn to_config(&self) -> anyhow::Result<VmConfig> {
        let mem = parse_size(&self.mem).with_context(|| format!("--mem {}", self.mem))?;
        if mem % (1 << 20) != 0 {
            bail!("--mem {} is not a whole number of MiB", self.mem);
        }
        let mut drives = Vec::new();
        for (i, spec) in self.disks.iter().enumerate() {
            let (spec, cow_overlay) = match spec.split_once(":cow") {
                Some((p, "")) => (p, Some((None, true))),
                Some((p, f)) if f.starts_with('=') && f.len() > 1 => {
                    (p, Some((Some(f[1..].to_string()), false)))
                }
                _ => (spec.as_str(), None),
            };
            let cow_overlay = cow_overlay
                .map(|(path, in_memory)| spore_vmm::config::CowOverlayConfig { path, in_memory });
            let (path, ro) = match spec.strip_suffix(":ro") {
                Some(p) => (p, true),
                None => (spec.strip_suffix(":rw").unwrap_or(spec), false),
            };
            drives.push(DriveConfig {
                drive_id: format!("disk{i}"),
                path_on_host: path.to_string(),
                is_root_device: false,
                is_read_only: ro,
                partuuid: None,
                cache_type: None,
                io_engine: None,
                cow_overlay,
                rate_limiter: None,
                socket: None,
            });
        }
        let vsock = match &self.vsock {
            Some(v) => {
                let (cid, path) = v
                    .split_once(':')
                    .with_context(|| format!("--vsock {v}: expected CID:UDS_PATH"))?;
                Some(VsockConfig {
                    guest_cid: cid
                        .parse()
                        .with_context(|| format!("--vsock {v}: bad CID {cid:?}"))?,
                    uds_path: path.to_string(),
                    vsock_id: None,
                })
            }
            None => None,
        };
        let config = VmConfig {
            boot_source: Some(BootSourceConfig {
                kernel_image_path: self.kernel.to_string_lossy().into_owned(),
                initrd_path: self
                    .initrd
                    .as_ref()
                    .map(|p| p.to_string_lossy().into_owned()),
                boot_args: self.cmdline.clone(),
                boot_protocol: match self.boot_protocol {
                    ProtocolArg::Auto => BootProtocol::Auto,
                    ProtocolArg::Linux => BootProtocol::Linux,
                    ProtocolArg::Unikernel => BootProtocol::Unikernel,
                },
            }),
            machine: MachineConfig {
                vcpu_count: self.vcpus,
                mem_size_mib: mem >> 20,
                ..Default::default()
            },
            drives,
            vsock,
            entropy: None,
            tmem: TmemConfig {
                enabled: !self.no_tmem,
                quota_bytes: parse_size(&self.tmem_quota)
                    .with_context(|| format!("--tmem-quota {}", self.tmem_quota))?,
                compression: match self.tmem_compression {
                    CompressionArg::None => Compression::None,
                    CompressionArg::Lz4 => Compression::Lz4,
                },
                timing: self.tmem_timing,
                host_cap_bytes: match &self.tmem_host_cap {
                    Some(s) => Some(parse_size(s).with_context(|| format!("--tmem-host-cap {s}"))?),
                    None => None,
                },
            },
            balloon: None,
            memory_hotplug: None,
            logger: None,
            metrics: None,
            network_interfaces: Vec::new(),
            pmem: Vec::new(),
            mmds_config: None,
            cpu_config: None,
            serial: None,
            guest_snapshots: match &self.guest_snapshot_dir {
                Some(dir) => {
                    let g = GuestSnapshotConfig {
                        directory: dir.to_string_lossy().into_owned(),
                        snapshot_type: match self.guest_snapshot_type {
                            SnapshotTypeArg::Full => SnapshotType::Full,
                            SnapshotTypeArg::Diff => SnapshotType::Diff,
                        },
                        after: match self.guest_snapshot_after {
                            AfterArg::Resume => AfterSnapshot::Resume,
                            AfterArg::Exit => AfterSnapshot::Exit,
                        },
                    };
                    g.validate_here()
                        .map_err(|e| anyhow::anyhow!("--guest-snapshot-dir: {e}"))?;
                    Some(g)
                }
                None => None,
            },
        };
        config.validate()?;
        Ok(config)
    }
}

pub fn run(args: RunArgs) -> anyhow::Result<u8> {
    let config = args.to_config()?;
    host::configure_seccomp(args.seccomp.setting()?)?;
    // The main thread's filter first: every thread started from here on
    // inherits it instead of installing its own.
    spore_vmm::seccomp::apply(spore_vmm::seccomp::ThreadKind::Vmm)?;
    let vmm = Arc::new(Vmm::new("run".into(), config, Box::new(std::io::stdout())));
    host::stop_on_host_signals(vmm.clone())?;
    vmm.enable_guest_fork();
    vmm.enable_background_standby();
    if args.guest_fork {
        let on = spore_vmm::clone::CloneConfig {
            guest_fork: true,
            ..Default::default()
        };
        vmm.set_clone_config(on)
            .map_err(|e| anyhow::anyhow!("--guest-fork: {e}"))?;
    }
    spore_vmm::seccomp::apply_main()?;
    vmm.start()?;
    host::forward_stdin(vmm.clone());
    // Read the pool once the VM stopped, before `finish` releases it.
    let tmem_info = args.tmem_stats_file.as_ref().map(|_| {
        vmm.wait_for_exit();
        vmm.tmem_info()
    });
    let code = finish(&vmm, args.marks_file.as_deref(), None);
    if let (Some(path), Some(info)) = (&args.tmem_stats_file, tmem_info) {
        std::fs::write(path, serde_json::to_vec_pretty(&info)?)
            .with_context(|| format!("writing tmem stats to {}", path.display()))?;
    }
    code
}

/// Waits for the VM to stop, releases it, writes marks, and picks the exit
/// status. With `SPORE_EXIT_RECORD` set (by `spore serve`) and an API
/// socket, first leaves the stop's reason beside the socket
/// (`spore_serve::vmm_exit`), so the daemon can tell a guest that ended its
/// VM from a VMM that was killed.
pub fn finish(
    vmm: &Vmm,
    marks_file: Option<&std::path::Path>,
    api_sock: Option<&std::path::Path>,
) -> anyhow::Result<u8> {
    let reason = vmm.wait_for_exit();
    if let Some(sock) = api_sock.filter(|_| std::env::var_os(vmm_exit::EXIT_RECORD_ENV).is_some()) {
        write_exit_record(sock, &reason);
    }
    let marks = vmm.shutdown();
    if let Some(path) = marks_file {
        host::write_marks(path, &marks)
            .with_context(|| format!("writing marks to {}", path.display()))?;
    }
    match reason {
        StopReason::Error(msg) => bail!("the VM stopped on an error: {msg}"),
        StopReason::Requested => Ok(host::host_signal_status().unwrap_or(0)),
        // exit_code() is 0, 1 or a guest's u8 status: the fallback never happens.
        other => Ok(u8::try_from(other.exit_code()).unwrap_or(1)),
    }
}

/// Writes `<api-sock>.exit` for `reason` (atomically; a failure is only
/// logged: the daemon then takes the VMM for killed).
fn write_exit_record(api_sock: &std::path::Path, reason: &StopReason) {
    let record = match reason {
        StopReason::GuestExit(code) => ExitRecord::GuestExit { code: *code },
        StopReason::Reset => ExitRecord::GuestReset,
        StopReason::Requested => ExitRecord::Requested,
        StopReason::Error(message) => ExitRecord::Error {
            message: message.clone(),
        },
    };
    let path = vmm_exit::record_path(api_sock);
    let written = serde_json::to_vec(&record)
        .map_err(std::io::Error::other)
        .and_then(|json| host::write_atomic(&path, &json));
    if let Err(e) = written {
        tracing::warn!("writing the exit record {}: {e}", path.display());
    }
}

/// Removes a record an earlier VMM left at this socket's path, so that
/// only this one's ending is read (with `SPORE_EXIT_RECORD` set).
pub fn clear_exit_record(api_sock: Option<&std::path::Path>) {
    if let Some(sock) = api_sock.filter(|_| std::env::var_os(vmm_exit::EXIT_RECORD_ENV).is_some()) {
        let _ = std::fs::remove_file(vmm_exit::record_path(sock));
    }
}
