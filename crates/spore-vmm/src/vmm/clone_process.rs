//! This process as a clone: a `spore vmm --clone-handoff FD` that a source
//! VMM started (`crate::clone::spawn`), from its command line
//! ([`ClonedProcessArgs`]) to a running clone. [`run`] prepares the KVM
//! objects, waits on the inherited socket for the template (or, for a
//! standby restored ahead, its number), starts the clone, serves its API and
//! reports to the source; unless its source's settings let clones outlive
//! it, the clone then ends when the source does. It sits above the state machine and the API
//! server it runs, which is why it lives here and not in `clone/`.

use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use super::Vmm;
use crate::api::{ApiServer, ApiServerError};
use crate::clone::args::ClonedProcessArgs;
use crate::clone::handoff::{recv_message, Handoff, HandoffError, Message};
use crate::clone::{child, CloneError};
use crate::memory::template::MemoryLayer;

#[derive(Debug, thiserror::Error)]
pub enum ClonedProcessError {
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
    #[error("{0}")]
    Seccomp(#[source] crate::seccomp::SeccompError),
    #[error("starting the clone: {0}")]
    Start(#[source] CloneError),
    #[error("serving the API on {path}: {source}")]
    Api {
        path: String,
        #[source]
        source: ApiServerError,
    },
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
    vmm.enable_background_standby();
    if let Some((bytes, vcpus)) = args.prepare {
        // A clone that cannot prepare still restores the ordinary way.
        if let Err(e) = vmm.prepare_clone(bytes, vcpus) {
            eprintln!("spore: preparing the clone VM: {e}");
        }
    }
    // apply_main's thread now, while nothing waits on this process.
    if let Err(e) = crate::seccomp::start_spawner_ahead() {
        eprintln!("spore: {e}");
    }
    let Some(incoming) = wait_for_template(vmm, args.handoff_fd)? else {
        return Ok(None);
    };
    // A clone keeps the filter it inherited from its source; otherwise the
    // main thread's goes on here, before the clone's guest runs.
    if let Err(e) = crate::seccomp::apply_main() {
        child::report(&incoming.sock, 0, Some(e.to_string()));
        return Err(ClonedProcessError::Seccomp(e));
    }
    let started = match incoming.start {
        Start::Handoff(h, layers) => vmm.start_clone(&h, layers),
        Start::Go(index, budget) => vmm.go_clone(index, budget),
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
            // What the source's settings said about its clones.
            let outlive = vmm.lock().source.config.clones_outlive_source;
            if !outlive {
                end_with_source(vmm, incoming.sock);
            }
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

/// Ends this clone when its source ends (`clones_outlive_source` off, the
/// default): a `source-watch` thread reads the handoff socket, which the
/// source holds open as long as it runs and the kernel closes however it
/// ends (`SIGKILL` included); at its end the clone stops as on `SIGTERM`.
/// A source already gone is seen at once, so there is no window between
/// the clone's start and the watch.
fn end_with_source(vmm: &Arc<Vmm>, sock: UnixStream) {
    use std::io::Read;
    let me = Arc::downgrade(vmm);
    let spawned = crate::seccomp::spawn(
        crate::seccomp::ThreadKind::Vmm,
        "source-watch".into(),
        move || {
            let mut buf = [0u8; 64];
            loop {
                match (&sock).read(&mut buf) {
                    // Nothing is sent after the start; ignore it.
                    Ok(n) if n > 0 => continue,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    _ => break,
                }
            }
            let Some(vmm) = me.upgrade() else { return };
            eprintln!(
                "spore: the source VMM ended; this clone ends with it (clones_outlive_source is off)"
            );
            vmm.request_stop();
        },
    );
    if let Err(e) = spawned {
        // Without the watch the clone would outlive its source unasked.
        eprintln!("spore: cannot watch the source VMM ({e}); this clone stops");
        vmm.request_stop();
    }
}

/// What starts a clone process.
enum Start {
    Handoff(Box<Handoff>, Vec<MemoryLayer>),
    /// The clone restored ahead gets this number and budget.
    Go(u64, u64),
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
                    start: Start::Go(go.index, go.budget),
                }))
            }
            Err(HandoffError::Closed) => return Ok(None),
            Err(e) => return Err(e.into()),
        }
    }
}
