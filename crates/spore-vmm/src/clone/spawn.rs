//! Clone processes: each clone is a `spore vmm` child of the source VMM,
//! started with `--clone-handoff FD` (one end of a socket pair; the whole
//! command line is [`ClonedProcessArgs`]) and waiting there for its
//! template ([`super::process`] is what it then does).
//!
//! They are forked by this VMM's clone factory ([`super::factory`]), a
//! process that maps no guest memory, so a clone skips spore's `execve` and
//! start-up; with `SPORE_CLONE_FACTORY=off` (or `SPORE_CLONE_EXE` set) each
//! is spawned as `posix_spawn` would, but exec'd by descriptor
//! ([`crate::own_exe`]: the VMM's filter allows no other exec). Never with
//! `fork()` of this process: that would copy the source's page tables and
//! write-protect its private guest pages, exactly the cost a template avoids. Each clone gets its own process group, so a terminal's
//! Ctrl-C to the source does not reach it, and its stdout/stderr (the
//! guest's serial console) go to `<name>.log` beside its socket.

use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::args::ClonedProcessArgs;
use super::factory::{self, ForkOrder, ForkedProcess};
use super::handoff::{recv_ready, Ready};
use super::sys::{clone_exe, poll_readable, set_inheritable};
use super::{CloneError, READY_TIMEOUT};
use crate::own_exe::{self, Spawned};

/// A started `spore vmm --clone-handoff` process.
pub struct CloneProcess {
    pub name: String,
    pub socket: PathBuf,
    pub log: PathBuf,
    pub dir: PathBuf,
    pub child: ProcessHandle,
    /// The source's end of the handoff socket.
    pub sock: UnixStream,
    /// The template it restored a clone of ahead (waiting for a go).
    pub prestarted: Option<String>,
    /// The VM size it prepared (memory bytes, vCPUs).
    pub prepared_for: Option<(u64, u8)>,
}

/// Starts a clone process named `name` in `dir`; it waits for a template.
/// With `prepare` (memory bytes, vCPUs) it makes its KVM VM and memory
/// slots for that size while it waits.
pub fn spawn(
    dir: &Path,
    name: &str,
    marks: bool,
    prepare: Option<(u64, u8)>,
) -> Result<CloneProcess, CloneError> {
    let io = |what| move |source| CloneError::Io { what, source };
    let (sock, theirs) = UnixStream::pair().map_err(io("create a handoff socket"))?;
    let socket = dir.join(format!("{name}.sock"));
    let log = dir.join(format!("{name}.log"));
    let out = crate::files::create_private(&log).map_err(io("create a clone log"))?;
    let marks_file = marks.then(|| dir.join(format!("{name}.marks.json")));
    if factory::enabled() {
        let order = ForkOrder {
            api_sock: socket.clone(),
            id: name.to_string(),
            prepare,
            marks_file,
        };
        let forked = factory::fork_clone(&order, &theirs, &out, dir)?;
        return Ok(CloneProcess {
            name: name.to_string(),
            socket,
            log,
            dir: dir.to_path_buf(),
            child: ProcessHandle::Forked(forked),
            sock,
            prestarted: None,
            prepared_for: prepare,
        });
    }
    let (_, exe_name) = clone_exe()?;
    let args = ClonedProcessArgs {
        api_sock: socket.clone(),
        id: name.to_string(),
        handoff_fd: theirs.as_raw_fd(),
        prepare,
        marks_file,
        seccomp: crate::seccomp::setting(),
    };
    // The child end must survive exec. Clearing CLOEXEC is safe: this VMM
    // spawns processes only here, one request at a time.
    set_inheritable(&theirs, true).map_err(io("pass the handoff socket"))?;
    let child = own_exe::spawn(&exe_name, &args.to_args(), out.as_raw_fd(), out.as_raw_fd());
    drop(theirs);
    let child = child.map_err(|e| CloneError::Spawn(format!("{}: {e}", exe_name.display())))?;
    Ok(CloneProcess {
        name: name.to_string(),
        socket,
        log,
        dir: dir.to_path_buf(),
        child: ProcessHandle::Spawned(child),
        sock,
        prestarted: None,
        prepared_for: prepare,
    })
}

impl CloneProcess {
    /// Waits for the clone's report; an error names its log.
    pub fn wait_ready(&self) -> Result<Ready, CloneError> {
        let fail = |detail: String| CloneError::Child {
            name: self.name.clone(),
            detail,
            log: self.log.display().to_string(),
        };
        self.sock
            .set_read_timeout(Some(READY_TIMEOUT))
            .map_err(|e| fail(e.to_string()))?;
        let ready = recv_ready(&self.sock).map_err(|e| match e {
            super::handoff::HandoffError::Closed => fail("it exited before starting".into()),
            e => fail(e.to_string()),
        })?;
        match &ready.error {
            Some(e) => Err(fail(e.clone())),
            None => Ok(ready),
        }
    }

