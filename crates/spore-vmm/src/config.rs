//! What a user asks for, in Firecracker's JSON shapes, validated.
//!
//! Every type here deserializes from the body of the matching API request
//! (`PUT /boot-source`, `/machine-config`, `/drives/{id}`, `/vsock`, `/tmem`) and from
//! the sections of a `--config-file`. Unknown fields are refused, as
//! Firecracker does. `validate` methods check what can be checked without
//! touching KVM; file existence is checked when the VM is built.

use serde::{Deserialize, Serialize};

mod guest_snapshot;

pub use guest_snapshot::{AfterSnapshot, GuestSnapshotConfig, SnapshotType};

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
    #[serde(default)]
    pub smt: bool,
    #[serde(default)]
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
        if self.smt {
            return Err(ConfigError::Unsupported {
                field: "smt",
                detail: "spore exposes one thread per core".into(),
            });
        }
        if let Some(t) = self.cpu_template.as_deref().filter(|t| *t != "None") {
            return Err(ConfigError::Unsupported {
                field: "cpu_template",
                detail: format!("{t:?} (only \"None\")"),
            });
        }
        if let Some(h) = self.huge_pages.as_deref().filter(|h| *h != "None") {
            return Err(ConfigError::Unsupported {
                field: "huge_pages",
                detail: format!("{h:?} (only \"None\")"),
            });
        }
        Ok(())
    }

    pub fn mem_bytes(&self) -> u64 {
        self.mem_size_mib << 20
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
    #[serde(default)]
    pub is_root_device: bool,
    #[serde(default)]
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
        if let Some(e) = self.io_engine.as_deref().filter(|e| *e != "Sync") {
            return Err(ConfigError::Unsupported {
                field: "io_engine",
                detail: format!("{e:?} (only \"Sync\")"),
            });
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
    /// Bytes of VMM memory the pool may hold (keys, stored values and 64
    /// bytes of bookkeeping per object).
    #[serde(default = "default_tmem_quota")]
    pub quota_bytes: u64,
    /// `"none"` or `"lz4"`.
    #[serde(default)]
    pub compression: Compression,
    /// Time the VMM's handling of every call per operation (reported by
    /// `GET /tmem` as `timing`); for benchmarks.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub timing: bool,
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
    #[serde(default)]
    pub stats_polling_interval_s: u16,
    /// Offer VIRTIO_BALLOON_F_REPORTING: the guest reports free ranges and
    /// spore releases them on the host.
    #[serde(default)]
    pub free_page_reporting: bool,
    /// Firecracker's free page hinting; spore does not offer it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub free_page_hinting: bool,
}

impl BalloonConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.free_page_hinting {
            return Err(ConfigError::Unsupported {
                field: "free_page_hinting",
                detail: "use free_page_reporting".into(),
            });
        }
        Ok(())
    }

    /// Checks the target against the guest's memory.
    pub fn validate_for(&self, machine: &MachineConfig) -> Result<(), ConfigError> {
        self.validate()?;
        if u64::from(self.amount_mib) > machine.mem_size_mib {
            return Err(ConfigError::BalloonTooLarge {
                amount: self.amount_mib.into(),
                mem: machine.mem_size_mib,
            });
        }
        Ok(())
    }
}

