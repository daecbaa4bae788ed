//! `EntryInfo`: what Stat, ListDir, MakeDir and Move say about a path, in
//! E2B's terms (Go's `os.FileMode` string, permission bits without type bits,
//! a symlink reported with its target's type). Everything here blocks: callers
//! run it on the blocking pool.

use std::collections::HashMap;
use std::ffi::CStr;
use std::fs::Metadata;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::connect::{Code, RpcError, RpcResult};
use crate::filesystem::paths::io_text;
use crate::proto::filesystem::{EntryInfo, FileType};

/// Owner and group names by id, looked up once per call (a ListDir of a big
/// tree would otherwise read the user database for every entry).
#[derive(Default)]
pub struct Names {
    users: HashMap<u32, String>,
    groups: HashMap<u32, String>,
}

impl Names {
    fn user(&mut self, uid: u32) -> String {
        self.users
            .entry(uid)
            .or_insert_with(|| user_name(uid).unwrap_or_else(|| uid.to_string()))
            .clone()
    }

    fn group(&mut self, gid: u32) -> String {
        self.groups
            .entry(gid)
            .or_insert_with(|| group_name(gid).unwrap_or_else(|| gid.to_string()))
            .clone()
    }
}

/// Runs a `get*id_r` lookup with a growing buffer; the name it found, if any.
fn lookup_name<T>(
    call: impl Fn(*mut T, &mut [libc::c_char], *mut *mut T) -> libc::c_int,
    name_of: impl Fn(&T) -> *const libc::c_char,
) -> Option<String> {
    let mut size = 1024;
    while size <= 1 << 20 {
        let mut buf = vec![0 as libc::c_char; size];
        // SAFETY: passwd and group are plain C structs; all-zero is a valid
        // value for the call to overwrite.
        let mut entry: T = unsafe { std::mem::zeroed() };
        let mut result: *mut T = std::ptr::null_mut();
        match call(&mut entry, &mut buf, &mut result) {
            0 if result.is_null() => return None,
            0 => {
                // SAFETY: on success the name points at a NUL-terminated string
                // inside `buf`, which is alive here.
                let name = unsafe { CStr::from_ptr(name_of(&entry)) };
                return Some(name.to_string_lossy().into_owned());
            }
            libc::ERANGE => size *= 4,
            _ => return None,
        }
    }
    None
}

fn user_name(uid: u32) -> Option<String> {
    lookup_name(
        |pwd: *mut libc::passwd, buf, result| {
            // SAFETY: every pointer is valid for the call; getpwuid_r writes
            // only into `pwd` and `buf` (of the length given).
            unsafe { libc::getpwuid_r(uid, pwd, buf.as_mut_ptr(), buf.len(), result) }
        },
        |pwd| pwd.pw_name,
    )
}

fn group_name(gid: u32) -> Option<String> {
    lookup_name(
        |grp: *mut libc::group, buf, result| {
            // SAFETY: as in `user_name`, for getgrgid_r.
            unsafe { libc::getgrgid_r(gid, grp, buf.as_mut_ptr(), buf.len(), result) }
        },
        |grp| grp.gr_name,
    )
}

/// Go's `os.FileMode.String()` of a Linux `st_mode`: the type and special
/// bits as Go's letters (`d`, `L`, `D`+`c`, `p`, `S`, `u`, `g`, `t`, or `-`
/// when none), then `rwxrwxrwx`.
pub fn permissions_string(st_mode: u32) -> String {
    let mut out = String::with_capacity(12);
    let kind = st_mode & libc::S_IFMT;
    // Go's order: dalTLDpSugct?
    if kind == libc::S_IFDIR {
        out.push('d');
    }
    if kind == libc::S_IFLNK {
        out.push('L');
    }
    if kind == libc::S_IFBLK || kind == libc::S_IFCHR {
        out.push('D');
    }
    if kind == libc::S_IFIFO {
        out.push('p');
    }
    if kind == libc::S_IFSOCK {
        out.push('S');
    }
    if st_mode & libc::S_ISUID != 0 {
        out.push('u');
    }
    if st_mode & libc::S_ISGID != 0 {
        out.push('g');
    }
    if kind == libc::S_IFCHR {
        out.push('c');
    }
    if st_mode & libc::S_ISVTX != 0 {
        out.push('t');
    }
    if out.is_empty() {
        out.push('-');
    }
    for (i, c) in "rwxrwxrwx".chars().enumerate() {
        let bit = 1 << (8 - i);
        out.push(if st_mode & bit != 0 { c } else { '-' });
    }
    out
}

