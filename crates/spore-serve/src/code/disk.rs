//! The code disk of a Linux function: its zip unpacked into a small
//! read-only ext4 image, which the guest mounts at `/var/task`.
//!
//! The zip is untrusted. Unpacking is bounded (entries, bytes actually
//! inflated, not the sizes the zip claims), refuses names that are absolute,
//! hold `..` or backslashes, and symlinks whose target leaves the tree, and
//! keeps only the executable bit of a file's unix mode. The image is made by
//! `mkfs.ext4 -d` from a temporary directory (no loop device, no mount) and
//! written atomically: a temporary file beside `out`, fsynced, mode 0600,
//! renamed into place.

use std::io::{Cursor, Read};
use std::path::{Component, Path, PathBuf};

use sha2::{Digest, Sha256};

use super::{MAX_UNPACKED_BYTES, MAX_ZIP_BYTES};

/// Most entries a function zip may hold (files, directories and links).
pub const MAX_ENTRIES: usize = 20_000;
/// Deepest directory nesting accepted.
const MAX_DEPTH: usize = 64;
/// ext4 block size of the image.
const BLOCK: u64 = 4096;

#[derive(Debug, thiserror::Error)]
pub enum CodeDiskError {
    #[error("not a readable zip: {0}")]
    NotAZip(String),
    #[error("the zip is larger than {MAX_ZIP_BYTES} bytes")]
    TooLarge,
    #[error("the zip unpacks to more than {MAX_UNPACKED_BYTES} bytes")]
    TooBig,
    #[error("the zip has more than {MAX_ENTRIES} entries")]
    TooManyEntries,
    #[error("zip entry '{name}' refused: {why}")]
    Unsafe { name: String, why: &'static str },
    /// The entry's header declares another size than its data inflates to.
    #[error("zip entry '{name}' declares {declared} bytes but inflates to {}", match inflated { Some(n) => format!("{n}"), None => "more".to_string() })]
    SizeMismatch {
        name: String,
        declared: u64,
        inflated: Option<u64>,
    },
    #[error("mkfs.ext4: {0}")]
    Mkfs(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl CodeDiskError {
    /// Whether the user's zip is at fault rather than the host.
    pub fn is_user_error(&self) -> bool {
        !matches!(self, CodeDiskError::Io(_) | CodeDiskError::Mkfs(_))
    }
}

/// What was unpacked.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Unpacked {
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
    /// Bytes of file content.
    pub bytes: u64,
    /// ext4 blocks the content needs (each file rounded up to a block).
    blocks: u64,
}

/// A built code disk.
#[derive(Debug, Clone)]
pub struct CodeDisk {
    pub path: PathBuf,
    pub size: u64,
    pub contents: Unpacked,
}

/// One entry's name as a relative path of plain components, or why not.
fn safe_relative(name: &str) -> Result<PathBuf, &'static str> {
    if name.contains('\0') {
        return Err("NUL in the name");
    }
    if name.contains('\\') {
        return Err("backslash in the name");
    }
    if name.starts_with('/') {
        return Err("absolute path");
    }
    let mut out = PathBuf::new();
    for c in Path::new(name).components() {
        match c {
            Component::Normal(part) => out.push(part),
            Component::CurDir => {}
            Component::ParentDir => return Err("'..' in the path"),
            Component::RootDir | Component::Prefix(_) => return Err("absolute path"),
        }
    }
    if out.as_os_str().is_empty() {
        return Err("empty name");
    }
    if out.components().count() > MAX_DEPTH {
        return Err("nested too deep");
    }
    Ok(out)
}

/// Whether a symlink at `link` (relative to the tree's root) pointing at
/// `target` stays in the tree. Only leading `..` components are accepted
/// (no more than the link's depth): `a/../..` would be inside lexically but
/// leaves the tree when `a` is itself a link to a directory.
fn symlink_target_ok(link: &Path, target: &str) -> Result<(), &'static str> {
    if target.is_empty() || target.contains('\0') || target.contains('\\') {
        return Err("bad symlink target");
    }
    if target.starts_with('/') {
        return Err("symlink to an absolute path");
    }
    let depth = link.components().count().saturating_sub(1);
    let mut ups = 0;
    let mut seen_name = false;
    for c in Path::new(target).components() {
        match c {
            Component::ParentDir if seen_name => {
                return Err("symlink target with '..' after a name")
            }
            Component::ParentDir => ups += 1,
            Component::CurDir => {}
            Component::Normal(_) => seen_name = true,
            Component::RootDir | Component::Prefix(_) => return Err("symlink to an absolute path"),
        }
    }
    if ups > depth {
        return Err("symlink pointing out of the tree");
    }
    Ok(())
}

