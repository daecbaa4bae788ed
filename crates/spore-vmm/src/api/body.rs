//! JSON bodies that exist only in the API, in Firecracker's shapes.
//!
//! Configuration bodies (`/boot-source`, `/machine-config`, `/drives/{id}`,
//! `/vsock`) are [`crate::config`] types, shared with `--config-file`. Like
//! those, every body here refuses unknown fields.

use serde::{Deserialize, Serialize};

use crate::config::{Compression, MachineConfig, RateLimiterConfig, TmemConfig};
use crate::devices::tmem::{CallTiming, PoolStats};

/// `PATCH /machine-config`: the fields to change; absent ones keep their value.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MachineConfigPatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vcpu_count: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_size_mib: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub smt: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub track_dirty_pages: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_template: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub huge_pages: Option<String>,
}

impl MachineConfigPatch {
    /// Whether the patch changes nothing (the parser refuses such a patch, as
    /// Firecracker does, since it is almost surely a client mistake).
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// `base` with the patch's fields laid over it. The result still needs
    /// [`MachineConfig::validate`].
    pub fn apply(&self, base: &MachineConfig) -> MachineConfig {
        MachineConfig {
            vcpu_count: self.vcpu_count.unwrap_or(base.vcpu_count),
            mem_size_mib: self.mem_size_mib.unwrap_or(base.mem_size_mib),
            smt: self.smt.unwrap_or(base.smt),
            track_dirty_pages: self.track_dirty_pages.unwrap_or(base.track_dirty_pages),
            cpu_template: self
                .cpu_template
                .clone()
                .or_else(|| base.cpu_template.clone()),
            huge_pages: self.huge_pages.clone().or_else(|| base.huge_pages.clone()),
        }
    }
}

/// `PATCH /drives/{id}` (Firecracker's `PartialDrive`): a new image and/or
/// new rate limits for a running VM's drive.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartialDrive {
    pub drive_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_on_host: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limiter: Option<RateLimiterConfig>,
}

/// `PATCH /balloon`: the new target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BalloonUpdate {
    pub amount_mib: u32,
}

/// `PATCH /balloon/statistics`: the new polling interval.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BalloonStatsUpdate {
    pub stats_polling_interval_s: u16,
}

/// `PATCH /balloon/hinting/start` (the body is optional).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BalloonHintingStart {
    /// Answer DONE as soon as the guest reports the run finished, so it can
    /// reuse the hinted pages without a `stop` (Firecracker's default: true).
    #[serde(default = "yes")]
    pub acknowledge_on_stop: bool,
}

impl Default for BalloonHintingStart {
    fn default() -> Self {
        Self {
            acknowledge_on_stop: true,
        }
    }
}

fn yes() -> bool {
    true
}

/// `PUT /actions` `action_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ActionType {
    /// Build the VM from the configuration given so far and run it.
    InstanceStart,
    /// Ask the guest to reboot (i8042 reset line); Linux guests shut down.
    SendCtrlAltDel,
    /// Write the metrics out now.
    FlushMetrics,
}

/// The body of `PUT /actions`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstanceActionInfo {
    pub action_type: ActionType,
}

/// `PATCH /vm` `state`: what the client wants the vCPUs to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum VmState {
    Paused,
    Resumed,
}

/// The body of `PATCH /vm`.
/// `PATCH /hotplug/memory`: the new target size of the virtio-mem device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HotplugMemoryUpdate {
    pub requested_size_mib: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmStateBody {
    pub state: VmState,
}

/// Where the microVM is in its life, as `GET /` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum InstanceState {
    /// Configured (or not yet), `InstanceStart` not yet sent.
    #[serde(rename = "Not started")]
    NotStarted,
    Running,
    Paused,
    /// spore extension: the guest stopped and the VMM is exiting.
    Stopped,
}

/// `GET /`: who this VMM is and what state its microVM is in.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstanceInfo {
    /// Always `"spore"`; Firecracker puts its own name here.
    pub app_name: String,
    /// The instance id given on the command line (`--id`), or a default.
    pub id: String,
    pub state: InstanceState,
    /// The spore version.
    pub vmm_version: String,
}

