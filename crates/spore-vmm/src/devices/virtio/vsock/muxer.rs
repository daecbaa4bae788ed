//! The `VsockMuxer`: routes guest packets to connections and host sockets
//! back to the guest.
//!
//! It maps (host port, guest port) pairs to [`Connection`]s, accepts host
//! clients on the listener (Firecracker's hybrid design: `CONNECT <port>\n`
//! reaches guest port `<port>`), connects guest requests for host port `P`
//! to the Unix socket `<uds_path>_P`, and owns the epoll set the device
//! worker sleeps on. It never blocks: every socket is non-blocking and the
//! guest-initiated connect fails rather than waits when the listener's
//! backlog is full.
//!
//! Memory is bounded: at most [`MAX_CONNECTIONS`] connections (each bounded
//! by its credit, see `connection.rs`), [`MAX_HANDSHAKES`] clients still
//! sending their handshake, and [`MAX_RST_QUEUE`] queued resets.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use spore_abi::vsock::EVENT_TRANSPORT_RESET;
use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};

use super::connection::{ConnKey, ConnState, Connection, RxOutcome, Verdict, CONNECT_TIMEOUT};
use super::identity::{Notice, VsockIdentity};
use super::listener::{Handshake, HostListener, ListenerError};
use super::packet::{parse_tx, Header, Op, RxBuffer, TxPacket, HOST_CID, MAX_PAYLOAD, TYPE_STREAM};
use crate::devices::virtio::GuestMemoryMmap;

/// Most simultaneous connections; requests beyond are reset.
pub const MAX_CONNECTIONS: usize = 512;
/// Most host clients still sending their handshake line.
pub const MAX_HANDSHAKES: usize = 64;
/// Most resets waiting for a guest rx buffer; beyond, resets are dropped
/// (only a guest that stops reading its rx queue gets there).
pub const MAX_RST_QUEUE: usize = 1024;
/// First host port handed to host-initiated connections, above the ports
/// guests usually address.
pub const LOCAL_PORT_BASE: u32 = 1 << 30;

/// How long host clients wait for a guest that has not given the event
/// queue a buffer yet (a driver that may never use it) before they are let
/// through anyway.
pub const RESET_ACK_TIMEOUT: Duration = Duration::from_secs(30);
/// How long host clients wait, once the reset event sits in a guest buffer,
/// for the guest to re-post one (it handled the event). A driver that takes
/// event buffers re-arms them after handling one, so this only bounds a
/// broken driver: letting a client through early brings back the silent
/// drop the wait prevents (the guest resets the connection it just accepted
/// and tells nobody), and a starved guest (a loaded host, nested emulation)
/// was seen taking more than 30 s to run its event handler.
pub const RESET_ACK_POSTED_TIMEOUT: Duration = Duration::from_secs(600);

/// A transport reset the guest has not acknowledged yet. Until it does, new
/// host clients are held back: a guest driver handles the reset event and
/// incoming packets in separate steps (Linux: two work items), so a
/// connection it accepted before seeing the event would be reset with the
/// stale ones.
struct ResetAck {
    /// The event queue's available index when the first unacknowledged
    /// reset event was written (read just before); `None` while no event
    /// has a buffer yet. The guest re-posts a buffer once it has handled an
    /// event, moving the index by one per event.
    avail_at_post: Option<u16>,
    /// Reset events written since `avail_at_post`: a second reset (a
    /// restore's, then a clone identity's new CID) posted before the guest
    /// handled the first must be waited for too, or a connection let
    /// through after the first is silently reset by the second.
    events: u16,
    /// When held clients are let through regardless.
    deadline: Instant,
}

