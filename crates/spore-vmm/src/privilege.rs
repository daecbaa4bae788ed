//! Running as an unprivileged user: the device handles a VMM opens while it
//! is still root, and the drop to its jail's uid and gids.
//!
//! `spore serve` starts each instance's VMM as root with `--uid`/`--gid`:
//! the VMM enters its network namespace, opens what only root may open
//! (`/dev/kvm`, `/dev/userfaultfd`, its own executable), then becomes that
//! user for good, before its seccomp filter and before any guest input.
//! What it does after that (guest memory, the API socket, snapshot files) it
//! does as that user: another function's files and the daemon's catalogue
//! are out of its reach, and it holds no capability.
//!
//! The handles are inherited by the processes the VMM starts (its clone
//! factory and clones, which never are root): not close-on-exec, at the
//! same numbers, told in [`KVM_FD_ENV`] and [`UFFD_FD_ENV`].

mod root;

use std::io;
use std::os::fd::{FromRawFd as _, RawFd};
use std::path::Path;
use std::sync::OnceLock;

pub use root::Bind;

/// The environment variable naming the inherited `/dev/kvm` descriptor.
pub const KVM_FD_ENV: &str = "SPORE_VMM_KVM_FD";
/// The environment variable naming the inherited `/dev/userfaultfd` one.
pub const UFFD_FD_ENV: &str = "SPORE_VMM_UFFD_FD";

/// The handles opened before the drop (or inherited), if any.
#[derive(Clone, Copy, Debug, Default)]
struct Handles {
    kvm: Option<RawFd>,
    uffd: Option<RawFd>,
}

static HANDLES: OnceLock<Handles> = OnceLock::new();

/// `/dev/net/tun` descriptors opened for this VMM's taps, in the order its
/// taps open: one opened before the drop (`spore serve` gives a networked
/// instance one tap), or those a clone received opened in its namespace
/// ([`give_tuns`]). Each tap needs an open of its own.
static TUN: std::sync::Mutex<Vec<std::fs::File>> = std::sync::Mutex::new(Vec::new());

/// A user and groups to become.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups (spore serve's group for shared read-only
    /// files such as runtime images).
    pub groups: Vec<u32>,
}

/// Takes the handles this process inherited from the VMM that started it
/// (a clone or clone factory of a VMM that dropped its privileges). Call
/// once at start; a process that inherited none opens devices by path.
pub fn adopt_inherited() {
    HANDLES.get_or_init(|| Handles {
        kvm: inherited(KVM_FD_ENV),
        uffd: inherited(UFFD_FD_ENV),
    });
}

/// Opens `/dev/kvm` (required), `/dev/userfaultfd` (if the kernel has it),
/// `/dev/net/tun` if `tap` (for one tap), enters `root` if given (a
/// directory and the host paths it shows, [`root::enter`]), then becomes
/// `who` for good (the caller opens the executable clones run first,
/// `own_exe`): no
/// supplementary groups but `who.groups`, real, effective and saved ids all
/// changed (no way back to root; every capability gone). The process stays
/// dumpable, as after an exec, so that its own `/proc/self` files stay its.
/// Call while the process has one thread.
pub fn drop_to(who: &Identity, tap: bool, root: Option<(&Path, &[Bind])>) -> io::Result<()> {
    let kvm = open_inheritable(c"/dev/kvm")
        .map_err(|e| io::Error::new(e.kind(), format!("opening /dev/kvm: {e}")))?;
    let uffd = open_inheritable(c"/dev/userfaultfd").ok();
    if tap {
        use std::os::unix::fs::OpenOptionsExt as _;
        let tun = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open("/dev/net/tun")
            .map_err(|e| io::Error::new(e.kind(), format!("opening /dev/net/tun: {e}")))?;
        *crate::host::lock(&TUN) = vec![tun];
    }
    if HANDLES
        .set(Handles {
            kvm: Some(kvm),
            uffd,
        })
        .is_err()
    {
        return Err(io::Error::other("the privileged handles were taken twice"));
    }
    if let Some((dir, binds)) = root {
        root::enter(dir, binds)?;
    }
    // SAFETY: plain id syscalls on values and a slice that outlives them.
    unsafe {
        check(
            libc::setgroups(who.groups.len(), who.groups.as_ptr()),
            "setgroups",
        )?;
        check(libc::setresgid(who.gid, who.gid, who.gid), "setresgid")?;
        check(libc::setresuid(who.uid, who.uid, who.uid), "setresuid")?;
        check(
            libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0),
            "PR_SET_DUMPABLE",
        )?;
    }
    // The drop is for good: root must be out of reach.
    // SAFETY: setuid takes a value.
    if who.uid != 0 && unsafe { libc::setuid(0) } == 0 {
        return Err(io::Error::other("still able to become root after the drop"));
    }
    Ok(())
}

