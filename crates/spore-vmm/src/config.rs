//! What a user asks for, in Firecracker's JSON shapes, validated.
//!
//! Every type here deserializes from the body of the matching API request
//! (`PUT /boot-source`, `/machine-config`, `/drives/{id}`, `/network-interfaces/{id}`,
//! `/vsock`, `/tmem`) and from
//! the sections of a `--config-file`. Unknown fields are refused, as
//! Firecracker does. `validate` methods check what can be checked without
//! touching KVM; file existence is checked when the VM is built.

use serde::{Deserialize, Serialize};

mod cpu_template;
mod guest_snapshot;
mod mmds;
mod net;
mod observe;
mod rate_limiter;
mod serial;
mod size;

pub use cpu_template::{
    Bitmap, CpuConfig, CpuidLeafModifier, CpuidRegister, CpuidRegisterModifier, KvmCapability,
    MsrModifier, StaticCpuTemplate,
};
pub use guest_snapshot::{AfterSnapshot, GuestSnapshotConfig, SnapshotType};
pub use mmds::{MmdsConfig, MmdsConfigError, MmdsVersion};
pub use net::{
    upsert_interface, validate_iface_id, validate_tap_name, MacAddr, MacAddrError, NetConfigError,
    NetworkInterfaceConfig, PartialNetworkInterface, MAX_TAP_NAME_LEN,
};
pub use observe::{null_is_default, LogLevel, LoggerConfig, MetricsConfig, NotSupported};
pub use rate_limiter::{RateLimiterConfig, TokenBucketConfig};
pub use serial::SerialConfig;
pub use size::{parse_size, SizeError};

/// How a tmem pool stores values (`TmemConfig::compression`). Defined here,
/// below the device, so that configuration never depends on devices.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    #[default]
    None,
    /// lz4 block format; a value that does not shrink is stored as is.
    Lz4,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("vcpu_count must be between 1 and {max}, got {got}")]
    VcpuCount { got: u64, max: u8 },
    #[error("mem_size_mib must be at least 1, got 0")]
    MemZero,
    #[error("mem_size_mib {got} exceeds host memory ({host} MiB)")]
    MemTooLarge { got: u64, host: u64 },
    #[error("mem_size_mib {got} exceeds the largest supported guest ({max} MiB)")]
    MemTooLargeForLayout { got: u64, max: u64 },
    #[error("{field} is not supported by spore: {detail}")]
    Unsupported { field: &'static str, detail: String },
    #[error("{0} must not be empty")]
    Empty(&'static str),
    #[error(transparent)]
    Mmds(MmdsConfigError),
    #[error("drive id in the path ({path}) differs from drive_id in the body ({body})")]
    DriveIdMismatch { path: String, body: String },
    #[error("guest_cid must be at least 3 (0-2 are reserved), got {0}")]
    GuestCid(u32),
    #[error("boot_args is longer than {max} bytes")]
    CmdlineTooLong { max: usize },
    #[error("no boot source: PUT /boot-source before InstanceStart")]
    NoBootSource,
    #[error("only one drive may be the root device ({0} and {1} both are)")]
    TwoRootDevices(String, String),
    #[error("too many devices: at most {0} virtio devices")]
    TooManyDevices(usize),
    #[error("balloon amount_mib {amount} exceeds mem_size_mib {mem}")]
    BalloonTooLarge { amount: u64, mem: u64 },
    #[error("hotplug memory: {0}")]
    Hotplug(String),
    #[error("{0}")]
    GuestSnapshots(String),
    /// Firecracker's message (its API prefixes "Machine config error: ").
    #[error("The number of vCPUs must be greater than 0, less than 32 and must be 1 or an even number if SMT is enabled.")]
    SmtVcpuCount,
    #[error("cpu_template: {0}")]
    CpuTemplate(String),
    #[error(transparent)]
    Net(#[from] NetConfigError),
}

/// Largest vCPU count spore configures (MP table and IOAPIC limits).
pub const MAX_VCPUS: u8 = 32;
/// Largest kernel command line accepted.
pub const CMDLINE_MAX: usize = 4096;
/// Largest guest memory the x86_64 layout places (it must fit under the
/// unikernel identity map too).
pub const MAX_MEM_MIB: u64 = 60 * 1024;

/// How the kernel image is booted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BootProtocol {
    /// Unikernel if the ELF carries the spore note, Linux otherwise.
    #[default]
    Auto,
    Linux,
    Unikernel,
}

/// `PUT /boot-source`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BootSourceConfig {
    pub kernel_image_path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initrd_path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_args: Option<String>,
    /// spore extension: force the boot protocol.
    #[serde(default)]
    pub boot_protocol: BootProtocol,
}

