//! Runtime base snapshots (SnapFaaS layering) for the Linux runtimes.
//!
//! A base is one VM of a runtime, booted with a placeholder code drive (an
//! empty ext4 image) and dirty-page tracking, paused when its agent says
//! `Standby` (the runtime initialised, no function attached) and written as
//! a Full snapshot into `<state>/bases/<runtime>-<mib>/`. Every function of
//! that runtime and memory size starts from it: its first instance restores
//! the base, gets its own code disk by `PATCH /drives/code` before it
//! resumes, is configured, and is written as a Diff on top of the base (see
//! [`crate::snapshots`]). So the runtime's pages are on disk once per host,
//! and each function's snapshot holds only its own pages.
//!
//! A base directory is written under a `.tmp-` name (its state, memory and
//! `base.json` record inside) and renamed into place, so a directory without
//! a `.tmp-` prefix is complete; [`BaseStore::recover`] removes half-written
//! ones. The record names the kernel and root image it was booted from: a
//! base of an older image or kernel is rebuilt (the function diffs on top of
//! the old one then fail their chain check at restore and are remade).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

use crate::fs::{create_private_dir, sync_dir, write_private};

/// The record file inside a base directory.
const RECORD: &str = "base.json";
/// The placeholder code disk every base boots with.
pub const PLACEHOLDER: &str = "placeholder.ext4";

/// What a base directory's `base.json` says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BaseRecord {
    /// The snapshot id of the base (its manifest's `layer.id`): the parent
    /// id every function diff on top of it names.
    pub id: String,
    /// The runtime, prefixed by its account's id for any account but the
    /// default (accounts never share a base).
    pub runtime: String,
    pub memory_mib: u32,
    /// The guest kernel and root image the base was booted from.
    pub kernel: String,
    pub root_image: String,
    /// The devices the base VM had besides disks and vsock
    /// ([`crate::runtime::LINUX_DEVICES`]; empty in bases made before it).
    #[serde(default)]
    pub devices: String,
    /// Bytes of the memory file on disk (it is sparse).
    pub mem_disk_bytes: u64,
    pub created_unix_ms: u64,
}

/// A complete base on disk.
#[derive(Clone, Debug)]
pub struct Base {
    pub dir: PathBuf,
    pub record: BaseRecord,
}

impl Base {
    pub fn state_path(&self) -> PathBuf {
        self.dir.join("vm.state")
    }

    pub fn mem_path(&self) -> PathBuf {
        self.dir.join("vm.mem")
    }

    /// `<runtime>-<mib>`, as in metrics and logs.
    pub fn name(&self) -> String {
        base_name(&self.record.runtime, self.record.memory_mib)
    }
}

/// `<runtime>-<mib>`: runtime names are the daemon's own (`python3`,
/// `provided`), never a user's, so this is a safe file name.
pub fn base_name(runtime: &str, memory_mib: u32) -> String {
    format!("{runtime}-{memory_mib}")
}

pub struct BaseStore {
    root: PathBuf,
    /// One build at a time per base; other starts of the same runtime and
    /// memory size wait for it and reuse it.
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    next_tmp: AtomicU64,
    /// When the last build of a base failed: starts do not try it again
    /// before [`BASE_RETRY_AFTER`] (each try costs a boot up to the ready
    /// timeout before the start falls back to booting the function).
    failed: Mutex<HashMap<String, std::time::Instant>>,
}

/// How long after a failed build a base is not tried again.
pub const BASE_RETRY_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

impl BaseStore {
    pub fn new(state_dir: &Path) -> Self {
        BaseStore {
            root: state_dir.join("bases"),
            locks: Mutex::new(HashMap::new()),
            next_tmp: AtomicU64::new(0),
            failed: Mutex::new(HashMap::new()),
        }
    }

    /// Records the outcome of a build of `runtime`'s base at `memory_mib`.
    pub fn build_done(&self, runtime: &str, memory_mib: u32, ok: bool) {
        let mut failed = self.failed.lock().unwrap_or_else(|e| e.into_inner());
        let name = base_name(runtime, memory_mib);
        if ok {
            failed.remove(&name);
        } else {
            failed.insert(name, std::time::Instant::now());
        }
    }

    /// How long ago a build of this base failed, if within [`BASE_RETRY_AFTER`].
    pub fn failed_recently(&self, runtime: &str, memory_mib: u32) -> Option<std::time::Duration> {
        let failed = self.failed.lock().unwrap_or_else(|e| e.into_inner());
        failed
            .get(&base_name(runtime, memory_mib))
            .map(|t| t.elapsed())
            .filter(|&ago| ago < BASE_RETRY_AFTER)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn dir_of(&self, runtime: &str, memory_mib: u32) -> PathBuf {
        self.root.join(base_name(runtime, memory_mib))
    }

    /// The lock serialising builds of one base.
    pub fn lock_for(&self, runtime: &str, memory_mib: u32) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.locks.lock().unwrap_or_else(|e| e.into_inner());
        locks
            .entry(base_name(runtime, memory_mib))
            .or_default()
            .clone()
    }