/// A `Kvm` handle: a duplicate of the one opened before the drop, else a
/// new open of `/dev/kvm`.
pub fn kvm() -> Result<kvm_ioctls::Kvm, kvm_ioctls::Error> {
    match HANDLES.get().and_then(|h| h.kvm) {
        Some(fd) => {
            let dup = dup_cloexec(fd)
                .map_err(|e| kvm_ioctls::Error::new(e.raw_os_error().unwrap_or(libc::EBADF)))?;
            // SAFETY: `dup` is a new descriptor of /dev/kvm that nothing
            // else owns.
            Ok(unsafe { kvm_ioctls::Kvm::from_raw_fd(dup) })
        }
        None => kvm_ioctls::Kvm::new(),
    }
}

/// The next `/dev/net/tun` opened for this VMM, if any: the tap open then
/// needs no permission on the device, and finds the tap in the namespace
/// the descriptor was opened in.
pub fn take_tun() -> Option<std::fs::File> {
    let mut tuns = crate::host::lock(&TUN);
    (!tuns.is_empty()).then(|| tuns.remove(0))
}

/// Whether the taps must use descriptors given to this VMM (a clone that
/// received them): its own open of `/dev/net/tun` would be in the wrong
/// namespace.
pub fn tuns_given() -> bool {
    TUNS_GIVEN.load(std::sync::atomic::Ordering::Relaxed)
}

static TUNS_GIVEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Descriptors of `/dev/net/tun` opened in this clone's namespace, one per
/// tap in the order the taps open.
pub fn give_tuns(tuns: Vec<std::fs::File>) {
    *crate::host::lock(&TUN) = tuns;
    TUNS_GIVEN.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// The `/dev/userfaultfd` descriptor opened before the drop, if any.
pub fn userfaultfd_device() -> Option<RawFd> {
    HANDLES.get().and_then(|h| h.uffd)
}

/// `KEY=fd` entries for a child's environment, so that it inherits the
/// handles (they are not close-on-exec).
pub fn child_env() -> Vec<String> {
    let Some(h) = HANDLES.get() else {
        return Vec::new();
    };
    let mut env = Vec::new();
    if let Some(fd) = h.kvm {
        env.push(format!("{KVM_FD_ENV}={fd}"));
    }
    if let Some(fd) = h.uffd {
        env.push(format!("{UFFD_FD_ENV}={fd}"));
    }
    env
}

/// Whether `key` is one of the environment variables [`child_env`] sets.
pub fn is_handle_env(key: &std::ffi::OsStr) -> bool {
    key == KVM_FD_ENV || key == UFFD_FD_ENV
}

/// A descriptor this process inherited, named by `env`: a character
/// device above stdio.
fn inherited(env: &str) -> Option<RawFd> {
    let fd: RawFd = std::env::var(env).ok()?.parse().ok()?;
    // SAFETY: a stat is plain data; fstat fills it (a bad fd is an error).
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let ok = unsafe { libc::fstat(fd, &mut st) } == 0;
    (fd > 2 && ok && st.st_mode & libc::S_IFMT == libc::S_IFCHR).then_some(fd)
}

fn open_inheritable(path: &std::ffi::CStr) -> io::Result<RawFd> {
    // SAFETY: open on a NUL-terminated path; the result is checked.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDWR) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

fn dup_cloexec(fd: RawFd) -> io::Result<RawFd> {
    // SAFETY: F_DUPFD_CLOEXEC on a descriptor this process holds.
    let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) };
    if dup < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(dup)
}

fn check(r: libc::c_int, what: &str) -> io::Result<()> {
    if r < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("{what}: {e}")));
    }
    Ok(())
}

/// Parses `U:G[:G2,G3…]` (a uid, its gid, supplementary groups).
pub fn parse_identity(s: &str) -> Result<Identity, String> {
    let mut parts = s.splitn(3, ':');
    let num = |p: Option<&str>, what: &str| -> Result<u32, String> {
        p.ok_or_else(|| format!("{s:?}: no {what} (want UID:GID[:GROUP,…])"))?
            .parse()
            .map_err(|_| format!("{s:?}: the {what} is not a number"))
    };
    let uid = num(parts.next(), "uid")?;
    let gid = num(parts.next(), "gid")?;
    let groups = match parts.next() {
        None | Some("") => Vec::new(),
        Some(list) => list
            .split(',')
            .map(|g| num(Some(g), "supplementary group"))
            .collect::<Result<_, _>>()?,
    };
    if uid == 0 {
        return Err(format!("{s:?}: uid 0 is root, not a jail's user"));
    }
    Ok(Identity { uid, gid, groups })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_parse_and_root_is_refused() {
        let id = parse_identity("100001:100001:100000").unwrap();
        assert_eq!(id.uid, 100_001);
        assert_eq!(id.groups, vec![100_000]);
        assert_eq!(parse_identity("5:6").unwrap().groups, Vec::<u32>::new());
        for bad in ["", "5", "x:1", "0:0", "5:6:x", "5:6:7,"] {
            assert!(parse_identity(bad).is_err(), "{bad:?} parsed");
        }
    }
}
