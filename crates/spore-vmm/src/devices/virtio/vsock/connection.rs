//! One vsock stream connection between a guest port and a host Unix socket:
//! its state machine and the credit accounting of both directions.
//!
//! Guest → host: we advertise a receive buffer of [`TX_BUF_SIZE`] bytes and
//! count in `fwd_cnt` every guest byte written to the host socket. Bytes the
//! host socket cannot take yet wait in `tx_buf`, which credit bounds: a guest
//! that sends beyond its credit gets the connection reset, so a connection
//! never holds more than [`TX_BUF_SIZE`] bytes of guest data.
//!
//! Host → guest: we never send more than the guest's credit
//! (`buf_alloc - (rx_cnt - fwd_cnt)` from its latest header), and stop
//! reading the host socket while that credit is zero.
//!
//! The host socket is watched edge-triggered; `readable`/`writable` remember
//! the last readiness seen until a read or write hits `WouldBlock`. A
//! connection never touches guest memory or queues; the muxer moves its
//! packets.

use std::collections::VecDeque;
use std::io::{self, Read};
use std::net::Shutdown;
use std::num::Wrapping;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use vmm_sys_util::epoll::EventSet;

use super::packet::{
    Header, Op, TxPacket, HOST_CID, SHUTDOWN_BOTH, SHUTDOWN_RCV, SHUTDOWN_SEND, TYPE_STREAM,
};

/// The receive buffer we advertise to the guest for each connection; also
/// the most guest data a connection ever buffers.
pub const TX_BUF_SIZE: u32 = 128 * 1024;
/// Forwarded bytes after which we tell the guest about its new credit
/// unprompted. A guest only blocks at zero credit, when a whole buffer is
/// in flight, so it always hears back once we forward past this.
pub const CREDIT_UPDATE_THRESHOLD: u32 = TX_BUF_SIZE / 4;
/// How long the guest has to answer a host-initiated OP_REQUEST.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a fully shut-down connection waits for the peer's OP_RST (or
/// for buffered data to drain) before we reset it ourselves.
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(2);

const PENDING_REQUEST: u8 = 1;
const PENDING_RESPONSE: u8 = 2;
const PENDING_CREDIT_UPDATE: u8 = 4;
const PENDING_CREDIT_REQUEST: u8 = 8;

/// A connection's address: host ("local") port and guest ("peer") port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnKey {
    pub local_port: u32,
    pub peer_port: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnState {
    /// Host-initiated: OP_REQUEST queued or sent, the guest has not answered.
    LocalInit,
    /// Data may flow (possibly half-closed, see the shutdown flags).
    Established,
}

/// What the muxer must do with a connection after handing it an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Keep,
    /// Send the guest OP_RST and drop the connection.
    Reset,
    /// Drop the connection without telling the guest (it sent OP_RST).
    Drop,
}

/// The next packet a connection wants delivered to the guest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RxOutcome {
    /// A packet; for OP_RW, `hdr.len` payload bytes are in the buffer
    /// passed to [`Connection::next_rx`].
    Packet(Header),
    /// Nothing to send now.
    Idle,
    /// The host socket failed: reset the connection.
    Reset,
}

pub struct Connection {
    stream: UnixStream,
    key: ConnKey,
    guest_cid: u64,
    state: ConnState,
    /// Control packets owed to the guest (`PENDING_*`).
    pending: u8,

    // Host -> guest credit.
    peer_buf_alloc: u32,
    peer_fwd_cnt: Wrapping<u32>,
    /// Payload bytes sent to the guest.
    rx_cnt: Wrapping<u32>,
    /// We asked for credit since the guest last reported it.
    credit_requested: bool,

    // Guest -> host.
    tx_buf: VecDeque<u8>,
    /// Leading bytes of `tx_buf` that are ours (the `OK <port>` line), not
    /// the guest's, so forwarding them earns the guest no credit.
    tx_uncredited: usize,
    fwd_cnt: Wrapping<u32>,
    last_fwd_cnt_sent: Wrapping<u32>,

