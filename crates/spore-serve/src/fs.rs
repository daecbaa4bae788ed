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

/// Copies `from` to `to` keeping its holes: only the data extents
/// (`SEEK_DATA`/`SEEK_HOLE`) are read and written, so a 2 GiB image with
/// 200 MiB in it costs 200 MiB. Where the file system cannot say, all of
/// it is copied.
pub fn copy_sparse(from: &Path, to: &Path) -> std::io::Result<()> {
    use std::io::{Read as _, Seek as _, SeekFrom, Write as _};
    use std::os::unix::io::AsRawFd as _;
    let mut src = std::fs::File::open(from)?;
    let len = src.metadata()?.len();
    let mut dst = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(to)?;
    dst.set_len(len)?;
    let seek = |fd: i32, offset: u64, whence: i32| -> Option<u64> {
        let offset = libc::off_t::try_from(offset).ok()?;
        // SAFETY: lseek on an open descriptor has no memory effects.
        let at = unsafe { libc::lseek(fd, offset, whence) };
        u64::try_from(at).ok()
    };
    let fd = src.as_raw_fd();
    let mut buf = vec![0u8; 1 << 20];
    let mut pos = 0u64;
    while pos < len {
        // No data after `pos` (ENXIO): the rest is a hole. A file system
        // without SEEK_DATA (EINVAL) has its data everywhere.
        let start = match seek(fd, pos, libc::SEEK_DATA) {
            Some(at) => at,
            None if std::io::Error::last_os_error().raw_os_error() == Some(libc::ENXIO) => break,
            None => pos,
        };
        let end = seek(fd, start, libc::SEEK_HOLE).unwrap_or(len).min(len);
        src.seek(SeekFrom::Start(start))?;
        dst.seek(SeekFrom::Start(start))?;
        let mut left = end - start;
        while left > 0 {
            let n = usize::try_from(left.min(buf.len() as u64)).unwrap_or(buf.len());
            src.read_exact(&mut buf[..n])?;
            dst.write_all(&buf[..n])?;
            left -= n as u64;
        }
        pos = end.max(start + 1);
    }
    dst.sync_all()
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

    #[test]
    fn a_sparse_copy_keeps_the_data_and_the_holes() {
        use std::os::unix::fs::FileExt as _;
        let dir = std::env::temp_dir().join(format!("spore-sparse-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b) = (dir.join("a"), dir.join("b"));
        let f = std::fs::File::create(&a).unwrap();
        f.set_len(64 << 20).unwrap();
        f.write_all_at(b"start", 0).unwrap();
        f.write_all_at(&[7u8; 5000], 20 << 20).unwrap();
        f.write_all_at(b"end", (64 << 20) - 3).unwrap();
        copy_sparse(&a, &b).unwrap();
        assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
        use std::os::unix::fs::MetadataExt as _;
        let blocks = std::fs::metadata(&b).unwrap().blocks() * 512;
        assert!(blocks < 8 << 20, "the copy holds {blocks} bytes");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
