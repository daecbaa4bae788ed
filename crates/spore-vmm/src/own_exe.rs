//! spore's own executable, which a clone source runs again (its clone
//! processes, its clone factory): which file it is, opened before the
//! seccomp filter, and started by descriptor, since the filter has no
//! `execve`.
//!
//! A compromised VMM thread must not run another program. Yet a clone
//! source starts processes of spore itself, under the filter it runs, after
//! the filter is in place. So the executable is opened once, before the
//! filters are compiled ([`open_at_start`]), at a descriptor number that the
//! filter names: `execveat(that fd, "", …, AT_EMPTY_PATH)` is the only exec
//! it allows. The new process inherits both the descriptor (not
//! close-on-exec, at the same number, told in [`EXE_FD_ENV`]) and the
//! filter, so it can start processes of spore in turn and nothing else.
//!
//! std's `Command` cannot exec by descriptor without a `pre_exec` hook,
//! which forces `fork()`: a fork of a source copies its page tables and
//! write-protects its private guest memory, the cost a template avoids.
//! [`spawn`] does what `posix_spawn` does instead: a `CLONE_VM |
//! CLONE_VFORK` child on a stack of its own, which sets up its descriptors,
//! signals and process group and execs, while the parent waits.

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::OnceLock;

/// The environment variable that tells a spawned process which descriptor
/// holds the executable (the number its inherited filter names).
pub const EXE_FD_ENV: &str = "SPORE_VMM_EXE_FD";

/// The program clones run and the name they run under (their `argv[0]`):
/// this very executable, through `/proc/self/exe`, so that a clone runs the
/// source's own version of spore even after the file was replaced on disk
/// (an upgrade): the handoff between them is not a stable format. The name
/// stays the executable's path (what `ps` and `spore serve`'s recovery
/// look for). `SPORE_CLONE_EXE` names another program instead. Without
/// /proc (in a jail) it is `argv[0]`, the absolute path the jailer ran.
pub fn path_and_name() -> io::Result<(PathBuf, PathBuf)> {
    if let Some(p) = std::env::var_os("SPORE_CLONE_EXE") {
        return Ok((PathBuf::from(&p), PathBuf::from(p)));
    }
    let path = match std::env::current_exe() {
        Ok(p) => p,
        // No /proc (a jail: spore's or Firecracker's jailer mounts none):
        // the jailer ran the binary by its absolute path inside the jail.
        Err(source) => match std::env::args_os().next().map(PathBuf::from) {
            Some(p) if p.is_absolute() && p.is_file() => p,
            _ => return Err(source),
        },
    };
    // A replaced executable reads as "PATH (deleted)": the name is PATH.
    let name = path
        .to_str()
        .and_then(|p| p.strip_suffix(" (deleted)"))
        .map_or_else(|| path.clone(), PathBuf::from);
    let program = Path::new("/proc/self/exe");
    if program.exists() {
        Ok((program.to_path_buf(), name))
    } else {
        Ok((path, name))
    }
}

/// The executable's descriptor, or why there is none.
static EXE: OnceLock<Result<RawFd, String>> = OnceLock::new();

/// Opens the executable clone processes are started from (or takes the one
/// this process inherited, named by [`EXE_FD_ENV`]). Call before the
/// seccomp filters are compiled; later calls change nothing.
pub fn open_at_start() {
    EXE.get_or_init(|| inherited().map_or_else(open, Ok));
}

/// The executable's descriptor, if [`open_at_start`] opened one.
pub fn fd() -> Option<RawFd> {
    EXE.get().and_then(|r| r.as_ref().ok().copied())
}

/// The descriptor this process inherited from the VMM that started it.
fn inherited() -> Option<RawFd> {
    let fd: RawFd = std::env::var(EXE_FD_ENV).ok()?.parse().ok()?;
    // SAFETY: a stat is plain data; fstat fills it (a bad fd is an error).
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let ok = unsafe { libc::fstat(fd, &mut st) } == 0;
    (fd > 2 && ok && st.st_mode & libc::S_IFMT == libc::S_IFREG).then_some(fd)
}

/// Opens the executable read-only and inheritable (execveat needs read or
/// `O_PATH` access; `O_PATH` is not among the filter's open flags).
fn open() -> Result<RawFd, String> {
    let (path, _) = path_and_name().map_err(|e| format!("finding it: {e}"))?;
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: open on a NUL-terminated path; the result is checked.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY) };
    if fd < 0 {
        return Err(format!(
            "opening {}: {}",
            path.display(),
            io::Error::last_os_error()
        ));
    }
    Ok(fd)
}

/// A process [`spawn`] started: this process's child, reaped by
/// [`Spawned::wait`] or [`Spawned::try_wait`] (as `std::process::Child`).
#[derive(Debug)]
pub struct Spawned {
    pid: libc::pid_t,
    status: Option<ExitStatus>,
}