/// Bounds of an unpack (the tests use small ones).
#[derive(Debug, Clone, Copy)]
struct Limits {
    bytes: u64,
    entries: usize,
}

const LIMITS: Limits = Limits {
    bytes: MAX_UNPACKED_BYTES,
    entries: MAX_ENTRIES,
};

/// Unpacks `zip` into the existing, empty directory `dest`.
pub fn unpack(zip: &[u8], dest: &Path) -> Result<Unpacked, CodeDiskError> {
    unpack_limited(zip, dest, LIMITS)
}

fn unpack_limited(zip: &[u8], dest: &Path, limits: Limits) -> Result<Unpacked, CodeDiskError> {
    if zip.len() > MAX_ZIP_BYTES {
        return Err(CodeDiskError::TooLarge);
    }
    let mut archive = zip::ZipArchive::new(Cursor::new(zip))
        .map_err(|e| CodeDiskError::NotAZip(e.to_string()))?;
    if archive.len() > limits.entries {
        return Err(CodeDiskError::TooManyEntries);
    }
    let mut stats = Unpacked::default();
    // Links are made last, so that no file is ever written through one, and
    // only after their parent directories exist as real directories.
    let mut links: Vec<(PathBuf, String)> = Vec::new();
    for i in 0..archive.len() {
        let mut entry = archive
            .by_index(i)
            .map_err(|e| CodeDiskError::NotAZip(e.to_string()))?;
        let name = entry.name().to_string();
        let unsafe_entry = |why| CodeDiskError::Unsafe {
            name: name.clone(),
            why,
        };
        let rel = safe_relative(&name).map_err(unsafe_entry)?;
        let path = dest.join(&rel);
        let mode = entry.unix_mode().unwrap_or(0);
        let kind = mode & libc::S_IFMT;
        if kind == libc::S_IFLNK {
            // The link's target is its content (bounded: a path).
            let mut target = String::new();
            entry
                .by_ref()
                .take(4096)
                .read_to_string(&mut target)
                .map_err(|_| unsafe_entry("symlink target is not UTF-8 text"))?;
            symlink_target_ok(&rel, &target).map_err(unsafe_entry)?;
            if let Some(parent) = path.parent() {
                make_dirs(parent).map_err(|e| conflict(e, &name))?;
            }
            links.push((rel, target));
        } else if entry.is_dir() || kind == libc::S_IFDIR {
            make_dirs(&path).map_err(|e| conflict(e, &name))?;
        } else if kind == 0 || kind == libc::S_IFREG {
            if let Some(parent) = path.parent() {
                make_dirs(parent).map_err(|e| conflict(e, &name))?;
            }
            let budget = limits.bytes - stats.bytes;
            let declared = entry.size();
            if declared > budget {
                return Err(CodeDiskError::TooBig);
            }
            let executable = mode & 0o111 != 0;
            let mut f = create_new(&path, if executable { 0o755 } else { 0o644 })
                .map_err(|e| conflict(e, &name))?;
            // Count what really inflates, not what the header claims: a bomb
            // may lie about its sizes. One byte past the declared size tells
            // a lie; reading to the end checks the entry's CRC.
            let n = std::io::copy(&mut entry.by_ref().take(declared + 1), &mut f)
                .map_err(|e| CodeDiskError::NotAZip(format!("{name}: {e}")))?;
            if n != declared {
                return Err(CodeDiskError::SizeMismatch {
                    name,
                    declared,
                    inflated: if n > declared { None } else { Some(n) },
                });
            }
            stats.files += 1;
            stats.bytes += n;
            stats.blocks += n.div_ceil(BLOCK);
        } else {
            return Err(unsafe_entry("not a file, directory or symlink"));
        }
    }
    for (rel, target) in links {
        let path = dest.join(&rel);
        // Every parent must be a real directory of the tree (create_dir_all
        // above made them; a file or link of that name would have failed).
        let mut at = dest.to_path_buf();
        for c in rel.parent().into_iter().flat_map(|p| p.components()) {
            at.push(c);
            let meta = std::fs::symlink_metadata(&at)?;
            if !meta.is_dir() {
                return Err(CodeDiskError::Unsafe {
                    name: rel.display().to_string(),
                    why: "a parent directory is not a directory",
                });
            }
        }
        std::os::unix::fs::symlink(&target, &path)
            .map_err(|e| conflict(e, &rel.display().to_string()))?;
        stats.symlinks += 1;
        // ext4 keeps targets under 60 bytes in the inode.
        if target.len() >= 60 {
            stats.blocks += 1;
        }
    }
    stats.dirs = settle_dirs(dest)?;
    Ok(stats)
}

