//! virtio-vsock (device id 19, virtio 1.2 §5.10) with Firecracker's hybrid
//! Unix-socket backend: guest stream sockets reach host programs through
//! Unix sockets, without vhost-vsock (absent on these hosts).
//!
//! - Host → guest: a client connects to `uds_path` and writes
//!   `CONNECT <port>\n`; once the guest accepts, it reads `OK <host_port>\n`
//!   and the socket carries the stream.
//! - Guest → host: a connection to host (CID 2) port `P` reaches the Unix
//!   socket listening at `<uds_path>_P`.
//!
//! Only stream sockets are offered (no VIRTIO_VSOCK_F_SEQPACKET). Files:
//! `packet.rs` (wire format and validation), `connection.rs` (one
//! connection), `listener.rs` (host socket and handshake), `muxer.rs`
//! (routing), `event_loop.rs` (the worker thread); `host_connect.rs` is the
//! host programs' end of the `CONNECT` handshake.

pub mod connection;
pub mod event_loop;
pub mod host_connect;
pub mod identity;
pub mod listener;
pub mod muxer;
pub mod packet;
pub mod persist;

#[cfg(test)]
mod tests;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use event_loop::{EventLoop, WorkerState};
use identity::VsockIdentity;
pub use identity::{Notice, VsockHandle};
use muxer::{MuxerError, VsockMuxer};
pub use persist::{VsockState, VsockStateError};
use virtio_queue::QueueT;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::worker::Worker;
use super::{device_type, ActivateContext, ActivateError, VirtioDevice};

/// Queue size of rx, tx and event queues.
pub const QUEUE_SIZE: u16 = 256;
const QUEUE_SIZES: [u16; 3] = [QUEUE_SIZE; 3];

