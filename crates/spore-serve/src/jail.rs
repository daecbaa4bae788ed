//! Every instance's VMM as a user of its own function: uids, and who may
//! reach which file of the state directory.
//!
//! Each function (per account: a function key) has a uid of `--uid-range`
//! (default 100000–165535), kept in the catalogue; its VMMs (cold boots,
//! restores, zygotes and the clones they start) run as that uid with its
//! own gid, after opening only `/dev/kvm` and `/dev/userfaultfd` as root
//! (`spore vmm --user`). The first id of the range is the *shared group*:
//! every jailed VMM has it as a supplementary group, and it may read what
//! holds no tenant's secret and is shared between functions — code by
//! hash, the runtime bases, their placeholder disk — and traverse (not
//! list) the state directory. What a function's VMM writes (its
//! snapshots, working sets, sockets) is its uid's alone; the catalogue,
//! the event queue and everything else of the daemon stay root's, 0600.
//! The runtime bases are built by a VMM running as the shared id itself.

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context as _;

use crate::catalog::Catalog;

/// `--uid-range`'s default: 65,536 ids above 100,000 (above the ids a
/// distribution hands out to people and services).
pub const DEFAULT_FIRST: u32 = 100_000;
pub const DEFAULT_COUNT: u32 = 65_536;

/// The state directory's subdirectories jailed VMMs pass through (`sbx`
/// and `sbx-bases`: sandboxes', `crate::sandboxes`).
const VMM_REACHABLE: [&str; 7] = [
    "run",
    "code",
    "snapshots",
    "bases",
    "sbx",
    "sbx-bases",
    "sbx-templates",
];

/// `FIRST:COUNT`: the shared group's id, then the functions' uids.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UidRange {
    pub first: u32,
    pub count: u32,
}

impl Default for UidRange {
    fn default() -> Self {
        UidRange {
            first: DEFAULT_FIRST,
            count: DEFAULT_COUNT,
        }
    }
}

impl std::str::FromStr for UidRange {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (first, count) = s
            .split_once(':')
            .ok_or_else(|| format!("{s:?}: want FIRST:COUNT (e.g. 100000:65536)"))?;
        let num = |v: &str, what: &str| {
            v.parse::<u32>()
                .map_err(|_| format!("{s:?}: the {what} is not a number"))
        };
        let (first, count) = (num(first, "first id")?, num(count, "count")?);
        if first == 0 {
            return Err(format!("{s:?}: id 0 is root"));
        }
        if count < 2 {
            return Err(format!(
                "{s:?}: the range needs the shared group and at least one function's uid"
            ));
        }
        if first.checked_add(count).is_none() {
            return Err(format!("{s:?}: the range passes the largest id"));
        }
        Ok(UidRange { first, count })
    }
}

/// A user a VMM runs as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct User {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups (the shared group).
    pub groups: Vec<u32>,
}

impl User {
    /// `spore vmm --user`'s value.
    pub fn arg(&self) -> String {
        let groups: Vec<String> = self.groups.iter().map(u32::to_string).collect();
        format!("{}:{}:{}", self.uid, self.gid, groups.join(","))
    }
}

/// How a jailed VMM is started: its user, and the host paths its root
/// shows (`spore vmm --chroot`), each at its own path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Jailed {
    pub user: User,
    /// Paths it writes into (besides its run directory, always writable).
    pub writable: Vec<PathBuf>,
    /// Paths it reads.
    pub read_only: Vec<PathBuf>,
}

impl Jailed {
    /// `spore vmm`'s arguments for it, its root at `<run_dir>/root`.
    pub fn args(&self, run_dir: &Path) -> Vec<std::ffi::OsString> {
        let mut args: Vec<std::ffi::OsString> = vec![
            "--user".into(),
            self.user.arg().into(),
            "--chroot".into(),
            run_dir.join("root").into(),
            "--bind".into(),
            run_dir.into(),
        ];
        for p in &self.writable {
            args.push("--bind".into());
            args.push(p.into());
        }
        for p in &self.read_only {
            args.push("--bind-ro".into());
            args.push(p.into());
        }
        args
    }
}

/// The daemon's jail: its uid range and the uids it gave out.
pub struct Jail {
    range: UidRange,
    catalog: Arc<Catalog>,
}

impl Jail {
    pub fn new(range: UidRange, catalog: Arc<Catalog>) -> Self {
        Jail { range, catalog }
    }

    /// The shared group (and the user that builds runtime bases).
    pub fn shared_gid(&self) -> u32 {
        self.range.first
    }

    /// The user of the VMMs that build runtime bases: the shared id.
    pub fn base_user(&self) -> User {
        User {
            uid: self.range.first,
            gid: self.range.first,
            groups: Vec::new(),
        }
    }

