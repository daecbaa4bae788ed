//! The jail's file system: `<base>/<exec>/<id>/root` with a copy of the exec
//! file, the few directories a VMM writes to and the device nodes a VM
//! needs, all owned by the VMM's user; then the switch into it (a new mount
//! namespace, pivot_root, the old root unmounted).

use std::ffi::CString;
use std::fs::{DirBuilder, File, OpenOptions};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

use super::args::Plan;
use super::sys::{check, cstr};

/// Directories made inside the jail, owned by the VMM's user, 0700: the
/// root (the API socket, snapshots), /dev and /dev/net for the nodes, /run
/// for Firecracker's default socket path.
const DIRS: [&str; 4] = ["", "dev", "dev/net", "run"];

/// A device node the jail gets: its path inside, and the numbers used
/// when the host has no such node to copy them from (None: skipped then).
struct Node {
    path: &'static str,
    fallback: Option<(u32, u32)>,
}

/// What a VM needs: KVM, TUN for network devices, userfaultfd for
/// snapshot restores served by a page-fault handler (only where the host
/// has it: its minor number is dynamic).
const NODES: [Node; 3] = [
    Node {
        path: "dev/kvm",
        fallback: Some((10, 232)),
    },
    Node {
        path: "dev/net/tun",
        fallback: Some((10, 200)),
    },
    Node {
        path: "dev/userfaultfd",
        fallback: None,
    },
];

/// What the jailer created on the host, removed again if it fails before
/// the VMM runs.
#[derive(Default)]
pub struct Made {
    /// The first directory of `<exec>/<id>/root` that did not exist.
    top: Option<PathBuf>,
}

impl Made {
    pub fn undo(&mut self) {
        if let Some(top) = self.top.take() {
            let _ = std::fs::remove_dir_all(top);
        }
    }
}

fn chown(path: &Path, uid: u32, gid: u32) -> anyhow::Result<()> {
    std::os::unix::fs::lchown(path, Some(uid), Some(gid))
        .with_context(|| format!("chown {}", path.display()))
}

/// Makes the jail's directory tree, the exec file's copy and the device
/// nodes. Everything created is recorded in `made`.
pub fn prepare(plan: &Plan, made: &mut Made) -> anyhow::Result<()> {
    // Remember the first missing ancestor so a failure removes exactly
    // what this run made (never a directory that was there before).
    let mut top = None;
    for dir in plan.chroot_dir.ancestors() {
        if dir.exists() {
            break;
        }
        top = Some(dir.to_path_buf());
    }
    made.top = top;
    std::fs::create_dir_all(&plan.chroot_dir)
        .with_context(|| format!("create {}", plan.chroot_dir.display()))?;
    for d in DIRS {
        let p = plan.chroot_dir.join(d);
        match DirBuilder::new().mode(0o700).create(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e).with_context(|| format!("create {}", p.display())),
        }
        let m = std::fs::symlink_metadata(&p)?;
        if !m.is_dir() {
            bail!("{} exists and is not a directory", p.display());
        }
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .with_context(|| format!("chmod {}", p.display()))?;
        chown(&p, plan.uid, plan.gid)?;
    }
    refuse_nodev(&plan.chroot_dir)?;
    copy_exec(plan)?;
    for node in &NODES {
        make_node(plan, node)?;
    }
    Ok(())
}

/// Device nodes on a `nodev` mount cannot be opened: say so now rather
/// than let the VMM fail on /dev/kvm later.
fn refuse_nodev(dir: &Path) -> anyhow::Result<()> {
    let c = cstr(dir.as_os_str().as_bytes())?;
    // SAFETY: statvfs fills the zeroed struct it is given.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a valid out pointer.
    check(unsafe { libc::statvfs(c.as_ptr(), &mut st) })
        .with_context(|| format!("statvfs {}", dir.display()))?;
    if st.f_flag & libc::ST_NODEV != 0 {
        bail!(
            "{} is on a nodev mount: device nodes there cannot be used (choose another --chroot-base-dir)",
            dir.display()
        );
    }
    Ok(())
}