/// spore extension (`PUT /entropy` in Firecracker): a virtio-rng device.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EntropyConfig {}

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
    #[serde(rename = "machine-config", default)]
    pub machine: MachineConfig,
    #[serde(default)]
    pub drives: Vec<DriveConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vsock: Option<VsockConfig>,
    /// Firecracker's entropy section. spore attaches a virtio-rng device to
    /// every VM; the section is accepted so Firecracker config files load.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entropy: Option<EntropyConfig>,
    /// spore extension: the tmem pool (defaults apply when absent).
    #[serde(default)]
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
        if let Some(b) = &self.balloon {
            b.validate_for(&self.machine)?;
        }
        if let Some(h) = &self.memory_hotplug {
            h.validate()?;
        }
        if let Some(g) = &self.guest_snapshots {
            g.validate().map_err(ConfigError::GuestSnapshots)?;
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
mod tests {
    use super::*;

    #[test]
    fn machine_config_bounds() {
        let mut m = MachineConfig::default();
        m.validate().unwrap();
        m.vcpu_count = 0;
        assert!(matches!(m.validate(), Err(ConfigError::VcpuCount { .. })));
        m.vcpu_count = 2;
        m.mem_size_mib = 0;
        assert_eq!(m.validate(), Err(ConfigError::MemZero));
        m.mem_size_mib = MAX_MEM_MIB + 1;
        assert!(m.validate().is_err());
        m.mem_size_mib = 256;
        m.smt = true;
        assert!(m.validate().is_err());
    }

    #[test]
    fn unknown_fields_refused() {
        let e = serde_json::from_str::<MachineConfig>(
            r#"{"vcpu_count":1,"mem_size_mib":128,"bogus":1}"#,
        );
        assert!(e.is_err());
        let c: VmConfig = serde_json::from_str(
            r#"{"boot-source":{"kernel_image_path":"/k"},"machine-config":{"vcpu_count":2,"mem_size_mib":256},
                "drives":[{"drive_id":"rootfs","path_on_host":"/d","is_root_device":true,"is_read_only":false}]}"#,
        )
        .unwrap();
        c.validate().unwrap();
        assert!(serde_json::from_str::<VmConfig>(r#"{"logger":{}}"#).is_err());
    }

    #[test]
    fn hotplug_memory_rules() {
        let c = |total, block, slot| MemoryHotplugConfig {
            total_size_mib: total,
            block_size_mib: block,
            slot_size_mib: slot,
        };
        c(2048, 2, 128).validate().unwrap();
        c(1024, 128, 128).validate().unwrap();
        for bad in [
            c(2048, 3, 128), // not a power of two
            c(2048, 1, 128), // below 2 MiB
            c(2048, 0, 128),
            c(2048, 2, 0),
            c(2048, 64, 96), // slot not a multiple of the block
            c(2000, 2, 128), // total not a multiple of the slot
            c(0, 2, 128),
            c(MAX_HOTPLUG_MIB * 2, 1024, 1024),
            c(64 * 1024, 2, 2), // too many slots
        ] {
            assert!(
                matches!(bad.validate(), Err(ConfigError::Hotplug(_))),
                "{bad:?}"
            );
        }
        let d: MemoryHotplugConfig = serde_json::from_str(r#"{"total_size_mib":1024}"#).unwrap();
        assert_eq!((d.block_size_mib, d.slot_size_mib), (2, 128));
        assert!(serde_json::from_str::<MemoryHotplugConfig>(r#"{"total_size_mib":-1}"#).is_err());
    }

    #[test]
    fn drives_and_vsock() {
        let mut c = VmConfig {
            boot_source: Some(BootSourceConfig {
                kernel_image_path: "/k".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let d = |id: &str, root| DriveConfig {
            drive_id: id.into(),
            path_on_host: "/x".into(),
            is_root_device: root,
            is_read_only: false,
            partuuid: None,
            cache_type: None,
            io_engine: None,
            cow_overlay: None,
        };
        c.upsert_drive(d("a", true));
        c.upsert_drive(d("a", true));
        assert_eq!(c.drives.len(), 1);
        c.upsert_drive(d("b", true));
        assert!(matches!(c.validate(), Err(ConfigError::TwoRootDevices(..))));
        let v = VsockConfig {
            guest_cid: 2,
            uds_path: "/s".into(),
            vsock_id: None,
        };
        assert_eq!(v.validate(), Err(ConfigError::GuestCid(2)));
    }

    #[test]
    fn tmem_defaults_and_file_section() {
        let c: VmConfig =
            serde_json::from_str(r#"{"boot-source":{"kernel_image_path":"/k"}}"#).unwrap();
        assert_eq!(c.tmem, TmemConfig::default());
        assert!(c.tmem.enabled);
        let c: VmConfig = serde_json::from_str(
            r#"{"boot-source":{"kernel_image_path":"/k"},"tmem":{"quota_bytes":1024,"compression":"lz4"}}"#,
        )
        .unwrap();
        assert_eq!(
            (c.tmem.quota_bytes, c.tmem.compression),
            (1024, Compression::Lz4)
        );
        assert!(serde_json::from_str::<TmemConfig>(r#"{"compression":"zip"}"#).is_err());
        assert!(serde_json::from_str::<TmemConfig>(r#"{"quota":1}"#).is_err());
    }

    #[test]
    fn balloon_section() {
        let c: VmConfig = serde_json::from_str(
            r#"{"boot-source":{"kernel_image_path":"/k"},"machine-config":{"vcpu_count":1,"mem_size_mib":256},
                "balloon":{"amount_mib":64,"deflate_on_oom":true,"stats_polling_interval_s":1}}"#,
        )
        .unwrap();
        c.validate().unwrap();
        let b = c.balloon.clone().unwrap();
        assert!(!b.free_page_reporting);
        let mut big = c.clone();
        big.balloon.as_mut().unwrap().amount_mib = 257;
        assert!(matches!(
            big.validate(),
            Err(ConfigError::BalloonTooLarge { .. })
        ));
        let mut hint = b;
        hint.free_page_hinting = true;
        assert!(hint.validate().is_err());
        assert!(serde_json::from_str::<BalloonConfig>(r#"{"amount_mib":1}"#).is_err());
        assert!(serde_json::from_str::<BalloonConfig>(
            r#"{"amount_mib":-1,"deflate_on_oom":false}"#
        )
        .is_err());
    }

    #[test]
    fn tmem_timing_is_opt_in() {
        assert!(!TmemConfig::default().timing);
        let json = serde_json::to_string(&TmemConfig::default()).unwrap();
        assert!(!json.contains("timing"), "{json}");
        let t: TmemConfig = serde_json::from_str(r#"{"timing":true}"#).unwrap();
        assert!(t.timing && t.enabled);
    }

    #[test]
    fn cow_overlay_shapes() {
        let drive = |overlay: &str, ro: bool| -> Result<DriveConfig, String> {
            let d: DriveConfig = serde_json::from_str(&format!(
                r#"{{"drive_id":"d","path_on_host":"/d","is_read_only":{ro},"cow_overlay":{overlay}}}"#
            ))
            .map_err(|e| e.to_string())?;
            d.validate().map(|()| d).map_err(|e| e.to_string())
        };
        let d = drive(r#"{"path":"/x.cow"}"#, false).unwrap();
        assert_eq!(d.cow_overlay.unwrap().path.as_deref(), Some("/x.cow"));
        assert!(
            drive(r#"{"in_memory":true}"#, false)
                .unwrap()
                .cow_overlay
                .unwrap()
                .in_memory
        );
        assert!(drive(r#"{"path":"/x.cow","in_memory":true}"#, false).is_ok());
        for (bad, ro) in [
            (r#"{}"#, false),
            (r#"{"path":""}"#, false),
            (r#"{"path":"/x.cow"}"#, true),
            (r#"{"path":"/x.cow","size":1}"#, false),
        ] {
            assert!(drive(bad, ro).is_err(), "{bad} ro={ro} accepted");
        }
    }
}