    /// The user of `function`'s VMMs (its uid given out on first use; the
    /// catalogue frees it when the function is deleted, so it is asked
    /// each time rather than remembered here).
    pub fn user_of(&self, function: &str) -> anyhow::Result<User> {
        let end = self.range.first + self.range.count;
        let uid = self.catalog.jail_uid(function, self.range.first + 1, end)?;
        Ok(User {
            uid,
            gid: uid,
            groups: vec![self.range.first],
        })
    }

    /// The user of `account`'s VMMs of sandbox template `template` (its
    /// zygote, the sandboxes cloned from it, their forks and resumes). The
    /// key cannot be a function's: function names have no `/`.
    pub fn user_of_template(&self, account: &str, template: &str) -> anyhow::Result<User> {
        self.user_of(&format!("sandbox-template/{account}/{template}"))
    }

    /// Makes the state directory reachable by jailed VMMs: its ancestors
    /// must let others through (refused with what to change, else), and
    /// the directories VMMs reach into (`run`, `code`, `snapshots`,
    /// `bases`) become traversable, not listable, by the shared group;
    /// code and bases already there become readable by it.
    pub fn prepare_state_dir(&self, state: &Path) -> anyhow::Result<()> {
        let state = std::fs::canonicalize(state)
            .with_context(|| format!("resolving {}", state.display()))?;
        for dir in state.ancestors().skip(1) {
            let mode = std::fs::metadata(dir)
                .with_context(|| format!("reading {}", dir.display()))?
                .mode();
            if mode & 0o001 == 0 {
                anyhow::bail!(
                    "the jailed VMMs (uids {}..{}) cannot reach the state directory {}: {} is mode {:o}, which lets no other user through; make it traversable (chmod o+x {}), choose another --state-dir, or run unjailed with --no-jail",
                    self.range.first,
                    self.range.first + self.range.count,
                    state.display(),
                    dir.display(),
                    mode & 0o7777,
                    dir.display()
                );
            }
        }
        let gid = self.shared_gid();
        traversable(&state, gid)?;
        // Everything else of the daemon's is root's alone (an older
        // daemon's logs directory was 0755).
        for entry in std::fs::read_dir(&state)?.flatten() {
            let name = entry.file_name();
            if VMM_REACHABLE.iter().any(|d| name == *d) {
                continue;
            }
            let meta = entry.metadata()?;
            if meta.is_dir() {
                chmod(&entry.path(), 0o700)?;
            } else if meta.is_file() {
                chmod(&entry.path(), 0o600)?;
            }
        }
        for sub in VMM_REACHABLE {
            let dir = state.join(sub);
            crate::fs::create_private_dir(&dir)?;
            traversable(&dir, gid)?;
        }
        for entry in std::fs::read_dir(state.join("bases"))?.flatten() {
            share_tree(&entry.path(), gid)?;
        }
        // Of stored code, what VMMs boot from (not the zips).
        for dir in std::fs::read_dir(state.join("code"))?.flatten() {
            for file in std::fs::read_dir(dir.path())?.flatten() {
                let name = file.file_name();
                let name = name.to_string_lossy();
                if name == "code.ext4" || name.starts_with("image-") {
                    share_file(&file.path(), gid)?;
                }
            }
        }
        Ok(())
    }

    /// Lets every jailed VMM read `file` (stored code it boots from).
    pub fn share(&self, file: &Path) -> std::io::Result<()> {
        share_file(file, self.shared_gid())
    }
}

/// At the daemon's start: with a uid range, checks it may jail and makes
/// the state directory ready; without (`--no-jail`), says what that means.
pub fn set_up(range: Option<UidRange>, catalog: &Arc<Catalog>, state: &Path) -> anyhow::Result<()> {
    let Some(range) = range else {
        tracing::warn!(
            "--no-jail: instance VMMs run as the daemon's own user; for development only"
        );
        return Ok(());
    };
    if !can_jail() {
        anyhow::bail!(
            "spore serve runs every instance's VMM as a user of its own, which needs root: run it as root, or pass --no-jail (development only: the VMMs then run as this user)"
        );
    }
    Jail::new(range, catalog.clone()).prepare_state_dir(state)
}

/// Whether this process can jail VMMs (it must be root to start them as
/// other users and open `/dev/kvm` for them).
pub fn can_jail() -> bool {
    // SAFETY: geteuid takes no arguments.
    unsafe { libc::geteuid() == 0 }
}

