//! The wire body of `PUT /snapshot/load` (Firecracker's shape, plus spore's
//! `restore_mode`, `working_set_record_ms`, clone and parent fields), and its
//! mapping onto the domain types in [`crate::snapshot::params`].
//!
//! The other snapshot bodies are domain types themselves
//! (`snapshot::params::SnapshotCreateParams`,
//! `config::GuestSnapshotConfig`); nothing here acts on a VM.

use serde::{Deserialize, Serialize};

use crate::clone::identity::CloneIdentity;
pub use crate::snapshot::params::{CloneDisks, LoadMemory};
use crate::snapshot::restore::RestoreMode;

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
    /// Firecracker's older name for `track_dirty_pages`.
    #[serde(default)]
    pub enable_diff_snapshots: Option<bool>,
    #[serde(default)]
    pub track_dirty_pages: Option<bool>,
    #[serde(default)]
    pub resume_vm: bool,
    /// spore: how a File backend fills RAM (default lazy).
    #[serde(default)]
    pub restore_mode: Option<RestoreMode>,
    /// spore: with `working_set`, recording a new working set ends this many
    /// milliseconds after the guest starts (default: when the VM stops).
    #[serde(default)]
    pub working_set_record_ms: Option<u64>,
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
    /// spore extension: the files of a diff's parents, nearest parent
    /// first, for layers moved away from where the diff's manifest says
    /// (each is still checked against the id and hash the child names).
    #[serde(default)]
    pub parents: Vec<ParentFiles>,
    /// Firecracker's: the restored vsock device's Unix socket, instead of
    /// the path the snapshot was taken with (which another VM may hold).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vsock_override: Option<VsockOverride>,
    /// Firecracker's: new host tap devices for the snapshot's network
    /// interfaces (an iface_id the snapshot lacks is refused).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub network_overrides: Vec<NetworkOverride>,
    /// Firecracker's (x86): restore kvmclock with `KVM_CLOCK_REALTIME`,
    /// advancing it by the wall-clock time since the snapshot.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub clock_realtime: bool,
}

/// One entry of `network_overrides`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkOverride {
    pub iface_id: String,
    pub host_dev_name: String,
}

/// `vsock_override` in `PUT /snapshot/load`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VsockOverride {
    pub uds_path: String,
}

/// One parent layer's files (`parents` in `PUT /snapshot/load`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParentFiles {
    pub snapshot_path: String,
    pub mem_file_path: String,
}

impl SnapshotLoadParams {
    /// The clone identity asked for, if any (`vsock_cid` needs `clone_generation`).
    pub fn clone_identity(&self) -> Result<Option<CloneIdentity>, String> {
        match (self.clone_generation, self.vsock_cid) {
            (None, None) => Ok(None),
            (None, Some(_)) => Err("vsock_cid needs clone_generation".into()),
            (Some(generation), vsock_cid) => {
                if vsock_cid.is_some_and(|c| c < 3 || c == u32::MAX) {
                    return Err("vsock_cid must be in 3..=4294967294".into());
                }
                Ok(Some(CloneIdentity {
                    net: Vec::new(),
                    index: 0,
                    generation,
                    vsock_cid,
                }))
            }
        }
    }

    /// Dirty page tracking for the restored VM: on when either
    /// `track_dirty_pages` or Firecracker's older `enable_diff_snapshots`
    /// is true, off when one is false and neither true (a VM restored only
    /// to serve does not pay for dirty logging), else (neither given) as
    /// the snapshotted VM had it.
    pub fn track_dirty(&self) -> Option<bool> {
        let asked = [self.track_dirty_pages, self.enable_diff_snapshots];
        if asked.contains(&Some(true)) {
            Some(true)
        } else if asked.contains(&Some(false)) {
            Some(false)
        } else {
            None
        }
    }