impl BootSourceConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.kernel_image_path.is_empty() {
            return Err(ConfigError::Empty("kernel_image_path"));
        }
        if self.initrd_path.as_deref() == Some("") {
            return Err(ConfigError::Empty("initrd_path"));
        }
        if self
            .boot_args
            .as_ref()
            .is_some_and(|a| a.len() >= CMDLINE_MAX)
        {
            return Err(ConfigError::CmdlineTooLong { max: CMDLINE_MAX });
        }
        Ok(())
    }
}

/// `PUT /machine-config`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MachineConfig {
    // u64 so that out-of-range values reach `validate` and get a clear message.
    pub vcpu_count: u64,
    pub mem_size_mib: u64,
    #[serde(default, deserialize_with = "null_is_default")]
    pub smt: bool,
    #[serde(default, deserialize_with = "null_is_default")]
    pub track_dirty_pages: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_template: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub huge_pages: Option<String>,
}

impl Default for MachineConfig {
    fn default() -> Self {
        Self {
            vcpu_count: 1,
            mem_size_mib: 128,
            smt: false,
            track_dirty_pages: false,
            cpu_template: None,
            huge_pages: None,
        }
    }
}

impl MachineConfig {
    /// The vCPU count in the u8 that KVM vCPU ids take: `validate` bounds it
    /// by MAX_VCPUS; an unvalidated count above 255 saturates.
    pub fn vcpu_count_u8(&self) -> u8 {
        u8::try_from(self.vcpu_count).unwrap_or(u8::MAX)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.vcpu_count == 0 || self.vcpu_count > MAX_VCPUS as u64 {
            return Err(ConfigError::VcpuCount {
                got: self.vcpu_count,
                max: MAX_VCPUS,
            });
        }
        if self.mem_size_mib == 0 {
            return Err(ConfigError::MemZero);
        }
        if self.mem_size_mib > MAX_MEM_MIB {
            return Err(ConfigError::MemTooLargeForLayout {
                got: self.mem_size_mib,
                max: MAX_MEM_MIB,
            });
        }
        let host = host_memory_mib();
        if host > 0 && self.mem_size_mib > host {
            return Err(ConfigError::MemTooLarge {
                got: self.mem_size_mib,
                host,
            });
        }
        // Two threads per core: an odd count above 1 leaves a core half made.
        if self.smt && self.vcpu_count > 1 && self.vcpu_count % 2 == 1 {
            return Err(ConfigError::SmtVcpuCount);
        }
        self.static_cpu_template()?;
        match self.huge_pages.as_deref() {
            None | Some("None") => {}
            // Firecracker's rule and words.
            Some("2M") if !self.mem_size_mib.is_multiple_of(2) => {
                return Err(ConfigError::Unsupported {
                    field: "huge_pages",
                    detail: "The memory size (MiB) is either 0, or not a multiple of the configured page size.".into(),
                })
            }
            Some("2M") => {}
            Some(h) => {
                return Err(ConfigError::Unsupported {
                    field: "huge_pages",
                    detail: format!("{h:?} (\"None\" or \"2M\"; spore has no \"Transparent\")"),
                })
            }
        }
        Ok(())
    }

    /// Guest RAM on explicit 2 MiB hugetlbfs pages.
    pub fn huge_pages_2m(&self) -> bool {
        self.huge_pages.as_deref() == Some("2M")
    }

    pub fn mem_bytes(&self) -> u64 {
        self.mem_size_mib << 20
    }

    /// The static template asked for (`None` when absent).
    pub fn static_cpu_template(&self) -> Result<StaticCpuTemplate, ConfigError> {
        match self.cpu_template.as_deref() {
            None => Ok(StaticCpuTemplate::None),
            Some(t) => StaticCpuTemplate::parse(t).map_err(ConfigError::CpuTemplate),
        }
    }
}

/// Host RAM in MiB, 0 if unknown.
pub fn host_memory_mib() -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    if pages <= 0 || page <= 0 {
        return 0;
    }
    (pages as u64).saturating_mul(page as u64) >> 20
}

