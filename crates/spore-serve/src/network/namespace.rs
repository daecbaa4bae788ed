//! What is done inside an instance's network namespace, or to its name:
//! a thread that entered it runs the commands and writes that must happen
//! there, a `/dev/net/tun` opened there for a clone that may not enter it,
//! its tap given to a jailed VMM's user, and a spare namespace renamed an
//! instance's.

use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;

use super::{NetError, Network, TAP_NAME};

/// Writes 1 to `/proc/sys/<key>` (of the calling thread's network
/// namespace); a missing key (no IPv6 in this kernel) is an error only if
/// `required`.
pub(super) fn set_sysctl(key: &str, required: bool) -> Result<(), NetError> {
    let path = Path::new("/proc/sys").join(key);
    match std::fs::write(&path, b"1") {
        Ok(()) => Ok(()),
        Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(NetError::Namespace {
            name: String::new(),
            detail: format!("writing 1 to {}: {e}", path.display()),
        }),
    }
}

/// `/dev/net/tun` opened in namespace `name` (by a thread that entered
/// it): a process outside it, given this descriptor, opens the namespace's
/// tap by its name (`TUNSETIFF` looks the device up in the namespace the
/// descriptor was opened in). For a clone whose user may not enter the
/// namespace. Blocking.
pub(super) fn open_tun_in(name: &str) -> Result<std::fs::File, NetError> {
    tap_in(name, None, true)?.ok_or_else(|| NetError::Namespace {
        name: name.to_string(),
        detail: "opening /dev/net/tun in it: no descriptor".into(),
    })
}

/// In one visit of namespace `name`: its tap given to `owner` (uid, gid),
/// and with `handoff` a `/dev/net/tun` opened there and returned (see
/// [`open_tun_in`]). Blocking.
pub(super) fn tap_in(
    name: &str,
    owner: Option<(u32, u32)>,
    handoff: bool,
) -> Result<Option<std::fs::File>, NetError> {
    let open = || {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open("/dev/net/tun")
            .map_err(|e| format!("opening /dev/net/tun in it: {e}"))
    };
    let (tx, rx) = std::sync::mpsc::channel();
    in_namespace(name, move || {
        let done = (|| {
            if let Some((uid, gid)) = owner {
                give_tap(&open()?, uid, gid)
                    .map_err(|e| format!("giving {TAP_NAME} to uid {uid}: {e}"))?;
            }
            handoff.then(open).transpose()
        })();
        let _ = tx.send(done);
        Ok(())
    })?;
    match rx.recv() {
        Ok(Ok(tun)) => Ok(tun),
        Ok(Err(detail)) => Err(NetError::Namespace {
            name: name.to_string(),
            detail,
        }),
        Err(_) => Err(NetError::Namespace {
            name: name.to_string(),
            detail: "no answer from its thread".into(),
        }),
    }
}

/// Moves the named namespace at `old` to `new`: `new` bound to the same
/// namespace, then `old` unbound and removed (the namespace lives on
/// through `new`).
pub(super) fn rename_namespace(old: &Path, new: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt as _;
    let c = |p: &Path| {
        std::ffi::CString::new(p.as_os_str().as_bytes())
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))
    };
    let (old_c, new_c) = (c(old)?, c(new)?);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o444)
        .open(new)?;
    // SAFETY: two valid C strings; a plain bind mount.
    let bound = unsafe {
        libc::mount(
            old_c.as_ptr(),
            new_c.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        )
    };
    if bound != 0 {
        let e = std::io::Error::last_os_error();
        let _ = std::fs::remove_file(new);
        return Err(e);
    }
    // SAFETY: a valid C string; detaching the old name's bind mount.
    if unsafe { libc::umount2(old_c.as_ptr(), libc::MNT_DETACH) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    std::fs::remove_file(old)
}

/// Gives the persistent tap [`TAP_NAME`] of the namespace `tun` was opened
/// in to `uid`/`gid` (as `ip tuntap add … user U group G` does).
fn give_tap(tun: &std::fs::File, uid: u32, gid: u32) -> std::io::Result<()> {
    use std::os::fd::AsRawFd as _;
    #[repr(C)]
    struct IfReq {
        name: [u8; libc::IFNAMSIZ],
        flags: libc::c_short,
        _pad: [u8; 22],
    }
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        // As iproute2 makes it: a tap without packet information.
        #[allow(
            clippy::cast_possible_truncation,
            reason = "IFF_TAP | IFF_NO_PI is 0x1002, a short's flags"
        )]
        flags: (libc::IFF_TAP | libc::IFF_NO_PI) as libc::c_short,
        _pad: [0; 22],
    };
    req.name[..TAP_NAME.len()].copy_from_slice(TAP_NAME.as_bytes());
    let fd = tun.as_raw_fd();
    let check = |rc: libc::c_int| match rc {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    };
    // SAFETY: TUNSETIFF reads an ifreq we own.
    check(unsafe { libc::ioctl(fd, libc::TUNSETIFF, &mut req) })?;
    // SAFETY: TUNSETOWNER and TUNSETGROUP take an integer argument.
    check(unsafe { libc::ioctl(fd, libc::TUNSETOWNER, libc::c_ulong::from(uid)) })?;
    // SAFETY: as above.
    check(unsafe { libc::ioctl(fd, libc::TUNSETGROUP, libc::c_ulong::from(gid)) })?;
    Ok(())
}

/// Runs `f` on a new thread that entered namespace `name` first (setns
/// changes only the calling thread, and the thread ends with `f`, so no
/// other thread of the daemon ever runs in the namespace); commands `f`
/// starts run there too.
pub(super) fn in_namespace<F>(name: &str, f: F) -> Result<(), NetError>
where
    F: FnOnce() -> Result<(), NetError> + Send + 'static,
{
    use std::os::fd::AsRawFd;
    let path = Network::namespace_path(name);
    let owned = name.to_string();
    let failed = move |detail: String| NetError::Namespace {
        name: owned.clone(),
        detail,
    };
    let file = std::fs::File::open(&path).map_err(|e| failed(format!("opening: {e}")))?;
    let joined = std::thread::Builder::new()
        .name("netns-setup".into())
        .spawn(move || {
            // SAFETY: setns on a file descriptor we own, on this thread only.
            if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(format!("entering: {}", std::io::Error::last_os_error()));
            }
            f().map_err(|e| e.to_string())
        })
        .map_err(|e| failed(format!("starting a thread: {e}")))?
        .join();
    match joined {
        Ok(Ok(())) => Ok(()),
        Ok(Err(detail)) => Err(failed(detail)),
        Err(_) => Err(failed("the setup thread panicked".into())),
    }
}
