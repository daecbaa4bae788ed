//! A root of the VMM's own (`spore vmm --chroot DIR --bind … --bind-ro …`):
//! a private mount namespace whose `/` is an empty, read-only tmpfs showing
//! only the host paths it was given, each at its own path (so the paths
//! `spore serve` sends over the API need no translation), and a `/proc`
//! that hides other users' processes. Entered as root, before the drop to
//! the VMM's user: chroot cannot be left without `CAP_SYS_CHROOT`, which the
//! drop takes away; the filter has no `mount`, `unshare`, `pivot_root` or
//! `chroot`.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

use super::check;

/// A host path the root shows at the same path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bind {
    pub path: PathBuf,
    pub writable: bool,
}

/// Moves this process into a root of its own at `dir` (an empty directory
/// of the host, which stays empty there) showing `binds`. Call while the
/// process has one thread (mount namespaces are per process only then).
pub fn enter(dir: &Path, binds: &[Bind]) -> io::Result<()> {
    // SAFETY: unshare with a flag; affects this (single-threaded) process.
    check(unsafe { libc::unshare(libc::CLONE_NEWNS) }, "unshare")?;
    // Nothing mounted from here on reaches the host's namespace.
    mount(
        None,
        Path::new("/"),
        None,
        libc::MS_REC | libc::MS_PRIVATE,
        None,
    )?;
    mount(
        Some(OsStr::new("tmpfs")),
        dir,
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        Some("mode=0755,size=256k"),
    )?;
    let mut binds = binds.to_vec();
    // A parent before what it holds.
    binds.sort_by(|a, b| a.path.cmp(&b.path));
    for bind in &binds {
        bind_into(dir, bind)?;
    }
    let proc_dir = dir.join("proc");
    std::fs::create_dir_all(&proc_dir)?;
    // Its own processes' files (pagemap for diff snapshots, its fds), not
    // other users'.
    mount(
        Some(OsStr::new("proc")),
        &proc_dir,
        Some("proc"),
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        Some("hidepid=2"),
    )?;
    // The tmpfs itself read-only: nothing to write outside the binds.
    mount(
        None,
        dir,
        None,
        libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        None,
    )?;
    let c = cstr(dir)?;
    // SAFETY: chroot on a NUL-terminated path.
    check(unsafe { libc::chroot(c.as_ptr()) }, "chroot")?;
    // SAFETY: chdir on a NUL-terminated path.
    check(unsafe { libc::chdir(c"/".as_ptr()) }, "chdir /")
}

/// `bind.path` of the host at the same path under `dir`, read-only unless
/// writable.
fn bind_into(dir: &Path, bind: &Bind) -> io::Result<()> {
    let relative = bind.path.strip_prefix("/").map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: not an absolute path", bind.path.display()),
        )
    })?;
    let target = dir.join(relative);
    let meta = std::fs::metadata(&bind.path)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", bind.path.display())))?;
    if meta.is_dir() {
        std::fs::create_dir_all(&target)?;
    } else {
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::File::create(&target)?;
    }
    // Not recursive: what is mounted under a path stays out (the root's
    // own mount point is under the run directory it shows).
    mount(
        Some(bind.path.as_os_str()),
        &target,
        None,
        libc::MS_BIND,
        None,
    )?;
    let mut flags = libc::MS_REMOUNT | libc::MS_BIND | libc::MS_NOSUID | libc::MS_NODEV;
    if !bind.writable {
        flags |= libc::MS_RDONLY;
    }
    mount(None, &target, None, flags, None)
}

fn mount(
    source: Option<&OsStr>,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> io::Result<()> {
    let opt = |s: Option<&[u8]>| s.map(CString::new).transpose().map_err(io::Error::other);
    let source = opt(source.map(OsStr::as_bytes))?;
    let (fstype, data) = (
        opt(fstype.map(str::as_bytes))?,
        opt(data.map(str::as_bytes))?,
    );
    let target_c = cstr(target)?;
    let ptr = |c: &Option<CString>| c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
    // SAFETY: NUL-terminated strings (or null) that outlive the call.
    let r = unsafe {
        libc::mount(
            ptr(&source),
            target_c.as_ptr(),
            ptr(&fstype),
            flags,
            ptr(&data).cast(),
        )
    };
    if r < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("mounting {}: {e}", target.display()),
        ));
    }
    Ok(())
}

fn cstr(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(io::Error::other)
}
