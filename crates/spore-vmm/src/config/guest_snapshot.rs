//! Guest-triggered snapshot points as configured (`PUT /snapshot/guest-triggered`,
//! `guest-snapshots` in a config file): where the snapshots go, which kind
//! they are and what the VM does afterwards.
//!
//! Configuration only: writing the snapshot is `vmm::guest_snapshot`'s job,
//! and the request it makes is built in `snapshot::params`.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Full, or Diff against the last snapshot of the same VM (Firecracker's
/// `snapshot_type`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum SnapshotType {
    #[default]
    Full,
    Diff,
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
/// what follows.
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
        crate::files::refuse_dotdot(std::path::Path::new(&self.directory))
            .map_err(|e| format!("guest-triggered snapshots: {e}"))?;
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_triggered_bodies() {
        let g: GuestSnapshotConfig = serde_json::from_str(r#"{"directory":"/snaps"}"#).unwrap();
        assert_eq!(
            (g.snapshot_type, g.after),
            (SnapshotType::Full, AfterSnapshot::Resume)
        );
        let (state, mem) = g.paths(7);
        assert_eq!(state, PathBuf::from("/snaps/tag-7.state"));
        assert_eq!(mem, PathBuf::from("/snaps/tag-7.mem"));
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