#[derive(Debug, thiserror::Error)]
pub enum MuxerError {
    #[error(transparent)]
    Listener(#[from] ListenerError),
    #[error("cannot create the vsock epoll set: {0}")]
    Epoll(#[source] io::Error),
}

pub struct VsockMuxer {
    guest_cid: u64,
    uds_path: PathBuf,
    epoll: Epoll,
    listener: HostListener,
    handshakes: HashMap<RawFd, Handshake>,
    conns: HashMap<ConnKey, Connection>,
    by_fd: HashMap<RawFd, ConnKey>,
    /// Connections that may have a packet for the guest.
    rxq: VecDeque<ConnKey>,
    /// Resets owed to the guest for connections that no longer exist.
    rst_queue: VecDeque<ConnKey>,
    next_local_port: u32,
    pending_reset_event: bool,
    /// Set from a transport reset until the guest acknowledges it.
    reset_ack: Option<ResetAck>,
    /// Host clients (stream, guest port) whose request waits for that ack.
    held_clients: Vec<(UnixStream, u32)>,
    /// [`RESET_ACK_TIMEOUT`] and [`RESET_ACK_POSTED_TIMEOUT`], shorter in tests.
    reset_ack_timeout: Duration,
    reset_ack_posted_timeout: Duration,
    /// Holds one OP_RW payload on its way from a host socket to the guest.
    scratch: Vec<u8>,
    /// Where a CID change comes from (see `identity.rs`).
    identity: Option<Arc<VsockIdentity>>,
    /// Notices to deliver once the guest handled the reset event.
    notices: Vec<Notice>,
    /// Our ends of delivered notices, write side shut: kept open so the
    /// connection sees EOF after the message rather than a hang-up (which
    /// would reset it before the guest accepts). Few, and dropped when old.
    notice_peers: VecDeque<(Instant, UnixStream)>,
}

/// Notice ends kept at most, and for how long.
const MAX_NOTICE_PEERS: usize = 16;
const NOTICE_PEER_LIFETIME: Duration = Duration::from_secs(60);

impl VsockMuxer {
    /// Listens on `uds_path` and prepares the epoll set.
    pub fn new(guest_cid: u64, uds_path: PathBuf) -> Result<Self, MuxerError> {
        let epoll = Epoll::new().map_err(MuxerError::Epoll)?;
        let listener = HostListener::bind(&uds_path)?;
        let me = VsockMuxer {
            guest_cid,
            uds_path,
            epoll,
            listener,
            handshakes: HashMap::new(),
            conns: HashMap::new(),
            by_fd: HashMap::new(),
            rxq: VecDeque::new(),
            rst_queue: VecDeque::new(),
            next_local_port: LOCAL_PORT_BASE,
            pending_reset_event: false,
            reset_ack: None,
            held_clients: Vec::new(),
            reset_ack_timeout: RESET_ACK_TIMEOUT,
            reset_ack_posted_timeout: RESET_ACK_POSTED_TIMEOUT,
            scratch: vec![0; MAX_PAYLOAD],
            identity: None,
            notices: Vec::new(),
            notice_peers: VecDeque::new(),
        };
        me.watch(me.listener.as_raw_fd())
            .map_err(MuxerError::Epoll)?;
        Ok(me)
    }

    pub fn guest_cid(&self) -> u64 {
        self.guest_cid
    }

    /// Takes the guest CID (and notices) from `identity` at every transport reset.
    pub fn share_identity(&mut self, identity: Arc<VsockIdentity>) {
        self.identity = Some(identity);
    }

    /// Shortens [`RESET_ACK_TIMEOUT`] and [`RESET_ACK_POSTED_TIMEOUT`] (tests).
    pub fn set_reset_ack_timeouts(&mut self, unposted: Duration, posted: Duration) {
        self.reset_ack_timeout = unposted;
        self.reset_ack_posted_timeout = posted;
    }

    pub fn uds_path(&self) -> &Path {
        &self.uds_path
    }

    /// Number of live connections.
    pub fn connection_count(&self) -> usize {
        self.conns.len()
    }

    /// Adds `fd` (level-triggered, readable) to the epoll set; events for it
    /// come back from [`VsockMuxer::wait`] with the fd as data.
    pub fn watch(&self, fd: RawFd) -> io::Result<()> {
        self.epoll.ctl(
            ControlOperation::Add,
            fd,
            EpollEvent::new(EventSet::IN, fd as u64),
        )
    }

    /// Removes `fd` from the epoll set.
    pub fn unwatch(&self, fd: RawFd) -> io::Result<()> {
        self.epoll
            .ctl(ControlOperation::Delete, fd, EpollEvent::default())
    }

    /// Sleeps until an fd in the set is ready, the next connection deadline,
    /// or `max_wait`. Returns the number of events filled in.
    pub fn wait(&self, events: &mut [EpollEvent], max_wait: Option<Duration>) -> io::Result<usize> {
        let now = Instant::now();
        let until_deadline = self
            .next_deadline()
            .map(|t| t.saturating_duration_since(now));
        let timeout = match (until_deadline, max_wait) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let ms = match timeout {
            // Round up so the deadline has passed when we wake.
            Some(d) => i32::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(i32::MAX),
            None => -1,
        };
        match self.epoll.wait(ms, events) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(0),
            r => r,
        }
    }

    fn next_deadline(&self) -> Option<Instant> {
        self.conns
            .values()
            .filter_map(Connection::expiry)
            .chain(self.handshakes.values().map(Handshake::deadline))
            .chain(self.reset_ack.as_ref().map(|a| a.deadline))
            .min()
    }

    /// Handles an epoll event. `false` if `fd` is not one of the muxer's
    /// (the caller's own fds, registered with [`VsockMuxer::watch`]).
    pub fn handle_event(&mut self, fd: RawFd, events: EventSet, now: Instant) -> bool {
        if fd == self.listener.as_raw_fd() {
            self.accept_clients(now);
        } else if self.handshakes.contains_key(&fd) {
            self.advance_handshake(fd, now);
        } else if let Some(&key) = self.by_fd.get(&fd) {
            if let Some(conn) = self.conns.get_mut(&key) {
                let verdict = conn.on_host_event(events);
                self.apply(key, verdict);
            }
        } else {
            return false;
        }
        true
    }

    /// Resets connections and drops handshakes whose deadline passed.
    pub fn process_timeouts(&mut self, now: Instant) {
        let expired: Vec<ConnKey> = self
            .conns
            .values()
            .filter(|c| c.expired(now))
            .map(Connection::key)
            .collect();
        for key in expired {
            // A host client whose OP_REQUEST the guest never answered sees
            // its socket closed, as for a refusal: say which it was here.
            if self.conns.get(&key).map(Connection::state) == Some(ConnState::LocalInit) {
                tracing::warn!(
                    "vsock: guest port {} did not answer a host connection within {:?}; closed",
                    key.peer_port,
                    CONNECT_TIMEOUT
                );
            } else {
                tracing::debug!("vsock {key:?}: timed out");
            }
            self.reset_conn(key);
        }
        // Closing a handshake's socket also removes it from the epoll set.
        self.handshakes.retain(|_, h| h.deadline() > now);
    }

    fn accept_clients(&mut self, now: Instant) {
        loop {
            match self.listener.accept() {
                Ok(Some(stream)) => {
                    if self.handshakes.len() >= MAX_HANDSHAKES {
                        tracing::warn!("vsock: too many pending host clients, refusing one");
                        continue;
                    }
                    let hs = Handshake::new(stream, now);
                    let fd = hs.fd();
                    if let Err(e) = self.watch(fd) {
                        tracing::warn!("vsock: cannot watch host client: {e}");
                        continue;
                    }
                    self.handshakes.insert(fd, hs);
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!("vsock: accept on {} failed: {e}", self.uds_path.display());
                    break;
                }
            }
        }
    }

    fn advance_handshake(&mut self, fd: RawFd, now: Instant) {
        let Some(hs) = self.handshakes.get_mut(&fd) else {
            return;
        };
        match hs.advance() {
            Ok(None) => {}
            Ok(Some(port)) => {
                if let Some(hs) = self.handshakes.remove(&fd) {
                    self.start_local(hs.into_stream(), port, now);
                }
            }
            Err(e) => {
                tracing::debug!("vsock: dropping host client: {e}");
                self.handshakes.remove(&fd);
            }
        }
    }

    fn allocate_local_port(&mut self) -> Option<u32> {
        // With at most MAX_CONNECTIONS ports taken, this many tries find one.
        for _ in 0..=MAX_CONNECTIONS {
            let port = self.next_local_port;
            self.next_local_port = port.checked_add(1).unwrap_or(LOCAL_PORT_BASE);
            if !self.conns.keys().any(|k| k.local_port == port) {
                return Some(port);
            }
        }
        None
    }

    /// A host client asked for guest port `peer_port`: send the guest
    /// OP_REQUEST (or hold it until the guest acknowledged a transport reset).
    fn start_local(&mut self, stream: UnixStream, peer_port: u32, now: Instant) {
        if self.reset_ack.is_some() {
            tracing::debug!(
                peer_port,
                "vsock: host client waits for the transport reset"
            );
            // Out of the epoll set while held: a client that gives up (or
            // sends early data) must not wake the worker in a loop.
            let _ = self.unwatch(stream.as_raw_fd());
            if self.held_clients.len() < MAX_HANDSHAKES {
                self.held_clients.push((stream, peer_port));
            } else {
                tracing::warn!(
                    "vsock: too many host clients wait for a transport reset, refusing one"
                );
            }
            return;
        }
        // The handshake watched this fd level-triggered; connections are
        // edge-triggered.
        self.open_to_guest(stream, peer_port, now, ControlOperation::Modify);
    }

    fn open_to_guest(
        &mut self,
        stream: UnixStream,
        peer_port: u32,
        now: Instant,
        watch: ControlOperation,
    ) {
        if self.conns.len() >= MAX_CONNECTIONS {
            tracing::warn!("vsock: {MAX_CONNECTIONS} connections open, refusing host client");
            return;
        }
        let Some(local_port) = self.allocate_local_port() else {
            return;
        };
        let key = ConnKey {
            local_port,
            peer_port,
        };
        let conn = Connection::new_local(stream, key, self.guest_cid, now);
        if let Err(e) = self.epoll.ctl(
            watch,
            conn.fd(),
            EpollEvent::new(conn_events(), conn.fd() as u64),
        ) {
            tracing::warn!("vsock: cannot watch connection: {e}");
            return;
        }
        self.insert(conn);
    }

    /// The guest asked for host port `key.local_port`.
    fn connect_guest(&mut self, key: ConnKey, req: &TxPacket) {
        if self.conns.len() >= MAX_CONNECTIONS {
            tracing::warn!("vsock: {MAX_CONNECTIONS} connections open, refusing guest request");
            self.push_rst(key);
            return;
        }
        let mut path = self.uds_path.as_os_str().to_owned();
        path.push(format!("_{}", key.local_port));
        let stream = match connect_unix(Path::new(&path)) {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!("vsock: guest connect to {path:?} failed: {e}");
                self.push_rst(key);
                return;
            }
        };
        let conn = Connection::new_peer(stream, key, self.guest_cid, req);
        if let Err(e) = self.epoll.ctl(
            ControlOperation::Add,
            conn.fd(),
            EpollEvent::new(conn_events(), conn.fd() as u64),
        ) {
            tracing::warn!("vsock: cannot watch connection: {e}");
            self.push_rst(key);
            return;
        }
        self.insert(conn);
    }

