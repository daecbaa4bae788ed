//! Function snapshots: the restore start path.
//!
//! The zygote of a function version (its first cold boot, paused after its
//! guest said `Ready`) is snapshotted through the VMM's own API (`PUT
//! /snapshot/create`, Full) into `<state>/snapshots/<name>-v<version>/`. The snapshot outlives the daemon: after a
//! restart, or once a zygote was demoted under the memory budget, an
//! instance is restored from it (`PUT /snapshot/load`) instead of booted.
//! The first restore records the guest's working set (`vm.state.ws`, written
//! by the VMM), later restores read it in one sequential read.
//!
//! For a `spore-uk` function the snapshot is one layer: the unikernel is the
//! function, there is no runtime to share below it. Linux runtimes put a
//! runtime base below a function diff (the Linux-runtime issue).
//!
//! A snapshot belongs to one version and is deleted with it; the catalogue
//! records finished snapshots only (written under a temporary name, then
//! renamed), so a daemon killed mid-write leaves a `.tmp-` directory that
//! [`SnapshotStore::recover`] removes.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::Context as _;

use crate::catalog::{Catalog, Function, SnapshotRecord};
use crate::vmm::VmmProcess;

/// How a restore fills guest memory (`restore_mode` of `PUT /snapshot/load`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RestoreMode {
    /// The recorded working set read up front; the rest on demand. The
    /// first restore of a snapshot records it.
    WorkingSet,
    /// Every page on demand from the memory file.
    Lazy,
}

impl RestoreMode {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "working-set" | "working_set" => Some(RestoreMode::WorkingSet),
            "lazy" => Some(RestoreMode::Lazy),
            _ => None,
        }
    }

    fn api_name(self) -> &'static str {
        match self {
            RestoreMode::WorkingSet => "working_set",
            RestoreMode::Lazy => "lazy",
        }
    }
}

/// How long after a restored guest starts its working-set recording ends:
/// long enough for the runtime's init and a first invocation.
const WORKING_SET_RECORD_MS: u64 = 1000;

/// A function version's snapshot files.
#[derive(Clone, Debug)]
pub struct FunctionSnapshot {
    pub dir: PathBuf,
}

impl FunctionSnapshot {
    pub fn state_path(&self) -> PathBuf {
        self.dir.join("vm.state")
    }

    pub fn mem_path(&self) -> PathBuf {
        self.dir.join("vm.mem")
    }

    /// Written by the VMM after the first working-set restore.
    pub fn working_set_path(&self) -> PathBuf {
        self.dir.join("vm.state.ws")
    }

    fn is_complete(&self) -> bool {
        self.state_path().is_file() && self.mem_path().is_file()
    }
}

pub struct SnapshotStore {
    root: PathBuf,
    catalog: Arc<Catalog>,
    mode: RestoreMode,
    /// Clone generations for restored instances: each differs from the
    /// snapshot's (0) and from every other restore's, so each guest reseeds.
    next_generation: AtomicU64,
    next_tmp: AtomicU64,
}

impl SnapshotStore {
    pub fn new(state_dir: &Path, catalog: Arc<Catalog>, mode: RestoreMode) -> Self {
        // Start past any generation an earlier daemon gave.
        let start = crate::instances::unix_ms() << 12;
        SnapshotStore {
            root: state_dir.join("snapshots"),
            catalog,
            mode,
            next_generation: AtomicU64::new(start.max(1)),
            next_tmp: AtomicU64::new(0),
        }
    }

    pub fn mode(&self) -> RestoreMode {
        self.mode
    }

    fn dir_of(&self, name: &str, version: i64) -> PathBuf {
        // Function names are [A-Za-z0-9_-]{1,64} (checked by the API).
        self.root.join(format!("{name}-v{version}"))
    }

    /// The snapshot of `f`'s current version, if one was made and its files
    /// are still there (a record whose files are gone is dropped).
    pub fn find(&self, f: &Function) -> Option<FunctionSnapshot> {
        let rec = match self.catalog.snapshot(&f.name, f.version) {
            Ok(r) => r?,
            Err(e) => {
                tracing::warn!("{e}");
                return None;
            }
        };
        let snap = FunctionSnapshot {
            dir: PathBuf::from(&rec.dir),
        };
        if snap.is_complete() {
            Some(snap)
        } else {
            tracing::warn!(function = %f.name, "snapshot {} is incomplete; dropped", rec.dir);
            self.drop_snapshot(&f.name, f.version);
            None
        }
    }

