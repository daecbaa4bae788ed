//! One vsock stream connection, guest side: its receive buffer and the
//! credit accounting of both directions (virtio 1.2 §5.10.6.3).
//!
//! The receive buffer has a fixed capacity allocated once, before the app
//! can fill the heap: a connection never allocates while it runs, so a full
//! heap never breaks a client. The capacity is what the guest advertises as
//! `buf_alloc`; a peer that sends past its credit loses the excess.

use alloc::vec::Vec;

use crate::virtio::VirtioError;

/// A fixed-capacity byte FIFO.
pub struct ByteRing {
    buf: Vec<u8>,
    head: usize,
    len: usize,
}

impl ByteRing {
    pub fn with_capacity(cap: usize) -> Result<Self, VirtioError> {
        let mut buf = Vec::new();
        buf.try_reserve_exact(cap)
            .map_err(|_| VirtioError::OutOfMemory)?;
        buf.resize(cap, 0);
        Ok(ByteRing {
            buf,
            head: 0,
            len: 0,
        })
    }

    pub fn capacity(&self) -> usize {
        self.buf.len()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn clear(&mut self) {
        self.head = 0;
        self.len = 0;
    }

    /// Appends as much of `data` as fits; returns the bytes taken.
    pub fn push(&mut self, data: &[u8]) -> usize {
        let cap = self.buf.len();
        let n = data.len().min(cap - self.len);
        let tail = (self.head + self.len) % cap.max(1);
        let first = n.min(cap - tail);
        self.buf[tail..tail + first].copy_from_slice(&data[..first]);
        self.buf[..n - first].copy_from_slice(&data[first..n]);
        self.len += n;
        n
    }

    /// Moves up to `out.len()` bytes out; returns how many.
    pub fn pop(&mut self, out: &mut [u8]) -> usize {
        let n = out.len().min(self.len);
        let n = self.peek(&mut out[..n]);
        self.consume(n);
        n
    }

    /// Copies up to `out.len()` bytes from the front without consuming them.
    pub fn peek(&self, out: &mut [u8]) -> usize {
        let cap = self.buf.len();
        let n = out.len().min(self.len);
        let first = n.min(cap - self.head);
        out[..first].copy_from_slice(&self.buf[self.head..self.head + first]);
        out[first..n].copy_from_slice(&self.buf[..n - first]);
        n
    }

    pub fn consume(&mut self, n: usize) {
        let n = n.min(self.len);
        self.head = (self.head + n) % self.buf.len().max(1);
        self.len -= n;
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnState {
    /// The slot holds no connection.
    Free,
    /// Open both ways (possibly half-closed by the peer, see `peer_shutdown`).
    Established,
    /// The peer reset it or shut both directions: the app reads what is
    /// buffered, then EOF, and must still `close` it.
    PeerClosed,
    /// The app closed it; waiting for the peer's RST (or a timeout).
    Closing,
}

/// Control packets owed to the peer, sent as soon as a tx buffer is free.
pub mod pending {
    pub const RESPONSE: u8 = 1;
    pub const CREDIT_UPDATE: u8 = 2;
    pub const SHUTDOWN: u8 = 4;
    pub const RST: u8 = 8;
}

pub struct Conn {
    pub state: ConnState,
    /// Bumped each time the slot is reused, so stale `ConnId`s miss.
    pub generation: u32,
    pub local_port: u32,
    pub peer_port: u32,
    pub rx: ByteRing,
    /// Bytes the app consumed (advertised to the peer).
    pub fwd_cnt: u32,
    pub last_fwd_sent: u32,
    /// Bytes sent to the peer.
    pub tx_cnt: u32,
    pub peer_buf_alloc: u32,
    pub peer_fwd_cnt: u32,
    pub peer_shutdown: u32,
    pub pending: u8,
    /// Handed to the app by `accept`.
    pub accepted: bool,
    /// TSC when `Closing` began.
    pub closing_since: u64,
}

impl Conn {
    pub fn new(rx_capacity: usize) -> Result<Self, VirtioError> {
        Ok(Conn {
            state: ConnState::Free,
            generation: 0,
            local_port: 0,
            peer_port: 0,
            rx: ByteRing::with_capacity(rx_capacity)?,
            fwd_cnt: 0,
            last_fwd_sent: 0,
            tx_cnt: 0,
            peer_buf_alloc: 0,
            peer_fwd_cnt: 0,
            peer_shutdown: 0,
            pending: 0,
            accepted: false,
            closing_since: 0,
        })
    }

    /// Takes the slot for a new connection from the peer's REQUEST.
    pub fn open(&mut self, local_port: u32, peer_port: u32, buf_alloc: u32, fwd_cnt: u32) {
        self.state = ConnState::Established;
        self.generation = self.generation.wrapping_add(1);
        self.local_port = local_port;
        self.peer_port = peer_port;
        self.rx.clear();
        self.fwd_cnt = 0;
        self.last_fwd_sent = 0;
        self.tx_cnt = 0;
        self.peer_buf_alloc = buf_alloc;
        self.peer_fwd_cnt = fwd_cnt;
        self.peer_shutdown = 0;
        self.pending = pending::RESPONSE;
        self.accepted = false;
    }

    pub fn free(&mut self) {
        self.state = ConnState::Free;
        self.pending = 0;
        self.rx.clear();
    }

    /// Bytes the peer can still take.
    pub fn peer_credit(&self) -> u32 {
        let in_flight = self.tx_cnt.wrapping_sub(self.peer_fwd_cnt);
        self.peer_buf_alloc.saturating_sub(in_flight)
    }

    pub fn is_open(&self) -> bool {
        self.state != ConnState::Free
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_wraps_and_refuses_overflow() {
        let mut r = ByteRing::with_capacity(8).unwrap();
        assert_eq!(r.push(b"abcdef"), 6);
        let mut out = [0u8; 4];
        assert_eq!(r.pop(&mut out), 4);
        assert_eq!(&out, b"abcd");
        assert_eq!(r.push(b"ghijklmn"), 6);
        let mut all = [0u8; 16];
        assert_eq!(r.pop(&mut all), 8);
        assert_eq!(&all[..8], b"efghijkl");
        assert!(r.is_empty());
    }

    #[test]
    fn credit_never_underflows() {
        let mut c = Conn::new(16).unwrap();
        c.open(1, 2, 100, 0);
        c.tx_cnt = 150;
        assert_eq!(c.peer_credit(), 0);
        c.peer_fwd_cnt = 120;
        assert_eq!(c.peer_credit(), 70);
        // Counters wrap at 2^32.
        c.tx_cnt = 5;
        c.peer_fwd_cnt = u32::MAX - 4;
        assert_eq!(c.peer_credit(), 90);
    }
}
