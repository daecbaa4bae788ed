//! The jailer's process steps: inherited descriptors closed, resource
//! limits, the network namespace, daemonizing, the PID namespace, the
//! uid/gid drop and the exec of the jailed binary.

use std::ffi::{CString, OsString};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use anyhow::Context;

use super::args::Limit;
use super::sys::{check, cstr};

/// Firecracker's jailer bounds open files to this when no `no-file` limit
/// is given.
const DEFAULT_NO_FILE: u64 = 2048;

/// Closes every descriptor above stderr the jailer inherited: the jailed
/// VMM must hold nothing of its caller's but stdio.
pub fn close_inherited_fds() -> anyhow::Result<()> {
    // SAFETY: close_range on descriptors this process owns; nothing in
    // this single-threaded process uses them after.
    let r = unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) };
    if r == 0 {
        return Ok(());
    }
    // Kernels before 5.9: close what /proc/self/fd lists.
    let fds: Vec<i32> = std::fs::read_dir("/proc/self/fd")
        .context("list /proc/self/fd")?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|&fd| fd > 2)
        .collect();
    for fd in fds {
        // SAFETY: as above; the directory's own fd is gone already (EBADF).
        unsafe { libc::close(fd) };
    }
    Ok(())
}

/// setrlimit's resource type: glibc's enum, musl's int.
#[cfg(target_env = "gnu")]
type Resource = libc::__rlimit_resource_t;
#[cfg(not(target_env = "gnu"))]
type Resource = libc::c_int;

fn setrlimit(resource: Resource, n: u64, what: &str) -> anyhow::Result<()> {
    let lim = libc::rlimit {
        rlim_cur: n,
        rlim_max: n,
    };
    // SAFETY: setrlimit reads one rlimit.
    check(unsafe { libc::setrlimit(resource, &lim) }).with_context(|| format!("set {what} to {n}"))
}

/// Sets the asked limits (and Firecracker's default for open files).
pub fn set_limits(limits: &[Limit]) -> anyhow::Result<()> {
    let mut no_file = DEFAULT_NO_FILE;
    for l in limits {
        match *l {
            Limit::FileSize(n) => setrlimit(libc::RLIMIT_FSIZE, n, "the file size limit")?,
            Limit::OpenFiles(n) => no_file = n,
        }
    }
    setrlimit(libc::RLIMIT_NOFILE, no_file, "the open file limit")
}

/// Joins the network namespace a handle names.
pub fn join_netns(path: &Path) -> anyhow::Result<()> {
    let f = File::open(path).with_context(|| format!("open netns {}", path.display()))?;
    // SAFETY: setns on a descriptor we hold.
    check(unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) })
        .with_context(|| format!("join the network namespace {}", path.display()))
}

fn fork() -> anyhow::Result<libc::pid_t> {
    // SAFETY: the jailer is single-threaded; the child only makes syscalls
    // and execs (or exits).
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(std::io::Error::last_os_error()).context("fork");
    }
    Ok(pid)
}

/// Detaches (fork, setsid, fork: no controlling terminal can come back)
/// and puts stdin, stdout and stderr on `dev_null`. Only the last child
/// returns; the others exit 0.
pub fn daemonize(dev_null: File) -> anyhow::Result<()> {
    if fork()? != 0 {
        // SAFETY: leaving without running anything else.
        unsafe { libc::_exit(0) };
    }
    // SAFETY: setsid takes no arguments.
    check(unsafe { libc::setsid() }).context("setsid")?;
    if fork()? != 0 {
        // SAFETY: as above.
        unsafe { libc::_exit(0) };
    }
    for fd in 0..3 {
        // SAFETY: dup2 onto stdio from a descriptor we hold.
        check(unsafe { libc::dup2(dev_null.as_raw_fd(), fd) }).context("redirect stdio")?;
    }
    Ok(())
}

/// Forks the VMM-to-be as pid 1 of a new PID namespace. The parent (the
/// jailer) calls `parent_done` with the child's pid and exits 0, as
/// Firecracker's does; only the child returns.
pub fn fork_into_pid_ns(parent_done: impl FnOnce(i32) -> anyhow::Result<()>) -> anyhow::Result<()> {
    // SAFETY: getsid/getpid take no pointers.
    let leader = unsafe { libc::getsid(0) == libc::getpid() };
    // SAFETY: unshare with a flag; affects children only.
    check(unsafe { libc::unshare(libc::CLONE_NEWPID) }).context("unshare a PID namespace")?;
    let child = fork()?;
    if child != 0 {
        let code = match parent_done(child) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("jailer: error: {}", crate::one_line(&e));
                // SAFETY: stopping the child we just made.
                unsafe { libc::kill(child, libc::SIGKILL) };
                1
            }
        };
        // SAFETY: leaving without running anything else.
        unsafe { libc::_exit(code) };
    }
    if leader {
        // The jailer led its session: its exit would send this child
        // SIGHUP; a session of its own avoids that.
        // SAFETY: setsid takes no arguments.
        check(unsafe { libc::setsid() }).context("setsid")?;
    }
    Ok(())
}

/// Becomes `uid`/`gid` with no supplementary groups, for good (real,
/// effective and saved ids: no way back to root, capabilities gone).
pub fn drop_privileges(uid: u32, gid: u32) -> anyhow::Result<()> {
    // SAFETY: plain id syscalls.
    unsafe {
        check(libc::setgroups(0, std::ptr::null())).context("setgroups")?;
        check(libc::setresgid(gid, gid, gid)).with_context(|| format!("setresgid {gid}"))?;
        check(libc::setresuid(uid, uid, uid)).with_context(|| format!("setresuid {uid}"))?;
    }
    Ok(())
}

/// Execs `path` with `args` and an empty environment (nothing of the
/// caller's reaches the VMM). Returns only on failure.
pub fn exec(path: &Path, args: &[OsString]) -> anyhow::Error {
    let run = || -> anyhow::Result<()> {
        let prog = cstr(path.as_os_str().as_bytes())?;
        let argv: Vec<CString> = std::iter::once(Ok(prog.clone()))
            .chain(args.iter().map(|a| cstr(a.as_bytes())))
            .collect::<anyhow::Result<_>>()?;
        let mut ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
        ptrs.push(std::ptr::null());
        let envp: [*const libc::c_char; 1] = [std::ptr::null()];
        // SAFETY: NUL-terminated strings in null-terminated arrays that
        // outlive the call.
        unsafe { libc::execve(prog.as_ptr(), ptrs.as_ptr(), envp.as_ptr()) };
        Err(std::io::Error::last_os_error()).with_context(|| format!("exec {}", path.display()))
    };
    match run() {
        Ok(()) => anyhow::anyhow!("exec returned"),
        Err(e) => e,
    }
}
