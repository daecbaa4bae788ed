//! Clone processes: each clone is a `spore vmm` child of the source VMM,
//! started with `--clone-handoff FD` (one end of a socket pair; the whole
//! command line is [`ClonedProcessArgs`]) and waiting there for its
//! template ([`super::process`] is what it then does).
//!
//! Processes are spawned with `posix_spawn` (std's path when no `pre_exec`
//! is given), never with `fork()`: a fork would copy the source's page
//! tables and write-protect its private guest pages, exactly the cost a
//! template avoids. Each clone gets its own process group, so a terminal's
//! Ctrl-C to the source does not reach it, and its stdout/stderr (the
//! guest's serial console) go to `<name>.log` beside its socket.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::args::ClonedProcessArgs;
use super::handoff::{recv_ready, Ready};
use super::{CloneError, READY_TIMEOUT};

/// A started `spore vmm --clone-handoff` process.
pub struct CloneProcess {
    pub name: String,
    pub socket: PathBuf,
    pub log: PathBuf,
    pub dir: PathBuf,
    pub child: Child,
    /// The source's end of the handoff socket.
    pub sock: UnixStream,
    /// The template it restored a clone of ahead (waiting for a go).
    pub prestarted: Option<String>,
    /// The VM size it prepared (memory bytes, vCPUs).
    pub prepared_for: Option<(u64, u8)>,
}

/// The program clones run and the name they run under (their `argv[0]`):
/// this very executable, through `/proc/self/exe`, so that a clone runs the
/// source's own version of spore even after the file was replaced on disk
/// (an upgrade): the handoff between them is not a stable format. The name
/// stays the executable's path (what `ps` and `spore serve`'s recovery
/// look for). `SPORE_CLONE_EXE` names another program instead. Without
/// /proc (in a jail) it is `argv[0]`, the absolute path the jailer ran.
pub fn clone_exe() -> Result<(PathBuf, PathBuf), CloneError> {
    if let Some(p) = std::env::var_os("SPORE_CLONE_EXE") {
        return Ok((PathBuf::from(&p), PathBuf::from(p)));
    }
    let path = match std::env::current_exe() {
        Ok(p) => p,
        // No /proc (a jail: spore's or Firecracker's jailer mounts none):
        // the jailer ran the binary by its absolute path inside the jail.
        Err(source) => match std::env::args_os().next().map(PathBuf::from) {
            Some(p) if p.is_absolute() && p.is_file() => p,
            _ => {
                return Err(CloneError::Io {
                    what: "find the spore executable",
                    source,
                })
            }
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

fn set_inheritable(fd: &impl AsRawFd, inherit: bool) -> std::io::Result<()> {
    let flags = if inherit { 0 } else { libc::FD_CLOEXEC };
    // SAFETY: fcntl on an fd we own.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, flags) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
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
    let (exe, exe_name) = clone_exe()?;
    let io = |what| move |source| CloneError::Io { what, source };
    let (sock, theirs) = UnixStream::pair().map_err(io("create a handoff socket"))?;
    let socket = dir.join(format!("{name}.sock"));
    let log = dir.join(format!("{name}.log"));
    let out = crate::files::create_private(&log).map_err(io("create a clone log"))?;
    let err = out.try_clone().map_err(io("create a clone log"))?;
    let args = ClonedProcessArgs {
        api_sock: socket.clone(),
        id: name.to_string(),
        handoff_fd: theirs.as_raw_fd(),
        prepare,
        marks_file: marks.then(|| dir.join(format!("{name}.marks.json"))),
        seccomp: crate::seccomp::setting(),
    };
    let mut cmd = Command::new(&exe);
    cmd.arg0(&exe_name)
        .args(args.to_args())
        // A pipe closed at once reads like /dev/null, which a jail lacks.
        .stdin(Stdio::piped())
        .stdout(out)
        .stderr(err)
        .process_group(0);
    // The child end must survive exec. Clearing CLOEXEC (instead of a
    // pre_exec hook, which would force fork()) is safe: this VMM spawns
    // processes only here, one request at a time.
    set_inheritable(&theirs, true).map_err(io("pass the handoff socket"))?;
    let child = cmd.spawn().map(|mut c| {
        drop(c.stdin.take());
        c
    });
    drop(theirs);
    let child = child.map_err(|e| CloneError::Spawn(format!("{}: {e}", exe_name.display())))?;
    Ok(CloneProcess {
        name: name.to_string(),
        socket,
        log,
        dir: dir.to_path_buf(),
        child,
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
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.socket);
    }

    /// Leaves the clone running on its own; a thread reaps it when it
    /// exits. The thread holds the source's end of the handoff socket
    /// until then: the clone sees it close when this process ends (its cue
    /// to end too, unless clones outlive their source).
    pub fn detach(self) -> u32 {
        let CloneProcess {
            mut child,
            name,
            sock,
            ..
        } = self;
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
