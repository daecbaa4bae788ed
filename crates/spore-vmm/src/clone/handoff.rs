//! The wire format between a source VMM and a clone process, over the Unix
//! stream socket pair the clone inherits.
//!
//! Source → clone, once: a 16-byte header (magic, payload length) carrying
//! the template's memfds as SCM_RIGHTS, then the bincode [`Handoff`].
//! A standby process of a zygote gets the whole handoff ahead, with
//! `prestart` set: it restores the clone paused, and a later [`Go`] (the
//! clone number) starts it.
//! Clone → source, once: a header and the bincode [`Ready`] (its pid and
//! when it started its vCPUs, or why it failed). Memory never travels over
//! the socket, and nothing is written to disk.
//!
//! The source keeps its end open as long as the clone runs (and its
//! process lives): unless `clones_outlive_source`, a clone ends when it
//! sees the socket close (`crate::vmm::clone_process`), which happens
//! however the source ends, `SIGKILL` included.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{FromRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

use super::CloneConfig;
use crate::host_usize;
use crate::memory::template::MemoryLayer;

const HANDOFF_MAGIC: &[u8; 8] = b"SPORECLN";
const GO_MAGIC: &[u8; 8] = b"SPOREGO!";
const READY_MAGIC: &[u8; 8] = b"SPORERDY";
/// Layers one template may have (SCM_RIGHTS carries at most 253 fds).
pub const MAX_LAYERS: usize = 64;
const MAX_PAYLOAD: u64 = 256 << 20;

/// What a clone needs besides the memfds.
#[derive(Debug, Serialize, Deserialize)]
pub struct Handoff {
    /// The template it is a clone of.
    pub template_id: String,
    pub name: String,
    /// Its clone number (what its `FORK` returns).
    pub index: u64,
    pub generation: u64,
    /// The clone's own configuration (its vsock socket and drives differ
    /// from the source's).
    pub config_json: String,
    /// bincode of [`crate::snapshot::MicrovmState`].
    pub state: Vec<u8>,
    /// Per layer, in order: `None` for the base, else its runs.
    pub layer_runs: Vec<Option<Vec<(u64, u64)>>>,
    pub fork_vcpu: Option<u8>,
    pub clone_config: CloneConfig,
    /// Its share of the clone tree's budget: the most clones its own
    /// subtree may count (see [`super::limits`]).
    pub budget: u64,
    /// Host CLOCK_MONOTONIC (ns) when the clone was asked for.
    pub request_ns: u64,
    /// Restore now, start on a [`Go`] (a zygote's standby process).
    pub prestart: bool,
    /// The clone's network namespace and addresses (`PUT /clone`'s
    /// `network`); never for a clone restored ahead.
    pub network: Option<super::network::CloneNetwork>,
    /// Its template's [`super::Template::chain`].
    pub chain: crate::snapshot::ChainState,
}

/// Starts a clone restored ahead (`prestart`).
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Go {
    pub index: u64,
    /// Its share of the clone tree's budget (as [`Handoff::budget`]).
    pub budget: u64,
    pub request_ns: u64,
}

/// What a waiting clone process receives.
pub enum Message {
    Handoff(Box<Handoff>, Vec<MemoryLayer>),
    Go(Go),
}

/// The clone's answer.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Ready {
    pub pid: u32,
    /// Host CLOCK_MONOTONIC (ns) right before its vCPUs started.
    pub start_ns: u64,
    pub error: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum HandoffError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("the peer sent something that is not a clone handoff ({0})")]
    Malformed(String),
    #[error("the source closed the handoff socket before sending a template")]
    Closed,
}

pub(super) fn send(
    sock: &UnixStream,
    magic: &[u8; 8],
    payload: &[u8],
    fds: &[RawFd],
) -> Result<(), HandoffError> {
    let mut header = [0u8; 16];
    header[..8].copy_from_slice(magic);
    header[8..].copy_from_slice(&(payload.len() as u64).to_le_bytes());
    let sent = sock
        .send_with_fds(&[&header[..]], fds)
        .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))?;
    let mut s = sock;
    s.write_all(&header[sent..])?;
    s.write_all(payload)?;
    Ok(())
}