#[derive(Debug, thiserror::Error)]
pub enum VsockError {
    #[error("guest_cid {0} is reserved or out of range; use 3..=4294967294")]
    GuestCid(u64),
    #[error(transparent)]
    Muxer(#[from] MuxerError),
    #[error("cannot create the vsock reset eventfd: {0}")]
    EventFd(#[source] io::Error),
}

pub struct Vsock {
    /// The guest CID (changed by a clone through [`VsockHandle`]).
    identity: Arc<VsockIdentity>,
    uds_path: PathBuf,
    /// Present while no worker runs; the worker owns it otherwise.
    muxer: Option<VsockMuxer>,
    worker: Option<Worker<WorkerState>>,
    /// Asks a running worker for a transport reset.
    reset_evt: EventFd,
}

impl Vsock {
    /// Creates the device and starts listening on `uds_path` (a stale socket
    /// file there is replaced; the file is removed when the device drops).
    pub fn new(guest_cid: u64, uds_path: PathBuf) -> Result<Vsock, VsockError> {
        // CIDs 0-2 are reserved, u32::MAX is VMADDR_CID_ANY, and Linux keeps
        // CIDs to 32 bits.
        if !(3..u64::from(u32::MAX)).contains(&guest_cid) {
            return Err(VsockError::GuestCid(guest_cid));
        }
        let reset_evt = EventFd::new(EFD_NONBLOCK).map_err(VsockError::EventFd)?;
        let identity = Arc::new(VsockIdentity::new(guest_cid));
        let mut muxer = VsockMuxer::new(guest_cid, uds_path.clone())?;
        muxer.share_identity(identity.clone());
        Ok(Vsock {
            identity,
            uds_path,
            muxer: Some(muxer),
            worker: None,
            reset_evt,
        })
    }

    pub fn guest_cid(&self) -> u64 {
        self.identity.cid()
    }

    /// A handle for changing the guest CID later (clones).
    pub fn handle(&self) -> Result<VsockHandle, VsockError> {
        let reset_evt = self.reset_evt.try_clone().map_err(VsockError::EventFd)?;
        Ok(VsockHandle::new(self.identity.clone(), reset_evt))
    }

    /// Shortens how long host clients wait for the guest to handle a
    /// transport reset (tests); only before the device is activated.
    /// `unposted`: while the event waits for a guest buffer; `posted`: once
    /// it sits in one.
    pub fn set_reset_ack_timeouts(
        &mut self,
        unposted: std::time::Duration,
        posted: std::time::Duration,
    ) {
        if let Some(m) = &mut self.muxer {
            m.set_reset_ack_timeouts(unposted, posted);
        }
    }

    pub fn uds_path(&self) -> &Path {
        &self.uds_path
    }

    /// Drops every connection and posts VIRTIO_VSOCK_EVENT_TRANSPORT_RESET
    /// on the event queue (at once if the device runs, else when it is next
    /// activated), so the guest drops its side too. Used after a snapshot
    /// restore, whose host sockets are gone.
    pub fn transport_reset(&mut self) {
        if self.worker.is_some() {
            if let Err(e) = self.reset_evt.write(1) {
                tracing::error!("vsock: cannot request a transport reset: {e}");
            }
        } else if let Some(muxer) = &mut self.muxer {
            muxer.transport_reset();
        }
    }
}

impl VirtioDevice for Vsock {
    fn device_type(&self) -> u32 {
        device_type::VSOCK
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &QUEUE_SIZES
    }

    fn avail_features(&self) -> u64 {
        1u64 << virtio_bindings::bindings::virtio_config::VIRTIO_F_VERSION_1
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        // struct virtio_vsock_config { le64 guest_cid; }
        let config = self.identity.cid().to_le_bytes();
        for (i, byte) in data.iter_mut().enumerate() {
            *byte = offset
                .checked_add(i as u64)
                .and_then(|o| usize::try_from(o).ok())
                .and_then(|o| config.get(o).copied())
                .unwrap_or(0);
        }
    }

    fn activate(&mut self, ctx: ActivateContext) -> Result<(), ActivateError> {
        if ctx.queues.len() != QUEUE_SIZES.len() || ctx.queue_events.len() != QUEUE_SIZES.len() {
            return Err(ActivateError::QueueCount {
                expected: QUEUE_SIZES.len(),
                got: ctx.queues.len().min(ctx.queue_events.len()),
            });
        }
        if let Some(i) = ctx.queues.iter().position(|q| !q.is_valid(&ctx.mem)) {
            return Err(ActivateError::Device(format!(
                "vsock queue {i} is not ready or lies outside guest memory"
            )));
        }
        if self.worker.is_some() {
            return Err(ActivateError::Device(
                "vsock device is already active".into(),
            ));
        }
        let reset_evt = self.reset_evt.try_clone().map_err(ActivateError::Worker)?;
        let muxer = self.muxer.take().ok_or_else(|| {
            ActivateError::Device("vsock device lost its state when its worker failed".into())
        })?;
        if let Err(e) = EventLoop::watch_fds(&muxer, &ctx.queue_events, &reset_evt) {
            self.muxer = Some(muxer);
            return Err(ActivateError::Worker(e));
        }
        let event_loop = EventLoop::new(
            muxer,
            ctx.mem,
            ctx.interrupt,
            ctx.queues,
            ctx.queue_events,
            reset_evt,
        );
        // If the thread cannot start, the muxer (and its listener) is lost
        // with the closure; activate then fails for good, saying so.
        let worker = Worker::spawn("vsock", move |stop| event_loop.run(stop))
            .map_err(ActivateError::Worker)?;
        self.worker = Some(worker);
        Ok(())
    }

    fn reset(&mut self) {
        let Some(worker) = self.worker.take() else {
            return;
        };
        match worker.stop() {
            Some(state) => {
                let mut muxer = state.muxer;
                muxer.reset();
                self.muxer = Some(muxer);
            }
            None => tracing::error!("vsock worker panicked; the device cannot be reused"),
        }
    }

    fn quiesce(&mut self) -> Result<Vec<virtio_queue::Queue>, ActivateError> {
        let worker = self
            .worker
            .take()
            .ok_or_else(|| ActivateError::Device("vsock is not active".into()))?;
        let state = worker
            .stop()
            .ok_or_else(|| ActivateError::Device("vsock worker panicked".into()))?;
        // Connections stay open: the same VMM resumes them after the snapshot.
        self.muxer = Some(state.muxer);
        Ok(state.queues)
    }

    /// The host sockets of the snapshotted VM are gone: reset the transport
    /// so the guest drops its connections and listens afresh.
    fn restored(&mut self) {
        self.transport_reset();
    }
}