/// `PUT /drives/{id}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DriveConfig {
    pub drive_id: String,
    pub path_on_host: String,
    #[serde(default, deserialize_with = "null_is_default")]
    pub is_root_device: bool,
    #[serde(default, deserialize_with = "null_is_default")]
    pub is_read_only: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partuuid: Option<String>,
    /// "Unsafe" (flush is a no-op) or "Writeback" (flush is fsync).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io_engine: Option<String>,
    /// spore: serve `path_on_host` read-only as the base of this private
    /// copy-on-write overlay (every guest write goes to the overlay).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cow_overlay: Option<CowOverlayConfig>,
    /// Firecracker's rate limiter (bytes and operations per refill time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limiter: Option<RateLimiterConfig>,
    /// Firecracker's vhost-user socket: accepted only as `null`.
    #[serde(default, skip_serializing)]
    pub socket: Option<NotSupported>,
}

/// A drive's copy-on-write overlay: `{"path": "/x.cow"}` (a sparse file,
/// created if missing, reopened with its contents if present),
/// `{"in_memory": true}` (a memfd, gone when the VMM exits), or both
/// (in memory, starting from the blocks of the file, which is never written).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CowOverlayConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(default)]
    pub in_memory: bool,
}

impl DriveConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.drive_id.is_empty() {
            return Err(ConfigError::Empty("drive_id"));
        }
        if self.path_on_host.is_empty() {
            return Err(ConfigError::Empty("path_on_host"));
        }
        if let Some(c) = self
            .cache_type
            .as_deref()
            .filter(|c| !matches!(*c, "Unsafe" | "Writeback"))
        {
            return Err(ConfigError::Unsupported {
                field: "cache_type",
                detail: format!("{c:?} (\"Unsafe\" or \"Writeback\")"),
            });
        }
        match self.io_engine.as_deref() {
            None | Some("Sync") => {}
            Some("Async") => {
                // Firecracker's rule: io_uring as it needs is in 5.10 on.
                crate::host::kernel_at_least(crate::host::ASYNC_IO_MIN_KERNEL).map_err(|e| {
                    ConfigError::Unsupported {
                        field: "io_engine",
                        detail: format!("\"Async\" (io_uring): {e}"),
                    }
                })?;
                // A copy-on-write disk (a cow_overlay, a clone's disk) is
                // served synchronously whatever the engine: see blk::Block::open.
            }
            Some(e) => {
                return Err(ConfigError::Unsupported {
                    field: "io_engine",
                    detail: format!("{e:?} (\"Sync\" or \"Async\")"),
                })
            }
        }
        if let Some(o) = &self.cow_overlay {
            let detail = match (o.path.as_deref(), o.in_memory) {
                _ if self.is_read_only => {
                    Some("a read-only drive has nothing to write to an overlay; drop is_read_only or cow_overlay")
                }
                (Some(""), _) => Some("path is empty"),
                (None, false) => Some("give a path or in_memory: true"),
                _ => None,
            };
            if let Some(d) = detail {
                return Err(ConfigError::Unsupported {
                    field: "cow_overlay",
                    detail: d.into(),
                });
            }
        }
        Ok(())
    }

    /// Whether a guest flush must reach stable storage.
    pub fn flush_is_durable(&self) -> bool {
        // Firecracker's default is Unsafe; spore honours flush by default.
        self.cache_type.as_deref() != Some("Unsafe")
    }
}

/// `PUT /vsock`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VsockConfig {
    pub guest_cid: u32,
    pub uds_path: String,
    /// Deprecated in Firecracker, accepted and ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vsock_id: Option<String>,
}

impl VsockConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.guest_cid < 3 {
            return Err(ConfigError::GuestCid(self.guest_cid));
        }
        if self.uds_path.is_empty() {
            return Err(ConfigError::Empty("uds_path"));
        }
        Ok(())
    }
}

/// Default tmem quota per VM: 256 MiB of VMM memory.
pub const DEFAULT_TMEM_QUOTA_BYTES: u64 = 256 << 20;

/// spore extension (`PUT /tmem` before start, `"tmem"` in a config file):
/// the VM's transcendent-memory pool. Every VM gets one unless `enabled` is
/// false; by default it may hold [`DEFAULT_TMEM_QUOTA_BYTES`], uncompressed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TmemConfig {
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Bytes of VMM memory the pool may hold: keys and stored values as
    /// allocator chunks, and each object's hash-table slot at worst load
    /// (see `devices::tmem::accounting`).
    #[serde(default = "default_tmem_quota")]
    pub quota_bytes: u64,
    /// `"none"` or `"lz4"`.
    #[serde(default)]
    pub compression: Compression,
    /// Time the VMM's handling of every call per operation (reported by
    /// `GET /tmem` as `timing`); for benchmarks.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub timing: bool,
    /// A cap on the tmem memory of every VMM on the host together (shared
    /// through a file, see `devices::tmem::host_cap`); with
    /// `SPORE_TMEM_HOST_CAP` set too, the lower one applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_cap_bytes: Option<u64>,
}