fn file_type(metadata: &Metadata) -> FileType {
    let kind = metadata.file_type();
    if kind.is_file() {
        FileType::File
    } else if kind.is_dir() {
        FileType::Directory
    } else {
        FileType::Unspecified
    }
}

/// The entry at `path` (not following a final symlink). A symlink is
/// reported as E2B does: its target's type and permission bits, the link's
/// own size and mode string, the fully resolved target (or the link's own
/// path when it dangles); `is_symlink` marks it (newer SDKs show it as one).
pub fn entry_info(path: &Path, names: &mut Names) -> io::Result<EntryInfo> {
    let metadata = std::fs::symlink_metadata(path)?;
    let (kind, perm, symlink_target, is_symlink) = if metadata.file_type().is_symlink() {
        let target = std::fs::canonicalize(path)
            .unwrap_or_else(|_| path.to_path_buf())
            .to_string_lossy()
            .into_owned();
        match std::fs::metadata(path) {
            Ok(target_meta) => (
                file_type(&target_meta),
                target_meta.mode() & 0o777,
                Some(target),
                true,
            ),
            Err(_) => (FileType::Unspecified, 0, Some(target), true),
        }
    } else {
        (file_type(&metadata), metadata.mode() & 0o777, None, false)
    };
    let name = path
        .file_name()
        .map_or_else(|| "/".to_owned(), |n| n.to_string_lossy().into_owned());
    Ok(EntryInfo {
        name,
        r#type: kind.into(),
        path: path.to_string_lossy().into_owned(),
        size: i64::try_from(metadata.size()).unwrap_or(i64::MAX),
        mode: perm,
        permissions: permissions_string(metadata.mode()),
        owner: names.user(metadata.uid()),
        group: names.group(metadata.gid()),
        modified_time: Some(pbjson_types::Timestamp {
            seconds: metadata.mtime(),
            nanos: i32::try_from(metadata.mtime_nsec()).unwrap_or(0),
        }),
        symlink_target,
        metadata: HashMap::new(),
        is_symlink,
    })
}

/// Stat's answer: the entry, or E2B's errors.
pub fn stat(path: &Path) -> RpcResult<EntryInfo> {
    entry_info(path, &mut Names::default()).map_err(|e| stat_error(path, &e))
}

pub(crate) fn stat_error(path: &Path, e: &io::Error) -> RpcError {
    match e.kind() {
        io::ErrorKind::NotFound => RpcError::not_found(format!(
            "file not found: lstat {}: {}",
            path.display(),
            io_text(e)
        )),
        io::ErrorKind::PermissionDenied => RpcError::new(
            Code::PermissionDenied,
            format!(
                "permission denied: lstat {}: {}",
                path.display(),
                io_text(e)
            ),
        ),
        _ => RpcError::internal(format!(
            "error getting file info: lstat {}: {}",
            path.display(),
            io_text(e)
        )),
    }
}

