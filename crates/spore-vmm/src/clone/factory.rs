//! The clone factory: one `spore vmm --clone-factory FD` process per source
//! VMM that forks clone processes, so that a clone does not pay for an
//! `execve` of spore and its start-up (the runtime, the command line parser,
//! compiling the seccomp filters): about 1.5 ms of the 3.5–5 ms of CPU a
//! clone process cost when each was spawned (`spore bench clone --count`).
//!
//! Why a process of its own and not `fork()` of the source: a fork copies
//! the source's page tables and write-protects its private guest memory,
//! the cost a template avoids. The factory maps no guest memory and runs a
//! single thread (fork copies only the calling thread), so a fork of it is
//! small, and its child is a clone process as a spawned one would be: the
//! same [`ClonedProcessArgs`], the same code from there on
//! (`crate::vmm::clone_process`), under the seccomp filter the factory
//! inherited from the source thread that started it.
//!
//! Protocol over the socket pair the factory inherits (framing as in
//! [`super::handoff`]): the source sends a [`ForkOrder`] with two fds (the
//! clone's end of its handoff socket, its log); the factory forks and
//! answers a [`Forked`] with a pidfd of the child, opened before the
//! factory could reap it, so the source never signals a reused pid. The
//! factory reaps its children; the source watches them through the pidfds.
//! The factory ends when the source's end closes (the source ended); its
//! clones then see their own handoff sockets close, as spawned ones do.
//!
//! Forked clones show the factory's command line; they name their main
//! thread [`CLONE_COMM`], which is how `limits` counts them.

use std::ffi::OsString;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use super::args::ClonedProcessArgs;
use super::handoff::{recv, send, HandoffError};
use super::sys::{clone_exe, poll_readable, set_inheritable};
use super::CloneError;
use crate::own_exe::{self, Spawned};

const ORDER_MAGIC: &[u8; 8] = b"SPOREFRK";
const FORKED_MAGIC: &[u8; 8] = b"SPOREFKD";
/// The name (`/proc/PID/comm`) of a forked clone process's main thread.
pub const CLONE_COMM: &str = "spore-clone";
/// The flag that makes `spore vmm` a factory.
pub const FACTORY_FLAG: &str = "--clone-factory";
/// `SPORE_CLONE_FACTORY=off` spawns every clone process instead (to
/// compare, or where forking is not wanted).
pub const FACTORY_ENV: &str = "SPORE_CLONE_FACTORY";

/// Whether a process is a clone factory (which runs no VM), from its
/// NUL-separated command line and its name (`comm`): the clones it forked
/// show the same command line but are named [`CLONE_COMM`].
pub fn is_factory(cmdline: &[u8], comm: &[u8]) -> bool {
    cmdline
        .split(|&b| b == 0)
        .any(|a| a == FACTORY_FLAG.as_bytes())
        && comm.trim_ascii_end() != CLONE_COMM.as_bytes()
}

/// A clone process to fork: [`ClonedProcessArgs`] without what the
/// factory supplies (the handoff fd, the seccomp setting).
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ForkOrder {
    pub api_sock: PathBuf,
    pub id: String,
    pub prepare: Option<(u64, u8)>,
    pub marks_file: Option<PathBuf>,
}

/// The factory's answer; a pidfd comes with a pid.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Forked {
    pub pid: u32,
    pub error: Option<String>,
}

/// The source's handle on its factory.
struct Factory {
    sock: UnixStream,
    child: Spawned,
}

/// This process's factory, started at its first clone process.
static FACTORY: Mutex<Option<Factory>> = Mutex::new(None);

/// Whether clone processes are forked by a factory (the default).
pub fn enabled() -> bool {
    std::env::var_os(FACTORY_ENV).is_none_or(|v| v != "off")
        && std::env::var_os("SPORE_CLONE_EXE").is_none()
}

/// A forked clone process, as the source holds it.
pub struct ForkedProcess {
    pub pid: u32,
    pub pidfd: OwnedFd,
}

/// Forks a clone process through this process's factory, starting the
/// factory first if there is none (or it died). `handoff` is the clone's
/// end of its handoff socket, `log` its stdout and stderr.
pub fn fork_clone(
    order: &ForkOrder,
    handoff: &UnixStream,
    log: &File,
    dir: &Path,
) -> Result<ForkedProcess, CloneError> {
    let mut factory = FACTORY.lock().unwrap_or_else(|e| e.into_inner());
    // One retry: a factory that died (killed by hand) is replaced.
    for attempt in 0..2 {
        if factory.is_none() {
            *factory = Some(start(dir)?);
        }
        let Some(f) = factory.as_mut() else { break };
        match f.order(order, handoff, log) {
            Ok(p) => return Ok(p),
            Err(OrderError::Factory(e)) if attempt == 0 => {
                tracing::warn!("the clone factory failed ({e}); starting another");
                if let Some(mut old) = factory.take() {
                    let _ = old.child.kill();
                    let _ = old.child.wait();
                }
            }
            Err(OrderError::Factory(e)) => {
                return Err(CloneError::Spawn(format!("the clone factory: {e}")))
            }
            Err(OrderError::Fork(e)) => return Err(CloneError::Spawn(e)),
        }
    }
    Err(CloneError::Spawn("the clone factory did not start".into()))
}

