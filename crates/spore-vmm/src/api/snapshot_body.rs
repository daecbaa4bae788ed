//! Bodies of `PUT /snapshot/create` and `PUT /snapshot/load` (Firecracker's
//! shapes), and of spore's `PUT /snapshot/guest-triggered`.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum SnapshotType {
    #[default]
    Full,
    Diff,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
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

/// What the VMM does once a guest-triggered snapshot is written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AfterSnapshot {
    /// The guest goes on running.
    #[default]
    Resume,
    /// The VM stops and the VMM exits with code 0 (a template is made).
    Exit,
}

/// Guest-triggered snapshot points (signal op `SNAPSHOT`): where they go and
/// what follows. `PUT /snapshot/guest-triggered`, or `guest-snapshots` in a
/// config file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GuestSnapshotConfig {
    /// Snapshots are written here as `tag-<T>.state` and `tag-<T>.mem`.
    pub directory: String,
    #[serde(default)]
    pub snapshot_type: SnapshotType,
    #[serde(default)]
    pub after: AfterSnapshot,
}

impl GuestSnapshotConfig {
    /// Checks what can be checked anywhere (a restore on another host
    /// re-checks nothing about the directory until the guest asks).
    pub fn validate(&self) -> Result<(), String> {
        if self.directory.trim().is_empty() {
            return Err("guest-triggered snapshots: directory is empty".into());
        }
        Ok(())
    }

    /// Also checks that the directory exists now.
    pub fn validate_here(&self) -> Result<(), String> {
        self.validate()?;
        if !std::path::Path::new(&self.directory).is_dir() {
            return Err(format!(
                "guest-triggered snapshots: {} is not a directory (create it first)",
                self.directory
            ));
        }
        Ok(())
    }

    /// (state file, memory file) of the snapshot tagged `tag`.
    pub fn paths(&self, tag: u32) -> (PathBuf, PathBuf) {
        let dir = PathBuf::from(&self.directory);
        (
            dir.join(format!("tag-{tag}.state")),
            dir.join(format!("tag-{tag}.mem")),
        )
    }

    /// The `PUT /snapshot/create` request this configuration makes for `tag`.
    pub fn create_params(&self, tag: u32) -> SnapshotCreateParams {
        let (state, mem) = self.paths(tag);
        SnapshotCreateParams {
            snapshot_type: self.snapshot_type,
            snapshot_path: state.to_string_lossy().into_owned(),
            mem_file_path: mem.to_string_lossy().into_owned(),
            ..Default::default()
        }
    }
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
}

impl SnapshotLoadParams {
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
    }

    #[test]
    fn guest_triggered_bodies() {
        let g: GuestSnapshotConfig = serde_json::from_str(r#"{"directory":"/snaps"}"#).unwrap();
        assert_eq!(
            (g.snapshot_type, g.after),
            (SnapshotType::Full, AfterSnapshot::Resume)
        );
        let p = g.create_params(7);
        assert_eq!(p.snapshot_path, "/snaps/tag-7.state");
        assert_eq!(p.mem_file_path, "/snaps/tag-7.mem");
        let g: GuestSnapshotConfig =
            serde_json::from_str(r#"{"directory":"/s","snapshot_type":"Diff","after":"exit"}"#)
                .unwrap();
        assert_eq!(
            (g.snapshot_type, g.after),
            (SnapshotType::Diff, AfterSnapshot::Exit)
        );
        for bad in [
            r#"{"directory":"/s","after":"stop"}"#,
            r#"{"directory":"/s","snapshot_type":"full"}"#,
            r#"{"directory":"/s","tag":1}"#,
            r#"{"after":"exit"}"#,
        ] {
            assert!(
                serde_json::from_str::<GuestSnapshotConfig>(bad).is_err(),
                "{bad}"
            );
        }
        let empty = GuestSnapshotConfig {
            directory: " ".into(),
            ..g.clone()
        };
        assert!(empty.validate().is_err());
        let missing = GuestSnapshotConfig {
            directory: "/nonexistent/spore-guest-snaps".into(),
            ..g
        };
        assert!(missing.validate().is_ok());
        assert!(missing
            .validate_here()
            .unwrap_err()
            .contains("not a directory"));
    }
}