fn default_true() -> bool {
    true
}

fn default_tmem_quota() -> u64 {
    DEFAULT_TMEM_QUOTA_BYTES
}

impl Default for TmemConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            quota_bytes: DEFAULT_TMEM_QUOTA_BYTES,
            compression: Compression::None,
            timing: false,
            host_cap_bytes: None,
        }
    }
}

/// `PUT /balloon`: a virtio-balloon device (Firecracker's fields).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BalloonConfig {
    /// Target balloon size: memory the guest should give back.
    pub amount_mib: u32,
    /// Offer VIRTIO_BALLOON_F_DEFLATE_ON_OOM: the guest may take pages back
    /// from the balloon instead of killing a process.
    pub deflate_on_oom: bool,
    /// 0 disables statistics (no stats queue); it cannot be switched on or
    /// off later, only changed between non-zero values.
    #[serde(default, deserialize_with = "null_is_default")]
    pub stats_polling_interval_s: u16,
    /// Offer VIRTIO_BALLOON_F_REPORTING: the guest reports free ranges and
    /// spore releases them on the host.
    #[serde(default, deserialize_with = "null_is_default")]
    pub free_page_reporting: bool,
    /// Offer VIRTIO_BALLOON_F_FREE_PAGE_HINT: on `PATCH /balloon/hinting/start`
    /// the guest hints its free pages and spore releases them on the host.
    #[serde(
        default,
        deserialize_with = "null_is_default",
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub free_page_hinting: bool,
}

impl BalloonConfig {
    /// Checks the target against the guest's memory.
    pub fn validate_for(&self, machine: &MachineConfig) -> Result<(), ConfigError> {
        if u64::from(self.amount_mib) > machine.mem_size_mib {
            return Err(ConfigError::BalloonTooLarge {
                amount: self.amount_mib.into(),
                mem: machine.mem_size_mib,
            });
        }
        Ok(())
    }
}

/// `PUT /entropy`: the virtio-rng device (every spore VM has one; this
/// sets its rate limiter).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EntropyConfig {
    /// Firecracker's rate limiter: a chain costs one op and the bytes it
    /// asks for (`devices::virtio::rng`).
    #[serde(default)]
    pub rate_limiter: Option<RateLimiterConfig>,
}

/// `PUT /hotplug/memory`: a virtio-mem region (Firecracker's shape).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryHotplugConfig {
    /// Size of the hotplug region; nothing is plugged at boot.
    pub total_size_mib: u64,
    /// Plug/unplug granularity: a power of two, at least 2 MiB.
    #[serde(default = "default_hotplug_block_mib")]
    pub block_size_mib: u64,
    /// KVM memory-slot granularity: a multiple of the block size dividing
    /// the total size; a slot exists only while it holds a plugged block.
    #[serde(default = "default_hotplug_slot_mib")]
    pub slot_size_mib: u64,
}

fn default_hotplug_block_mib() -> u64 {
    2
}

fn default_hotplug_slot_mib() -> u64 {
    128
}

/// Largest hotplug region (it sits above boot RAM, under the 1 TiB that
/// 40 physical address bits reach).
pub const MAX_HOTPLUG_MIB: u64 = 512 * 1024;
/// Most KVM slots one hotplug region may use.
pub const MAX_HOTPLUG_SLOTS: u64 = 256;

impl MemoryHotplugConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        let err = |m: String| Err(ConfigError::Hotplug(m));
        let (total, block, slot) = (self.total_size_mib, self.block_size_mib, self.slot_size_mib);
        if block < 2 || !block.is_power_of_two() {
            return err(format!(
                "block_size_mib must be a power of two of at least 2, got {block}"
            ));
        }
        if slot == 0 || !slot.is_multiple_of(block) {
            return err(format!(
                "slot_size_mib ({slot}) must be a non-zero multiple of block_size_mib ({block})"
            ));
        }
        if total == 0 || !total.is_multiple_of(slot) {
            return err(format!(
                "total_size_mib ({total}) must be a non-zero multiple of slot_size_mib ({slot})"
            ));
        }
        if total > MAX_HOTPLUG_MIB {
            return err(format!(
                "total_size_mib {total} exceeds the largest region ({MAX_HOTPLUG_MIB} MiB)"
            ));
        }
        if total / slot > MAX_HOTPLUG_SLOTS {
            return err(format!(
                "{total} MiB in {slot} MiB slots needs {} KVM slots, more than {MAX_HOTPLUG_SLOTS}; raise slot_size_mib",
                total / slot
            ));
        }
        Ok(())
    }
}

