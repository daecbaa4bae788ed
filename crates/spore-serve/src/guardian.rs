//! The daemon's guardian: a small process (`spore serve` run again with a
//! hidden flag) that outlives the daemon only to clean up after it. The
//! daemon holds the write end of a pipe whose read end the guardian waits
//! on; whatever ends the daemon (exit, SIGTERM, kill -9, a crash), the
//! kernel closes that end and the guardian wakes. It then takes the state
//! directory's lock and does what the next daemon's start would do: ends
//! every VMM process of the state directory (instances, zygotes and their
//! clones), removes the run directories, the network namespaces, veths and
//! the nftables table. So nothing a dead daemon started keeps running or
//! holds memory until somebody starts it again.
//!
//! A pipe rather than `PR_SET_PDEATHSIG` on each VMM: the parent-death
//! signal follows the thread that forked the child, not the process, and
//! clones are forked by a zygote VMM, not by the daemon.

use std::io::Read as _;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::Context as _;

use crate::network::{NetPool, Network};

/// The descriptor the guardian finds the pipe's read end at.
pub const GUARDIAN_FD: i32 = 3;
/// How long the guardian waits for the dead daemon's lock before deciding
/// a new daemon has it (and has cleaned up itself).
const LOCK_WAIT: Duration = Duration::from_secs(3);

/// The running guardian, seen from the daemon. Dropping it (the daemon's
/// exit) closes the pipe and lets the guardian clean up.
pub struct Guardian {
    _pipe: OwnedFd,
    pid: u32,
}

impl Guardian {
    /// Starts `spore_bin serve --guardian-fd 3 --state-dir STATE --net-pool POOL`.
    pub fn start(spore_bin: &Path, state_dir: &Path, pool: &NetPool) -> anyhow::Result<Self> {
        let mut fds = [0i32; 2];
        // SAFETY: pipe2 fills `fds` with two new descriptors we then own.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(std::io::Error::last_os_error()).context("making the guardian's pipe");
        }
        // SAFETY: both descriptors were just created and are owned here only.
        let (read_end, write_end) =
            unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let read_fd = read_end.as_raw_fd();
        let mut cmd = Command::new(spore_bin);
        cmd.arg("serve")
            .arg("--guardian-fd")
            .arg(GUARDIAN_FD.to_string())
            .arg("--state-dir")
            .arg(state_dir)
            .arg("--net-pool")
            .arg(pool.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        // SAFETY: only async-signal-safe calls between fork and exec: dup2
        // puts the read end at GUARDIAN_FD without close-on-exec, setpgid
        // takes the guardian out of the daemon's process group (a Ctrl+C
        // to the group must not end it before it cleaned up).
        unsafe {
            cmd.pre_exec(move || {
                if libc::dup2(read_fd, GUARDIAN_FD) < 0 || libc::setpgid(0, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().context("starting the guardian")?;
        drop(read_end);
        Ok(Guardian {
            _pipe: write_end,
            pid: child.id(),
        })
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }
}

/// The guardian's life: waits for the daemon to be gone, then cleans up
/// after it unless a new daemon already holds the state directory.
pub fn run(state_dir: &Path, pool: NetPool, fd: i32) -> anyhow::Result<()> {
    anyhow::ensure!(
        fd == GUARDIAN_FD,
        "--guardian-fd is {GUARDIAN_FD}, set by the daemon"
    );
    // SAFETY: the daemon put the pipe's read end at this descriptor for us.
    let mut pipe = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    let mut buf = [0u8; 16];
    loop {
        match pipe.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e).context("waiting on the daemon's pipe"),
        }
    }
    // The dead daemon's lock is released as it exits: a new daemon that
    // holds it past LOCK_WAIT has cleaned up itself.
    let Some(_lock) = crate::fs::lock_for(&state_dir.join(crate::fs::STATE_LOCK), LOCK_WAIT)?
    else {
        // A new daemon holds the directory: it cleaned up when it started.
        return Ok(());
    };
    let report = crate::recovery::recover(state_dir)?;
    let net = Network::new(state_dir, pool).remove_leftovers();
    crate::cgroups::remove_tree(&crate::network::prefix_of(state_dir));
    // The pid records go too (a full disk may refuse this: the next
    // daemon drops them then).
    match crate::catalog::Catalog::open_local(&state_dir.join("catalog.db")) {
        Ok(catalog) => {
            if let Err(e) = crate::recovery::forget_processes(&catalog) {
                tracing::warn!("spore serve's guardian: VMM records kept: {e:#}");
            }
        }
        Err(e) => tracing::warn!("spore serve's guardian: VMM records kept: {e:#}"),
    }
    if report.killed > 0 || report.removed > 0 || net > 0 {
        tracing::warn!(
            "spore serve's guardian: the daemon of {} is gone; {} VMM processes ended, {} run directories and {net} network leftovers removed",
            state_dir.display(),
            report.killed,
            report.removed
        );
    }
    Ok(())
}
