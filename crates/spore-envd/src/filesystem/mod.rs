//! The `filesystem.Filesystem` service: Stat, MakeDir, Move, ListDir, Remove
//! ([`entry`] builds the answers), and the directory watchers ([`watch`]).
//! Like E2B's envd, the calls act with envd's own rights; what envd creates
//! for another user (when it runs as root) is handed to that user.

pub mod atomic;
pub mod entry;
pub mod paths;
pub mod watch;
pub mod watchers;

use std::io;
use std::path::Path;

use hyper::body::Incoming;
use hyper::{Request, Response};
use paths::{blocking, ensure_dirs, fs_error, io_text, new_owner, resolve, EnsureDirsError};

use crate::connect::{self, Body, Code, RpcError, RpcResult};
use crate::proto::filesystem::{
    ListDirRequest, ListDirResponse, MakeDirRequest, MakeDirResponse, MoveRequest, MoveResponse,
    RemoveRequest, RemoveResponse, StatRequest, StatResponse,
};
use crate::state::Ctx;

/// The service's methods (the arms of [`route`]).
const METHODS: &[&str] = &[
    "Stat",
    "MakeDir",
    "Move",
    "ListDir",
    "Remove",
    "WatchDir",
    "CreateWatcher",
    "GetWatcherEvents",
    "RemoveWatcher",
];

/// Whether the service has `method`.
pub fn has_method(method: &str) -> bool {
    METHODS.contains(&method)
}

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