/// A name used twice, or a directory where the zip already put a file, is the
/// zip's fault; anything else is the host's.
fn conflict(e: std::io::Error, name: &str) -> CodeDiskError {
    match e.kind() {
        std::io::ErrorKind::AlreadyExists | std::io::ErrorKind::NotADirectory => {
            CodeDiskError::Unsafe {
                name: name.to_string(),
                why: "conflicts with another entry of that name",
            }
        }
        _ => CodeDiskError::Io(e),
    }
}

fn make_dirs(path: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new().recursive(true).create(path)
}

/// A new file with exactly `mode` (set after creating it: the umask must not
/// decide what the guest's function user may read).
fn create_new(path: &Path, mode: u32) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)?;
    f.set_permissions(std::fs::Permissions::from_mode(mode))?;
    Ok(f)
}

/// Sets every directory under `dir` (and `dir`) to 0755; returns how many
/// there are below `dir`.
fn settle_dirs(dir: &Path) -> std::io::Result<u64> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    let mut n = 0;
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        if e.file_type()?.is_dir() {
            n += 1 + settle_dirs(&e.path())?;
        }
    }
    Ok(n)
}

/// A directory removed when dropped (also on an error path).
struct TempDir(PathBuf);

impl TempDir {
    fn new_in(parent: &Path, prefix: &str) -> std::io::Result<TempDir> {
        let mut random = [0u8; 8];
        for _ in 0..16 {
            getrandom::fill(&mut random).map_err(|e| std::io::Error::other(e.to_string()))?;
            let tag: String = random.iter().map(|b| format!("{b:02x}")).collect();
            let path = parent.join(format!("{prefix}{tag}"));
            match std::fs::create_dir(&path) {
                Ok(()) => return Ok(TempDir(path)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
        Err(std::io::Error::other("cannot create a temporary directory"))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Removes a temporary file when dropped unless disarmed.
struct TempFile(Option<PathBuf>);

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// `mkfs.ext4`, also where `/sbin` is not on the PATH (a non-root user's).
pub fn mkfs_ext4() -> Option<PathBuf> {
    e2fsprogs_tool("mkfs.ext4")
}

/// One of e2fsprogs' programs (`name`), also where `/sbin` is not on the
/// PATH.
pub fn e2fsprogs_tool(name: &str) -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    on_path
        .into_iter()
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Builds the code disk of `zip` at `out`: unpacked into a temporary
/// directory (removed afterwards), turned into a read-only ext4 image (no
/// journal, no reserved blocks, label `spore-code`, the UUID taken from the
/// zip's SHA-256 so that the same zip gives the same file system id), sized
/// to the content plus a small margin, written atomically with mode 0600.
pub fn build(zip: &[u8], out: &Path) -> Result<CodeDisk, CodeDiskError> {
    let mkfs =
        mkfs_ext4().ok_or_else(|| CodeDiskError::Mkfs("not found (install e2fsprogs)".into()))?;
    let out_dir = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let file_name = out
        .file_name()
        .ok_or_else(|| std::io::Error::other(format!("{} names no file", out.display())))?
        .to_string_lossy()
        .into_owned();
    let tree = TempDir::new_in(&std::env::temp_dir(), ".spore-code-")?;
    let contents = unpack(zip, &tree.0)?;

    // Content blocks, one per directory, inode tables (256 bytes an inode),
    // then a tenth more and 1 MiB for ext4's own metadata (superblock, group
    // descriptors, bitmaps).
    let inodes = contents.files + contents.dirs + contents.symlinks + 16;
    let blocks = contents.blocks + contents.dirs + 1 + (inodes * 256).div_ceil(BLOCK);
    let size_blocks = blocks + blocks / 10 + (1 << 20) / BLOCK;

    let digest = Sha256::digest(zip);
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    let uuid = format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    );
    let tmp_path = out_dir.join(format!(".{file_name}.tmp-{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp_path);
    let mut guard = TempFile(Some(tmp_path.clone()));
    let tmp = create_new(&tmp_path, 0o600)?;
    tmp.set_len(size_blocks * BLOCK)?;
    drop(tmp);
    let output = std::process::Command::new(&mkfs)
        .args([
            "-q",
            "-F",
            "-t",
            "ext4",
            "-b",
            "4096",
            "-m",
            "0",
            "-O",
            "^has_journal",
        ])
        .args(["-N", &inodes.to_string(), "-L", "spore-code", "-U", &uuid])
        .arg("-E")
        .arg(format!("hash_seed={uuid},root_owner=0:0"))
        .arg("-d")
        .arg(&tree.0)
        .arg(&tmp_path)
        .stdin(std::process::Stdio::null())
        .output()?;
    if !output.status.success() {
        let text = String::from_utf8_lossy(&output.stderr);
        let last = text.lines().rfind(|l| !l.trim().is_empty()).unwrap_or("");
        return Err(CodeDiskError::Mkfs(format!(
            "{} ({})",
            last.trim(),
            output.status
        )));
    }
    let f = std::fs::OpenOptions::new().write(true).open(&tmp_path)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp_path, out)?;
    guard.0 = None;
    crate::fs::sync_dir(&out_dir)?;
    Ok(CodeDisk {
        path: out.to_path_buf(),
        size: size_blocks * BLOCK,
        contents,
    })
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;

    use zip::write::SimpleFileOptions;

    use super::*;

    enum E<'a> {
        File(&'a str, &'a [u8], u32),
        Dir(&'a str),
        Link(&'a str, &'a str),
    }

    fn zip_of(entries: &[E]) -> Vec<u8> {
        let mut w = zip::ZipWriter::new(Cursor::new(Vec::new()));
        for e in entries {
            match e {
                E::File(name, data, mode) => {
                    let o = SimpleFileOptions::default()
                        .compression_method(zip::CompressionMethod::Deflated)
                        .unix_permissions(*mode);
                    w.start_file(*name, o).unwrap();
                    w.write_all(data).unwrap();
                }
                E::Dir(name) => w
                    .add_directory(*name, SimpleFileOptions::default())
                    .unwrap(),
                E::Link(name, target) => w
                    .add_symlink(*name, *target, SimpleFileOptions::default())
                    .unwrap(),
            }
        }
        w.finish().unwrap().into_inner()
    }

    fn scratch() -> TempDir {
        TempDir::new_in(&std::env::temp_dir(), ".spore-code-test-").unwrap()
    }

    fn refused(zip: &[u8]) -> String {
        let dir = scratch();
        match unpack(zip, &dir.0) {
            Err(CodeDiskError::Unsafe { why, .. }) => why.to_string(),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn refuses_parent_and_absolute_paths() {
        let outside = std::env::temp_dir().join("spore-code-test-escaped");
        let _ = std::fs::remove_file(&outside);
        for name in [
            "../spore-code-test-escaped",
            "a/../../spore-code-test-escaped",
            "./../x",
        ] {
            assert!(
                refused(&zip_of(&[E::File(name, b"x", 0o644)])).contains(".."),
                "{name}"
            );
        }
        assert!(refused(&zip_of(&[E::File(
            "/tmp/spore-code-test-escaped",
            b"x",
            0o644
        )]))
        .contains("absolute"));
        assert!(refused(&zip_of(&[E::File("a\\..\\x", b"x", 0o644)])).contains("backslash"));
        assert!(!outside.exists());
    }

    #[test]
    fn refuses_symlinks_out_of_the_tree() {
        for (link, target) in [
            ("l", "/etc/passwd"),
            ("l", ".."),
            ("a/l", "../.."),
            ("a/l", "b/../../.."),
            ("l", "x/.."),
        ] {
            let why = refused(&zip_of(&[E::Link(link, target)]));
            assert!(why.contains("symlink"), "{link} -> {target}: {why}");
        }
        // A file written through a link the zip made earlier: the link is
        // made last, so the file's directory is real and the link collides.
        let why = refused(&zip_of(&[E::Link("d", "."), E::File("d/f", b"x", 0o644)]));
        assert!(why.contains("conflicts"), "{why}");
        // Links inside the tree are kept.
        let dir = scratch();
        let got = unpack(
            &zip_of(&[
                E::File("lib/data.txt", b"hi", 0o644),
                E::Link("lib/alias", "data.txt"),
                E::Link("bin/up", "../lib/data.txt"),
            ]),
            &dir.0,
        )
        .unwrap();
        assert_eq!(got.symlinks, 2);
        assert_eq!(std::fs::read(dir.0.join("bin/up")).unwrap(), b"hi");
        assert_eq!(
            std::fs::read_link(dir.0.join("lib/alias")).unwrap(),
            Path::new("data.txt")
        );
    }

    #[test]
    fn bounds_what_it_inflates() {
        let zeros = vec![0u8; 3 << 20];
        let bomb = zip_of(&[E::File("zeros", &zeros, 0o644)]);
        assert!(
            bomb.len() < 64 << 10,
            "deflated zeros are small: {}",
            bomb.len()
        );
        let small = Limits {
            bytes: 1 << 20,
            entries: 10,
        };
        let dir = scratch();
        assert!(matches!(
            unpack_limited(&bomb, &dir.0, small),
            Err(CodeDiskError::TooBig)
        ));
        // Many entries, each under the limit, adding up past it.
        let part = vec![0u8; 300 << 10];
        let many = zip_of(&[
            E::File("a", &part, 0o644),
            E::File("b", &part, 0o644),
            E::File("c", &part, 0o644),
            E::File("d", &part, 0o644),
        ]);
        let dir = scratch();
        assert!(matches!(
            unpack_limited(&many, &dir.0, small),
            Err(CodeDiskError::TooBig)
        ));
        let entries = Limits {
            bytes: 1 << 20,
            entries: 3,
        };
        let dir = scratch();
        assert!(matches!(
            unpack_limited(&many, &dir.0, entries),
            Err(CodeDiskError::TooManyEntries)
        ));
        assert!(matches!(
            unpack(b"not a zip", &dir.0),
            Err(CodeDiskError::NotAZip(_))
        ));
    }

    /// Sets every local and central header's uncompressed size to `size`.
    fn declare_size(zip: &mut [u8], size: u32) {
        for i in 0..zip.len().saturating_sub(30) {
            match zip[i..i + 4] {
                [0x50, 0x4b, 0x03, 0x04] => {
                    zip[i + 22..i + 26].copy_from_slice(&size.to_le_bytes())
                }
                [0x50, 0x4b, 0x01, 0x02] => {
                    zip[i + 24..i + 28].copy_from_slice(&size.to_le_bytes())
                }
                _ => {}
            }
        }
    }

    #[test]
    fn refuses_an_entry_whose_header_lies_about_its_size() {
        let data = vec![7u8; 200 << 10];
        let honest = zip_of(&[E::File("handler", &data, 0o644)]);
        let mut lying = honest.clone();
        declare_size(&mut lying, 65 << 10);
        let dir = scratch();
        match unpack(&lying, &dir.0) {
            Err(CodeDiskError::SizeMismatch {
                name,
                declared,
                inflated: None,
            }) => {
                assert_eq!((name.as_str(), declared), ("handler", 65 << 10));
            }
            other => panic!("a header declaring less than the data: {other:?}"),
        }
        let mut lying = honest;
        declare_size(&mut lying, 300 << 10);
        let dir = scratch();
        let got = unpack(&lying, &dir.0);
        assert!(
            matches!(
                got,
                Err(CodeDiskError::SizeMismatch {
                    inflated: Some(n),
                    ..
                }) if n == 200 << 10
            ) || matches!(got, Err(CodeDiskError::NotAZip(_))),
            "a header declaring more than the data: {got:?}"
        );
    }

    #[test]
    fn keeps_only_the_executable_bit() {
        let dir = scratch();
        let got = unpack(
            &zip_of(&[
                E::File("bootstrap", b"#!/bin/sh\n", 0o755),
                E::File("data.json", b"{}", 0o600),
                E::File("suid", b"x", 0o4750),
                E::Dir("empty/"),
            ]),
            &dir.0,
        )
        .unwrap();
        assert_eq!(
            (got.files, got.dirs, got.symlinks, got.bytes),
            (3, 1, 0, 13)
        );
        let mode = |p: &str| {
            std::fs::metadata(dir.0.join(p))
                .unwrap()
                .permissions()
                .mode()
                & 0o7777
        };
        assert_eq!(mode("bootstrap"), 0o755);
        assert_eq!(mode("data.json"), 0o644);
        assert_eq!(mode("suid"), 0o755);
        assert_eq!(mode("empty"), 0o755);
    }

    fn debugfs(image: &Path, request: &str) -> String {
        let debugfs = mkfs_ext4()
            .and_then(|m| m.parent().map(|d| d.join("debugfs")))
            .filter(|p| p.is_file())
            .unwrap_or_else(|| PathBuf::from("debugfs"));
        let out = std::process::Command::new(debugfs)
            .args(["-R", request])
            .arg(image)
            .output()
            .expect("debugfs (e2fsprogs) runs");
        assert!(out.status.success(), "debugfs -R '{request}': {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    #[test]
    fn code_disk_holds_the_zip() {
        assert!(
            mkfs_ext4().is_some(),
            "mkfs.ext4 missing: install e2fsprogs (scripts/ensure-deps.sh)"
        );
        let dir = scratch();
        let out = dir.0.join("code.ext4");
        let zip = zip_of(&[
            E::File("bootstrap", b"#!/bin/sh\necho hi\n", 0o755),
            E::File(
                "lib/handler.py",
                b"def handler(e, c):\n    return e\n",
                0o644,
            ),
            E::Link("handler.py", "lib/handler.py"),
        ]);
        let disk = build(&zip, &out).unwrap();
        let meta = std::fs::metadata(&out).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(meta.len(), disk.size);
        assert!(
            disk.size <= 2 << 20,
            "a tiny zip makes a small disk: {}",
            disk.size
        );
        // Nothing left beside the image.
        let names: Vec<_> = std::fs::read_dir(&dir.0)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("code.ext4")]);

        // `ls -l` lines: inode, mode (octal, with the file type), ..., name.
        let root = debugfs(&out, "ls -l /");
        let mode_of = |listing: &str, name: &str| -> String {
            listing
                .lines()
                .map(|l| l.split_whitespace().collect::<Vec<_>>())
                .find(|w| w.last() == Some(&name))
                .and_then(|w| w.get(1).map(|m| m.to_string()))
                .unwrap_or_else(|| panic!("{name} not in {listing}"))
        };
        assert_eq!(mode_of(&root, "bootstrap"), "100755");
        assert_eq!(mode_of(&root, "lib"), "40755");
        assert_eq!(mode_of(&root, "handler.py"), "120777");
        assert_eq!(
            mode_of(&debugfs(&out, "ls -l /lib"), "handler.py"),
            "100644"
        );
        assert_eq!(debugfs(&out, "cat /bootstrap"), "#!/bin/sh\necho hi\n");
        assert!(debugfs(&out, "stat /handler.py").contains("Fast link dest: \"lib/handler.py\""));

        // A refused zip leaves neither the image nor a temporary file.
        let bad = dir.0.join("bad.ext4");
        assert!(build(&zip_of(&[E::File("../x", b"x", 0o644)]), &bad).is_err());
        assert!(!bad.exists());
        assert_eq!(std::fs::read_dir(&dir.0).unwrap().count(), 1);
    }
}