/// What every jailed VMM reads outside the state directory: spore itself
/// and the system's libraries (a zygote starts clone processes of it,
/// which a dynamically linked build loads them for).
pub fn system_paths(spore_bin: &Path) -> Vec<PathBuf> {
    let mut paths = vec![spore_bin.to_path_buf()];
    // (A merged /usr's /lib links to usr/lib: the root shows the link's
    // target at the link's path, where the loader looks.)
    for lib in ["/lib", "/lib64", "/usr/lib", "/usr/lib64"] {
        let lib = PathBuf::from(lib);
        if lib.is_dir() {
            paths.push(lib);
        }
    }
    paths
}

/// `dir` root's with `user`'s group, mode 01770: its VMMs make files in
/// it, and cannot remove or replace the daemon's own (a sandbox's record
/// beside its snapshots: the sticky bit).
pub fn share_dir_with(dir: &Path, user: &User) -> std::io::Result<()> {
    chown(dir, Some(0), Some(user.gid))?;
    chmod(dir, 0o1770)
}

/// `file` in `dir` readable, not writable, by `user`: both root's with
/// its group, `dir` 0750 and `file` 0640 (a built template's image).
pub fn share_read_only(dir: &Path, file: &Path, user: &User) -> std::io::Result<()> {
    chown(dir, Some(0), Some(user.gid))?;
    chmod(dir, 0o750)?;
    chown(file, Some(0), Some(user.gid))?;
    chmod(file, 0o640)
}

/// Gives `files` that exist to `user` (files an unjailed daemon wrote,
/// which a jailed VMM now reads).
pub fn give_files(files: &[PathBuf], user: &User) -> std::io::Result<()> {
    for f in files {
        match std::fs::symlink_metadata(f) {
            Ok(m) if m.is_file() && (m.uid(), m.gid()) != (user.uid, user.gid) => {
                chown(f, Some(user.uid), Some(user.gid))?;
            }
            _ => {}
        }
    }
    Ok(())
}

/// Whether `user` may read `file` (a path a user gave, such as a sandbox
/// template's image): its mode and its directories', by owner, group
/// (its own or a supplementary one) or others; `Err` says what to change.
pub fn check_readable(file: &Path, user: &User) -> Result<(), String> {
    let may = |p: &Path, bits: u32| -> Result<bool, String> {
        let m = std::fs::metadata(p).map_err(|e| format!("{}: {e}", p.display()))?;
        let mode = m.mode();
        Ok(if m.uid() == user.uid {
            mode & (bits << 6) != 0
        } else if m.gid() == user.gid || user.groups.contains(&m.gid()) {
            mode & (bits << 3) != 0
        } else {
            mode & bits != 0
        })
    };
    let file = std::fs::canonicalize(file).map_err(|e| format!("{}: {e}", file.display()))?;
    for dir in file.ancestors().skip(1) {
        if !may(dir, 0o1)? {
            return Err(format!(
                "{} is not reachable by the jailed VMMs (uid {}, groups {} and {:?}): its directory {} lets them not through (chmod o+x, or g+x with group {})",
                file.display(),
                user.uid,
                user.gid,
                user.groups,
                dir.display(),
                user.groups.first().copied().unwrap_or(user.gid)
            ));
        }
    }
    if !may(&file, 0o4)? {
        return Err(format!(
            "{} is not readable by the jailed VMMs (uid {}, groups {} and {:?}): make it readable (chmod o+r, or chgrp {} and chmod g+r), or run spore serve with --no-jail",
            file.display(),
            user.uid,
            user.gid,
            user.groups,
            user.groups.first().copied().unwrap_or(user.gid)
        ));
    }
    Ok(())
}

fn chown(path: &Path, uid: Option<u32>, gid: Option<u32>) -> std::io::Result<()> {
    std::os::unix::fs::lchown(path, uid, gid)
        .map_err(|e| std::io::Error::new(e.kind(), format!("chown {}: {e}", path.display())))
}

fn chmod(path: &Path, mode: u32) -> std::io::Result<()> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| std::io::Error::new(e.kind(), format!("chmod {}: {e}", path.display())))
}

/// `dir` root's, mode 0710 with the shared group: VMMs pass through it to
/// paths they are given, and cannot list it.
fn traversable(dir: &Path, gid: u32) -> std::io::Result<()> {
    chown(dir, Some(0), Some(gid))?;
    chmod(dir, 0o710)
}

/// Gives `path` (and all it holds) to `user`: a directory its VMM writes
/// into (its run directory, a snapshot being written).
pub fn own_tree(path: &Path, user: &User) -> std::io::Result<()> {
    for p in tree(path)? {
        chown(&p, Some(user.uid), Some(user.gid))?;
    }
    Ok(())
}

/// Lets the shared group read `path` and all it holds (directories
/// listable, files readable, nothing writable): code by hash, runtime
/// bases. The owner stays.
pub fn share_tree(path: &Path, gid: u32) -> std::io::Result<()> {
    for p in tree(path)? {
        let meta = std::fs::symlink_metadata(&p)?;
        if meta.file_type().is_symlink() {
            continue;
        }
        chown(&p, None, Some(gid))?;
        let owner = meta.mode() & 0o700;
        let group = if meta.is_dir() { 0o050 } else { 0o040 };
        chmod(&p, owner | group)?;
    }
    Ok(())
}

