//! Host files the VMM opens or writes on a user's behalf (snapshot, memory,
//! working-set, kernel, initrd and drive files; clone logs), with the rules
//! that keep a path from holding or damaging the VMM:
//!
//! - opening never blocks: files are opened with `O_NONBLOCK` (a FIFO would
//!   otherwise wait for a writer forever), checked with `fstat`, and only a
//!   regular file (or, for a drive, a block device) is kept, its `O_NONBLOCK`
//!   cleared;
//! - a file spore writes replaces at most a regular file: an existing
//!   device node, FIFO, socket or directory (or a symlink to one) is refused;
//! - paths in snapshot requests may not contain `..`;
//! - files spore creates are private (0600);
//! - temporary files carry the creating pid (`.NAME.spore-tmp-PID`), so the
//!   ones a killed VMM left can be recognised and removed
//!   ([`remove_stale_temps`]).
//!
//! The lowest layer, like `host`: it imports nothing else of the crate.

use std::ffi::OsStr;
use std::fs::{File, FileType, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};

/// Mode of every file spore creates.
pub const PRIVATE_MODE: u32 = 0o600;
/// What sets a spore temporary file's name apart: `.NAME` + this + pid.
pub const TEMP_MARK: &str = ".spore-tmp-";

/// What a path must name to be opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// A regular file.
    Regular,
    /// A regular file or a block device (a drive).
    RegularOrBlock,
}

/// "a FIFO", "a directory"...: what a file type is, for messages.
pub fn kind_of(t: &FileType) -> &'static str {
    if t.is_file() {
        "a regular file"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_symlink() {
        "a symbolic link"
    } else {
        "not a regular file"
    }
}

fn refused(kind: &str, expect: Expect) -> io::Error {
    let wanted = match expect {
        Expect::Regular => "a regular file",
        Expect::RegularOrBlock => "a regular file or a block device",
    };
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("it is {kind}, not {wanted}"),
    )
}

/// Opens `path` (for writing too with `write`) without ever blocking, and
/// keeps it only if it is what `expect` says. The error names what the
/// path is; callers add the path.
pub fn open_checked(path: &Path, write: bool, expect: Expect) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    let t = file.metadata()?.file_type();
    let ok = t.is_file() || (expect == Expect::RegularOrBlock && t.is_block_device());
    if !ok {
        return Err(refused(kind_of(&t), expect));
    }
    clear_nonblock(&file)?;
    Ok(file)
}

/// A regular file opened read-only (see [`open_checked`]).
pub fn open_regular(path: &Path) -> io::Result<File> {
    open_checked(path, false, Expect::Regular)
}

fn clear_nonblock(file: &File) -> io::Result<()> {
    let fd = file.as_raw_fd();
    // SAFETY: F_GETFL on a descriptor this function borrows; no memory is passed.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: F_SETFL with an integer argument on the same open descriptor.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Refuses a path with a `..` component (a user who means a parent
/// directory gives an absolute path).
pub fn refuse_dotdot(path: &Path) -> Result<(), String> {
    if path.components().any(|c| c == Component::ParentDir) {
        return Err(format!(
            "{}: a path with a `..` component is refused; give the path without `..` (an absolute path for a parent directory)",
            path.display()
        ));
    }
    Ok(())
}

/// Checks that spore may put a file at `path`: nothing is there yet, or a
/// regular file (symlinks followed). Anything else is refused, naming it.
pub fn check_target(path: &Path) -> io::Result<()> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => Ok(()),
        Ok(m) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "it is {}; only a new file or an existing regular file may be written",
                kind_of(&m.file_type())
            ),
        )),
        // A dangling symlink is replaced by the rename, not followed.
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Creates (or truncates) a private file: a log spore writes.
pub fn create_private(path: &Path) -> io::Result<File> {
    check_target(path)?;
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(PRIVATE_MODE)
        .open(path)
}

/// Opens a log or metrics target as Firecracker does: a FIFO (opened
/// read-write so that the open does not wait for a reader), a regular
/// file (created 0600, appended to) or a character device (`/dev/stderr`),
/// never blocking on a write (a full FIFO refuses the write instead).
/// Anything else is refused, naming it.
pub fn open_log_target(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .mode(PRIVATE_MODE)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(path)?;
    let t = file.metadata()?.file_type();
    if !(t.is_file() || t.is_fifo() || t.is_char_device()) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("it is {}, not a regular file or a FIFO", kind_of(&t)),
        ));
    }
    Ok(file)
}

