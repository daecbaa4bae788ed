//! Bodies of `PUT /snapshot/create` and `PUT /snapshot/load` (Firecracker's
//! shapes).

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum SnapshotType {
    #[default]
    Full,
    Diff,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotCreateParams {
    #[serde(default)]
    pub snapshot_type: SnapshotType,
    pub snapshot_path: String,
    pub mem_file_path: String,
    /// Firecracker's deprecated field; accepted and ignored.
    #[serde(default)]
    pub version: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MemBackendType {
    File,
    Uffd,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemBackend {
    pub backend_type: MemBackendType,
    pub backend_path: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotLoadParams {
    pub snapshot_path: String,
    #[serde(default)]
    pub mem_backend: Option<MemBackend>,
    /// Deprecated in Firecracker in favour of `mem_backend`.
    #[serde(default)]
    pub mem_file_path: Option<String>,
    #[serde(default)]
    pub enable_diff_snapshots: bool,
    #[serde(default)]
    pub track_dirty_pages: bool,
    #[serde(default)]
    pub resume_vm: bool,
    /// spore, for testing clone identity without the clone machinery: give
    /// the restored VM this clone generation before it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clone_generation: Option<u64>,
    /// spore, with `clone_generation`: the restored VM's new vsock CID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vsock_cid: Option<u32>,
    /// spore, for testing: restore every writable drive as a clone's (its
    /// image, or the snapshot's overlay, as the base of a new overlay
    /// `<dir>/<name>.<drive_id>.cow`; see `blk::overlay::clone_drive`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clone_disks: Option<CloneDisks>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CloneDisks {
    pub dir: String,
    pub name: String,
}

impl SnapshotLoadParams {
    /// The clone identity asked for, if any (`vsock_cid` needs `clone_generation`).
    pub fn clone_identity(&self) -> Result<Option<crate::vm::identity::CloneIdentity>, String> {
        match (self.clone_generation, self.vsock_cid) {
            (None, None) => Ok(None),
            (None, Some(_)) => Err("vsock_cid needs clone_generation".into()),
            (Some(generation), vsock_cid) => {
                if vsock_cid.is_some_and(|c| c < 3 || c == u32::MAX) {
                    return Err("vsock_cid must be in 3..=4294967294".into());
                }
                Ok(Some(crate::vm::identity::CloneIdentity {
                    generation,
                    vsock_cid,
                }))
            }
        }
    }

    /// The memory file to map: `mem_backend` (File) or `mem_file_path`,
    /// exactly one of them.
    pub fn mem_file(&self) -> Result<&str, String> {
        match (&self.mem_backend, &self.mem_file_path) {
            (Some(_), Some(_)) => {
                Err("give either mem_backend or the deprecated mem_file_path, not both".into())
            }
            (None, None) => Err("mem_backend is missing".into()),
            (None, Some(p)) => Ok(p),
            (Some(b), None) => match b.backend_type {
                MemBackendType::File => Ok(&b.backend_path),
                MemBackendType::Uffd => {
                    Err("mem_backend Uffd is not supported yet; use File".into())
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_bodies() {
        let p: SnapshotLoadParams = serde_json::from_str(
            r#"{"snapshot_path":"s","mem_backend":{"backend_type":"File","backend_path":"m"},"resume_vm":true}"#,
        )
        .unwrap();
        assert_eq!(p.mem_file(), Ok("m"));
        assert!(p.resume_vm);
        let p: SnapshotLoadParams =
            serde_json::from_str(r#"{"snapshot_path":"s","mem_file_path":"m"}"#).unwrap();
        assert_eq!(p.mem_file(), Ok("m"));
        let p: SnapshotLoadParams = serde_json::from_str(r#"{"snapshot_path":"s"}"#).unwrap();
        assert!(p.mem_file().is_err());
        let p: SnapshotLoadParams = serde_json::from_str(
            r#"{"snapshot_path":"s","mem_backend":{"backend_type":"Uffd","backend_path":"u"}}"#,
        )
        .unwrap();
        assert!(p.mem_file().is_err());
        let p: SnapshotLoadParams = serde_json::from_str(
            r#"{"snapshot_path":"s","mem_file_path":"m","clone_generation":3,"vsock_cid":9}"#,
        )
        .unwrap();
        assert_eq!(p.clone_identity().unwrap().unwrap().vsock_cid, Some(9));
        let p: SnapshotLoadParams =
            serde_json::from_str(r#"{"snapshot_path":"s","vsock_cid":9}"#).unwrap();
        assert!(p.clone_identity().is_err());
        let c: SnapshotCreateParams =
            serde_json::from_str(r#"{"snapshot_path":"s","mem_file_path":"m"}"#).unwrap();
        assert_eq!(c.snapshot_type, SnapshotType::Full);
    }
}