/// Lets the shared group read `file` and pass through its directory
/// (not list it): one file of a directory whose others stay private.
pub fn share_file(file: &Path, gid: u32) -> std::io::Result<()> {
    let add = |p: &Path, bits: u32| -> std::io::Result<()> {
        let mode = std::fs::metadata(p)?.mode() & 0o7777;
        chown(p, None, Some(gid))?;
        if mode & bits != bits {
            chmod(p, mode | bits)?;
        }
        Ok(())
    };
    if let Some(dir) = file.parent() {
        add(dir, 0o010)?;
    }
    add(file, 0o040)
}

/// `path` and everything under it, without following symbolic links.
fn tree(path: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out = vec![path.to_path_buf()];
    let mut i = 0;
    while i < out.len() {
        let p = out[i].clone();
        i += 1;
        if std::fs::symlink_metadata(&p)?.is_dir() {
            for entry in std::fs::read_dir(&p)? {
                out.push(entry?.path());
            }
        }
    }
    Ok(out)
}

/// The owner of `path` as a user (for files made by root on a VMM's
/// behalf, e.g. a merged snapshot, given back to the VMM's uid).
pub fn owner_of(path: &Path) -> std::io::Result<(u32, u32)> {
    let m = std::fs::metadata(path)?;
    Ok((m.uid(), m.gid()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uid_ranges_parse_and_bad_ones_say_why() {
        assert_eq!(
            "100000:65536".parse::<UidRange>().unwrap(),
            UidRange::default()
        );
        for bad in ["", "5", "0:10", "5:1", "x:5", "4294967295:2"] {
            assert!(bad.parse::<UidRange>().is_err(), "{bad:?} parsed");
        }
        let u = User {
            uid: 7,
            gid: 7,
            groups: vec![5],
        };
        assert_eq!(u.arg(), "7:7:5");
    }

    #[test]
    fn readability_for_a_jailed_user_follows_owner_group_and_others() {
        let dir = std::env::temp_dir().join(format!("spore-jail-read-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        chmod(&dir, 0o755).unwrap();
        let file = dir.join("rootfs.ext4");
        std::fs::write(&file, b"x").unwrap();
        // SAFETY: getegid takes no arguments.
        let my_gid = unsafe { libc::getegid() };
        let stranger = User {
            uid: 4_000_001,
            gid: 4_000_001,
            groups: vec![4_000_000],
        };
        chmod(&file, 0o644).unwrap();
        assert!(check_readable(&file, &stranger).is_ok());
        chmod(&file, 0o640).unwrap();
        let e = check_readable(&file, &stranger).unwrap_err();
        assert!(e.contains("not readable") && e.contains("--no-jail"), "{e}");
        // Its group is one of the user's supplementary groups.
        let member = User {
            groups: vec![my_gid],
            ..stranger.clone()
        };
        assert!(check_readable(&file, &member).is_ok());
        // A directory on the way that lets others not through.
        chmod(&file, 0o644).unwrap();
        chmod(&dir, 0o700).unwrap();
        let e = check_readable(&file, &stranger).unwrap_err();
        assert!(e.contains("not reachable"), "{e}");
        assert!(check_readable(&dir.join("missing"), &stranger).is_err());
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_shared_dir_is_sticky_and_group_writable() {
        let dir = std::env::temp_dir().join(format!("spore-jail-sticky-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // SAFETY: getegid takes no arguments.
        let gid = unsafe { libc::getegid() };
        let user = User {
            uid: 0,
            gid,
            groups: Vec::new(),
        };
        share_dir_with(&dir, &user).unwrap();
        let m = std::fs::metadata(&dir).unwrap();
        assert_eq!((m.mode() & 0o7777, m.gid()), (0o1770, gid));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_shared_tree_is_group_readable_and_keeps_its_owner() {
        let dir = std::env::temp_dir().join(format!("spore-jail-share-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::fs::write(dir.join("sub/f"), b"x").unwrap();
        chmod(&dir.join("sub/f"), 0o600).unwrap();
        chmod(&dir.join("sub"), 0o700).unwrap();
        // SAFETY: getegid takes no arguments.
        let gid = unsafe { libc::getegid() };
        share_tree(&dir, gid).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().mode() & 0o777;
        assert_eq!(mode(&dir.join("sub")), 0o750);
        assert_eq!(mode(&dir.join("sub/f")), 0o640);
        let _ = std::fs::remove_dir_all(dir);
    }
}