/// Creates a new private file; `path` must not exist (a symlink is not followed).
pub fn create_new_private(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(PRIVATE_MODE)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

/// The directory a file path lies in (`.` for a bare name).
pub fn dir_of(path: &Path) -> &Path {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// This process's temporary name for `dest`: `.NAME.spore-tmp-PID` beside it.
pub fn temp_path(dest: &Path) -> io::Result<PathBuf> {
    let name = dest
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not a file path"))?;
    let mut tmp = std::ffi::OsString::from(".");
    tmp.push(name);
    tmp.push(format!("{TEMP_MARK}{}", std::process::id()));
    Ok(dest.with_file_name(tmp))
}

/// The pid in a spore temporary file's name, if `name` is exactly one:
/// `.`, a non-empty name, [`TEMP_MARK`], decimal digits.
pub fn temp_pid(name: &OsStr) -> Option<u32> {
    let name = std::str::from_utf8(name.as_bytes()).ok()?;
    let rest = name.strip_prefix('.')?;
    let (base, pid) = rest.rsplit_once(TEMP_MARK)?;
    if base.is_empty() || pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if pid.starts_with('0') {
        return None;
    }
    pid.parse().ok()
}

fn alive(pid: u32) -> bool {
    // Without /proc (in a jail) no process can be seen: every one counts
    // as alive, so no temp file of a running process is ever removed.
    !Path::new("/proc/self").exists() || Path::new("/proc").join(pid.to_string()).exists()
}

/// Removes the spore temporary files in `dir` whose creating process is
/// gone (a VMM killed mid-write). Only regular files whose name matches
/// [`temp_pid`] exactly are touched. Returns how many were removed.
pub fn remove_stale_temps(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let me = std::process::id();
    let mut removed = 0;
    for entry in entries.flatten() {
        let Some(pid) = temp_pid(&entry.file_name()) else {
            continue;
        };
        if pid == me || alive(pid) {
            continue;
        }
        // file_type does not follow symlinks: a link is left alone.
        if !entry.file_type().is_ok_and(|t| t.is_file()) {
            continue;
        }
        let path = entry.path();
        match std::fs::remove_file(&path) {
            Ok(()) => {
                tracing::info!("removed {} (left by process {pid})", path.display());
                removed += 1;
            }
            Err(e) => tracing::warn!("cannot remove {}: {e}", path.display()),
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("spore-files-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn mkfifo(p: &Path) {
        let c = std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    }

    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let d = scratch("fifo");
        let f = d.join("fifo");
        mkfifo(&f);
        let e = open_regular(&f).unwrap_err();
        assert!(e.to_string().contains("a FIFO"), "{e}");
        let e = open_checked(&f, true, Expect::RegularOrBlock).unwrap_err();
        assert!(e.to_string().contains("a FIFO"), "{e}");
        let e = open_regular(Path::new("/dev/zero")).unwrap_err();
        assert!(e.to_string().contains("character device"), "{e}");
        let e = open_regular(&d).unwrap_err();
        assert!(e.to_string().contains("directory"), "{e}");
        let reg = d.join("reg");
        std::fs::write(&reg, b"x").unwrap();
        let file = open_regular(&reg).unwrap();
        // SAFETY: F_GETFL on an open descriptor.
        let flags = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
        assert_eq!(flags & libc::O_NONBLOCK, 0);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn targets_may_be_new_or_regular_only() {
        let d = scratch("target");
        assert!(check_target(&d.join("new")).is_ok());
        std::fs::write(d.join("reg"), b"x").unwrap();
        assert!(check_target(&d.join("reg")).is_ok());
        assert!(check_target(Path::new("/dev/null"))
            .unwrap_err()
            .to_string()
            .contains("character device"));
        mkfifo(&d.join("fifo"));
        assert!(check_target(&d.join("fifo")).is_err());
        assert!(check_target(&d).is_err());
        std::os::unix::fs::symlink("/dev/null", d.join("link")).unwrap();
        assert!(check_target(&d.join("link")).is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn dotdot_is_refused() {
        assert!(refuse_dotdot(Path::new("/a/../b")).is_err());
        assert!(refuse_dotdot(Path::new("../b")).is_err());
        assert!(refuse_dotdot(Path::new("/a/b..c/d")).is_ok());
        assert!(refuse_dotdot(Path::new("a/./b")).is_ok());
    }

    #[test]
    fn temp_names_match_exactly() {
        let t = temp_path(Path::new("/x/vm.mem")).unwrap();
        let name = t.file_name().unwrap();
        assert_eq!(temp_pid(name), Some(std::process::id()));
        for bad in [
            "vm.mem.spore-tmp-12",
            "..spore-tmp-12",
            ".vm.spore-tmp-",
            ".vm.spore-tmp-12x",
            ".vm.spore-tmp-012",
            ".vm.tmp-12",
            ".vm.spore-tmp-99999999999999",
        ] {
            assert_eq!(temp_pid(OsStr::new(bad)), None, "{bad}");
        }
    }

    #[test]
    fn stale_temps_of_dead_processes_only_are_removed() {
        let d = scratch("stale");
        // A pid that is not alive: past the kernel's pid_max.
        let dead = d.join(".vm.mem.spore-tmp-4194305");
        let mine = temp_path(&d.join("vm.state")).unwrap();
        let other = d.join(".vm.mem.tmp-4194305");
        let dir = d.join(".sub.spore-tmp-4194305");
        for f in [&dead, &mine, &other] {
            std::fs::write(f, b"x").unwrap();
        }
        std::fs::create_dir(&dir).unwrap();
        assert_eq!(remove_stale_temps(&d), 1);
        assert!(!dead.exists());
        assert!(mine.exists() && other.exists() && dir.exists());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn created_files_are_private() {
        let d = scratch("mode");
        let p = d.join("log");
        create_private(&p).unwrap();
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, PRIVATE_MODE);
        assert!(create_private(Path::new("/dev/null")).is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