    /// The base of `runtime` at `memory_mib`, if a complete one is on disk.
    pub fn find(&self, runtime: &str, memory_mib: u32) -> Option<Base> {
        read_base(&self.dir_of(runtime, memory_mib))
            .filter(|b| b.record.runtime == runtime && b.record.memory_mib == memory_mib)
    }

    /// A fresh private temporary directory for a base being written.
    pub fn temp_dir(&self, runtime: &str, memory_mib: u32) -> anyhow::Result<PathBuf> {
        let n = self.next_tmp.fetch_add(1, Ordering::Relaxed);
        let tmp = self
            .root
            .join(format!(".tmp-{}-{n}", base_name(runtime, memory_mib)));
        create_private_dir(&self.root)?;
        let _ = std::fs::remove_dir_all(&tmp);
        create_private_dir(&tmp)?;
        Ok(tmp)
    }

    /// Writes `record` into `tmp` (which holds `vm.state` and `vm.mem`) and
    /// renames it into place, replacing an older base of the same name.
    pub fn commit(&self, tmp: &Path, record: &BaseRecord) -> anyhow::Result<Base> {
        let json = serde_json::to_vec_pretty(record)?;
        write_private(&tmp.join(RECORD), &json)?;
        let dir = self.dir_of(&record.runtime, record.memory_mib);
        // An old base is moved aside first, so that `dir` is either the old
        // complete base or the new one; VMMs that mapped its files keep them.
        let n = self.next_tmp.fetch_add(1, Ordering::Relaxed);
        let old = self.root.join(format!(
            ".tmp-old-{}-{n}",
            base_name(&record.runtime, record.memory_mib)
        ));
        if dir.exists() {
            std::fs::rename(&dir, &old)
                .with_context(|| format!("moving the old base {} aside", dir.display()))?;
        }
        std::fs::rename(tmp, &dir)
            .with_context(|| format!("renaming {} to {}", tmp.display(), dir.display()))?;
        let _ = sync_dir(&self.root);
        let _ = std::fs::remove_dir_all(&old);
        Ok(Base {
            dir,
            record: record.clone(),
        })
    }

    /// The placeholder code disk bases boot with: an empty ext4 image, made
    /// once (atomically, 0600) and kept.
    pub fn placeholder(&self) -> anyhow::Result<PathBuf> {
        let path = self.root.join(PLACEHOLDER);
        if path.is_file() {
            return Ok(path);
        }
        create_private_dir(&self.root)?;
        crate::code::disk::build(&empty_zip(), &path)
            .with_context(|| format!("making the placeholder code disk {}", path.display()))?;
        Ok(path)
    }

    /// After a restart: removes half-written bases (`.tmp-` directories and
    /// directories without a complete record). Returns how many.
    pub fn recover(&self) -> usize {
        let mut removed = 0;
        let Ok(entries) = std::fs::read_dir(&self.root) else {
            return 0;
        };
        for e in entries.flatten() {
            let path = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if name == PLACEHOLDER {
                continue;
            }
            // A placeholder being made by mkfs when the daemon died.
            let half_placeholder = name.starts_with(&format!(".{PLACEHOLDER}.tmp-"));
            if half_placeholder {
                let _ = std::fs::remove_file(&path);
                removed += 1;
                continue;
            }
            if name.starts_with(".tmp-") || read_base(&path).is_none() {
                if path.is_dir() {
                    let _ = std::fs::remove_dir_all(&path);
                } else {
                    let _ = std::fs::remove_file(&path);
                }
                removed += 1;
            }
        }
        removed
    }
}

/// A base directory's record, if the directory is complete.
pub fn read_base(dir: &Path) -> Option<Base> {
    let text = std::fs::read(dir.join(RECORD)).ok()?;
    let record: BaseRecord = serde_json::from_slice(&text).ok()?;
    let base = Base {
        dir: dir.to_path_buf(),
        record,
    };
    (base.state_path().is_file() && base.mem_path().is_file() && !base.record.id.is_empty())
        .then_some(base)
}