/// ListDir: the entries under `requested` (its symlinks resolved first) down
/// to `depth` levels (0 and 1: the directory's own entries), in the order
/// Go's `filepath.WalkDir` gives (by name, each directory before its
/// contents). Symlinks inside are listed, not followed. A subdirectory that
/// cannot be read is listed but not descended into.
pub fn list_dir(requested: &Path, depth: u32) -> RpcResult<Vec<EntryInfo>> {
    let depth = depth.max(1);
    let resolved = std::fs::canonicalize(requested).map_err(|e| match e.raw_os_error() {
        Some(libc::ELOOP) => RpcError::new(
            Code::FailedPrecondition,
            format!(
                "cyclic symlink or chain >255 links at {:?}",
                requested.display().to_string()
            ),
        ),
        _ if e.kind() == io::ErrorKind::NotFound => RpcError::not_found(format!(
            "path not found: {}: {}",
            requested.display(),
            io_text(&e)
        )),
        _ if e.kind() == io::ErrorKind::PermissionDenied => RpcError::new(
            Code::PermissionDenied,
            format!("{}: {}", requested.display(), io_text(&e)),
        ),
        _ => RpcError::internal(format!(
            "error resolving symlink: {}: {}",
            requested.display(),
            io_text(&e)
        )),
    })?;
    let metadata = std::fs::metadata(&resolved).map_err(|e| stat_error(&resolved, &e))?;
    if !metadata.is_dir() {
        return Err(RpcError::invalid_argument(format!(
            "path is not a directory: {}",
            resolved.display()
        )));
    }
    let mut entries = Vec::new();
    let mut names = Names::default();
    walk(&resolved, requested, 1, depth, &mut names, &mut entries).map_err(|e| match e.kind() {
        io::ErrorKind::PermissionDenied => RpcError::new(
            Code::PermissionDenied,
            format!(
                "error reading directory {}: {}",
                resolved.display(),
                io_text(&e)
            ),
        ),
        _ => RpcError::internal(format!(
            "error reading directory {}: {}",
            resolved.display(),
            io_text(&e)
        )),
    })?;
    Ok(entries)
}

