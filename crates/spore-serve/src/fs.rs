//! The daemon's files on disk: private directories, atomic private writes,
//! directory syncs and disk usage. The state directory holds users' code and
//! VMM sockets, so everything the daemon makes in it is owner-only; a file a
//! restarted daemon reads back (a record, a zip) is written atomically, so it
//! is either the old one or the whole new one.

use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// `err` with what was being done to which path in its message.
fn at(err: std::io::Error, doing: &str, path: &Path) -> std::io::Error {
    std::io::Error::new(err.kind(), format!("{doing} {}: {err}", path.display()))
}

/// Creates `dir` and its missing parents, mode 0700.
pub fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| at(e, "creating", dir))
}

/// Writes `bytes` to `path` atomically, mode 0600: a temporary file beside
/// it (a name of its own per call, so concurrent writers of one path never
/// share it), fsynced, renamed over `path`, the directory synced.
pub fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other(format!("{} names no file", path.display())))?
        .to_string_lossy();
    let tmp = path.with_file_name(format!(
        ".{name}.tmp-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| at(e, "creating", &tmp))?;
        f.write_all(bytes).map_err(|e| at(e, "writing", &tmp))?;
        f.sync_all().map_err(|e| at(e, "syncing", &tmp))?;
        drop(f);
        std::fs::rename(&tmp, path).map_err(|e| at(e, "renaming into place", path))
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written?;
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => sync_dir(dir),
        _ => sync_dir(Path::new(".")),
    }
}

/// Makes the renames and new entries in `dir` durable.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| at(e, "syncing", dir))
}

/// The state directory's lock file, `serve.lock`.
pub const STATE_LOCK: &str = "serve.lock";

/// Takes an exclusive `flock` on `path` (created if missing), trying for
/// up to `wait`; `None` if another process still holds it then. The lock
/// lasts as long as the returned file is open.
pub fn lock_for(path: &Path, wait: std::time::Duration) -> std::io::Result<Option<std::fs::File>> {
    use std::os::fd::AsRawFd as _;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| at(e, "opening", path))?;
    let until = std::time::Instant::now() + wait;
    loop {
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(Some(file));
        }
        if std::time::Instant::now() >= until {
            return Ok(None);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Bytes a file takes on disk (its allocated blocks; memory files are
/// sparse), 0 if it cannot be read.
pub fn disk_bytes(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.blocks() * 512)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn private_writes_replace_whole_files_and_leave_no_temporary() {
        let dir = std::env::temp_dir().join(format!("spore-fs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        create_private_dir(&dir.join("a/b")).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir.join("a/b")), 0o700);
        let file = dir.join("a/b/record.json");
        write_private(&file, b"one").unwrap();
        write_private(&file, b"two, longer").unwrap();
        assert_eq!(std::fs::read(&file).unwrap(), b"two, longer");
        assert_eq!(mode(&file), 0o600);
        let names: Vec<_> = std::fs::read_dir(dir.join("a/b"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["record.json"]);
        assert!(write_private(&dir.join("missing/x"), b"").is_err());
        assert!(disk_bytes(&file) > 0);
        assert_eq!(disk_bytes(&dir.join("missing")), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