    fn insert(&mut self, conn: Connection) {
        let key = conn.key();
        self.by_fd.insert(conn.fd(), key);
        self.conns.insert(key, conn);
        self.reschedule(key);
    }

    fn reschedule(&mut self, key: ConnKey) {
        if let Some(conn) = self.conns.get_mut(&key) {
            if !conn.in_rxq && conn.has_rx_work() {
                conn.in_rxq = true;
                self.rxq.push_back(key);
            }
        }
    }

    fn apply(&mut self, key: ConnKey, verdict: Verdict) {
        match verdict {
            Verdict::Keep => self.reschedule(key),
            Verdict::Reset => self.reset_conn(key),
            Verdict::Drop => self.remove(key),
        }
    }

    fn remove(&mut self, key: ConnKey) {
        if let Some(conn) = self.conns.remove(&key) {
            self.by_fd.remove(&conn.fd());
            // Dropping the stream closes it, which also leaves the epoll set.
        }
    }

    /// Drops the connection (if any) and tells the guest with OP_RST.
    fn reset_conn(&mut self, key: ConnKey) {
        self.remove(key);
        self.push_rst(key);
    }

    fn push_rst(&mut self, key: ConnKey) {
        if self.rst_queue.len() < MAX_RST_QUEUE {
            self.rst_queue.push_back(key);
        } else {
            tracing::warn!("vsock: guest is not reading resets, dropping one for {key:?}");
        }
    }