/// Reads one message; returns the payload and the fds that came with it.
pub(super) fn recv(
    sock: &UnixStream,
    magic: &[u8; 8],
) -> Result<(Vec<u8>, Vec<File>), HandoffError> {
    let (m, payload, files) = recv_any(sock, &[magic])?;
    debug_assert_eq!(&m, magic);
    Ok((payload, files))
}

/// A message read: its magic, payload and the fds that came with it.
type Received = ([u8; 8], Vec<u8>, Vec<File>);

/// Reads one message whose magic is one of `magics`.
fn recv_any(sock: &UnixStream, magics: &[&[u8; 8]]) -> Result<Received, HandoffError> {
    let mut header = [0u8; 16];
    let mut fds = [-1 as RawFd; MAX_LAYERS];
    let mut iov = [libc::iovec {
        iov_base: header.as_mut_ptr().cast::<libc::c_void>(),
        iov_len: header.len(),
    }];
    // SAFETY: the iovec points into `header`, which outlives the call.
    let (n, nfds) = unsafe { sock.recv_with_fds(&mut iov, &mut fds) }
        .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))?;
    // SAFETY: the kernel just gave us these fds; nobody else owns them.
    let files: Vec<File> = fds[..nfds]
        .iter()
        .map(|&fd| unsafe { File::from_raw_fd(fd) })
        .collect();
    for f in &files {
        set_cloexec(f);
    }
    if n == 0 {
        return Err(HandoffError::Closed);
    }
    let mut s = sock;
    s.read_exact(&mut header[n..])?;
    let mut magic = [0u8; 8];
    magic.copy_from_slice(&header[..8]);
    if !magics.contains(&&magic) {
        return Err(HandoffError::Malformed("bad magic".into()));
    }
    let len = u64::from_le_bytes(header[8..].try_into().unwrap_or([0; 8]));
    if len > MAX_PAYLOAD {
        return Err(HandoffError::Malformed(format!("{len}-byte payload")));
    }
    let mut payload = vec![0u8; host_usize::from_u64(len)];
    s.read_exact(&mut payload)?;
    Ok((magic, payload, files))
}

fn set_cloexec(f: &File) {
    use std::os::fd::AsRawFd;
    // SAFETY: fcntl on an fd we own.
    unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
}

/// Sends the template to a clone process.
pub fn send_handoff(
    sock: &UnixStream,
    handoff: &Handoff,
    layers: &[MemoryLayer],
) -> Result<(), HandoffError> {
    use std::os::fd::AsRawFd;
    let payload =
        bincode::serialize(handoff).map_err(|e| HandoffError::Malformed(e.to_string()))?;
    let fds: Vec<RawFd> = layers.iter().map(|l| l.file.as_raw_fd()).collect();
    send(sock, HANDOFF_MAGIC, &payload, &fds)
}

fn layers_of(
    runs: &[Option<Vec<(u64, u64)>>],
    files: Vec<File>,
) -> Result<Vec<MemoryLayer>, HandoffError> {
    if runs.len() != files.len() {
        return Err(HandoffError::Malformed(format!(
            "{} layers described, {} memory files received",
            runs.len(),
            files.len()
        )));
    }
    Ok(files
        .into_iter()
        .zip(runs.iter())
        .map(|(f, runs)| MemoryLayer {
            file: Arc::new(f),
            runs: runs.clone(),
        })
        .collect())
}

/// Waits for the next message of the source (a clone process waits here).
pub fn recv_message(sock: &UnixStream) -> Result<Message, HandoffError> {
    let (magic, payload, files) = recv_any(sock, &[HANDOFF_MAGIC, GO_MAGIC])?;
    let malformed = |e: bincode::Error| HandoffError::Malformed(e.to_string());
    if &magic == GO_MAGIC {
        return Ok(Message::Go(
            bincode::deserialize(&payload).map_err(malformed)?,
        ));
    }
    let handoff: Handoff = bincode::deserialize(&payload).map_err(malformed)?;
    let layers = layers_of(&handoff.layer_runs, files)?;
    Ok(Message::Handoff(Box::new(handoff), layers))
}

pub fn send_go(sock: &UnixStream, go: &Go) -> Result<(), HandoffError> {
    let payload = bincode::serialize(go).map_err(|e| HandoffError::Malformed(e.to_string()))?;
    send(sock, GO_MAGIC, &payload, &[])
}