enum OrderError {
    /// The factory is gone or garbled: start another.
    Factory(String),
    /// The factory could not fork this one.
    Fork(String),
}

impl Factory {
    fn order(
        &mut self,
        order: &ForkOrder,
        handoff: &UnixStream,
        log: &File,
    ) -> Result<ForkedProcess, OrderError> {
        let gone = |e: HandoffError| OrderError::Factory(e.to_string());
        let payload = serde_json::to_vec(order).map_err(|e| OrderError::Fork(e.to_string()))?;
        send(
            &self.sock,
            ORDER_MAGIC,
            &payload,
            &[handoff.as_raw_fd(), log.as_raw_fd()],
        )
        .map_err(gone)?;
        let (payload, mut files) = recv(&self.sock, FORKED_MAGIC).map_err(gone)?;
        let forked: Forked = serde_json::from_slice(&payload)
            .map_err(|e| OrderError::Factory(format!("a garbled answer: {e}")))?;
        if let Some(e) = forked.error {
            return Err(OrderError::Fork(e));
        }
        match (files.pop(), files.is_empty()) {
            (Some(pidfd), true) => Ok(ForkedProcess {
                pid: forked.pid,
                pidfd: pidfd.into(),
            }),
            _ => Err(OrderError::Factory(
                "an answer without exactly one pidfd".into(),
            )),
        }
    }
}

/// Starts the factory: `spore vmm --clone-factory FD`, spawned like a clone
/// process (its own process group, stdin a closed pipe); its stdout and
/// stderr are this process's. `dir` (where this VMM's clones go) is on its command
/// line only so that `ps` and `spore serve`'s recovery see whose it is.
fn start(dir: &Path) -> Result<Factory, CloneError> {
    let (_, exe_name) = clone_exe()?;
    let io = |what| move |source| CloneError::Io { what, source };
    let (sock, theirs) = UnixStream::pair().map_err(io("create the clone factory socket"))?;
    // A factory that stops answering is replaced, not waited for forever.
    sock.set_read_timeout(Some(super::READY_TIMEOUT))
        .map_err(io("create the clone factory socket"))?;
    let mut args: Vec<OsString> = vec![
        "vmm".into(),
        FACTORY_FLAG.into(),
        theirs.as_raw_fd().to_string().into(),
        "--clone-dir".into(),
        dir.into(),
    ];
    args.extend(crate::seccomp::setting().to_args());
    set_inheritable(&theirs, true).map_err(io("pass the clone factory socket"))?;
    let child = own_exe::spawn(&exe_name, &args, 1, 2);
    drop(theirs);
    let child = child.map_err(|e| {
        CloneError::Spawn(format!("the clone factory ({}): {e}", exe_name.display()))
    })?;
    Ok(Factory { sock, child })
}

/// The factory's side: serves fork orders on `fd` until the source closes
/// it; each child runs `run_clone` with its arguments and exits with what
/// it returns. Call on a single-threaded process (fork copies one thread).
pub fn serve(fd: RawFd, run_clone: &dyn Fn(ClonedProcessArgs) -> u8) -> u8 {
    // SAFETY: the fd was inherited for this purpose; nothing else owns it.
    let sock = unsafe { UnixStream::from_raw_fd(fd) };
    // Not passed on to the clones.
    let _ = set_inheritable(&sock, false);
    loop {
        reap_children();
        match wait_readable(&sock) {
            Ok(false) => continue,
            Ok(true) => {}
            Err(e) => {
                eprintln!("spore: clone factory: {e}");
                return 1;
            }
        }
        let (payload, files) = match recv(&sock, ORDER_MAGIC) {
            Ok(m) => m,
            // The source ended.
            Err(HandoffError::Closed) => return 0,
            Err(e) => {
                eprintln!("spore: clone factory: {e}");
                return 1;
            }
        };
        let answer = match (
            serde_json::from_slice::<ForkOrder>(&payload),
            <[File; 2]>::try_from(files),
        ) {
            (Ok(order), Ok([handoff, log])) => fork_one(&sock, order, handoff, log, run_clone),
            (Err(e), _) => Err(format!("a malformed order: {e}")),
            (_, Err(files)) => Err(format!("an order with {} fds, not 2", files.len())),
        };
        let sent = match answer {
            Ok((pid, pidfd)) => send_forked(&sock, &Forked { pid, error: None }, Some(&pidfd)),
            Err(e) => send_forked(
                &sock,
                &Forked {
                    pid: 0,
                    error: Some(e),
                },
                None,
            ),
        };
        if let Err(e) = sent {
            eprintln!("spore: clone factory: answering the source: {e}");
            return 1;
        }
    }
}

fn send_forked(sock: &UnixStream, f: &Forked, pidfd: Option<&OwnedFd>) -> Result<(), HandoffError> {
    let payload = serde_json::to_vec(f).map_err(|e| HandoffError::Malformed(e.to_string()))?;
    let fds: Vec<RawFd> = pidfd.iter().map(|p| p.as_raw_fd()).collect();
    send(sock, FORKED_MAGIC, &payload, &fds)
}