impl Spawned {
    pub fn id(&self) -> u32 {
        self.pid.cast_unsigned()
    }

    /// Its exit status if it has exited (reaping it), else `None`.
    pub fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        self.reap(libc::WNOHANG)
    }

    /// Waits for it to exit (reaping it).
    pub fn wait(&mut self) -> io::Result<ExitStatus> {
        loop {
            match self.reap(0) {
                Ok(Some(s)) => return Ok(s),
                Ok(None) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// SIGKILL, unless it was reaped already (its pid may be reused).
    pub fn kill(&mut self) -> io::Result<()> {
        if self.status.is_some() {
            return Ok(());
        }
        // SAFETY: kill on our own unreaped child.
        if unsafe { libc::kill(self.pid, libc::SIGKILL) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn reap(&mut self, flags: libc::c_int) -> io::Result<Option<ExitStatus>> {
        if let Some(s) = self.status {
            return Ok(Some(s));
        }
        let mut status = 0;
        // SAFETY: waitpid on our own child, status into a local.
        match unsafe { libc::waitpid(self.pid, &mut status, flags) } {
            0 => Ok(None),
            p if p < 0 => Err(io::Error::last_os_error()),
            _ => {
                let s = ExitStatus::from_raw(status);
                self.status = Some(s);
                Ok(Some(s))
            }
        }
    }
}

/// What the child needs, prepared before the clone: it may only make
/// system calls, never allocate or lock.
struct ChildPlan {
    exe: RawFd,
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
    stdin: RawFd,
    stdout: RawFd,
    stderr: RawFd,
    /// The parent thread's signal mask, put back after the clone.
    mask: libc::sigset_t,
    /// The child's: empty, as std's `Command` gives its children (the
    /// VMM's threads block the host signals its signal thread waits for).
    child_mask: libc::sigset_t,
    /// The errno of the step that failed (0: it exec'd).
    errno: AtomicI32,
}

/// Starts the executable as `arg0 args…` in a process group of its own,
/// stdin a pipe closed at once (it reads as end of file; a jail has no
/// /dev/null), stdout and stderr on the given descriptors, the environment
/// this process's with [`EXE_FD_ENV`]. Descriptors the caller made
/// inheritable are passed on.
pub fn spawn(arg0: &Path, args: &[OsString], stdout: RawFd, stderr: RawFd) -> io::Result<Spawned> {
    let exe = match EXE.get() {
        Some(Ok(fd)) => *fd,
        Some(Err(why)) => {
            return Err(io::Error::other(format!(
                "the spore executable was not opened at start ({why})"
            )))
        }
        None => return Err(io::Error::other("the spore executable was never opened")),
    };
    let cstr = |s: &OsStr| CString::new(s.as_bytes()).map_err(io::Error::other);
    let argv: Vec<CString> = std::iter::once(arg0.as_os_str())
        .chain(args.iter().map(OsString::as_os_str))
        .map(cstr)
        .collect::<io::Result<_>>()?;
    let mut envp: Vec<CString> = std::env::vars_os()
        .filter(|(k, _)| k != EXE_FD_ENV && !crate::privilege::is_handle_env(k))
        .map(|(k, v)| {
            let mut kv = k;
            kv.push("=");
            kv.push(v);
            cstr(&kv)
        })
        .collect::<io::Result<_>>()?;
    envp.push(cstr(OsStr::new(&format!("{EXE_FD_ENV}={exe}")))?);
    for kv in crate::privilege::child_env() {
        envp.push(cstr(OsStr::new(&kv))?);
    }
    let stdin = StdinPipe::new()?;
    let mut plan = ChildPlan {
        exe,
        argv: nul_terminated(&argv),
        envp: nul_terminated(&envp),
        stdin: stdin.read,
        stdout,
        stderr,
        // SAFETY: a sigset_t is plain data; filled below.
        mask: unsafe { std::mem::zeroed() },
        // SAFETY: as above; emptied below.
        child_mask: unsafe { std::mem::zeroed() },
        errno: AtomicI32::new(0),
    };
    let pid = clone_and_exec(&mut plan)?;
    drop(stdin);
    let mut child = Spawned { pid, status: None };
    match plan.errno.load(Ordering::SeqCst) {
        0 => Ok(child),
        e => {
            let _ = child.wait();
            Err(io::Error::from_raw_os_error(e))
        }
    }
}

fn nul_terminated(strings: &[CString]) -> Vec<*const libc::c_char> {
    strings
        .iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

/// The stdin pipe: the child's end is its stdin, ours is closed at once.
struct StdinPipe {
    read: RawFd,
    write: RawFd,
}

impl StdinPipe {
    fn new() -> io::Result<Self> {
        let mut fds = [0; 2];
        // SAFETY: pipe2 into a local array; close-on-exec, the child dups it.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(StdinPipe {
            read: fds[0],
            write: fds[1],
        })
    }
}

impl Drop for StdinPipe {
    fn drop(&mut self) {
        // SAFETY: our own pipe's fds, closed once.
        unsafe {
            libc::close(self.read);
            libc::close(self.write);
        }
    }
}

/// The child's stack: it runs only [`child_main`], which calls no more than
/// a few system calls.
const CHILD_STACK: usize = 64 * 1024;

/// Clones a child that shares this memory and runs [`child_main`]; returns
/// when it has exec'd or exited (`CLONE_VFORK`). Every signal is blocked
/// meanwhile, so none of this process's handlers runs on the child's stack.
fn clone_and_exec(plan: &mut ChildPlan) -> io::Result<libc::pid_t> {
    let mut stack = vec![0u8; CHILD_STACK];
    // The stack's end, aligned down to 16 bytes as both ABIs want.
    let top = stack.as_mut_ptr().wrapping_add(CHILD_STACK);
    let top = top.wrapping_sub(top.addr() % 16);
    // SAFETY: sigset operations on locals; pthread_sigmask on this thread.
    unsafe {
        libc::sigemptyset(&mut plan.child_mask);
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut plan.mask);
    }
    let arg: *mut ChildPlan = plan;
    // SAFETY: CLONE_VM | CLONE_VFORK: the child runs on `stack` in this
    // memory while this thread is suspended, until it execs or exits;
    // `plan` and `stack` outlive that. SIGCHLD makes it a normal child.
    let pid = unsafe {
        libc::clone(
            child_main,
            top.cast(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            arg.cast(),
        )
    };
    let err = io::Error::last_os_error();
    // SAFETY: restores this thread's mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &plan.mask, std::ptr::null_mut()) };
    drop(stack);
    if pid < 0 {
        return Err(err);
    }
    Ok(pid)
}

/// The child: descriptors, default signal handlers, its own process group,
/// no signal blocked, then `execveat` of the executable's fd. Only
/// system calls: it shares the parent's memory, allocator included.
extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the parent's ChildPlan, alive while this runs.
    let plan = unsafe { &*arg.cast::<ChildPlan>() };
    let fail = || -> libc::c_int {
        let e = io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO);
        plan.errno.store(e, Ordering::SeqCst);
        // SAFETY: ends the child without touching the shared memory's state.
        unsafe { libc::_exit(127) }
    };
    // SAFETY: system calls on the plan's fds and locals.
    unsafe {
        // Handlers are this memory's code: back to the default before any
        // signal can be delivered (those ignored stay ignored, as exec
        // keeps them; SIGPIPE back to default, as std's Command does).
        for sig in 1..=libc::SIGRTMAX() {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut old) != 0 {
                continue;
            }
            let ignored = old.sa_sigaction == libc::SIG_IGN && sig != libc::SIGPIPE;
            if old.sa_sigaction != libc::SIG_DFL && !ignored {
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(sig, &dfl, std::ptr::null_mut());
            }
        }
        for (from, to) in [(plan.stdin, 0), (plan.stdout, 1), (plan.stderr, 2)] {
            // dup2 onto itself keeps close-on-exec: clear it instead.
            let done = if from == to {
                libc::fcntl(to, libc::F_SETFD, 0)
            } else {
                libc::dup2(from, to)
            };
            if done < 0 {
                return fail();
            }
        }
        if libc::setpgid(0, 0) < 0 {
            return fail();
        }
        libc::sigprocmask(libc::SIG_SETMASK, &plan.child_mask, std::ptr::null_mut());
        libc::syscall(
            libc::SYS_execveat,
            plan.exe,
            c"".as_ptr(),
            plan.argv.as_ptr(),
            plan.envp.as_ptr(),
            libc::AT_EMPTY_PATH,
        );
    }
    fail()
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use super::*;

    /// The test binary stands in for spore: spawned by its descriptor, it
    /// lists its tests and exits 0; a reaped child is not signalled again.
    #[test]
    fn the_executable_runs_by_its_descriptor() {
        open_at_start();
        assert!(fd().is_some_and(|fd| fd > 2), "{:?}", EXE.get());
        let null = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/null")
            .unwrap();
        let out = null.as_raw_fd();
        let mut child = spawn(Path::new("spore-test"), &["--list".into()], out, out).unwrap();
        let status = child.wait().unwrap();
        assert!(status.success(), "{status}");
        assert_eq!(child.try_wait().unwrap(), Some(status));
        child.kill().unwrap();
    }
}