    fn handle_guest_packet(&mut self, pkt: TxPacket, now: Instant) {
        let key = ConnKey {
            local_port: pkt.dst_port,
            peer_port: pkt.src_port,
        };
        if let Some(conn) = self.conns.get_mut(&key) {
            let verdict = conn.recv(&pkt, now);
            self.apply(key, verdict);
            return;
        }
        match pkt.op {
            Op::Request => self.connect_guest(key, &pkt),
            // Never answer a reset, or two peers could bounce them forever.
            Op::Rst => {}
            _ => self.push_rst(key),
        }
    }

    /// Consumes every packet the guest queued on tx. Returns whether any
    /// descriptor was used.
    pub fn process_tx(&mut self, mem: &GuestMemoryMmap, queue: &mut Queue, now: Instant) -> bool {
        let mut used = false;
        while let Some(chain) = queue.pop_descriptor_chain(mem) {
            let head = chain.head_index();
            let parsed = parse_tx(mem, chain, self.guest_cid);
            if let Err(e) = queue.add_used(mem, head, 0) {
                tracing::warn!("vsock: cannot return tx descriptor {head}: {e}");
            }
            used = true;
            match parsed {
                Ok(pkt) => self.handle_guest_packet(pkt, now),
                Err(e) => {
                    tracing::debug!("vsock: dropping malformed guest packet: {e}");
                    if let Some((local_port, peer_port)) = e.rst_ports() {
                        self.reset_conn(ConnKey {
                            local_port,
                            peer_port,
                        });
                    }
                }
            }
        }
        used
    }