/// Whether the socket has something to read, waiting up to a second (so
/// that exited children are reaped while no order comes).
fn wait_readable(sock: &UnixStream) -> std::io::Result<bool> {
    match poll_readable(sock.as_raw_fd(), 1000) {
        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => Ok(false),
        r => r,
    }
}

/// Collects every child that exited (their pidfds stay valid for the source).
fn reap_children() {
    loop {
        let mut status = 0;
        // SAFETY: waitpid with WNOHANG on any child; status is a local.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid <= 0 {
            return;
        }
        tracing::debug!("clone process {pid} exited (status {status:#x})");
    }
}

/// Forks one clone process; returns its pid and a pidfd.
fn fork_one(
    sock: &UnixStream,
    order: ForkOrder,
    handoff: File,
    log: File,
    run_clone: &dyn Fn(ClonedProcessArgs) -> u8,
) -> Result<(u32, OwnedFd), String> {
    let args = ClonedProcessArgs {
        api_sock: order.api_sock,
        id: order.id,
        handoff_fd: handoff.as_raw_fd(),
        prepare: order.prepare,
        marks_file: order.marks_file,
        seccomp: crate::seccomp::setting(),
    };
    // SAFETY: this process runs one thread (the factory starts none), so
    // the child is a complete copy of it.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(format!("fork: {}", std::io::Error::last_os_error()));
    }
    if pid == 0 {
        // The child: becomes the clone process.
        let code = match become_clone(sock, &log) {
            Ok(()) => {
                drop(log);
                run_clone(args)
            }
            Err(e) => {
                eprintln!("spore: clone process set-up: {e}");
                1
            }
        };
        std::io::Write::flush(&mut std::io::stdout()).ok();
        // SAFETY: ends this process (the fork's child) without running the
        // factory's exit handlers a second time.
        unsafe { libc::_exit(i32::from(code)) };
    }
    drop(handoff);
    // SAFETY: pidfd_open on our own unreaped child: it cannot be a reused pid.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        // SAFETY: our own child; it has not run anything the source knows.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        return Err(format!("pidfd_open: {e}"));
    }
    #[allow(
        clippy::cast_possible_truncation,
        reason = "pidfd_open returned a file descriptor (>= 0 here), which fits an i32"
    )]
    let fd = fd as RawFd;
    // SAFETY: a fresh fd owned by nobody else.
    Ok((pid as u32, unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// In the forked child: its own process group, the log as stdout and
/// stderr, the factory's socket closed, [`CLONE_COMM`] as its name.
fn become_clone(factory: &UnixStream, log: &File) -> std::io::Result<()> {
    let check = |r: libc::c_int| {
        if r < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(())
        }
    };
    // SAFETY: plain fd and process-attribute calls on fds this process owns;
    // the name is a NUL-terminated constant.
    unsafe {
        check(libc::close(factory.as_raw_fd()))?;
        check(libc::setpgid(0, 0))?;
        check(libc::dup2(log.as_raw_fd(), 1))?;
        check(libc::dup2(log.as_raw_fd(), 2))?;
        check(libc::prctl(
            libc::PR_SET_NAME,
            c"spore-clone".as_ptr() as libc::c_ulong,
            0,
            0,
            0,
        ))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_factory_is_told_from_its_clones_by_name() {
        let line = b"spore\0vmm\0--clone-factory\x003\0--clone-dir\0/r\0";
        assert!(is_factory(line, b"spore\n"));
        assert!(!is_factory(line, b"spore-clone\n"));
        assert!(!is_factory(b"spore\0vmm\0--api-sock\0/r/s\0", b"spore\n"));
    }

    #[test]
    fn the_name_constant_matches_the_c_string() {
        assert_eq!(c"spore-clone".to_str().ok(), Some(CLONE_COMM));
    }

    /// An order and its answer cross the socket with their fds.
    #[test]
    fn order_and_answer_round_trip() {
        let (a, b) = UnixStream::pair().unwrap();
        let (h, _h2) = UnixStream::pair().unwrap();
        let log = crate::memory::create_memfd("factory-test").unwrap();
        let order = ForkOrder {
            api_sock: "/run/c1.sock".into(),
            id: "c1".into(),
            prepare: Some((128 << 20, 1)),
            marks_file: None,
        };
        let payload = serde_json::to_vec(&order).unwrap();
        send(&a, ORDER_MAGIC, &payload, &[h.as_raw_fd(), log.as_raw_fd()]).unwrap();
        let (p, files) = recv(&b, ORDER_MAGIC).unwrap();
        assert_eq!(serde_json::from_slice::<ForkOrder>(&p).unwrap(), order);
        assert_eq!(files.len(), 2);
        // A garbled magic is refused, not taken for an order.
        send(&a, FORKED_MAGIC, b"{}", &[]).unwrap();
        assert!(recv(&b, ORDER_MAGIC).is_err());
    }
}
