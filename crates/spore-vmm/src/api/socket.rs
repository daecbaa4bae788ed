//! The API's Unix socket file: created private, removed when done.
//!
//! The socket controls the whole microVM, so it must never be reachable by
//! another user, not even for an instant: it is bound, restricted to its owner
//! (0600), and only then listened on, so no connection can be queued while the
//! file still has umask permissions. All that happens under a temporary name
//! in the same directory, renamed into place last: a client that waits for
//! the path to appear (as scripts do) never finds a socket that is not yet
//! listening. It must also never delete what is not
//! its own: a path that exists and is not a socket is refused, a live socket
//! (some other VMM answers on it) is refused, and on drop the file is removed
//! only if it is still the one this process created.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::{fs, io};

use super::ApiServerError;

/// Connections the kernel queues before the server accepts them.
const BACKLOG: libc::c_int = 128;

/// A socket file this process bound; dropping it removes the file.
#[derive(Debug)]
pub(super) struct SocketFile {
    path: PathBuf,
    /// (device, inode) of the file as bound, to recognise it at removal.
    identity: (u64, u64),
}

impl SocketFile {
    pub(super) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        let ours = fs::symlink_metadata(&self.path)
            .map(|m| (m.dev(), m.ino()) == self.identity)
            .unwrap_or(false);
        if ours {
            if let Err(e) = fs::remove_file(&self.path) {
                tracing::warn!("cannot remove the API socket {}: {e}", self.path.display());
            }
        }
    }
}

/// Binds a listening socket at `path`, readable and writable by the owner
/// only, after clearing a stale socket file left by a dead VMM.
pub(super) fn bind_private(path: &Path) -> Result<(UnixListener, SocketFile), ApiServerError> {
    let owned = || path.to_path_buf();
    clear_stale(path)?;
    sockaddr(path)?; // the final path must fit a socket address too
    let tmp = temp_path(path);
    let _ = fs::remove_file(&tmp);
    let addr = sockaddr(&tmp)?;

    // SAFETY: plain syscall; the result is checked before use.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(ApiServerError::Bind {
            path: owned(),
            source: io::Error::last_os_error(),
        });
    }
    // SAFETY: `fd` is a fresh descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: `addr` is a fully initialised sockaddr_un and the length given
    // is its size.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_un).cast(),
            SOCKADDR_UN_LEN,
        )
    };
    if rc != 0 {
        return Err(ApiServerError::Bind {
            path: owned(),
            source: io::Error::last_os_error(),
        });
    }
    // From here on the file exists and is ours: record it so that any
    // failure below removes it again.
    let meta = fs::symlink_metadata(&tmp).map_err(|source| ApiServerError::Bind {
        path: owned(),
        source,
    })?;
    let mut file = SocketFile {
        path: tmp.clone(),
        identity: (meta.dev(), meta.ino()),
    };
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o600)).map_err(|source| {
        ApiServerError::Permissions {
            path: owned(),
            source,
        }
    })?;
    // SAFETY: plain syscall on a descriptor we own.
    if unsafe { libc::listen(fd.as_raw_fd(), BACKLOG) } != 0 {
        return Err(ApiServerError::Bind {
            path: owned(),
            source: io::Error::last_os_error(),
        });
    }
    // The socket stays bound to its inode across the rename.
    fs::rename(&tmp, path).map_err(|source| ApiServerError::Bind {
        path: owned(),
        source,
    })?;
    file.path = owned();
    Ok((UnixListener::from(fd), file))
}

/// A short, process-unique name beside `path` to bind under before the rename.
fn temp_path(path: &Path) -> PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    dir.unwrap_or(Path::new("."))
        .join(format!(".spore-api-{}-{n}.sock", std::process::id()))
}

/// Removes a socket file no process answers on; refuses anything else.
fn clear_stale(path: &Path) -> Result<(), ApiServerError> {
    let meta = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(ApiServerError::Inspect {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    if !meta.file_type().is_socket() {
        return Err(ApiServerError::NotASocket {
            path: path.to_path_buf(),
        });
    }
    if UnixStream::connect(path).is_ok() {
        return Err(ApiServerError::InUse {
            path: path.to_path_buf(),
        });
    }
    tracing::debug!("removing stale API socket {}", path.display());
    fs::remove_file(path).map_err(|source| ApiServerError::RemoveStale {
        path: path.to_path_buf(),
        source,
    })
}

#[allow(clippy::cast_possible_truncation, reason = "sockaddr_un is 110 bytes")]
const SOCKADDR_UN_LEN: libc::socklen_t =
    std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
#[allow(clippy::cast_possible_truncation, reason = "AF_UNIX is 1")]
const AF_UNIX_FAMILY: libc::sa_family_t = libc::AF_UNIX as libc::sa_family_t;

fn sockaddr(path: &Path) -> Result<libc::sockaddr_un, ApiServerError> {
    // SAFETY: sockaddr_un is plain old data; all zeroes is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = AF_UNIX_FAMILY;
    let bytes = path.as_os_str().as_bytes();
    // One byte stays zero: the kernel reads sun_path as a C string.
    let max = addr.sun_path.len() - 1;
    if bytes.is_empty() || bytes.contains(&0) || bytes.len() > max {
        return Err(ApiServerError::BadPath {
            path: path.to_path_buf(),
            max,
        });
    }
    for (dst, &src) in addr.sun_path.iter_mut().zip(bytes) {
        *dst = src as libc::c_char;
    }
    Ok(addr)
}
