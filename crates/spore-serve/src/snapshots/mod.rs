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
//! function, there is no runtime to share below it. A Linux function's
//! snapshot is a Diff on top of its runtime's base ([`crate::bases`]): its
//! directory also holds `layer.json` naming the base (id and directory) and
//! the diff's size on disk, and a restore loads the chain base + diff.
//!
//! A snapshot belongs to one version and is deleted with it; the catalogue
//! records finished snapshots only (written under a temporary name, then
//! renamed), so a daemon killed mid-write leaves a `.tmp-` directory that
//! [`SnapshotStore::recover`] removes.

mod origin;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::Context as _;
pub use origin::{Origin, ORIGIN_RECORD};

use crate::bases::{read_base, Base};
use crate::catalog::{Catalog, Function, SnapshotRecord};
use crate::clock::unix_ms;
use crate::fs::{create_private_dir, disk_bytes, sync_dir, write_private};
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

/// How a Linux function's snapshot is kept (`--linux-snapshots`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinuxSnapshots {
    /// SnapFaaS: the function's Diff on its runtime's shared base, restored
    /// as the chain base + diff (disk per function: its diff).
    Layered,
    /// The Firecracker baseline of SnapFaaS's evaluation: the Diff is
    /// written as for `Layered`, then merged with the base into one Full
    /// snapshot of the function (`spore snapshot merge`, Firecracker's
    /// `rebase-snap`) and the Diff deleted (disk per function: a whole
    /// memory file). A benchmark knob: it costs disk for nothing else.
    Merged,
}

impl LinuxSnapshots {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "layered" => Some(LinuxSnapshots::Layered),
            "merged" => Some(LinuxSnapshots::Merged),
            _ => None,
        }
    }
}

/// `merged.json` of a function snapshot that was a Diff merged with its
/// base into one Full snapshot.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MergedRecord {
    /// The base the Diff was on (`<runtime>-<mib>`) and its id.
    pub base: String,
    pub base_id: String,
    /// Bytes the Diff's memory file took on disk before the merge.
    pub diff_disk_bytes: u64,
    /// Bytes the merged memory file takes on disk.
    pub full_disk_bytes: u64,
}

const MERGED_RECORD: &str = "merged.json";

/// How long after a restored guest starts its working-set recording ends
/// (the default of `--working-set-record-ms`): long enough for the
/// runtime's init and a first invocation on a real CPU. Recording also ends
/// when the instance stops cleanly, whichever comes first.
pub const WORKING_SET_RECORD_MS: u64 = 1000;

/// A function version's snapshot files.
#[derive(Clone, Debug)]
pub struct FunctionSnapshot {
    pub dir: PathBuf,
    /// A Diff's base (`None`: a Full snapshot).
    pub layer: Option<LayerRecord>,
}

/// `layer.json` of a function snapshot that is a Diff on a runtime base.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LayerRecord {
    /// `<runtime>-<mib>` and the base's snapshot id (the diff's parent).
    pub base: String,
    pub base_id: String,
    /// The base's directory (its `vm.state` and `vm.mem`).
    pub base_dir: String,
    /// Bytes the diff's memory file takes on disk.
    pub diff_disk_bytes: u64,
}

const LAYER_RECORD: &str = "layer.json";

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
        // A base made again (new kernel or image) under the same directory
        // has a new id: a diff of the old one no longer applies.
        let parent_there = self.layer.as_ref().is_none_or(|l| {
            read_base(Path::new(&l.base_dir)).is_some_and(|b| b.record.id == l.base_id)
        });
        self.state_path().is_file() && self.mem_path().is_file() && parent_there
    }

    /// The snapshot in `dir`, with its `layer.json` if it has one (a
    /// `layer.json` that does not parse makes the snapshot unusable).
    fn open(dir: PathBuf) -> Option<Self> {
        let layer = match std::fs::read(dir.join(LAYER_RECORD)) {
            Ok(bytes) => Some(serde_json::from_slice(&bytes).ok()?),
            Err(_) => None,
        };
        Some(FunctionSnapshot { dir, layer })
    }
}