/// An MMDS configuration checked as Firecracker checks it against the
/// interfaces.
pub fn check_mmds_config(
    m: &MmdsConfig,
    ifaces: &[NetworkInterfaceConfig],
) -> Result<(), ConfigError> {
    let ids: Vec<&str> = ifaces.iter().map(|i| i.iface_id.as_str()).collect();
    m.validate(&ids).map_err(ConfigError::Mmds)
}

/// The whole VM as a `--config-file` describes it (Firecracker's layout).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmConfig {
    #[serde(
        rename = "boot-source",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub boot_source: Option<BootSourceConfig>,
    #[serde(
        rename = "machine-config",
        default,
        deserialize_with = "null_is_default"
    )]
    pub machine: MachineConfig,
    #[serde(default, deserialize_with = "null_is_default")]
    pub drives: Vec<DriveConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vsock: Option<VsockConfig>,
    /// Firecracker's entropy section. spore attaches a virtio-rng device to
    /// every VM; the section is accepted so Firecracker config files load.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entropy: Option<EntropyConfig>,
    /// spore extension: the tmem pool (defaults apply when absent).
    #[serde(default, deserialize_with = "null_is_default")]
    pub tmem: TmemConfig,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub balloon: Option<BalloonConfig>,
    /// A virtio-mem device (`PUT /hotplug/memory`).
    #[serde(
        rename = "memory-hotplug",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub memory_hotplug: Option<MemoryHotplugConfig>,
    /// spore extension: where guest-triggered snapshots go
    /// (`PUT /snapshot/guest-triggered`); without it the guest's requests
    /// are ignored.
    #[serde(
        rename = "guest-snapshots",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub guest_snapshots: Option<GuestSnapshotConfig>,
    /// Firecracker's logger section (as `PUT /logger`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logger: Option<LoggerConfig>,
    /// Firecracker's metrics section (as `PUT /metrics`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<MetricsConfig>,
    /// `PUT /serial` (Firecracker keeps it out of its config file; spore
    /// takes and shows it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<SerialConfig>,
    /// `PUT /cpu-config`: a custom CPU template (replaces a static
    /// `machine-config.cpu_template`, and is replaced by one).
    #[serde(
        rename = "cpu-config",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub cpu_config: Option<CpuConfig>,
    /// `PUT /mmds/config`: which interfaces route the guest's MMDS
    /// requests, at which address, in which version and format.
    #[serde(
        rename = "mmds-config",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub mmds_config: Option<MmdsConfig>,
    /// Guest network interfaces, each a virtio-net device on a host tap
    /// (`PUT /network-interfaces/{iface_id}`).
    #[serde(
        rename = "network-interfaces",
        default,
        deserialize_with = "null_is_default"
    )]
    pub network_interfaces: Vec<NetworkInterfaceConfig>,
    /// Firecracker's section for what spore does not have yet: accepted
    /// when `null` or empty, refused otherwise (naming the key).
    #[serde(default, deserialize_with = "null_is_default", skip_serializing)]
    pub pmem: Vec<NotSupported>,
}

impl VmConfig {
    /// Checks the whole configuration before a VM is built from it.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.boot_source
            .as_ref()
            .ok_or(ConfigError::NoBootSource)?
            .validate()?;
        self.machine.validate()?;
        let mut root: Option<&str> = None;
        for d in &self.drives {
            d.validate()?;
            if d.is_root_device {
                if let Some(r) = root {
                    return Err(ConfigError::TwoRootDevices(r.into(), d.drive_id.clone()));
                }
                root = Some(&d.drive_id);
            }
        }
        if let Some(v) = &self.vsock {
            v.validate()?;
        }
        net::validate_interfaces(&self.network_interfaces)?;
        if let Some(b) = &self.balloon {
            b.validate_for(&self.machine)?;
        }
        if let Some(h) = &self.memory_hotplug {
            h.validate()?;
        }
        if let Some(g) = &self.guest_snapshots {
            g.validate().map_err(ConfigError::GuestSnapshots)?;
        }
        if let Some(m) = &self.mmds_config {
            check_mmds_config(m, &self.network_interfaces)?;
        }
        Ok(())
    }

    /// Adds or replaces a drive (by id), as `PUT /drives/{id}` does.
    pub fn upsert_drive(&mut self, drive: DriveConfig) {
        match self
            .drives
            .iter_mut()
            .find(|d| d.drive_id == drive.drive_id)
        {
            Some(d) => *d = drive,
            None => self.drives.push(drive),
        }
    }
}

#[cfg(test)]
mod tests;