    /// Stops a clone that failed or is no longer wanted.
    pub fn kill(mut self) {
        self.child.kill_and_wait();
        let _ = std::fs::remove_file(&self.socket);
    }

    /// Leaves the clone running on its own; a thread reaps it when it
    /// exits. The thread holds the source's end of the handoff socket
    /// until then: the clone sees it close when this process ends (its cue
    /// to end too, unless clones outlive their source).
    pub fn detach(self) -> u32 {
        let CloneProcess {
            child, name, sock, ..
        } = self;
        let mut child = match child {
            ProcessHandle::Spawned(c) => c,
            ProcessHandle::Forked(f) => {
                let pid = f.pid;
                watch_detached(Detached {
                    name,
                    process: f,
                    _sock: sock,
                });
                return pid;
            }
        };
        let pid = child.id();
        let _ = crate::seccomp::spawn(
            crate::seccomp::ThreadKind::Vmm,
            "clone-reaper".into(),
            move || {
                match child.wait() {
                    Ok(s) => tracing::info!("clone {name} (pid {pid}) exited: {s}"),
                    Err(e) => tracing::warn!("clone {name} (pid {pid}): {e}"),
                }
                drop(sock);
            },
        );
        pid
    }
}

/// A clone process: spawned (this process's child) or forked by the
/// factory (watched through its pidfd; the factory reaps it).
pub enum ProcessHandle {
    Spawned(Spawned),
    Forked(ForkedProcess),
}

impl ProcessHandle {
    /// Its process id (in this VMM's pid namespace).
    pub fn pid(&self) -> u32 {
        match self {
            ProcessHandle::Spawned(c) => c.id(),
            ProcessHandle::Forked(f) => f.pid,
        }
    }

    /// Whether it still runs (a spawned child that ended is reaped here).
    pub fn running(&mut self) -> bool {
        match self {
            ProcessHandle::Spawned(c) => matches!(c.try_wait(), Ok(None)),
            ProcessHandle::Forked(f) => !pidfd_exited(f, 0),
        }
    }

    /// SIGKILL, then waits (a forked one for at most 5 s) until it is gone.
    pub fn kill_and_wait(&mut self) {
        match self {
            ProcessHandle::Spawned(c) => {
                let _ = c.kill();
                let _ = c.wait();
            }
            ProcessHandle::Forked(f) => {
                // SAFETY: pidfd_send_signal on a pidfd we own; no siginfo.
                unsafe {
                    libc::syscall(
                        libc::SYS_pidfd_send_signal,
                        f.pidfd.as_fd().as_raw_fd(),
                        libc::SIGKILL,
                        std::ptr::null::<libc::siginfo_t>(),
                        0,
                    )
                };
                pidfd_exited(f, 5000);
            }
        }
    }
}

/// Whether the process behind the pidfd has exited, waiting up to
/// `timeout_ms` for it.
fn pidfd_exited(f: &ForkedProcess, timeout_ms: i32) -> bool {
    poll_readable(f.pidfd.as_raw_fd(), timeout_ms).unwrap_or(false)
}

/// A forked clone left running: the source's end of its handoff socket is
/// held until it exits (its cue to end with the source, as for a spawned
/// one), without a thread per clone.
struct Detached {
    name: String,
    process: ForkedProcess,
    _sock: UnixStream,
}

/// The forked clones left running, and the count left after the last sweep.
static DETACHED: Mutex<(Vec<Detached>, usize)> = Mutex::new((Vec::new(), 0));

/// Adds a clone to [`DETACHED`]; drops those that exited once the list has
/// doubled since the last sweep (one `poll` over all of them: amortized
/// constant work per clone, however many a request starts).
fn watch_detached(d: Detached) {
    let mut guard = DETACHED.lock().unwrap_or_else(|e| e.into_inner());
    let (list, after_sweep) = &mut *guard;
    list.push(d);
    if list.len() < (*after_sweep * 2).max(64) {
        return;
    }
    let mut pfds: Vec<libc::pollfd> = list
        .iter()
        .map(|d| libc::pollfd {
            fd: d.process.pidfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // SAFETY: `pfds` is a valid array of its length.
    let n = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, 0) };
    if n > 0 {
        let mut exited = pfds.iter().map(|p| p.revents != 0);
        list.retain(|d| {
            let gone = exited.next().unwrap_or(false);
            if gone {
                tracing::info!("clone {} (pid {}) exited", d.name, d.process.pid);
            }
            !gone
        });
    }
    *after_sweep = list.len();
}