    /// Whether a packet may be waiting for a guest rx buffer.
    pub fn has_rx_work(&self) -> bool {
        !self.rst_queue.is_empty() || !self.rxq.is_empty()
    }

    /// Fills guest rx buffers with pending packets. Returns whether any
    /// descriptor was used.
    pub fn process_rx(&mut self, mem: &GuestMemoryMmap, queue: &mut Queue, now: Instant) -> bool {
        let mut used = false;
        while self.has_rx_work() {
            let Some(chain) = queue.pop_descriptor_chain(mem) else {
                break;
            };
            let head = chain.head_index();
            let buf = match RxBuffer::new(mem, chain) {
                Ok(Some(buf)) => buf,
                Ok(None) => {
                    tracing::debug!("vsock: rx buffer {head} cannot hold a header, skipping");
                    add_used(queue, mem, head, 0);
                    used = true;
                    continue;
                }
                Err(e) => {
                    tracing::debug!("vsock: bad rx buffer {head}: {e}");
                    add_used(queue, mem, head, 0);
                    used = true;
                    continue;
                }
            };
            let room = buf.payload_room().min(MAX_PAYLOAD);
            let Some(hdr) = self.next_rx_packet(room, now) else {
                // Nothing after all: leave the buffer to the guest.
                queue.go_to_previous_position();
                break;
            };
            let payload_len = if hdr.op == Op::Rw as u16 {
                hdr.len as usize
            } else {
                0
            };
            let written = match buf.write(&hdr, &self.scratch[..payload_len]) {
                Ok(n) => n,
                Err(e) => {
                    tracing::warn!("vsock: cannot write rx packet: {e}");
                    0
                }
            };
            add_used(queue, mem, head, written);
            used = true;
        }
        used
    }