    readable: bool,
    writable: bool,
    /// The host peer closed its socket entirely.
    host_hup: bool,
    /// We read EOF from the host and told the guest (OP_SHUTDOWN).
    host_eof: bool,
    host_write_shut: bool,
    /// Shutdown flags the guest sent.
    peer_shut: u32,
    expiry: Option<Instant>,
    /// Set by the muxer while the connection sits in its rx work queue.
    pub(super) in_rxq: bool,
}

impl Connection {
    fn base(stream: UnixStream, key: ConnKey, guest_cid: u64, state: ConnState) -> Self {
        Connection {
            stream,
            key,
            guest_cid,
            state,
            pending: 0,
            peer_buf_alloc: 0,
            peer_fwd_cnt: Wrapping(0),
            rx_cnt: Wrapping(0),
            credit_requested: false,
            tx_buf: VecDeque::new(),
            tx_uncredited: 0,
            fwd_cnt: Wrapping(0),
            last_fwd_cnt_sent: Wrapping(0),
            readable: false,
            writable: true,
            host_hup: false,
            host_eof: false,
            host_write_shut: false,
            peer_shut: 0,
            expiry: None,
            in_rxq: false,
        }
    }

    /// A host client asked (`CONNECT <port>`) to reach guest port
    /// `key.peer_port`; the guest is sent OP_REQUEST.
    pub fn new_local(stream: UnixStream, key: ConnKey, guest_cid: u64, now: Instant) -> Self {
        let mut c = Self::base(stream, key, guest_cid, ConnState::LocalInit);
        c.pending = PENDING_REQUEST;
        c.expiry = Some(now + CONNECT_TIMEOUT);
        c
    }

    /// The guest's OP_REQUEST `req` reached a host listener over `stream`;
    /// the guest is sent OP_RESPONSE.
    pub fn new_peer(stream: UnixStream, key: ConnKey, guest_cid: u64, req: &TxPacket) -> Self {
        let mut c = Self::base(stream, key, guest_cid, ConnState::Established);
        c.pending = PENDING_RESPONSE;
        c.peer_buf_alloc = req.buf_alloc;
        c.peer_fwd_cnt = Wrapping(req.fwd_cnt);
        c
    }

    pub fn key(&self) -> ConnKey {
        self.key
    }

