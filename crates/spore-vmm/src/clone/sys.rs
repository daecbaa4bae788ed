//! The process plumbing clone processes and the clone factory both start
//! with: which executable they run, fds they inherit, waiting on a pidfd
//! or socket.

use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};

use super::CloneError;

/// The program clones run and the name they run under (their `argv[0]`):
/// this very executable, through `/proc/self/exe`, so that a clone runs the
/// source's own version of spore even after the file was replaced on disk
/// (an upgrade): the handoff between them is not a stable format. The name
/// stays the executable's path (what `ps` and `spore serve`'s recovery
/// look for). `SPORE_CLONE_EXE` names another program instead. Without
/// /proc (in a jail) it is `argv[0]`, the absolute path the jailer ran.
pub fn clone_exe() -> Result<(PathBuf, PathBuf), CloneError> {
    if let Some(p) = std::env::var_os("SPORE_CLONE_EXE") {
        return Ok((PathBuf::from(&p), PathBuf::from(p)));
    }
    let path = match std::env::current_exe() {
        Ok(p) => p,
        // No /proc (a jail: spore's or Firecracker's jailer mounts none):
        // the jailer ran the binary by its absolute path inside the jail.
        Err(source) => match std::env::args_os().next().map(PathBuf::from) {
            Some(p) if p.is_absolute() && p.is_file() => p,
            _ => {
                return Err(CloneError::Io {
                    what: "find the spore executable",
                    source,
                })
            }
        },
    };
    // A replaced executable reads as "PATH (deleted)": the name is PATH.
    let name = path
        .to_str()
        .and_then(|p| p.strip_suffix(" (deleted)"))
        .map_or_else(|| path.clone(), PathBuf::from);
    let program = Path::new("/proc/self/exe");
    if program.exists() {
        Ok((program.to_path_buf(), name))
    } else {
        Ok((path, name))
    }
}

/// Sets or clears `FD_CLOEXEC` on `fd`: whether a spawned process inherits it.
pub(super) fn set_inheritable(fd: &impl AsRawFd, inherit: bool) -> std::io::Result<()> {
    let flags = if inherit { 0 } else { libc::FD_CLOEXEC };
    // SAFETY: fcntl on an fd we own.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, flags) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Whether `fd` is readable (a pidfd: its process exited), waiting up to
/// `timeout_ms`.
pub(super) fn poll_readable(fd: RawFd, timeout_ms: i32) -> std::io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    match unsafe { libc::poll(&mut pfd, 1, timeout_ms) } {
        n if n < 0 => Err(std::io::Error::last_os_error()),
        n => Ok(n > 0),
    }
}