    fn next_rx_packet(&mut self, room: usize, now: Instant) -> Option<Header> {
        loop {
            if let Some(key) = self.rst_queue.pop_front() {
                return Some(self.rst_header(key));
            }
            let key = self.rxq.pop_front()?;
            let Some(conn) = self.conns.get_mut(&key) else {
                continue;
            };
            conn.in_rxq = false;
            match conn.next_rx(&mut self.scratch[..room], now) {
                RxOutcome::Packet(hdr) => {
                    self.reschedule(key);
                    return Some(hdr);
                }
                RxOutcome::Idle => {
                    if conn.has_rx_work() {
                        // Only an rx buffer too small for any payload gets
                        // here: wait for the next buffer.
                        conn.in_rxq = true;
                        self.rxq.push_front(key);
                        return None;
                    }
                }
                RxOutcome::Reset => self.reset_conn(key),
            }
        }
    }

    fn rst_header(&self, key: ConnKey) -> Header {
        Header {
            src_cid: HOST_CID,
            dst_cid: self.guest_cid,
            src_port: key.local_port,
            dst_port: key.peer_port,
            len: 0,
            type_: TYPE_STREAM,
            op: Op::Rst as u16,
            flags: 0,
            buf_alloc: 0,
            fwd_cnt: 0,
        }
    }

    /// Posts a pending transport-reset event if the guest gave an event
    /// buffer, and lets held host clients through once the guest re-posted
    /// one (it handled the event) or the wait timed out. Returns whether any
    /// descriptor was used.
    pub fn process_event_queue(
        &mut self,
        mem: &GuestMemoryMmap,
        queue: &mut Queue,
        now: Instant,
    ) -> bool {
        let avail_idx = |queue: &Queue| {
            queue
                .avail_idx(mem, std::sync::atomic::Ordering::Acquire)
                .ok()
                .map(|w| w.0)
        };
        // Read before posting: a polling driver may see the event, handle it
        // and hand the buffer back before this function reads again.
        let before = avail_idx(queue);
        let was_pending = self.pending_reset_event;
        let used = self.post_reset_event(mem, queue);
        if let Some(ack) = &mut self.reset_ack {
            if was_pending && !self.pending_reset_event {
                // An event is in a guest buffer: the wait counts from now.
                if ack.avail_at_post.is_none() {
                    ack.avail_at_post = before;
                }
                ack.events = ack.events.saturating_add(1);
                ack.deadline = now + self.reset_ack_posted_timeout;
            }
            // Handled when the guest gave back one buffer per event.
            let acked = !self.pending_reset_event
                && match (ack.avail_at_post, avail_idx(queue)) {
                    (Some(at), Some(idx)) => idx.wrapping_sub(at) >= ack.events,
                    _ => false,
                };
            if acked || now >= ack.deadline {
                if acked {
                    tracing::debug!(
                        held = self.held_clients.len(),
                        "vsock: the guest handled the transport reset"
                    );
                } else {
                    tracing::warn!(
                        held = self.held_clients.len(),
                        posted = ack.avail_at_post.is_some(),
                        "vsock: the guest did not acknowledge the transport reset in time; \
                         letting held host clients through"
                    );
                }
                self.reset_ack = None;
                // Notices (a clone's new generation) go out now that the
                // guest's driver is past the reset.
                self.deliver_notices();
                for (stream, port) in std::mem::take(&mut self.held_clients) {
                    // Held clients were out of the epoll set.
                    if let Err(e) = self.watch(stream.as_raw_fd()) {
                        tracing::warn!("vsock: cannot watch a held host client: {e}");
                        continue;
                    }
                    self.start_local(stream, port, now);
                }
            }
        }
        used
    }