    /// Refuses the body if any path in it has a `..` component (see
    /// [`crate::files::refuse_dotdot`]).
    pub fn refuse_dotdot(&self) -> Result<(), String> {
        let mut paths = vec![&self.snapshot_path];
        paths.extend(self.mem_backend.as_ref().map(|b| &b.backend_path));
        paths.extend(self.mem_file_path.as_ref());
        for p in &self.parents {
            paths.extend([&p.snapshot_path, &p.mem_file_path]);
        }
        paths.extend(self.clone_disks.as_ref().map(|c| &c.dir));
        paths.extend(self.vsock_override.as_ref().map(|v| &v.uds_path));
        paths
            .into_iter()
            .try_for_each(|p| crate::files::refuse_dotdot(std::path::Path::new(p)))
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

    /// The memory source: `mem_backend` or the deprecated `mem_file_path`,
    /// exactly one of them. A `Uffd` backend_path naming a Unix socket is
    /// an external handler (Firecracker's protocol); naming a regular file
    /// (a snapshot memory file), the built-in handler serves it.
    pub fn memory(&self) -> Result<LoadMemory, String> {
        let mode = self.restore_mode.unwrap_or_default();
        match (&self.mem_backend, &self.mem_file_path) {
            (Some(_), Some(_)) => {
                Err("give either mem_backend or the deprecated mem_file_path, not both".into())
            }
            (None, None) => Err("mem_backend is missing".into()),
            (None, Some(p)) => Ok(LoadMemory::File {
                path: p.clone(),
                mode,
            }),
            (Some(b), None) => match b.backend_type {
                MemBackendType::File => Ok(LoadMemory::File {
                    path: b.backend_path.clone(),
                    mode,
                }),
                MemBackendType::Uffd => {
                    if mode != RestoreMode::Lazy {
                        return Err(format!(
                            "restore_mode {mode:?} needs the File backend; the Uffd backend \
                             serves pages on demand"
                        ));
                    }
                    use std::os::unix::fs::FileTypeExt;
                    let path = &b.backend_path;
                    match std::fs::metadata(path) {
                        Ok(m) if m.file_type().is_socket() => Ok(LoadMemory::UffdExternal {
                            socket: path.clone(),
                        }),
                        Ok(m) if m.is_file() => Ok(LoadMemory::UffdBuiltin { path: path.clone() }),
                        Ok(_) => Err(format!(
                            "mem_backend Uffd: {path} is neither a Unix socket (an external \
                             page-fault handler) nor a memory file (the built-in handler)"
                        )),
                        Err(e) => Err(format!(
                            "mem_backend Uffd: backend_path {path}: {e} (it must name the Unix \
                             socket a page-fault handler listens on, or a snapshot memory file \
                             for the built-in handler)"
                        )),
                    }
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
        let file = |path: &str, mode| LoadMemory::File {
            path: path.into(),
            mode,
        };
        let p: SnapshotLoadParams = serde_json::from_str(
            r#"{"snapshot_path":"s","mem_backend":{"backend_type":"File","backend_path":"m"},"resume_vm":true}"#,
        )
        .unwrap();
        assert_eq!(p.memory(), Ok(file("m", RestoreMode::Lazy)));
        assert!(p.resume_vm);
        let p: SnapshotLoadParams =
            serde_json::from_str(r#"{"snapshot_path":"s","mem_file_path":"m"}"#).unwrap();
        assert_eq!(p.memory(), Ok(file("m", RestoreMode::Lazy)));
        let p: SnapshotLoadParams = serde_json::from_str(r#"{"snapshot_path":"s"}"#).unwrap();
        assert!(p.memory().is_err());
        for (mode, want) in [
            ("lazy", RestoreMode::Lazy),
            ("eager", RestoreMode::Eager),
            ("working_set", RestoreMode::WorkingSet),
        ] {
            let p: SnapshotLoadParams = serde_json::from_str(&format!(
                r#"{{"snapshot_path":"s","mem_file_path":"m","restore_mode":"{mode}","working_set_record_ms":5}}"#
            ))
            .unwrap();
            assert_eq!(p.memory(), Ok(file("m", want)));
            assert_eq!(p.working_set_record_ms, Some(5));
        }
        // Unknown modes and backends do not decode.
        for body in [
            r#"{"snapshot_path":"s","mem_file_path":"m","restore_mode":"fast"}"#,
            r#"{"snapshot_path":"s","mem_backend":{"backend_type":"Nfs","backend_path":"m"}}"#,
        ] {
            assert!(
                serde_json::from_str::<SnapshotLoadParams>(body).is_err(),
                "{body}"
            );
        }
        // Uffd: a missing path, a regular file (built-in), a socket (external).
        let dir = std::env::temp_dir().join(format!("spore-load-body-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let uffd = |path: &std::path::Path, mode: &str| {
            serde_json::from_str::<SnapshotLoadParams>(&format!(
                r#"{{"snapshot_path":"s","mem_backend":{{"backend_type":"Uffd","backend_path":"{}"}},"restore_mode":"{mode}"}}"#,
                path.display()
            ))
            .unwrap()
            .memory()
        };
        let e = uffd(&dir.join("nope.sock"), "lazy").unwrap_err();
        assert!(e.contains("No such file"), "{e}");
        let mem = dir.join("mem");
        std::fs::write(&mem, b"x").unwrap();
        assert_eq!(
            uffd(&mem, "lazy"),
            Ok(LoadMemory::UffdBuiltin {
                path: mem.display().to_string()
            })
        );
        assert!(uffd(&mem, "eager").is_err());
        let sock = dir.join("h.sock");
        let _l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        assert_eq!(
            uffd(&sock, "lazy"),
            Ok(LoadMemory::UffdExternal {
                socket: sock.display().to_string()
            })
        );
        std::fs::remove_dir_all(&dir).unwrap();
        let p: SnapshotLoadParams = serde_json::from_str(
            r#"{"snapshot_path":"s","mem_file_path":"m","clone_generation":3,"vsock_cid":9}"#,
        )
        .unwrap();
        assert_eq!(p.clone_identity().unwrap().unwrap().vsock_cid, Some(9));
        let p: SnapshotLoadParams =
            serde_json::from_str(r#"{"snapshot_path":"s","vsock_cid":9}"#).unwrap();
        assert!(p.clone_identity().is_err());
    }

    #[test]
    fn vsock_override_is_firecrackers_shape() {
        let p: SnapshotLoadParams = serde_json::from_str(
            r#"{"snapshot_path":"s","mem_file_path":"m","vsock_override":{"uds_path":"/run/v.sock"}}"#,
        )
        .unwrap();
        assert_eq!(p.vsock_override.unwrap().uds_path, "/run/v.sock");
        assert!(serde_json::from_str::<SnapshotLoadParams>(
            r#"{"snapshot_path":"s","vsock_override":{"path":"x"}}"#
        )
        .is_err());
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
        let off = |body: &str| serde_json::from_str::<SnapshotLoadParams>(body).unwrap();
        assert_eq!(
            off(r#"{"snapshot_path":"s","track_dirty_pages":false}"#).track_dirty(),
            Some(false)
        );
        assert_eq!(
            off(r#"{"snapshot_path":"s","track_dirty_pages":false,"enable_diff_snapshots":true}"#)
                .track_dirty(),
            Some(true)
        );
        assert!(p.parent_paths().is_empty());
        // A typo in a parent entry is refused, not ignored.
        assert!(serde_json::from_str::<SnapshotLoadParams>(
            r#"{"snapshot_path":"s","parents":[{"snapshot_path":"a","mem_path":"b"}]}"#
        )
        .is_err());
    }
}