/// Lists `dir` (at `level`, 1 for the root's entries), reporting paths under
/// `shown` (the path the client asked for). Only the root's read errors fail.
fn walk(
    dir: &Path,
    shown: &Path,
    level: u32,
    depth: u32,
    names: &mut Names,
    out: &mut Vec<EntryInfo>,
) -> io::Result<()> {
    let mut children: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(read) => read.filter_map(|e| e.ok().map(|e| e.path())).collect(),
        Err(e) if level == 1 => return Err(e),
        Err(_) => return Ok(()),
    };
    children.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
    for child in children {
        let Some(name) = child.file_name() else {
            continue;
        };
        let shown_child = shown.join(name);
        let mut entry = match entry_info(&child, names) {
            Ok(entry) => entry,
            // Gone since the directory was read.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        entry.path = shown_child.to_string_lossy().into_owned();
        // Descend into real directories only (a symlink's type is its target's).
        let descend =
            level < depth && entry.r#type == i32::from(FileType::Directory) && !entry.is_symlink;
        out.push(entry);
        if descend {
            walk(&child, &shown_child, level + 1, depth, names, out)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{symlink, PermissionsExt};

    use super::*;

    #[test]
    fn permission_strings_match_gos_file_mode() {
        assert_eq!(permissions_string(libc::S_IFREG | 0o644), "-rw-r--r--");
        assert_eq!(permissions_string(libc::S_IFDIR | 0o755), "drwxr-xr-x");
        assert_eq!(permissions_string(libc::S_IFLNK | 0o777), "Lrwxrwxrwx");
        assert_eq!(
            permissions_string(libc::S_IFDIR | libc::S_ISVTX | 0o777),
            "dtrwxrwxrwx"
        );
        assert_eq!(
            permissions_string(libc::S_IFREG | libc::S_ISUID | 0o755),
            "urwxr-xr-x"
        );
        assert_eq!(permissions_string(libc::S_IFCHR | 0o666), "Dcrw-rw-rw-");
        assert_eq!(permissions_string(libc::S_IFBLK | 0o660), "Drw-rw----");
        assert_eq!(permissions_string(libc::S_IFIFO | 0o600), "prw-------");
        assert_eq!(permissions_string(libc::S_IFSOCK | 0o777), "Srwxrwxrwx");
        assert_eq!(permissions_string(libc::S_IFREG), "----------");
    }

    fn names(entries: &[EntryInfo], root: &Path) -> Vec<String> {
        entries
            .iter()
            .map(|e| {
                Path::new(&e.path)
                    .strip_prefix(root)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect()
    }

    #[test]
    fn list_dir_descends_to_the_depth_asked() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("a/b/c")).unwrap();
        std::fs::write(root.join("a/f"), b"x").unwrap();
        std::fs::write(root.join("a/b/g"), b"y").unwrap();
        std::fs::write(root.join("z"), b"z").unwrap();
        assert_eq!(names(&list_dir(root, 0).unwrap(), root), ["a", "z"]);
        assert_eq!(names(&list_dir(root, 1).unwrap(), root), ["a", "z"]);
        assert_eq!(
            names(&list_dir(root, 2).unwrap(), root),
            ["a", "a/b", "a/f", "z"]
        );
        assert_eq!(
            names(&list_dir(root, 9).unwrap(), root),
            ["a", "a/b", "a/b/c", "a/b/g", "a/f", "z"]
        );
        let e = list_dir(&root.join("z"), 1).unwrap_err();
        assert_eq!(e.code, Code::InvalidArgument);
        assert_eq!(
            list_dir(&root.join("nope"), 1).unwrap_err().code,
            Code::NotFound
        );
    }

    #[test]
    fn symlinks_are_listed_with_their_targets_type_and_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir(root.join("d")).unwrap();
        std::fs::write(root.join("d/inner"), b"1").unwrap();
        std::fs::write(root.join("f"), b"hello").unwrap();
        std::fs::set_permissions(root.join("f"), std::fs::Permissions::from_mode(0o640)).unwrap();
        symlink(root.join("d"), root.join("ld")).unwrap();
        symlink("f", root.join("lf")).unwrap();
        symlink("missing", root.join("dangling")).unwrap();
        let entries = list_dir(root, 5).unwrap();
        assert_eq!(
            names(&entries, root),
            ["d", "d/inner", "dangling", "f", "ld", "lf"]
        );
        let lf = entries.iter().find(|e| e.name == "lf").unwrap();
        assert_eq!(lf.r#type, i32::from(FileType::File));
        assert!(lf.is_symlink);
        assert_eq!(lf.mode, 0o640);
        assert_eq!(lf.permissions, "Lrwxrwxrwx");
        let real = std::fs::canonicalize(root.join("f")).unwrap();
        assert_eq!(lf.symlink_target.as_deref(), Some(real.to_str().unwrap()));
        let dangling = entries.iter().find(|e| e.name == "dangling").unwrap();
        assert_eq!(dangling.r#type, i32::from(FileType::Unspecified));
        let f = entries.iter().find(|e| e.name == "f").unwrap();
        assert_eq!(
            (f.size, f.mode, f.permissions.as_str()),
            (5, 0o640, "-rw-r-----")
        );
        assert!(!f.is_symlink && f.symlink_target.is_none());
        // A listing through a symlinked directory reports the path asked for.
        let through = list_dir(&root.join("ld"), 1).unwrap();
        assert_eq!(through[0].path, root.join("ld/inner").to_string_lossy());
    }

    #[test]
    fn owners_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let entry = stat(dir.path()).unwrap();
        // SAFETY: getuid cannot fail.
        let uid = unsafe { libc::getuid() };
        assert_eq!(
            entry.owner,
            user_name(uid).unwrap_or_else(|| uid.to_string())
        );
        assert_eq!(entry.r#type, i32::from(FileType::Directory));
        assert_eq!(
            stat(&dir.path().join("x")).unwrap_err().code,
            Code::NotFound
        );
    }
}