pub fn send_ready(sock: &UnixStream, ready: &Ready) -> Result<(), HandoffError> {
    let payload = bincode::serialize(ready).map_err(|e| HandoffError::Malformed(e.to_string()))?;
    send(sock, READY_MAGIC, &payload, &[])
}

pub fn recv_ready(sock: &UnixStream) -> Result<Ready, HandoffError> {
    let (payload, _) = recv(sock, READY_MAGIC)?;
    bincode::deserialize(&payload).map_err(|e| HandoffError::Malformed(e.to_string()))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::FileExt;

    use super::*;

    /// The network part goes as bincode too: fields left out would shift
    /// the rest (an interface with no new MAC, a clone given its taps).
    #[test]
    fn handoff_carries_the_network_whatever_is_left_unset() {
        use crate::clone::network::{CloneInterface, CloneNetwork};
        let network = CloneNetwork {
            netns_template: "/run/netns/x-{n}".into(),
            tun_socket_template: None,
            interfaces: vec![CloneInterface {
                iface_id: "eth0".into(),
                guest_mac_template: None,
                ipv4: Some("10.0.0.{n}/24".into()),
                gateway: None,
            }],
        };
        for tun in [None, Some("/run/t-{n}.sock".to_string())] {
            let n = CloneNetwork {
                tun_socket_template: tun,
                ..network.clone()
            };
            let bytes = bincode::serialize(&n).unwrap();
            assert_eq!(bincode::deserialize::<CloneNetwork>(&bytes).unwrap(), n);
        }
    }

    /// A chain as a source's last Full snapshot leaves it, with pages
    /// written since.
    fn chain_with_a_head() -> crate::snapshot::ChainState {
        let mut pending = crate::snapshot::dirty::DirtyPages::new();
        pending.merge_region(0, &[0b1010, 1 << 63]);
        crate::snapshot::ChainState {
            head: Some(crate::snapshot::ChainHead {
                id: "base".into(),
                state_hash: "ab".into(),
                paths: crate::snapshot::LayerPaths {
                    state: "/s/base.state".into(),
                    mem: "/s/base.mem".into(),
                },
                mem_size: 1 << 20,
                vcpu_count: 1,
            }),
            pending,
        }
    }

    #[test]
    fn handoff_carries_memfds_and_state() {
        let (a, b) = UnixStream::pair().unwrap();
        let mem = crate::memory::create_memfd("t").unwrap();
        mem.set_len(8192).unwrap();
        mem.write_all_at(b"hello", 4096).unwrap();
        let layers = vec![MemoryLayer {
            file: Arc::new(mem),
            runs: None,
        }];
        let h = Handoff {
            template_id: "t".into(),
            name: "c1".into(),
            index: 1,
            generation: 1,
            config_json: "{}".into(),
            state: vec![7; 100_000],
            layer_runs: vec![None],
            fork_vcpu: Some(0),
            clone_config: CloneConfig::default(),
            budget: 3,
            request_ns: 5,
            prestart: false,
            network: None,
            chain: chain_with_a_head(),
        };
        send_handoff(&a, &h, &layers).unwrap();
        let Message::Handoff(got, got_layers) = recv_message(&b).unwrap() else {
            panic!("not a handoff");
        };
        assert_eq!(got.state.len(), 100_000);
        assert_eq!((got.fork_vcpu, got.budget), (Some(0), 3));
        assert_eq!(got.chain.head, h.chain.head);
        assert_eq!(got.chain.pending, h.chain.pending);
        let mut buf = [0u8; 5];
        got_layers[0].file.read_exact_at(&mut buf, 4096).unwrap();
        assert_eq!(&buf, b"hello");

        let go = Go {
            index: 4,
            budget: 2,
            request_ns: 6,
        };
        send_go(&a, &go).unwrap();
        let Message::Go(got) = recv_message(&b).unwrap() else {
            panic!("not a go");
        };
        assert_eq!(got, go);

        let r = Ready {
            pid: 3,
            start_ns: 4,
            error: None,
        };
        send_ready(&b, &r).unwrap();
        assert_eq!(recv_ready(&a).unwrap(), r);
        // Garbage and a closed peer are errors, not panics.
        (&b).write_all(&[0u8; 16]).unwrap();
        assert!(matches!(recv_ready(&a), Err(HandoffError::Malformed(_))));
        drop(b);
        assert!(matches!(recv_ready(&a), Err(HandoffError::Closed)));
    }
}
