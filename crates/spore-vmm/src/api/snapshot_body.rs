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
    /// spore extension: the files of a diff's parents, nearest parent
    /// first, for layers moved away from where the diff's manifest says
    /// (each is still checked against the id and hash the child names).
    #[serde(default)]
    pub parents: Vec<ParentFiles>,
}

/// One parent layer's files (`parents` in `PUT /snapshot/load`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParentFiles {
    pub snapshot_path: String,
    pub mem_file_path: String,
}

impl SnapshotLoadParams {
    /// Dirty page tracking for the restored VM: on when either
    /// `track_dirty_pages` or Firecracker's older `enable_diff_snapshots`
    /// asks for it, else as the snapshotted VM had it.
    pub fn track_dirty(&self) -> Option<bool> {
        (self.track_dirty_pages || self.enable_diff_snapshots).then_some(true)
    }

    pub fn parent_paths(&self) -> Vec<crate::snapshot::LayerPaths> {
        self.parents
            .iter()
            .map(|p| crate::snapshot::LayerPaths {
                state: p.snapshot_path.clone().into(),
                mem: p.mem_file_path.clone().into(),
            })
            .collect()
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
        let c: SnapshotCreateParams =
            serde_json::from_str(r#"{"snapshot_path":"s","mem_file_path":"m"}"#).unwrap();
        assert_eq!(c.snapshot_type, SnapshotType::Full);
        let c: SnapshotCreateParams = serde_json::from_str(
            r#"{"snapshot_type":"Diff","snapshot_path":"s","mem_file_path":"m"}"#,
        )
        .unwrap();
        assert_eq!(c.snapshot_type, SnapshotType::Diff);
    }

    #[test]
    fn load_parents_and_tracking() {
        let p: SnapshotLoadParams = serde_json::from_str(
            r#"{"snapshot_path":"s","mem_file_path":"m","enable_diff_snapshots":true,
                "parents":[{"snapshot_path":"p.state","mem_file_path":"p.mem"},
                           {"snapshot_path":"b.state","mem_file_path":"b.mem"}]}"#,
        )
        .unwrap();
        assert_eq!(p.track_dirty(), Some(true));
        let parents = p.parent_paths();
        assert_eq!(parents.len(), 2);
        assert_eq!(parents[0].state, std::path::Path::new("p.state"));
        assert_eq!(parents[1].mem, std::path::Path::new("b.mem"));
        let p: SnapshotLoadParams = serde_json::from_str(r#"{"snapshot_path":"s"}"#).unwrap();
        assert_eq!(p.track_dirty(), None);
        assert!(p.parent_paths().is_empty());
        // A typo in a parent entry is refused, not ignored.
        assert!(serde_json::from_str::<SnapshotLoadParams>(
            r#"{"snapshot_path":"s","parents":[{"snapshot_path":"a","mem_path":"b"}]}"#
        )
        .is_err());
    }
}