impl InstanceInfo {
    /// Info for this build of spore.
    pub fn new(id: impl Into<String>, state: InstanceState) -> Self {
        Self {
            app_name: "spore".into(),
            id: id.into(),
            state,
            vmm_version: env!("CARGO_PKG_VERSION").into(),
        }
    }
}

/// The Firecracker version whose API and command line spore answers as:
/// the API spec spore is checked against
/// (`shared/reference/firecracker-api.yaml`, and the reference binary its
/// status codes are compared with). Clients (Firecracker's SDKs, tools that
/// parse `firecracker --version`) gate features on this number, so spore
/// claims the version whose behaviour it matches, and reports its own
/// version beside it.
pub const FIRECRACKER_VERSION: &str = "1.17.0-dev";

/// `GET /version`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VersionInfo {
    /// The Firecracker API version spore answers as ([`FIRECRACKER_VERSION`]).
    pub firecracker_version: String,
    /// spore extension: spore's own version.
    pub spore_version: String,
}

impl VersionInfo {
    pub fn current() -> Self {
        Self {
            firecracker_version: FIRECRACKER_VERSION.into(),
            spore_version: env!("CARGO_PKG_VERSION").into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn instance_info_matches_firecracker_shape() {
        let info = InstanceInfo::new("vm0", InstanceState::NotStarted);
        let v = serde_json::to_value(&info).unwrap();
        assert_eq!(
            v,
            json!({"app_name": "spore", "id": "vm0", "state": "Not started",
                   "vmm_version": env!("CARGO_PKG_VERSION")})
        );
        assert_eq!(
            serde_json::to_value(InstanceState::Paused).unwrap(),
            json!("Paused")
        );
    }

    #[test]
    fn version_has_firecrackers_field_and_spores() {
        let v = serde_json::to_value(VersionInfo::current()).unwrap();
        let fc = v["firecracker_version"].as_str().unwrap();
        // Firecracker's SDKs parse it as semver: MAJOR.MINOR.PATCH[-pre].
        let core = fc.split('-').next().unwrap();
        assert_eq!(core.split('.').count(), 3, "{fc}");
        assert!(core.split('.').all(|n| n.parse::<u32>().is_ok()), "{fc}");
        assert!(fc.starts_with("1."), "{fc}");
        assert_eq!(v["spore_version"], env!("CARGO_PKG_VERSION"));
    }

    #[test]
    fn patch_applies_only_given_fields() {
        let base = MachineConfig {
            cpu_template: Some("None".into()),
            ..MachineConfig::default()
        };
        let p = MachineConfigPatch {
            mem_size_mib: Some(512),
            ..Default::default()
        };
        assert!(!p.is_empty());
        let m = p.apply(&base);
        assert_eq!(m.mem_size_mib, 512);
        assert_eq!(m.vcpu_count, base.vcpu_count);
        assert_eq!(m.cpu_template.as_deref(), Some("None"));
        assert!(MachineConfigPatch::default().is_empty());
        assert_eq!(MachineConfigPatch::default().apply(&base), base);
    }
}

/// `PUT /tmem`: the fields to change. Before `InstanceStart` any of them;
/// afterwards only `quota_bytes` (raising or lowering it; lowering below
/// what is stored refuses new puts but keeps every object).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TmemUpdate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<Compression>,
}

impl TmemUpdate {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// `base` with the update's fields laid over it.
    pub fn apply(&self, base: &TmemConfig) -> TmemConfig {
        TmemConfig {
            enabled: self.enabled.unwrap_or(base.enabled),
            quota_bytes: self.quota_bytes.unwrap_or(base.quota_bytes),
            compression: self.compression.unwrap_or(base.compression),
            timing: base.timing,
            host_cap_bytes: base.host_cap_bytes,
        }
    }
}

/// `GET /tmem`: whether the VM has a pool, its configuration, and (once
/// started) its contents and per-operation counters.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TmemInfo {
    pub enabled: bool,
    #[serde(flatten)]
    pub stats: PoolStats,
    /// Per-operation handling time, when `tmem.timing` is on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timing: Option<CallTiming>,
}
