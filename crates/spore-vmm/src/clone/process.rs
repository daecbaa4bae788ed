//! The clone process: a `spore vmm --clone-handoff FD` that a source VMM
//! started ([`super::spawn`]), from its command line to a running clone.
//!
//! [`ClonedProcessArgs`] is that command line, written by `spawn`
//! ([`ClonedProcessArgs::to_args`]) and read back by the binary
//! ([`ClonedProcessArgs::from_flags`]): the one definition of what a clone
//! process is told. [`run`] then prepares the KVM objects, waits on the
//! inherited socket for the template (or, for a standby restored ahead, its
//! number), starts the clone, serves its API and reports to the source.

use std::ffi::OsString;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Arc;

use super::child;
use super::handoff::{recv_message, Handoff, HandoffError, Message};
use super::CloneError;
use crate::api::{ApiServer, ApiServerError};
use crate::memory::template::MemoryLayer;
use crate::vmm::Vmm;

/// Everything a clone process is told on its command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClonedProcessArgs {
    /// Where the clone serves its API.
    pub api_sock: PathBuf,
    /// Its instance id (`GET /`).
    pub id: String,
    /// The inherited end of the handoff socket pair.
    pub handoff_fd: RawFd,
    /// (guest memory bytes, vCPUs) to make KVM objects for while waiting;
    /// on the command line in whole MiB.
    pub prepare: Option<(u64, u8)>,
    /// Where its signal-port marks go when it stops.
    pub marks_file: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum ClonedProcessError {
    #[error("{0}")]
    BadArgs(String),
    #[error("receiving the clone template: {0}")]
    Handoff(#[from] HandoffError),
    #[error("receiving the clone template: --clone-handoff {fd}: {source}")]
    Poll {
        fd: RawFd,
        #[source]
        source: std::io::Error,
    },
    #[error("restoring the clone ahead: {0}")]
    RestoreAhead(#[source] CloneError),
    #[error("starting the clone: {0}")]
    Start(#[source] CloneError),
    #[error("serving the API on {path}: {source}")]
    Api {
        path: String,
        #[source]
        source: ApiServerError,
    },
}

impl ClonedProcessArgs {
    /// The `spore` arguments (after the program name) that start this
    /// process: `vmm --api-sock S --id N --clone-handoff FD [--clone-prepare
    /// MIB,VCPUS] [--marks-file F]`.
    pub fn to_args(&self) -> Vec<OsString> {
        let mut a: Vec<OsString> = vec![
            "vmm".into(),
            "--api-sock".into(),
            self.api_sock.clone().into(),
            "--id".into(),
            self.id.clone().into(),
            "--clone-handoff".into(),
            self.handoff_fd.to_string().into(),
        ];
        if let Some((bytes, vcpus)) = self.prepare {
            a.push("--clone-prepare".into());
            a.push(format!("{},{vcpus}", bytes >> 20).into());
        }
        if let Some(m) = &self.marks_file {
            a.push("--marks-file".into());
            a.push(m.clone().into());
        }
        a
    }

    /// The arguments from the `spore vmm` flags that carry them (the CLI's
    /// parser reads the flags; their meaning is decided here).
    pub fn from_flags(
        api_sock: Option<PathBuf>,
        id: String,
        handoff_fd: RawFd,
        prepare: Option<&str>,
        marks_file: Option<PathBuf>,
    ) -> Result<Self, ClonedProcessError> {
        let api_sock = api_sock.ok_or_else(|| {
            ClonedProcessError::BadArgs("--clone-handoff needs --api-sock".into())
        })?;
        let prepare = match prepare {
            None => None,
            Some(spec) => Some(parse_prepare(spec).ok_or_else(|| {
                ClonedProcessError::BadArgs(format!("--clone-prepare {spec:?}: expected MIB,VCPUS"))
            })?),
        };
        Ok(ClonedProcessArgs {
            api_sock,
            id,
            handoff_fd,
            prepare,
            marks_file,
        })
    }
}

/// `MIB,VCPUS` → (bytes, vCPUs).
fn parse_prepare(spec: &str) -> Option<(u64, u8)> {
    let (mib, vcpus) = spec.split_once(',')?;
    let mib: u64 = mib.trim().parse().ok()?;
    Some((mib.checked_mul(1 << 20)?, vcpus.trim().parse().ok()?))
}

/// Runs this process as the clone `args` describe, on `vmm` (fresh, with
/// the caller's host-signal handling already hooked to it). Returns the
/// API server of the running clone, to keep until the VM stopped, or
/// `None` when the source went away (or a stop came) before using this
/// standby process.
pub fn run(
    vmm: &Arc<Vmm>,
    args: &ClonedProcessArgs,
) -> Result<Option<ApiServer>, ClonedProcessError> {
    vmm.set_api_socket(&args.api_sock);
    vmm.enable_guest_fork();
    if let Some((bytes, vcpus)) = args.prepare {
        // A clone that cannot prepare still restores the ordinary way.
        if let Err(e) = vmm.prepare_clone(bytes, vcpus) {
            eprintln!("spore: preparing the clone VM: {e}");
        }
    }
    let Some(incoming) = wait_for_template(vmm, args.handoff_fd)? else {
        return Ok(None);
    };
    let started = match incoming.start {
        Start::Handoff(h, layers) => vmm.start_clone(&h, layers),
        Start::Go(index) => vmm.go_clone(index),
    };
    let start_ns = match started {
        Ok(t) => t,
        Err(e) => {
            child::report(&incoming.sock, 0, Some(e.to_string()));
            return Err(ClonedProcessError::Start(e));
        }
    };
    match ApiServer::start(&args.api_sock, vmm.clone()) {
        Ok(server) => {
            child::report(&incoming.sock, start_ns, None);
            Ok(Some(server))
        }
        Err(source) => {
            child::report(&incoming.sock, start_ns, Some(source.to_string()));
            vmm.request_stop();
            vmm.wait_for_exit();
            vmm.shutdown();
            Err(ClonedProcessError::Api {
                path: args.api_sock.display().to_string(),
                source,
            })
        }
    }
}

/// What starts a clone process.
enum Start {
    Handoff(Box<Handoff>, Vec<MemoryLayer>),
    /// The clone restored ahead gets this number.
    Go(u64),
}

/// The socket a clone process inherited and what came over it.
struct Incoming {
    sock: UnixStream,
    start: Start,
}

/// Blocks until the source sends the clone handoff (or, for a clone
/// restored ahead, its go); polls so that a host signal can end a standby
/// process that was never used.
fn wait_for_template(vmm: &Vmm, fd: RawFd) -> Result<Option<Incoming>, ClonedProcessError> {
    let sock = child::adopt_socket(fd)?;
    loop {
        let mut p = libc::pollfd {
            fd: sock.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, on a socket this function owns.
        let n = unsafe { libc::poll(&mut p, 1, 200) };
        if vmm.control().stop_reason().is_some() {
            return Ok(None);
        }
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(ClonedProcessError::Poll { fd, source: e });
        }
        if n == 0 {
            continue;
        }
        match recv_message(&sock) {
            // A zygote's standby: restore now, start on the go. On failure
            // nobody waits for an answer yet: end, and let the source see
            // the socket close when it uses this process.
            Ok(Message::Handoff(handoff, layers)) if handoff.prestart => vmm
                .restore_clone(&handoff, layers)
                .map_err(ClonedProcessError::RestoreAhead)?,
            Ok(Message::Handoff(handoff, layers)) => {
                return Ok(Some(Incoming {
                    sock,
                    start: Start::Handoff(handoff, layers),
                }))
            }
            Ok(Message::Go(go)) => {
                return Ok(Some(Incoming {
                    sock,
                    start: Start::Go(go.index),
                }))
            }
            Err(HandoffError::Closed) => return Ok(None),
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> ClonedProcessArgs {
        ClonedProcessArgs {
            api_sock: "/run/c1.sock".into(),
            id: "c1".into(),
            handoff_fd: 7,
            prepare: Some((256 << 20, 2)),
            marks_file: Some("/run/c1.marks.json".into()),
        }
    }

    /// What `spawn` writes is what the binary reads back.
    #[test]
    fn the_command_line_round_trips() {
        let a = args();
        let line: Vec<String> = a
            .to_args()
            .iter()
            .map(|s| s.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            line,
            [
                "vmm",
                "--api-sock",
                "/run/c1.sock",
                "--id",
                "c1",
                "--clone-handoff",
                "7",
                "--clone-prepare",
                "256,2",
                "--marks-file",
                "/run/c1.marks.json"
            ]
        );
        let flag = |name: &str| {
            line.iter()
                .position(|s| s == name)
                .map(|i| line[i + 1].clone())
        };
        let back = ClonedProcessArgs::from_flags(
            flag("--api-sock").map(PathBuf::from),
            flag("--id").unwrap_or_default(),
            flag("--clone-handoff")
                .and_then(|s| s.parse().ok())
                .unwrap_or(-1),
            flag("--clone-prepare").as_deref(),
            flag("--marks-file").map(PathBuf::from),
        )
        .unwrap();
        assert_eq!(back, a);
        let bare = ClonedProcessArgs {
            prepare: None,
            marks_file: None,
            ..a
        };
        assert_eq!(bare.to_args().len(), 7);
    }

    #[test]
    fn bad_flags_are_refused() {
        let from = |sock: Option<&str>, prepare: Option<&str>| {
            ClonedProcessArgs::from_flags(sock.map(PathBuf::from), "c".into(), 3, prepare, None)
        };
        assert!(from(None, None)
            .unwrap_err()
            .to_string()
            .contains("--api-sock"));
        for spec in [
            "",
            "256",
            "256,",
            "x,1",
            "256,300",
            "-1,1",
            "18446744073709551615,1",
        ] {
            assert!(from(Some("s"), Some(spec)).is_err(), "{spec:?}");
        }
        assert_eq!(
            from(Some("s"), Some(" 64 , 4 ")).unwrap().prepare,
            Some((64 << 20, 4))
        );
    }
}