    /// Pauses `vmm` (a zygote, or a booted instance whose guest has said
    /// `Ready`), writes its snapshot and records it. The VM is left paused.
    pub async fn create(&self, f: &Function, vmm: &VmmProcess) -> anyhow::Result<FunctionSnapshot> {
        let n = self.next_tmp.fetch_add(1, Ordering::Relaxed);
        let tmp = self
            .root
            .join(format!(".tmp-{}-v{}-{n}", f.name, f.version));
        create_private_dir(&self.root)?;
        let _ = std::fs::remove_dir_all(&tmp);
        create_private_dir(&tmp)?;
        let written = async {
            vmm.api("PATCH", "/vm", Some(r#"{"state":"Paused"}"#.into()))
                .await?;
            let body = serde_json::json!({
                "snapshot_type": "Full",
                "snapshot_path": tmp.join("vm.state"),
                "mem_file_path": tmp.join("vm.mem"),
            });
            vmm.api("PUT", "/snapshot/create", Some(body.to_string()))
                .await?;
            let dir = self.dir_of(&f.name, f.version);
            // A snapshot of this version made by an earlier daemon that died
            // before recording it: replaced.
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::rename(&tmp, &dir)
                .with_context(|| format!("renaming {} to {}", tmp.display(), dir.display()))?;
            sync_dir(&self.root);
            anyhow::Ok(dir)
        }
        .await;
        let dir = match written {
            Ok(dir) => dir,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&tmp);
                return Err(e);
            }
        };
        let rec = SnapshotRecord {
            function: f.name.clone(),
            version: f.version,
            dir: dir.display().to_string(),
        };
        self.catalog
            .put_snapshot(&rec, crate::instances::unix_ms())?;
        Ok(FunctionSnapshot { dir })
    }

    /// Restores `snap` into the fresh VMM `vmm` (nothing loaded yet) and
    /// resumes it; its vsock device serves `vmm.vsock_uds`. The guest gets a
    /// new clone generation, so it reseeds as a clone does. A VMM that
    /// records the working set is marked to be stopped cleanly (it writes
    /// the working set then, if its recording time has not ended first).
    pub async fn restore(
        &self,
        snap: &FunctionSnapshot,
        vmm: &mut VmmProcess,
    ) -> anyhow::Result<()> {
        let generation = self.next_generation.fetch_add(1, Ordering::Relaxed);
        let mut body = serde_json::json!({
            "snapshot_path": snap.state_path(),
            "mem_backend": { "backend_type": "File", "backend_path": snap.mem_path() },
            "restore_mode": self.mode.api_name(),
            "resume_vm": true,
            "vsock_override": { "uds_path": vmm.vsock_uds },
            "clone_generation": generation,
        });
        if self.mode == RestoreMode::WorkingSet && !snap.working_set_path().is_file() {
            body["working_set_record_ms"] = WORKING_SET_RECORD_MS.into();
            vmm.stop_cleanly = true;
        }
        vmm.api("PUT", "/snapshot/load", Some(body.to_string()))
            .await?;
        Ok(())
    }

    /// Deletes the snapshot of one version (record and files).
    pub fn drop_snapshot(&self, name: &str, version: i64) {
        if let Err(e) = self.catalog.remove_snapshot(name, version) {
            tracing::warn!("{e}");
        }
        let _ = std::fs::remove_dir_all(self.dir_of(name, version));
    }

    /// Deletes every snapshot of `name` but the one of `keep` (its current
    /// version; `None` when the function was deleted).
    pub fn prune(&self, name: &str, keep: Option<i64>) {
        let records = match self.catalog.snapshots() {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!("{e}");
                return;
            }
        };
        for r in records {
            if r.function == name && Some(r.version) != keep {
                tracing::info!(function = %name, version = r.version, "snapshot deleted");
                self.drop_snapshot(name, r.version);
            }
        }
    }

    /// After a restart: drops half-written snapshots, records whose files
    /// are gone or whose function version is no longer current, and
    /// directories nothing records. Returns how many were removed.
    pub fn recover(&self) -> usize {
        let mut removed = 0;
        let mut kept = std::collections::BTreeSet::new();
        for r in self.catalog.snapshots().unwrap_or_default() {
            let current = self
                .catalog
                .get(&r.function)
                .ok()
                .flatten()
                .is_some_and(|f| f.version == r.version);
            let snap = FunctionSnapshot {
                dir: PathBuf::from(&r.dir),
            };
            if current && snap.is_complete() {
                kept.insert(snap.dir);
            } else {
                self.drop_snapshot(&r.function, r.version);
                removed += 1;
            }
        }
        if let Ok(entries) = std::fs::read_dir(&self.root) {
            for e in entries.flatten() {
                if !kept.contains(&e.path()) {
                    let _ = std::fs::remove_dir_all(e.path());
                    removed += 1;
                }
            }
        }
        removed
    }
}

fn create_private_dir(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("creating {}", dir.display()))
}

/// Makes a rename in `dir` durable.
fn sync_dir(dir: &Path) {
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
}
