//! What a snapshot is asked to be, as typed values: where a new snapshot
//! goes and of which kind ([`SnapshotCreateParams`]), where a restored VM's
//! memory comes from ([`LoadMemory`]) and whether its drives become a
//! clone's ([`CloneDisks`]).
//!
//! The API's wire bodies (`api::snapshot_body`) and the CLI map onto these;
//! nothing here parses HTTP or touches a VM.

use serde::{Deserialize, Serialize};

use crate::config::GuestSnapshotConfig;
pub use crate::config::SnapshotType;
pub use crate::snapshot::restore::RestoreMode;

/// `PUT /snapshot/create` (Firecracker's body, which is also the request).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotCreateParams {
    #[serde(default)]
    pub snapshot_type: SnapshotType,
    pub snapshot_path: String,
    pub mem_file_path: String,
    /// spore extension: record the memory file's SHA-256 in the manifest
    /// (`layer.mem_sha256`), checked by eager restores and
    /// `spore snapshot inspect --verify`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hash_memory: bool,
    /// Firecracker's deprecated field; accepted and ignored.
    #[serde(default)]
    pub version: Option<String>,
}

impl SnapshotCreateParams {
    /// The snapshot a guest's `SNAPSHOT` signal with `tag` asks for.
    pub fn for_guest_tag(config: &GuestSnapshotConfig, tag: u32) -> Self {
        let (state, mem) = config.paths(tag);
        SnapshotCreateParams {
            snapshot_type: config.snapshot_type,
            snapshot_path: state.to_string_lossy().into_owned(),
            mem_file_path: mem.to_string_lossy().into_owned(),
            ..Default::default()
        }
    }

    /// The layer this request writes.
    pub fn layer_kind(&self) -> crate::snapshot::format::LayerKind {
        match self.snapshot_type {
            SnapshotType::Full => crate::snapshot::format::LayerKind::Full,
            SnapshotType::Diff => crate::snapshot::format::LayerKind::Diff,
        }
    }
}

/// Where a restored VM's memory comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LoadMemory {
    /// The memory file, filled per the mode.
    File { path: String, mode: RestoreMode },
    /// userfaultfd with the built-in handler serving this memory file.
    UffdBuiltin { path: String },
    /// userfaultfd handed to the handler listening on this socket.
    UffdExternal { socket: String },
}

/// Restore every writable drive as a clone's: its image (or the snapshot's
/// overlay) becomes the base of a new overlay `<dir>/<name>.<drive_id>.cow`
/// (see `blk::overlay::clone_drive`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CloneDisks {
    pub dir: String,
    pub name: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_bodies_and_guest_requests() {
        let c: SnapshotCreateParams =
            serde_json::from_str(r#"{"snapshot_path":"s","mem_file_path":"m"}"#).unwrap();
        assert_eq!(c.snapshot_type, SnapshotType::Full);
        let c: SnapshotCreateParams = serde_json::from_str(
            r#"{"snapshot_type":"Diff","snapshot_path":"s","mem_file_path":"m"}"#,
        )
        .unwrap();
        assert_eq!(c.snapshot_type, SnapshotType::Diff);
        assert_eq!(c.layer_kind(), crate::snapshot::format::LayerKind::Diff);
        let g = GuestSnapshotConfig {
            directory: "/snaps".into(),
            snapshot_type: SnapshotType::Full,
            after: Default::default(),
        };
        let p = SnapshotCreateParams::for_guest_tag(&g, 7);
        assert_eq!(p.snapshot_path, "/snaps/tag-7.state");
        assert_eq!(p.mem_file_path, "/snaps/tag-7.mem");
    }
}