    pub fn fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }

    pub fn state(&self) -> ConnState {
        self.state
    }

    pub fn expiry(&self) -> Option<Instant> {
        self.expiry
    }

    /// Bytes we may still send the guest.
    pub fn peer_credit(&self) -> u32 {
        let in_flight = (self.rx_cnt - self.peer_fwd_cnt).0;
        self.peer_buf_alloc.saturating_sub(in_flight)
    }

    /// Guest bytes received but not yet written to the host socket.
    pub fn guest_bytes_buffered(&self) -> usize {
        self.tx_buf.len() - self.tx_uncredited
    }

    fn can_read_host(&self) -> bool {
        self.state == ConnState::Established
            && self.readable
            && !self.host_eof
            && self.peer_shut & SHUTDOWN_RCV == 0
    }

    /// Whether [`Connection::next_rx`] may produce a packet.
    pub fn has_rx_work(&self) -> bool {
        self.pending != 0
            || (self.can_read_host() && (self.peer_credit() > 0 || !self.credit_requested))
    }

    fn update_peer_credit(&mut self, buf_alloc: u32, fwd_cnt: u32) {
        if buf_alloc != self.peer_buf_alloc || fwd_cnt != self.peer_fwd_cnt.0 {
            self.credit_requested = false;
        }
        self.peer_buf_alloc = buf_alloc;
        self.peer_fwd_cnt = Wrapping(fwd_cnt);
    }

    /// Handles a validated packet the guest sent on this connection.
    pub fn recv(&mut self, pkt: &TxPacket, now: Instant) -> Verdict {
        if pkt.op == Op::Rst {
            return Verdict::Drop;
        }
        self.update_peer_credit(pkt.buf_alloc, pkt.fwd_cnt);
        match pkt.op {
            Op::Rst => Verdict::Drop,
            // A second REQUEST for a live connection: the guest lost track.
            Op::Request => Verdict::Reset,
            Op::Response => {
                if self.state != ConnState::LocalInit {
                    return Verdict::Reset;
                }
                self.state = ConnState::Established;
                self.expiry = None;
                // tx_buf is empty: OP_RW before OP_RESPONSE resets.
                let line = format!("OK {}\n", self.key.local_port);
                self.tx_uncredited = line.len();
                self.tx_buf.extend(line.as_bytes());
                self.flush_and_settle()
            }
            Op::Rw => {
                if self.state != ConnState::Established
                    || self.peer_shut & SHUTDOWN_SEND != 0
                    || self.host_write_shut
                {
                    return Verdict::Reset;
                }
                if self.guest_bytes_buffered() + pkt.payload.len() > TX_BUF_SIZE as usize {
                    tracing::debug!(
                        "vsock {:?}: guest sent beyond its credit, resetting",
                        self.key
                    );
                    return Verdict::Reset;
                }
                self.tx_buf.extend(&pkt.payload);
                self.flush_and_settle()
            }
            Op::Shutdown => {
                if self.state != ConnState::Established {
                    return Verdict::Reset;
                }
                self.peer_shut |= pkt.flags & SHUTDOWN_BOTH;
                if self.peer_shut == SHUTDOWN_BOTH && self.expiry.is_none() {
                    self.expiry = Some(now + SHUTDOWN_TIMEOUT);
                }
                self.flush_and_settle()
            }
            Op::CreditUpdate => Verdict::Keep,
            Op::CreditRequest => {
                self.pending |= PENDING_CREDIT_UPDATE;
                Verdict::Keep
            }
        }
    }

    /// Handles readiness of the host socket.
    pub fn on_host_event(&mut self, ev: EventSet) -> Verdict {
        if ev
            .intersects(EventSet::IN | EventSet::READ_HANG_UP | EventSet::HANG_UP | EventSet::ERROR)
        {
            self.readable = true;
        }
        if ev.intersects(EventSet::HANG_UP | EventSet::ERROR) {
            self.host_hup = true;
        }
        if ev.intersects(EventSet::OUT | EventSet::HANG_UP | EventSet::ERROR) {
            self.writable = true;
        }
        // Nobody is left to talk to: the client gave up before the guest
        // accepted, or the guest will not read what is left.
        if self.host_hup
            && (self.state == ConnState::LocalInit || self.peer_shut & SHUTDOWN_RCV != 0)
        {
            return Verdict::Reset;
        }
        self.flush_and_settle()
    }

    fn flush_and_settle(&mut self) -> Verdict {
        if self.writable {
            if let Err(e) = self.flush() {
                tracing::debug!("vsock {:?}: host socket write failed: {e}", self.key);
                return Verdict::Reset;
            }
        }
        self.settle()
    }

    /// Applies the guest's shutdown once all it sent reached the host.
    fn settle(&mut self) -> Verdict {
        if !self.tx_buf.is_empty() {
            return Verdict::Keep;
        }
        // Linux's close() sends SHUTDOWN with both flags and waits for our
        // RST to finish.
        if self.peer_shut == SHUTDOWN_BOTH {
            return Verdict::Reset;
        }
        if self.peer_shut & SHUTDOWN_SEND != 0 && !self.host_write_shut {
            // The host client sees EOF; it may still answer (half-close).
            let _ = self.stream.shutdown(Shutdown::Write);
            self.host_write_shut = true;
        }
        Verdict::Keep
    }

    fn flush(&mut self) -> io::Result<()> {
        while !self.tx_buf.is_empty() {
            let (front, _) = self.tx_buf.as_slices();
            // MSG_NOSIGNAL: a vanished client must be an EPIPE, not a SIGPIPE.
            let sent =
                socket2::SockRef::from(&self.stream).send_with_flags(front, libc::MSG_NOSIGNAL);
            match sent {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.consume_tx(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.writable = false;
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn consume_tx(&mut self, n: usize) {
        self.tx_buf.drain(..n);
        let ours = n.min(self.tx_uncredited);
        self.tx_uncredited -= ours;
        // n - ours <= TX_BUF_SIZE, so it fits a u32.
        self.fwd_cnt += Wrapping(u32::try_from(n - ours).unwrap_or(u32::MAX));
        if (self.fwd_cnt - self.last_fwd_cnt_sent).0 >= CREDIT_UPDATE_THRESHOLD {
            self.pending |= PENDING_CREDIT_UPDATE;
        }
    }

    fn header(&mut self, op: Op, flags: u32, len: u32) -> Header {
        // Every packet carries our credit; the guest needs no separate update.
        self.last_fwd_cnt_sent = self.fwd_cnt;
        self.pending &= !PENDING_CREDIT_UPDATE;
        Header {
            src_cid: HOST_CID,
            dst_cid: self.guest_cid,
            src_port: self.key.local_port,
            dst_port: self.key.peer_port,
            len,
            type_: TYPE_STREAM,
            op: op as u16,
            flags,
            buf_alloc: TX_BUF_SIZE,
            fwd_cnt: self.fwd_cnt.0,
        }
    }

    /// Produces the next packet for the guest. `buf` receives an OP_RW
    /// payload; at most `buf.len()` bytes (the rx buffer's room) are read.
    pub fn next_rx(&mut self, buf: &mut [u8], now: Instant) -> RxOutcome {
        for (bit, op) in [
            (PENDING_REQUEST, Op::Request),
            (PENDING_RESPONSE, Op::Response),
            (PENDING_CREDIT_UPDATE, Op::CreditUpdate),
            (PENDING_CREDIT_REQUEST, Op::CreditRequest),
        ] {
            if self.pending & bit != 0 {
                self.pending &= !bit;
                return RxOutcome::Packet(self.header(op, 0, 0));
            }
        }
        if !self.can_read_host() {
            return RxOutcome::Idle;
        }
        let credit = self.peer_credit() as usize;
        if credit == 0 {
            // The guest normally updates us as it reads; ask once in case
            // it is waiting to be asked.
            if !self.credit_requested {
                self.credit_requested = true;
                return RxOutcome::Packet(self.header(Op::CreditRequest, 0, 0));
            }
            return RxOutcome::Idle;
        }
        let max = buf.len().min(credit);
        if max == 0 {
            return RxOutcome::Idle;
        }
        loop {
            return match self.stream.read(&mut buf[..max]) {
                Ok(0) => {
                    self.host_eof = true;
                    let mut flags = SHUTDOWN_SEND;
                    if self.host_hup {
                        // The client is gone entirely: it will not read either.
                        flags |= SHUTDOWN_RCV;
                        self.expiry = Some(now + SHUTDOWN_TIMEOUT);
                    }
                    RxOutcome::Packet(self.header(Op::Shutdown, flags, 0))
                }
                Ok(n) => {
                    // n <= max <= credit, a u32.
                    let n32 = u32::try_from(n).unwrap_or(u32::MAX);
                    self.rx_cnt += Wrapping(n32);
                    RxOutcome::Packet(self.header(Op::Rw, 0, n32))
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.readable = false;
                    RxOutcome::Idle
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::debug!("vsock {:?}: host socket read failed: {e}", self.key);
                    RxOutcome::Reset
                }
            };
        }
    }

    /// Whether the connection's deadline (connect or shutdown) passed.
    pub fn expired(&self, now: Instant) -> bool {
        self.expiry.is_some_and(|t| t <= now)
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    const CID: u64 = 3;

    fn pkt(op: Op, buf_alloc: u32, fwd_cnt: u32, payload: &[u8]) -> TxPacket {
        TxPacket {
            src_port: 1000,
            dst_port: 52,
            op,
            flags: 0,
            buf_alloc,
            fwd_cnt,
            payload: payload.to_vec(),
        }
    }

    fn peer_conn(buf_alloc: u32) -> (Connection, UnixStream) {
        let (ours, theirs) = UnixStream::pair().unwrap();
        ours.set_nonblocking(true).unwrap();
        let key = ConnKey {
            local_port: 52,
            peer_port: 1000,
        };
        let c = Connection::new_peer(ours, key, CID, &pkt(Op::Request, buf_alloc, 0, &[]));
        (c, theirs)
    }

    fn next_packet(c: &mut Connection, buf: &mut [u8]) -> Header {
        match c.next_rx(buf, Instant::now()) {
            RxOutcome::Packet(h) => h,
            other => panic!("expected a packet, got {other:?}"),
        }
    }

    #[test]
    fn never_sends_beyond_guest_credit() {
        let (mut c, mut host) = peer_conn(1000);
        let mut buf = vec![0u8; 4096];
        let h = next_packet(&mut c, &mut buf);
        assert_eq!(h.op, Op::Response as u16);
        assert_eq!((h.src_port, h.dst_port, h.dst_cid), (52, 1000, CID));

        host.write_all(&[7u8; 3000]).unwrap();
        c.on_host_event(EventSet::IN);
        let h = next_packet(&mut c, &mut buf);
        assert_eq!((h.op, h.len), (Op::Rw as u16, 1000));
        assert_eq!(c.peer_credit(), 0);

        // Out of credit: one credit request, then nothing until the guest
        // reports progress.
        assert_eq!(next_packet(&mut c, &mut buf).op, Op::CreditRequest as u16);
        assert_eq!(c.next_rx(&mut buf, Instant::now()), RxOutcome::Idle);
        assert!(!c.has_rx_work());

        let v = c.recv(&pkt(Op::CreditUpdate, 1000, 600, &[]), Instant::now());
        assert_eq!(v, Verdict::Keep);
        assert_eq!(c.peer_credit(), 600);
        assert!(c.has_rx_work());
        let h = next_packet(&mut c, &mut buf);
        assert_eq!((h.op, h.len), (Op::Rw as u16, 600));

        // A bigger guest buffer opens more credit.
        c.recv(&pkt(Op::CreditUpdate, 4000, 1600, &[]), Instant::now());
        let h = next_packet(&mut c, &mut buf[..500]);
        assert_eq!(h.len, 500);
        let h = next_packet(&mut c, &mut buf);
        assert_eq!(h.len, 900);
    }

    #[test]
    fn counts_forwarded_bytes_and_updates_credit() {
        let (mut c, mut host) = peer_conn(65536);
        let mut buf = vec![0u8; 4096];
        next_packet(&mut c, &mut buf); // RESPONSE

        let chunk = vec![1u8; 16 * 1024];
        assert_eq!(
            c.recv(&pkt(Op::Rw, 65536, 0, &chunk), Instant::now()),
            Verdict::Keep
        );
        let mut got = vec![0u8; chunk.len()];
        host.read_exact(&mut got).unwrap();
        assert_eq!(got, chunk);
        // Below the threshold: no unsolicited update...
        assert!(!c.has_rx_work());
        // ...but a credit request is answered, with the forwarded count.
        c.recv(&pkt(Op::CreditRequest, 65536, 0, &[]), Instant::now());
        let h = next_packet(&mut c, &mut buf);
        assert_eq!(h.op, Op::CreditUpdate as u16);
        assert_eq!((h.buf_alloc, h.fwd_cnt), (TX_BUF_SIZE, 16 * 1024));

        // Forwarding past the threshold triggers an update by itself.
        for _ in 0..2 {
            c.recv(&pkt(Op::Rw, 65536, 0, &chunk), Instant::now());
            host.read_exact(&mut got).unwrap();
        }
        assert!(c.has_rx_work());
        let h = next_packet(&mut c, &mut buf);
        assert_eq!(h.op, Op::CreditUpdate as u16);
        assert_eq!(h.fwd_cnt, 48 * 1024);
    }

    #[test]
    fn buffers_at_most_its_advertised_credit() {
        let (mut c, _host) = peer_conn(65536);
        let chunk = vec![2u8; 64 * 1024];
        // Nobody reads the host socket: data piles up in the socket, then in
        // tx_buf, and the guest's credit shrinks accordingly.
        let mut verdict = Verdict::Keep;
        for _ in 0..64 {
            verdict = c.recv(&pkt(Op::Rw, 65536, 0, &chunk), Instant::now());
            assert!(c.guest_bytes_buffered() <= TX_BUF_SIZE as usize);
            if verdict != Verdict::Keep {
                break;
            }
        }
        assert_eq!(verdict, Verdict::Reset, "credit overrun must reset");
    }

    #[test]
    fn host_initiated_handshake_writes_ok_line_without_credit() {
        let (ours, mut host) = UnixStream::pair().unwrap();
        ours.set_nonblocking(true).unwrap();
        let key = ConnKey {
            local_port: 1 << 30,
            peer_port: 52,
        };
        let now = Instant::now();
        let mut c = Connection::new_local(ours, key, CID, now);
        let mut buf = vec![0u8; 64];
        let h = next_packet(&mut c, &mut buf);
        assert_eq!(
            (h.op, h.src_port, h.dst_port),
            (Op::Request as u16, 1 << 30, 52)
        );
        assert!(c.expired(now + CONNECT_TIMEOUT));

        // Data before the guest accepted is a protocol error.
        let mut early = c.recv(&pkt(Op::Rw, 4096, 0, b"x"), now);
        assert_eq!(early, Verdict::Reset);
        early = c.recv(&pkt(Op::Response, 4096, 0, &[]), now);
        assert_eq!(early, Verdict::Keep);
        assert_eq!(c.state(), ConnState::Established);
        assert!(!c.expired(now + CONNECT_TIMEOUT));
        let mut line = vec![0u8; 14];
        host.read_exact(&mut line).unwrap();
        assert_eq!(line, b"OK 1073741824\n");
        // Our own line earns the guest no credit.
        c.recv(&pkt(Op::CreditRequest, 4096, 0, &[]), now);
        assert_eq!(next_packet(&mut c, &mut buf).fwd_cnt, 0);
    }

    #[test]
    fn shutdown_both_ways() {
        // Guest closes: RST once its data is out.
        let (mut c, mut host) = peer_conn(4096);
        c.recv(&pkt(Op::Rw, 4096, 0, b"bye"), Instant::now());
        let mut sd = pkt(Op::Shutdown, 4096, 0, &[]);
        sd.flags = SHUTDOWN_SEND;
        assert_eq!(c.recv(&sd, Instant::now()), Verdict::Keep);
        let mut all = Vec::new();
        host.read_to_end(&mut all).unwrap(); // EOF: we shut our write side
        assert_eq!(all, b"bye");
        sd.flags = SHUTDOWN_BOTH;
        assert_eq!(c.recv(&sd, Instant::now()), Verdict::Reset);

        // Host closes: data, then SHUTDOWN with both flags.
        let (mut c, mut host) = peer_conn(4096);
        let mut buf = vec![0u8; 4096];
        next_packet(&mut c, &mut buf); // RESPONSE
        host.write_all(b"last").unwrap();
        drop(host);
        assert_eq!(
            c.on_host_event(EventSet::IN | EventSet::HANG_UP),
            Verdict::Keep
        );
        let h = next_packet(&mut c, &mut buf);
        assert_eq!((h.op, &buf[..4]), (Op::Rw as u16, &b"last"[..]));
        let h = next_packet(&mut c, &mut buf);
        assert_eq!((h.op, h.flags), (Op::Shutdown as u16, SHUTDOWN_BOTH));
        assert!(c.expired(Instant::now() + SHUTDOWN_TIMEOUT));
        assert_eq!(
            c.recv(&pkt(Op::Rst, 0, 0, &[]), Instant::now()),
            Verdict::Drop
        );
    }
}