/// A zip with no entries (its end-of-central-directory record only).
fn empty_zip() -> Vec<u8> {
    let mut z = b"PK\x05\x06".to_vec();
    z.extend_from_slice(&[0u8; 18]);
    z
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_failed_base_is_not_tried_again_at_once() {
        let dir = std::env::temp_dir().join(format!("spore-bases-{}", std::process::id()));
        let store = super::BaseStore::new(&dir);
        assert!(store.failed_recently("python3", 256).is_none());
        store.build_done("python3", 256, false);
        assert!(store.failed_recently("python3", 256).is_some());
        assert!(store.failed_recently("python3", 512).is_none());
        store.build_done("python3", 256, true);
        assert!(store.failed_recently("python3", 256).is_none());
    }

    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("spore-bases-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn record(id: &str) -> BaseRecord {
        BaseRecord {
            id: id.into(),
            runtime: "python3".into(),
            memory_mib: 256,
            kernel: "/k".into(),
            root_image: "/r".into(),
            devices: crate::runtime::LINUX_DEVICES.into(),
            mem_disk_bytes: 4096,
            created_unix_ms: 1,
        }
    }

    fn fake_snapshot(dir: &Path) {
        std::fs::write(dir.join("vm.state"), b"s").unwrap();
        std::fs::write(dir.join("vm.mem"), b"m").unwrap();
    }

    #[test]
    fn paths_and_names() {
        let s = BaseStore::new(Path::new("/state"));
        assert_eq!(
            s.dir_of("python3", 256),
            Path::new("/state/bases/python3-256")
        );
        assert_eq!(base_name("provided", 128), "provided-128");
        // One lock per base, shared by its callers.
        assert!(Arc::ptr_eq(
            &s.lock_for("python3", 256),
            &s.lock_for("python3", 256)
        ));
        assert!(!Arc::ptr_eq(
            &s.lock_for("python3", 256),
            &s.lock_for("python3", 512)
        ));
    }

    #[test]
    fn a_committed_base_is_found_again_and_replaced_atomically() {
        use std::os::unix::fs::PermissionsExt;
        let state = scratch("commit");
        let s = BaseStore::new(&state);
        assert!(s.find("python3", 256).is_none());
        let tmp = s.temp_dir("python3", 256).unwrap();
        fake_snapshot(&tmp);
        let b = s.commit(&tmp, &record("one")).unwrap();
        assert_eq!(b.dir, state.join("bases/python3-256"));
        assert!(!tmp.exists());
        let mode = std::fs::metadata(b.dir.join(RECORD))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let mode = std::fs::metadata(&b.dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        // A restarted daemon (a new store) finds the same base.
        let again = BaseStore::new(&state).find("python3", 256).unwrap();
        assert_eq!(again.record, record("one"));
        assert!(BaseStore::new(&state).find("python3", 512).is_none());
        // A rebuilt base replaces it.
        let tmp = s.temp_dir("python3", 256).unwrap();
        fake_snapshot(&tmp);
        s.commit(&tmp, &record("two")).unwrap();
        assert_eq!(s.find("python3", 256).unwrap().record.id, "two");
        assert_eq!(s.recover(), 0, "nothing half-written is left");
        let _ = std::fs::remove_dir_all(&state);
    }

    #[test]
    fn half_written_bases_are_removed_at_recovery() {
        let state = scratch("recover");
        let s = BaseStore::new(&state);
        // A complete one stays.
        let tmp = s.temp_dir("python3", 256).unwrap();
        fake_snapshot(&tmp);
        s.commit(&tmp, &record("ok")).unwrap();
        // Killed mid-write: a temporary directory with the state only.
        let half = s.temp_dir("python3", 512).unwrap();
        std::fs::write(half.join("vm.state"), b"s").unwrap();
        // A directory in place whose record is missing or broken.
        let broken = s.dir_of("provided", 128);
        std::fs::create_dir_all(&broken).unwrap();
        fake_snapshot(&broken);
        std::fs::write(broken.join(RECORD), b"{not json").unwrap();
        let norecord = s.dir_of("provided", 256);
        std::fs::create_dir_all(&norecord).unwrap();
        fake_snapshot(&norecord);
        // A record whose memory file is gone.
        let nomem = s.dir_of("python3", 1024);
        std::fs::create_dir_all(&nomem).unwrap();
        std::fs::write(nomem.join("vm.state"), b"s").unwrap();
        std::fs::write(
            nomem.join(RECORD),
            serde_json::to_vec(&record("x")).unwrap(),
        )
        .unwrap();
        assert_eq!(s.recover(), 4);
        assert!(!half.exists() && !broken.exists() && !norecord.exists() && !nomem.exists());
        assert_eq!(s.find("python3", 256).unwrap().record.id, "ok");
        let _ = std::fs::remove_dir_all(&state);
    }

    #[test]
    fn the_placeholder_is_an_empty_ext4_image_made_once() {
        use std::os::unix::fs::PermissionsExt;
        let state = scratch("placeholder");
        let t = state.join("t");
        std::fs::create_dir_all(&t).unwrap();
        let u = crate::code::disk::unpack(&empty_zip(), &t).unwrap();
        assert_eq!((u.files, u.dirs), (0, 0));
        if crate::code::disk::mkfs_ext4().is_none() {
            eprintln!("no mkfs.ext4: the image itself is not checked");
            return;
        }
        let s = BaseStore::new(&state);
        let p = s.placeholder().unwrap();
        assert_eq!(p, state.join("bases/placeholder.ext4"));
        let meta = std::fs::metadata(&p).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        // ext4's magic at 1024 + 0x38.
        let bytes = std::fs::read(&p).unwrap();
        assert_eq!(&bytes[1024 + 0x38..1024 + 0x3a], &[0x53, 0xef]);
        // Kept: not made again, and not removed by recovery.
        let mtime = meta.modified().unwrap();
        assert_eq!(s.placeholder().unwrap(), p);
        assert_eq!(s.recover(), 0);
        assert_eq!(std::fs::metadata(&p).unwrap().modified().unwrap(), mtime);
        let _ = std::fs::remove_dir_all(&state);
    }
}