/// Copies (never links: two VMMs must not share the binary's pages) the
/// exec file into the jail, through a temp file renamed into place.
fn copy_exec(plan: &Plan) -> anyhow::Result<()> {
    let dst = plan.chroot_dir.join(&plan.exec_name);
    let tmp = plan.chroot_dir.join(format!(
        ".{}.jailer-tmp-{}",
        plan.exec_name,
        std::process::id()
    ));
    let mut src = File::open(&plan.exec_file)
        .with_context(|| format!("open {}", plan.exec_file.display()))?;
    let mode = src.metadata()?.mode() & 0o7777 & !0o6000; // no set-id bits
    let result = (|| -> anyhow::Result<()> {
        let mut out = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)
            .with_context(|| format!("create {}", tmp.display()))?;
        std::io::copy(&mut src, &mut out)
            .with_context(|| format!("copy {} into the jail", plan.exec_file.display()))?;
        out.flush()?;
        out.sync_all()?;
        std::os::unix::fs::fchown(&out, Some(plan.uid), Some(plan.gid))
            .with_context(|| format!("chown {}", tmp.display()))?;
        std::fs::rename(&tmp, &dst).with_context(|| format!("rename to {}", dst.display()))?;
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

fn make_node(plan: &Plan, node: &Node) -> anyhow::Result<()> {
    let host = Path::new("/").join(node.path);
    let numbers = match std::fs::metadata(&host) {
        Ok(m) if m.file_type().is_char_device() => {
            let rdev = m.rdev();
            Some((libc::major(rdev), libc::minor(rdev)))
        }
        _ => node.fallback,
    };
    let Some((major, minor)) = numbers else {
        return Ok(());
    };
    let path = plan.chroot_dir.join(node.path);
    let c = cstr(path.as_os_str().as_bytes())?;
    // Owner read/write only: the VMM's user, set just below.
    // SAFETY: mknod on a NUL-terminated path.
    let r = unsafe {
        libc::mknod(
            c.as_ptr(),
            libc::S_IFCHR | libc::S_IRUSR | libc::S_IWUSR,
            libc::makedev(major, minor),
        )
    };
    check(r).with_context(|| {
        format!(
            "mknod {} (is id {:?} already jailed?)",
            path.display(),
            plan.id
        )
    })?;
    chown(&path, plan.uid, plan.gid)
}

/// Enters a new mount namespace whose root is the jail: `/` made private
/// (so nothing propagates back to the host), the jail bound on itself (a
/// mount point, as pivot_root needs), pivot_root, the old root detached
/// and removed.
pub fn enter(dir: &Path) -> anyhow::Result<()> {
    // SAFETY: plain syscalls with NUL-terminated paths or null pointers.
    unsafe {
        check(libc::unshare(libc::CLONE_NEWNS)).context("unshare a mount namespace")?;
        check(libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_PRIVATE | libc::MS_REC,
            std::ptr::null(),
        ))
        .context("make / private")?;
        let d: CString = cstr(dir.as_os_str().as_bytes())?;
        check(libc::mount(
            d.as_ptr(),
            d.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND | libc::MS_REC,
            std::ptr::null(),
        ))
        .with_context(|| format!("bind {} on itself", dir.display()))?;
        check(libc::chdir(d.as_ptr())).with_context(|| format!("chdir {}", dir.display()))?;
        let old = c"old_root";
        match check(libc::mkdir(old.as_ptr(), 0o700)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e).context("mkdir old_root"),
        }
        #[allow(
            clippy::cast_possible_truncation,
            reason = "pivot_root(2) returns 0 or -1, both in i32"
        )]
        let pivoted = libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), old.as_ptr()) as i32;
        check(pivoted).context("pivot_root")?;
        check(libc::chdir(c"/".as_ptr())).context("chdir /")?;
        check(libc::umount2(old.as_ptr(), libc::MNT_DETACH)).context("unmount the old root")?;
        check(libc::rmdir(old.as_ptr())).context("rmdir old_root")?;
        check(libc::chroot(c".".as_ptr())).context("chroot")?;
    }
    Ok(())
}

/// Writes `<exec>.pid` at the jail's root (0600, atomic): the VMM's pid as
/// the host sees it, for callers of a daemonized or pid-namespaced jail.
pub fn write_pid_file(exec_name: &str, pid: i32) -> anyhow::Result<()> {
    let path = PathBuf::from("/").join(format!("{exec_name}.pid"));
    let tmp = PathBuf::from("/").join(format!(
        ".{exec_name}.pid.jailer-tmp-{}",
        std::process::id()
    ));
    let result = (|| -> anyhow::Result<()> {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)?;
        write!(f, "{pid}")?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)?;
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.with_context(|| format!("write the pid file {}", path.display()))
}