pub struct SnapshotStore {
    root: PathBuf,
    catalog: Arc<Catalog>,
    mode: RestoreMode,
    /// How long a first working-set restore records (ms).
    record_ms: u64,
    /// Clone generations for restored instances: each differs from the
    /// snapshot's (0) and from every other restore's, so each guest reseeds.
    next_generation: AtomicU64,
    next_tmp: AtomicU64,
}

impl SnapshotStore {
    pub fn new(state_dir: &Path, catalog: Arc<Catalog>, mode: RestoreMode, record_ms: u64) -> Self {
        // Start past any generation an earlier daemon gave.
        let start = unix_ms() << 12;
        SnapshotStore {
            root: state_dir.join("snapshots"),
            catalog,
            mode,
            record_ms: record_ms.max(1),
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
        match FunctionSnapshot::open(PathBuf::from(&rec.dir)) {
            Some(snap) if snap.is_complete() => Some(snap),
            _ => {
                tracing::warn!(function = %f.name, "snapshot {} is incomplete; dropped", rec.dir);
                self.drop_snapshot(&f.name, f.version);
                None
            }
        }
    }

    /// A new clone generation, for a restore the daemon drives itself.
    pub fn next_generation(&self) -> u64 {
        self.next_generation.fetch_add(1, Ordering::Relaxed)
    }

    /// Pauses `vmm` (a zygote, or a booted instance whose guest has said
    /// `Ready`), writes its snapshot and records it. The VM is left paused.
    /// `kernel` (the guest kernel it booted) is named in its origin record.
    pub async fn create(
        &self,
        f: &Function,
        vmm: &VmmProcess,
        kernel: &Path,
    ) -> anyhow::Result<FunctionSnapshot> {
        self.write(f, vmm, None, kernel).await
    }

    /// Like [`Self::create`], but a Diff on top of `base`, which `vmm` was
    /// restored from (with dirty-page tracking): only the pages written
    /// since. Its `layer.json` names the base; checked against the diff's
    /// manifest (`GET /snapshot/last`: its parent's id).
    pub async fn create_diff(
        &self,
        f: &Function,
        vmm: &VmmProcess,
        base: &Base,
        kernel: &Path,
    ) -> anyhow::Result<FunctionSnapshot> {
        self.write(f, vmm, Some(base), kernel).await
    }

    async fn write(
        &self,
        f: &Function,
        vmm: &VmmProcess,
        base: Option<&Base>,
        kernel: &Path,
    ) -> anyhow::Result<FunctionSnapshot> {
        let tmp = self.temp_dir(f)?;
        if let Some(user) = &vmm.user {
            crate::jail::own_tree(&tmp, user)?;
        }
        let written = async {
            vmm.api("PATCH", "/vm", Some(r#"{"state":"Paused"}"#.into()))
                .await?;
            let body = serde_json::json!({
                "snapshot_type": if base.is_some() { "Diff" } else { "Full" },
                "snapshot_path": tmp.join("vm.state"),
                "mem_file_path": tmp.join("vm.mem"),
            });
            vmm.api("PUT", "/snapshot/create", Some(body.to_string()))
                .await?;
            let layer = match base {
                Some(base) => {
                    let manifest: serde_json::Value =
                        serde_json::from_str(&vmm.api("GET", "/snapshot/last", None).await?)?;
                    let parent = manifest["layer"]["parent"]["id"].as_str().unwrap_or("");
                    if parent != base.record.id {
                        anyhow::bail!(
                            "the diff's parent is {parent:?}, not the base {} ({})",
                            base.record.id,
                            base.dir.display()
                        );
                    }
                    let layer = LayerRecord {
                        base: base.name(),
                        base_id: base.record.id.clone(),
                        base_dir: base.dir.display().to_string(),
                        diff_disk_bytes: disk_bytes(&tmp.join("vm.mem")),
                    };
                    write_private(&tmp.join(LAYER_RECORD), &serde_json::to_vec_pretty(&layer)?)?;
                    Some(layer)
                }
                None => None,
            };
            write_origin(&tmp, kernel).await;
            let dir = self.dir_of(&f.name, f.version);
            // A snapshot of this version made by an earlier daemon that died
            // before recording it: replaced.
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::rename(&tmp, &dir)
                .with_context(|| format!("renaming {} to {}", tmp.display(), dir.display()))?;
            let _ = sync_dir(&self.root);
            anyhow::Ok((dir, layer))
        }
        .await;
        let (dir, layer) = match written {
            Ok(w) => w,
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
        self.catalog.put_snapshot(&rec, unix_ms())?;
        Ok(FunctionSnapshot { dir, layer })
    }

    /// A new directory (private, empty) to fill with the files of `f`'s
    /// snapshot fetched from another node, then given to [`Self::adopt`].
    pub fn import_dir(&self, f: &Function) -> anyhow::Result<PathBuf> {
        self.temp_dir(f)
    }

    /// A new private, empty directory beside the snapshots for one of
    /// `f`'s being written (a `.tmp-` name, which [`Self::recover`] removes
    /// if the daemon dies before renaming it into place).
    fn temp_dir(&self, f: &Function) -> anyhow::Result<PathBuf> {
        let n = self.next_tmp.fetch_add(1, Ordering::Relaxed);
        let tmp = self
            .root
            .join(format!(".tmp-{}-v{}-{n}", f.name, f.version));
        create_private_dir(&self.root)?;
        let _ = std::fs::remove_dir_all(&tmp);
        create_private_dir(&tmp)?;
        Ok(tmp)
    }

    /// Makes the fetched snapshot in `tmp` (from [`Self::import_dir`]) `f`'s
    /// snapshot on this node: owned by `user` (the function's jailed uid),
    /// renamed into place and recorded. `tmp` is removed if that fails.
    pub fn adopt(
        &self,
        f: &Function,
        tmp: &Path,
        user: Option<&crate::jail::User>,
    ) -> anyhow::Result<FunctionSnapshot> {
        let adopted = (|| {
            let snap = FunctionSnapshot::open(tmp.to_path_buf())
                .filter(|s| s.layer.is_none() && s.is_complete())
                .ok_or_else(|| anyhow::anyhow!("the fetched snapshot is incomplete"))?;
            drop(snap);
            if let Some(user) = user {
                crate::jail::own_tree(tmp, user)?;
            }
            let dir = self.dir_of(&f.name, f.version);
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::rename(tmp, &dir)
                .with_context(|| format!("renaming {} to {}", tmp.display(), dir.display()))?;
            let _ = sync_dir(&self.root);
            let rec = SnapshotRecord {
                function: f.name.clone(),
                version: f.version,
                dir: dir.display().to_string(),
            };
            self.catalog.put_snapshot(&rec, unix_ms())?;
            anyhow::Ok(FunctionSnapshot { dir, layer: None })
        })();
        if adopted.is_err() {
            let _ = std::fs::remove_dir_all(tmp);
        }
        adopted
    }

    /// `f`'s snapshot as another node may fetch it: a Full snapshot with an
    /// origin record (a Diff needs its base, which is not shipped).
    pub fn shippable(
        &self,
        name: &str,
        version: i64,
    ) -> Result<(FunctionSnapshot, Origin), String> {
        let rec = self
            .catalog
            .snapshot(name, version)
            .map_err(|e| e.to_string())?
            .ok_or("no snapshot of that version here")?;
        let snap = FunctionSnapshot::open(PathBuf::from(&rec.dir))
            .filter(|s| s.is_complete())
            .ok_or("the snapshot here is incomplete")?;
        if snap.layer.is_some() {
            return Err("a diff on a runtime base: not shipped".into());
        }
        let origin = Origin::read(&snap.dir).ok_or("the snapshot here has no origin record")?;
        Ok((snap, origin))
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
        let generation = self.next_generation();
        let mut body = serde_json::json!({
            "snapshot_path": snap.state_path(),
            "mem_backend": { "backend_type": "File", "backend_path": snap.mem_path() },
            "restore_mode": self.mode.api_name(),
            "resume_vm": true,
            "vsock_override": { "uds_path": vmm.vsock_uds },
            "clone_generation": generation,
            // An instance never writes a diff: no dirty logging (a base
            // with tracking on would otherwise pass it on to every restore).
            "track_dirty_pages": false,
        });
        if let Some(layer) = &snap.layer {
            // The diff's manifest names the base too; given here so the
            // chain never depends on a path recorded inside the diff.
            let base = Path::new(&layer.base_dir);
            body["parents"] = serde_json::json!([{
                "snapshot_path": base.join("vm.state"),
                "mem_file_path": base.join("vm.mem"),
            }]);
        }
        if self.mode == RestoreMode::WorkingSet && !snap.working_set_path().is_file() {
            body["working_set_record_ms"] = self.record_ms.into();
            vmm.stop_cleanly = true;
        }
        vmm.api("PUT", "/snapshot/load", Some(body.to_string()))
            .await?;
        Ok(())
    }

    /// Replaces the Diff `snap` (of `f`'s current version, on a base) by one
    /// Full snapshot of the same memory: `spore snapshot merge` (run as
    /// `spore_bin`, a process of its own like the VMMs) flattens base +
    /// diff into a temporary directory, which then takes the Diff's place
    /// (same directory, so the catalogue's record stays right) with a
    /// `merged.json` saying what it was made from.
    pub async fn merge_with_base(
        &self,
        f: &Function,
        snap: &FunctionSnapshot,
        spore_bin: &Path,
    ) -> anyhow::Result<(FunctionSnapshot, MergedRecord)> {
        let layer = snap
            .layer
            .clone()
            .ok_or_else(|| anyhow::anyhow!("{} is not a diff", snap.dir.display()))?;
        let tmp = self.temp_dir(f)?;
        let merged = async {
            let base = Path::new(&layer.base_dir);
            let out = tokio::process::Command::new(spore_bin)
                .args(["snapshot", "merge", "--state"])
                .arg(snap.state_path())
                .arg("--mem")
                .arg(snap.mem_path())
                .arg("--parent")
                .arg(base.join("vm.state"))
                .arg(base.join("vm.mem"))
                .arg("--out-state")
                .arg(tmp.join("vm.state"))
                .arg("--out-mem")
                .arg(tmp.join("vm.mem"))
                .stdin(std::process::Stdio::null())
                .output()
                .await
                .with_context(|| format!("running {} snapshot merge", spore_bin.display()))?;
            if !out.status.success() {
                anyhow::bail!(
                    "spore snapshot merge failed ({}): {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
            let record = MergedRecord {
                base: layer.base.clone(),
                base_id: layer.base_id.clone(),
                diff_disk_bytes: layer.diff_disk_bytes,
                full_disk_bytes: disk_bytes(&tmp.join("vm.mem")),
            };
            write_private(
                &tmp.join(MERGED_RECORD),
                &serde_json::to_vec_pretty(&record)?,
            )?;
            // Made by this daemon on the diff's behalf: given to whoever
            // owns the diff (a jailed function's uid restores it, and
            // records its working set beside it).
            let (uid, gid) = crate::jail::owner_of(&snap.dir)?;
            let owner = crate::jail::User {
                uid,
                gid,
                groups: Vec::new(),
            };
            crate::jail::own_tree(&tmp, &owner)?;
            std::fs::remove_dir_all(&snap.dir)
                .with_context(|| format!("removing the diff {}", snap.dir.display()))?;
            std::fs::rename(&tmp, &snap.dir)
                .with_context(|| format!("renaming {} to {}", tmp.display(), snap.dir.display()))?;
            let _ = sync_dir(&self.root);
            anyhow::Ok(record)
        }
        .await;
        match merged {
            Ok(record) => Ok((
                FunctionSnapshot {
                    dir: snap.dir.clone(),
                    layer: None,
                },
                record,
            )),
            Err(e) => {
                let _ = std::fs::remove_dir_all(&tmp);
                Err(e)
            }
        }
    }

    /// The files a snapshot is made of that another node needs (the working
    /// set only once recorded).
    pub const SHIPPED_FILES: [&'static str; 4] =
        ["vm.state", "vm.mem", "vm.state.ws", ORIGIN_RECORD];

    /// Deletes the snapshot of one version (record and files).
    pub fn drop_snapshot(&self, name: &str, version: i64) {
        if let Err(e) = self.catalog.remove_snapshot(name, version) {
            tracing::warn!("{e}");
        }
        let _ = std::fs::remove_dir_all(self.dir_of(name, version));
    }

    /// Deletes every snapshot of `name` but those of the revisions in `keep`
    /// (`$LATEST`'s and its published versions'; none when the function was
    /// deleted).
    pub fn prune(&self, name: &str, keep: &[i64]) {
        let records = match self.catalog.snapshots() {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!("{e}");
                return;
            }
        };
        for r in records {
            if r.function == name && !keep.contains(&r.version) {
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
                .live_revisions(&r.function)
                .is_ok_and(|live| live.contains(&r.version));
            let snap = FunctionSnapshot::open(PathBuf::from(&r.dir));
            if let Some(snap) = snap.filter(|s| current && s.is_complete()) {
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

/// Writes `origin.json` into the snapshot being made in `dir`. A kernel
/// that cannot be read leaves the snapshot without one: it restores here
/// but is never shipped.
async fn write_origin(dir: &Path, kernel: &Path) {
    let (dir, kernel) = (dir.to_path_buf(), kernel.to_path_buf());
    let written = tokio::task::spawn_blocking(move || {
        let origin = Origin::of_this_host(&kernel)?;
        let bytes = serde_json::to_vec_pretty(&origin).map_err(std::io::Error::other)?;
        write_private(&dir.join(ORIGIN_RECORD), &bytes)
    })
    .await;
    match written {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!("snapshot without an origin record (not shipped): {e}"),
        Err(e) => tracing::warn!("snapshot without an origin record (not shipped): {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Makes `dir` a Diff on `base` (base id "abc") by writing its layer.json.
    fn write_layer_record(dir: &Path, base: &Path) -> LayerRecord {
        let layer = LayerRecord {
            base: "python3-256".into(),
            base_id: "abc".into(),
            base_dir: base.display().to_string(),
            diff_disk_bytes: 4096,
        };
        write_private(
            &dir.join(LAYER_RECORD),
            &serde_json::to_vec(&layer).unwrap(),
        )
        .unwrap();
        layer
    }

    #[test]
    fn a_diff_is_complete_only_with_its_base() {
        let root = std::env::temp_dir().join(format!("spore-snap-layer-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let (dir, base) = (root.join("f-v1"), root.join("python3-256"));
        for d in [&dir, &base] {
            std::fs::create_dir_all(d).unwrap();
            std::fs::write(d.join("vm.state"), b"s").unwrap();
            std::fs::write(d.join("vm.mem"), b"m").unwrap();
        }
        // Without layer.json: a Full snapshot.
        let full = FunctionSnapshot::open(dir.clone()).unwrap();
        assert!(full.layer.is_none() && full.is_complete());
        let layer = write_layer_record(&dir, &base);
        let diff = FunctionSnapshot::open(dir.clone()).unwrap();
        assert_eq!(diff.layer.as_ref(), Some(&layer));
        assert!(!diff.is_complete(), "the base has no record");
        let record = |id: &str| crate::bases::BaseRecord {
            id: id.into(),
            runtime: "python3".into(),
            memory_mib: 256,
            kernel: "/k".into(),
            root_image: "/r".into(),
            devices: crate::runtime::LINUX_DEVICES.into(),
            mem_disk_bytes: 1,
            created_unix_ms: 1,
        };
        let write_record = |id: &str| {
            write_private(
                &base.join("base.json"),
                &serde_json::to_vec(&record(id)).unwrap(),
            )
            .unwrap()
        };
        write_record("other");
        assert!(!diff.is_complete(), "the base was made again");
        write_record("abc");
        assert!(diff.is_complete());
        std::fs::remove_file(base.join("vm.mem")).unwrap();
        assert!(!diff.is_complete(), "the base's memory file is gone");
        // A layer.json that does not parse: not usable.
        std::fs::write(dir.join(LAYER_RECORD), b"{").unwrap();
        assert!(FunctionSnapshot::open(dir).is_none());
        let _ = std::fs::remove_dir_all(&root);
    }

    fn function(name: &str) -> Function {
        Function {
            name: name.into(),
            runtime: "python3".into(),
            handler: "f.handler".into(),
            memory_mib: 256,
            timeout_s: 3,
            env: Default::default(),
            description: String::new(),
            role: "r".into(),
            code_sha256: "00".into(),
            code_size: 1,
            version: 1,
            revision_id: "rev".into(),
            last_modified: "2026-01-01T00:00:00.000+0000".into(),
            reserved_concurrency: None,
            network: false,
            published: None,
        }
    }

    #[test]
    fn linux_snapshot_modes_parse() {
        assert_eq!(
            LinuxSnapshots::parse("layered"),
            Some(LinuxSnapshots::Layered)
        );
        assert_eq!(
            LinuxSnapshots::parse("merged"),
            Some(LinuxSnapshots::Merged)
        );
        assert_eq!(LinuxSnapshots::parse("full"), None);
    }

    /// `merge_with_base` with a stand-in for `spore snapshot merge` (a
    /// script that checks its arguments and writes the two outputs): the
    /// diff's directory becomes a full snapshot with `merged.json`; a merge
    /// that fails leaves the diff as it was.
    #[tokio::test]
    async fn a_diff_merged_with_its_base_takes_its_place() {
        use std::os::unix::fs::PermissionsExt;
        let root = std::env::temp_dir().join(format!("spore-snap-merge-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        let catalog = Arc::new(Catalog::open(&root.join("catalog.db")).unwrap());
        let store = SnapshotStore::new(&root, catalog, RestoreMode::Lazy, 1000);
        let f = function("lorem");
        let (dir, base) = (
            root.join("snapshots/lorem-v1"),
            root.join("bases/python3-256"),
        );
        for d in [&dir, &base] {
            std::fs::create_dir_all(d).unwrap();
            std::fs::write(d.join("vm.state"), b"s").unwrap();
            std::fs::write(d.join("vm.mem"), b"m").unwrap();
        }
        write_layer_record(&dir, &base);
        let diff = FunctionSnapshot::open(dir.clone()).unwrap();
        let script = |body: &str| {
            let p = root.join("spore");
            std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
            p
        };
        // Fails: the diff stays, no temporary directory is left.
        let bin = script("echo 'chain broken' >&2; exit 1");
        let err = store.merge_with_base(&f, &diff, &bin).await.unwrap_err();
        assert!(format!("{err:#}").contains("chain broken"), "{err:#}");
        assert!(dir.join(LAYER_RECORD).is_file());
        let left: Vec<_> = std::fs::read_dir(root.join("snapshots")).unwrap().collect();
        assert_eq!(left.len(), 1, "only the diff's directory");
        // Succeeds: the arguments name the diff, its base and the outputs.
        let want = format!(
            "snapshot merge --state {d}/vm.state --mem {d}/vm.mem --parent {b}/vm.state {b}/vm.mem --out-state",
            d = dir.display(),
            b = base.display()
        );
        let bin = script(&format!(
            r#"case "$*" in "{want}"*) ;; *) echo "args: $*" >&2; exit 2 ;; esac
while [ $# -gt 0 ]; do case $1 in --out-state) echo state >"$2" ;; --out-mem) head -c 8192 /dev/urandom >"$2" ;; esac; shift; done"#
        ));
        let (full, rec) = store.merge_with_base(&f, &diff, &bin).await.unwrap();
        assert_eq!(full.dir, dir);
        assert!(full.layer.is_none());
        assert_eq!(rec.base_id, "abc");
        assert_eq!(rec.diff_disk_bytes, 4096);
        assert!(rec.full_disk_bytes >= 8192);
        let reopened = FunctionSnapshot::open(dir.clone()).unwrap();
        assert!(reopened.layer.is_none() && reopened.is_complete());
        let on_disk: MergedRecord =
            serde_json::from_slice(&std::fs::read(dir.join(MERGED_RECORD)).unwrap()).unwrap();
        assert_eq!(on_disk, rec);
        assert_eq!(std::fs::read(dir.join("vm.state")).unwrap(), b"state\n");
        // A full snapshot cannot be merged again.
        assert!(store.merge_with_base(&f, &full, &bin).await.is_err());
        let _ = std::fs::remove_dir_all(&root);
    }
}
