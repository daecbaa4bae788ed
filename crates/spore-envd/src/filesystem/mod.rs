//! The `filesystem.Filesystem` service: Stat, MakeDir, Move, ListDir, Remove
//! ([`entry`] builds the answers), and the directory watchers ([`watch`]).
//! Like E2B's envd, the calls act with envd's own rights; what envd creates
//! for another user (when it runs as root) is handed to that user.

pub mod atomic;
pub mod entry;
pub mod watch;

use std::io;
use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};

use hyper::body::Incoming;
use hyper::{Request, Response};

use crate::connect::{self, Body, Code, RpcError, RpcResult};
use crate::proto::filesystem::{
    ListDirRequest, ListDirResponse, MakeDirRequest, MakeDirResponse, MoveRequest, MoveResponse,
    RemoveRequest, RemoveResponse, StatRequest, StatResponse,
};
use crate::state::{Ctx, User};

/// Serves `/filesystem.Filesystem/<method>`; `None` for a method it does not have.
pub async fn route(ctx: Ctx, method: &str, req: Request<Incoming>) -> Option<Response<Body>> {
    let response = match method {
        "Stat" => connect::unary(req, |m: StatRequest| stat(&ctx, m)).await,
        "MakeDir" => connect::unary(req, |m: MakeDirRequest| make_dir(&ctx, m)).await,
        "Move" => connect::unary(req, |m: MoveRequest| rename(&ctx, m)).await,
        "ListDir" => connect::unary(req, |m: ListDirRequest| list_dir(&ctx, m)).await,
        "Remove" => connect::unary(req, |m: RemoveRequest| remove(&ctx, m)).await,
        "WatchDir" => watch::watch_dir(ctx, req).await,
        "CreateWatcher" => connect::unary(req, |m| watch::create_watcher(&ctx, m)).await,
        "GetWatcherEvents" => connect::unary(req, |m| watch::get_watcher_events(&ctx, m)).await,
        "RemoveWatcher" => connect::unary(req, |m| watch::remove_watcher(&ctx, m)).await,
        _ => return None,
    };
    Some(response)
}

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

async fn stat(ctx: &Ctx, req: StatRequest) -> RpcResult<StatResponse> {
    let path = resolve(ctx, &req.path)?;
    let entry = blocking(move || entry::stat(&path)).await?;
    Ok(StatResponse { entry: Some(entry) })
}

async fn make_dir(ctx: &Ctx, req: MakeDirRequest) -> RpcResult<MakeDirResponse> {
    let path = resolve(ctx, &req.path)?;
    let owner = new_owner(&ctx.user);
    let entry = blocking(move || {
        match std::fs::metadata(&path) {
            Ok(m) if m.is_dir() => {
                return Err(RpcError::new(
                    Code::AlreadyExists,
                    format!("directory already exists: {}", path.display()),
                ))
            }
            Ok(_) => {
                return Err(RpcError::invalid_argument(format!(
                    "path already exists but it is not a directory: {}",
                    path.display()
                )))
            }
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                return Err(fs_error(
                    &format!("error getting file info: {}", path.display()),
                    &e,
                ))
            }
            Err(_) => {}
        }
        ensure_dirs(&path, owner).map_err(EnsureDirsError::into_rpc)?;
        entry::stat(&path)
    })
    .await?;
    Ok(MakeDirResponse { entry: Some(entry) })
}

async fn rename(ctx: &Ctx, req: MoveRequest) -> RpcResult<MoveResponse> {
    let source = resolve(ctx, &req.source)?;
    let destination = resolve(ctx, &req.destination)?;
    let owner = new_owner(&ctx.user);
    let entry = blocking(move || {
        if let Some(parent) = destination.parent() {
            ensure_dirs(parent, owner).map_err(EnsureDirsError::into_rpc)?;
        }
        std::fs::rename(&source, &destination).map_err(|e| {
            let what = format!("rename {} {}", source.display(), destination.display());
            match e.kind() {
                io::ErrorKind::NotFound => {
                    RpcError::not_found(format!("source file not found: {what}: {}", io_text(&e)))
                }
                _ => fs_error(&format!("error renaming: {what}"), &e),
            }
        })?;
        entry::stat(&destination)
    })
    .await?;
    Ok(MoveResponse { entry: Some(entry) })
}

async fn list_dir(ctx: &Ctx, req: ListDirRequest) -> RpcResult<ListDirResponse> {
    let path = resolve(ctx, &req.path)?;
    let entries = blocking(move || entry::list_dir(&path, req.depth)).await?;
    Ok(ListDirResponse { entries })
}

/// Removes a file, a symlink or a directory tree; a missing path is not an
/// error (as Go's `os.RemoveAll`).
async fn remove(ctx: &Ctx, req: RemoveRequest) -> RpcResult<RemoveResponse> {
    let path = resolve(ctx, &req.path)?;
    if path == Path::new("/") {
        return Err(RpcError::invalid_argument("refusing to remove /"));
    }
    blocking(move || {
        let result = match std::fs::symlink_metadata(&path) {
            Ok(m) if m.is_dir() => std::fs::remove_dir_all(&path),
            Ok(_) => std::fs::remove_file(&path),
            Err(e) => Err(e),
        };
        match result {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(fs_error(
                &format!("error removing file or directory {}", path.display()),
                &e,
            )),
            _ => Ok(()),
        }
    })
    .await?;
    Ok(RemoveResponse {})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_text_reads_like_go() {
        let e = io::Error::from_raw_os_error(libc::ENOENT);
        assert_eq!(io_text(&e), "no such file or directory");
        assert_eq!(
            fs_error("open /x", &e).message,
            "open /x: no such file or directory"
        );
        assert_eq!(
            fs_error("w", &io::Error::from_raw_os_error(libc::ENOSPC)).code,
            Code::ResourceExhausted
        );
        assert_eq!(
            fs_error("w", &io::Error::from_raw_os_error(libc::EACCES)).code,
            Code::PermissionDenied
        );
    }

    #[test]
    fn ensure_dirs_makes_parents_and_refuses_files() {
        let dir = tempfile::tempdir().unwrap();
        let deep = dir.path().join("a/b/c");
        ensure_dirs(&deep, None).unwrap();
        assert!(deep.is_dir());
        ensure_dirs(&deep, None).unwrap();
        std::fs::write(dir.path().join("f"), b"").unwrap();
        match ensure_dirs(&dir.path().join("f/g"), None) {
            Err(EnsureDirsError::NotADirectory(p)) => assert_eq!(p, dir.path().join("f")),
            other => panic!("{other:?}"),
        }
    }
}