    fn post_reset_event(&mut self, mem: &GuestMemoryMmap, queue: &mut Queue) -> bool {
        let mut used = false;
        while self.pending_reset_event {
            let Some(chain) = queue.pop_descriptor_chain(mem) else {
                break;
            };
            let head = chain.head_index();
            let event = EVENT_TRANSPORT_RESET.to_le_bytes();
            let written = match chain.writer(mem) {
                Ok(mut w) if w.available_bytes() >= event.len() => w
                    .write_all(&event)
                    .map(|()| u32::try_from(event.len()).unwrap_or(u32::MAX))
                    .unwrap_or(0),
                _ => 0,
            };
            add_used(queue, mem, head, written);
            used = true;
            if written > 0 {
                tracing::debug!("vsock: transport reset event posted");
                self.pending_reset_event = false;
            }
        }
        used
    }

    /// Opens a connection to each notice's guest port carrying its message;
    /// the host end closes after the message, so the guest reads it then EOF.
    fn deliver_notices(&mut self) {
        let now = Instant::now();
        self.notice_peers
            .retain(|(at, _)| now.duration_since(*at) < NOTICE_PEER_LIFETIME);
        for notice in std::mem::take(&mut self.notices) {
            let pair = UnixStream::pair().and_then(|(near, mut far)| {
                near.set_nonblocking(true)?;
                far.set_nonblocking(true)?;
                // A few bytes into an empty socket buffer: never blocks.
                far.write_all(&notice.message)?;
                far.shutdown(std::net::Shutdown::Write)?;
                Ok((near, far))
            });
            match pair {
                Ok((near, far)) => {
                    self.open_to_guest(near, notice.port, now, ControlOperation::Add);
                    if self.notice_peers.len() >= MAX_NOTICE_PEERS {
                        self.notice_peers.pop_front();
                    }
                    self.notice_peers.push_back((now, far));
                }
                Err(e) => tracing::warn!("vsock: cannot open notice for port {}: {e}", notice.port),
            }
        }
    }

    /// Drops every connection without telling the guest (its driver reset).
    pub fn reset(&mut self) {
        // Closing each stream also removes it from the epoll set.
        self.conns.clear();
        self.by_fd.clear();
        self.rxq.clear();
        self.rst_queue.clear();
        self.pending_reset_event = false;
        self.reset_ack = None;
        self.held_clients.clear();
    }

    /// Drops every connection and queues VIRTIO_VSOCK_EVENT_TRANSPORT_RESET,
    /// after which the guest drops its side of them too (snapshot restore:
    /// the host sockets did not survive).
    pub fn transport_reset(&mut self) {
        let now = Instant::now();
        // Events already in guest buffers and not handled yet still count.
        let unhandled = self
            .reset_ack
            .as_ref()
            .and_then(|a| a.avail_at_post.map(|at| (at, a.events)));
        self.reset();
        self.pending_reset_event = true;
        if let Some(identity) = &self.identity {
            let cid = identity.cid();
            if cid != self.guest_cid {
                tracing::info!("vsock: guest CID {} -> {cid}", self.guest_cid);
                self.guest_cid = cid;
            }
            self.notices.extend(identity.take_notices());
        }
        // A guest that never gives the event queue a buffer holds clients
        // back this long at most.
        self.reset_ack = Some(ResetAck {
            avail_at_post: unhandled.map(|(at, _)| at),
            events: unhandled.map_or(0, |(_, n)| n),
            deadline: now + self.reset_ack_timeout,
        });
    }
}

fn conn_events() -> EventSet {
    EventSet::IN | EventSet::OUT | EventSet::READ_HANG_UP | EventSet::EDGE_TRIGGERED
}

fn add_used(queue: &mut Queue, mem: &GuestMemoryMmap, head: u16, len: u32) {
    if let Err(e) = queue.add_used(mem, head, len) {
        tracing::warn!("vsock: cannot return descriptor {head}: {e}");
    }
}

/// Connects to a host listener without ever blocking: a full backlog
/// fails with `EAGAIN` instead of stalling the worker.
fn connect_unix(path: &Path) -> io::Result<UnixStream> {
    let addr = socket2::SockAddr::unix(path)?;
    let sock = socket2::Socket::new(socket2::Domain::UNIX, socket2::Type::STREAM, None)?;
    sock.set_nonblocking(true)?;
    sock.connect(&addr)?;
    Ok(sock.into())
}
