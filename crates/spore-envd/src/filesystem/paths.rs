//! What the filesystem service and `/files` share: a client's path made
//! absolute, blocking work off the runtime, errors as E2B's envd words them,
//! and directories made for (and handed to) a user.

use std::io;
use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};

use crate::connect::{Code, RpcError, RpcResult};
use crate::state::{Ctx, User};

/// A client's path, made absolute as E2B's envd does: empty means the default
/// working directory (else the home), `~` and relative paths start at the
/// user's home; `~user` is refused.
pub fn resolve(ctx: &Ctx, path: &str) -> RpcResult<PathBuf> {
    let path = if path.is_empty() {
        ctx.state
            .settings()
            .default_workdir
            .clone()
            .unwrap_or_default()
    } else {
        path.to_owned()
    };
    if path.starts_with('~') && path != "~" && !path.starts_with("~/") {
        return Err(RpcError::invalid_argument(format!(
            "failed to expand path '{path}' for user '{}': cannot expand user-specific home dir",
            ctx.user.name
        )));
    }
    ctx.user.resolve(&path)
}

/// Runs blocking filesystem work on the blocking pool.
pub async fn blocking<T, F>(work: F) -> RpcResult<T>
where
    F: FnOnce() -> RpcResult<T> + Send + 'static,
    T: Send + 'static,
{
    tokio::task::spawn_blocking(work)
        .await
        .unwrap_or_else(|e| Err(RpcError::internal(format!("filesystem task failed: {e}"))))
}

/// An I/O error as Go prints an errno: `no such file or directory`.
pub fn io_text(e: &io::Error) -> String {
    let text = e.to_string();
    let text = match text.find(" (os error ") {
        Some(i) => &text[..i],
        None => &text,
    };
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// A failed filesystem operation, by its errno: `not_found`,
/// `permission_denied`, `resource_exhausted` (disk full), else `internal`.
pub fn fs_error(what: &str, e: &io::Error) -> RpcError {
    let code = match e.kind() {
        io::ErrorKind::NotFound => Code::NotFound,
        io::ErrorKind::PermissionDenied | io::ErrorKind::ReadOnlyFilesystem => {
            Code::PermissionDenied
        }
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded => Code::ResourceExhausted,
        _ => Code::Internal,
    };
    RpcError::new(code, format!("{what}: {}", io_text(e)))
}

/// Who what envd creates for `user` should belong to: the user, when envd
/// runs as root and the user is someone else (otherwise envd's own files are
/// already the user's, or could not be given away).
pub fn new_owner(user: &User) -> Option<(u32, u32)> {
    // SAFETY: geteuid cannot fail.
    let euid = unsafe { libc::geteuid() };
    (euid == 0 && user.uid != 0).then_some((user.uid, user.gid))
}

/// Why [`ensure_dirs`] failed.
#[derive(Debug)]
pub enum EnsureDirsError {
    /// A component exists and is not a directory.
    NotADirectory(PathBuf),
    Io(String, io::Error),
}

impl EnsureDirsError {
    pub fn into_rpc(self) -> RpcError {
        match self {
            EnsureDirsError::NotADirectory(path) => {
                RpcError::invalid_argument(format!("path is a file: {}", path.display()))
            }
            EnsureDirsError::Io(what, e) => fs_error(&what, &e),
        }
    }
}

/// Creates `path` and its missing parents (mode 0755), each handed to
/// `owner`. A component that is not a directory fails.
pub fn ensure_dirs(path: &Path, owner: Option<(u32, u32)>) -> Result<(), EnsureDirsError> {
    let mut current = PathBuf::from("/");
    for part in path
        .components()
        .skip_while(|c| matches!(c, std::path::Component::RootDir))
    {
        current.push(part);
        match std::fs::metadata(&current) {
            Ok(m) if m.is_dir() => continue,
            Ok(_) => return Err(EnsureDirsError::NotADirectory(current)),
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                return Err(EnsureDirsError::Io(
                    format!("failed to stat directory {}", current.display()),
                    e,
                ))
            }
            Err(_) => {}
        }
        match std::fs::DirBuilder::new().mode(0o755).create(&current) {
            Ok(()) => {}
            // Made meanwhile by someone else: hand it over all the same.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                return Err(EnsureDirsError::Io(
                    format!("failed to create directory {}", current.display()),
                    e,
                ))
            }
        }
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(&current, Some(uid), Some(gid)).map_err(|e| {
                EnsureDirsError::Io(
                    format!("failed to chown directory {}", current.display()),
                    e,
                )
            })?;
        }
    }
    Ok(())
}
