//! The process plumbing clone processes and the clone factory both start
//! with: which executable they run (`crate::own_exe`), fds they inherit,
//! waiting on a pidfd or socket.

use std::os::fd::{AsRawFd, RawFd};
use std::path::PathBuf;

use super::CloneError;

/// The program clones run and the name they run under
/// ([`crate::own_exe::path_and_name`]).
pub fn clone_exe() -> Result<(PathBuf, PathBuf), CloneError> {
    crate::own_exe::path_and_name().map_err(|source| CloneError::Io {
        what: "find the spore executable",
        source,
    })
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
