//! The virtio-vsock driver (device id 19): stream sockets that host
//! programs open to the guest through the VMM (for spore's hybrid vsock,
//! `CONNECT <port>` on the device's Unix socket, e.g. `spore vsock connect`
//! or `spore vsock forward`).
//!
//! Polled: [`Vsock::poll`] drains the used rings (packets from the host,
//! finished transmissions, transport events) and sends the control packets
//! owed; [`Vsock::wait_for_work`] polls and otherwise sleeps in the signal
//! port's `wait` until the device has something. The app API is
//! [`Vsock::listen`], [`Vsock::accept`], [`Vsock::recv`], [`Vsock::send`] /
//! [`Vsock::write_all`] and [`Vsock::close`], with blocking helpers.
//!
//! Everything is allocated in [`Vsock::new`]: queues, packet buffers and a
//! fixed number of connection slots with their receive buffers. Serving
//! connections allocates nothing, so an app whose heap is full keeps its
//! sockets working.

mod conn;
mod header;
#[cfg(test)]
mod tests;

use alloc::vec::Vec;
use core::fmt;

use self::conn::{pending, Conn, ConnState};
pub use self::header::Header as PacketHeader;
use self::header::{
    op, Header, EVENT_TRANSPORT_RESET, HDR_SIZE, HOST_CID, SHUTDOWN_BOTH, SHUTDOWN_RCV,
    SHUTDOWN_SEND, TYPE_STREAM,
};
use super::mmio::{Transport, F_VERSION_1};
use super::queue::VirtQueue;
use super::{device_id, find_device, VirtioError};
use crate::{clock, BootInfo};

const RXQ: u16 = 0;
const TXQ: u16 = 1;
const EVQ: u16 = 2;

/// Payload room of one receive buffer.
const RX_PAYLOAD: usize = 4096;
const RX_BUFS: u16 = 64;
/// Largest payload of one packet the guest sends.
const TX_PAYLOAD: usize = 16 * 1024;
const TX_BUFS: u16 = 32;
const EV_BUFS: u16 = 4;
const EV_SIZE: usize = 8;
/// A connection the app closed is forgotten after this long without the
/// peer's RST.
const CLOSE_TIMEOUT_US: u64 = 2_000_000;

/// Sizes chosen when the driver starts.
#[derive(Clone, Copy, Debug)]
pub struct VsockConfig {
    /// Connection slots (simultaneous connections).
    pub max_connections: usize,
    /// Receive buffer per connection; advertised as `buf_alloc`.
    pub conn_buffer: usize,
}

impl Default for VsockConfig {
    fn default() -> Self {
        VsockConfig {
            max_connections: 8,
            conn_buffer: 64 * 1024,
        }
    }
}

/// Names one connection; stale once the connection is closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnId {
    slot: u16,
    generation: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VsockError {
    /// Nothing to read yet (or no room to send): poll or wait, then retry.
    WouldBlock,
    /// The connection is closed (by the peer, a reset, or the app).
    Closed,
    /// Every listening slot is taken.
    TooManyListeners,
}

impl fmt::Display for VsockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::WouldBlock => write!(f, "vsock: operation would block"),
            Self::Closed => write!(f, "vsock: connection closed"),
            Self::TooManyListeners => write!(f, "vsock: too many listening ports"),
        }
    }
}

/// Counters of what the driver did, for apps and benchmarks.
#[derive(Clone, Copy, Debug, Default)]
pub struct VsockStats {
    pub packets_in: u64,
    pub packets_out: u64,
    pub notifies: u64,
    pub waits: u64,
    pub refused: u64,
    /// Bytes a peer sent past the credit the guest gave it (dropped).
    pub overrun_bytes: u64,
}

pub struct Vsock {
    transport: Transport,
    guest_cid: u64,
    rx: VirtQueue,
    tx: VirtQueue,
    ev: VirtQueue,
    /// `rx.size()` buffers of `HDR_SIZE + RX_PAYLOAD`; descriptor id = index.
    rx_bufs: Vec<u8>,
    /// `tx.size()` buffers of `HDR_SIZE + TX_PAYLOAD`, indexed by descriptor id.
    tx_bufs: Vec<u8>,
    ev_bufs: Vec<u8>,
    listeners: [Option<u32>; 8],
    conns: Vec<Conn>,
    /// RSTs owed for packets that matched no connection: (peer port, local port).
    orphan_rsts: [(u32, u32); 8],
    orphan_count: usize,
    stats: VsockStats,
}

fn alloc_zeroed_vec(n: usize) -> Result<Vec<u8>, VirtioError> {
    let mut v = Vec::new();
    v.try_reserve_exact(n)
        .map_err(|_| VirtioError::OutOfMemory)?;
    v.resize(n, 0);
    Ok(v)
}

impl Vsock {
    /// Finds the vsock device in the boot info and brings it up.
    pub fn new(info: &BootInfo, config: VsockConfig) -> Result<Vsock, VirtioError> {
        let dev =
            find_device(info, device_id::VSOCK).ok_or(VirtioError::NoDevice(device_id::VSOCK))?;
        // SAFETY: the boot info lists this window as a virtio-mmio device,
        // identity-mapped by the boot protocol; only this driver uses it.
        let (transport, _) = unsafe { Transport::init(&dev, F_VERSION_1, 0)? };
        let rx = transport.setup_queue(RXQ, RX_BUFS)?;
        let tx = transport.setup_queue(TXQ, TX_BUFS)?;
        let ev = transport.setup_queue(EVQ, EV_BUFS)?;
        let guest_cid = transport.config_u32(0) as u64 | (transport.config_u32(4) as u64) << 32;
        let mut conns = Vec::new();
        conns
            .try_reserve_exact(config.max_connections)
            .map_err(|_| VirtioError::OutOfMemory)?;
        for _ in 0..config.max_connections {
            // buf_alloc is a u32 on the wire.
            conns.push(Conn::new(config.conn_buffer.clamp(1, 1 << 30))?);
        }
        let mut v = Vsock {
            rx_bufs: alloc_zeroed_vec(rx.size() as usize * (HDR_SIZE + RX_PAYLOAD))?,
            tx_bufs: alloc_zeroed_vec(tx.size() as usize * (HDR_SIZE + TX_PAYLOAD))?,
            ev_bufs: alloc_zeroed_vec(ev.size() as usize * EV_SIZE)?,
            transport,
            guest_cid,
            rx,
            tx,
            ev,
            listeners: [None; 8],
            conns,
            orphan_rsts: [(0, 0); 8],
            orphan_count: 0,
            stats: VsockStats::default(),
        };
        while v.post_free_rx() {}
        while v.post_free_ev() {}
        v.transport.driver_ok();
        v.notify(RXQ);
        v.notify(EVQ);
        Ok(v)
    }

    pub fn guest_cid(&self) -> u64 {
        self.guest_cid
    }

    /// (descriptor table, available ring, used ring, size) of a queue, for
    /// tests that play the device.
    #[cfg(test)]
    fn queue_layout(&self, q: u16) -> (u64, u64, u64, u16) {
        let q = match q {
            RXQ => &self.rx,
            TXQ => &self.tx,
            _ => &self.ev,
        };
        let (d, a, u) = q.addresses();
        (d, a, u, q.size())
    }

    pub fn stats(&self) -> VsockStats {
        self.stats
    }

    /// Accepts connections the host makes to `port`.
    pub fn listen(&mut self, port: u32) -> Result<(), VsockError> {
        if self.listeners.contains(&Some(port)) {
            return Ok(());
        }
        let slot = self
            .listeners
            .iter_mut()
            .find(|l| l.is_none())
            .ok_or(VsockError::TooManyListeners)?;
        *slot = Some(port);
        Ok(())
    }

    fn notify(&mut self, q: u16) {
        self.stats.notifies += 1;
        self.transport.notify(q);
    }

    /// Hands the next free rx descriptor, with its buffer, to the device;
    /// false if every buffer is already posted. Buffer index = descriptor id.
    fn post_free_rx(&mut self) -> bool {
        let Some(&id) = self.rx.peek_free() else {
            return false;
        };
        let size = HDR_SIZE + RX_PAYLOAD;
        let start = id as usize * size;
        let Some(buf) = self.rx_bufs.get_mut(start..start + size) else {
            return false;
        };
        // SAFETY: the buffer lives in `rx_bufs` as long as the driver, and
        // the driver reads it only after the device returns it.
        let got = unsafe { self.rx.add(buf.as_mut_ptr(), size as u32, true) };
        debug_assert_eq!(got, Some(id));
        true
    }

    /// As [`post_free_rx`](Self::post_free_rx), for the event queue.
    fn post_free_ev(&mut self) -> bool {
        let Some(&id) = self.ev.peek_free() else {
            return false;
        };
        let start = id as usize * EV_SIZE;
        let Some(buf) = self.ev_bufs.get_mut(start..start + EV_SIZE) else {
            return false;
        };
        // SAFETY: as for `post_free_rx`.
        let got = unsafe { self.ev.add(buf.as_mut_ptr(), EV_SIZE as u32, true) };
        debug_assert_eq!(got, Some(id));
        true
    }

    /// Handles everything the device has returned; sends owed control
    /// packets. Returns true if anything happened.
    pub fn poll(&mut self) -> bool {
        let mut progress = false;
        // Events first: a transport reset closes the connections that existed
        // before it, not one whose request arrived in the same poll.
        let mut ev_reposted = false;
        while let Some(used) = self.ev.pop_used() {
            progress = true;
            let start = used.id as usize * EV_SIZE;
            let id = u32::from_le_bytes([
                self.ev_bufs[start],
                self.ev_bufs[start + 1],
                self.ev_bufs[start + 2],
                self.ev_bufs[start + 3],
            ]);
            if id == EVENT_TRANSPORT_RESET {
                self.transport_reset();
            }
            ev_reposted = true;
        }
        if ev_reposted {
            while self.post_free_ev() {}
            self.notify(EVQ);
        }
        let mut popped = 0;
        while let Some(used) = self.rx.pop_used() {
            progress = true;
            popped += 1;
            self.stats.packets_in += 1;
            let size = HDR_SIZE + RX_PAYLOAD;
            let start = used.id as usize * size;
            let len = (used.len as usize).min(size);
            if len >= HDR_SIZE {
                let mut hb = [0u8; HDR_SIZE];
                hb.copy_from_slice(&self.rx_bufs[start..start + HDR_SIZE]);
                let hdr = Header::from_bytes(&hb);
                let payload_len = (hdr.len as usize).min(len - HDR_SIZE);
                self.handle_packet(&hdr, start + HDR_SIZE, payload_len);
            }
        }
        if popped > 0 {
            // The device reads the available ring whenever it has data, so
            // it needs a (costly, exiting) notification only if it may have
            // found the ring empty: when it holds none of the buffers. If it
            // runs dry later, its used-buffer interrupt wakes this driver,
            // whose next poll sees that and notifies.
            let starved = self.rx.free_count() == self.rx.size() as usize;
            while self.post_free_rx() {}
            if starved {
                self.notify(RXQ);
            }
        }
        while self.tx.pop_used().is_some() {
            progress = true;
        }
        if self.flush_pending() {
            progress = true;
        }
        self.expire_closing();
        progress
    }

    /// Polls; if nothing happened, sleeps until the device has work or
    /// `timeout_us` passed, then polls again.
    pub fn wait_for_work(&mut self, timeout_us: u32) -> bool {
        if self.poll() {
            return true;
        }
        self.stats.waits += 1;
        crate::signal::wait(timeout_us);
        self.poll()
    }

    fn transport_reset(&mut self) {
        self.guest_cid =
            self.transport.config_u32(0) as u64 | (self.transport.config_u32(4) as u64) << 32;
        // The device dropped every connection and expects nothing more about
        // them: free their slots at once (their ids now read as closed), so
        // that a request arriving right behind the reset finds room.
        for c in &mut self.conns {
            c.free();
        }
    }

    fn find_conn(&self, local_port: u32, peer_port: u32) -> Option<usize> {
        self.conns
            .iter()
            .position(|c| c.is_open() && c.local_port == local_port && c.peer_port == peer_port)
    }

    fn handle_packet(&mut self, hdr: &Header, payload_at: usize, payload_len: usize) {
        if hdr.dst_cid != self.guest_cid || hdr.src_cid != HOST_CID || hdr.type_ != TYPE_STREAM {
            if hdr.op != op::RST {
                self.owe_orphan_rst(hdr.src_port, hdr.dst_port);
            }
            return;
        }
        let Some(i) = self.find_conn(hdr.dst_port, hdr.src_port) else {
            self.handle_new(hdr);
            return;
        };
        let c = &mut self.conns[i];
        c.peer_buf_alloc = hdr.buf_alloc;
        c.peer_fwd_cnt = hdr.fwd_cnt;
        match hdr.op {
            op::RW => {
                if c.state == ConnState::Established && c.peer_shutdown & SHUTDOWN_SEND == 0 {
                    let data = &self.rx_bufs[payload_at..payload_at + payload_len];
                    let taken = c.rx.push(data);
                    self.stats.overrun_bytes += (payload_len - taken) as u64;
                }
            }
            op::CREDIT_UPDATE => {}
            op::CREDIT_REQUEST => c.pending |= pending::CREDIT_UPDATE,
            op::SHUTDOWN => {
                c.peer_shutdown |= hdr.flags & SHUTDOWN_BOTH;
                if c.peer_shutdown == SHUTDOWN_BOTH {
                    // As Linux does: the peer is gone both ways, so end the
                    // connection; buffered data stays readable. A closing
                    // slot is freed once the RST is out.
                    if c.state == ConnState::Established {
                        c.state = ConnState::PeerClosed;
                    }
                    c.pending = pending::RST;
                }
            }
            op::RST => {
                if c.state == ConnState::Closing {
                    c.free();
                } else {
                    c.state = ConnState::PeerClosed;
                    c.pending = 0;
                }
            }
            _ => {
                // REQUEST on a live connection, RESPONSE (the guest never
                // connects out) or an unknown op: reset it (a closing slot
                // stays closing and is freed once the RST is out).
                if c.state != ConnState::Closing {
                    c.state = ConnState::PeerClosed;
                }
                c.pending = pending::RST;
            }
        }
    }

    fn handle_new(&mut self, hdr: &Header) {
        if hdr.op == op::RST {
            return;
        }
        let listening = self.listeners.contains(&Some(hdr.dst_port));
        let slot = self.conns.iter().position(|c| !c.is_open());
        match (hdr.op, listening, slot) {
            (op::REQUEST, true, Some(i)) => {
                self.conns[i].open(hdr.dst_port, hdr.src_port, hdr.buf_alloc, hdr.fwd_cnt);
            }
            _ => {
                self.stats.refused += 1;
                self.owe_orphan_rst(hdr.src_port, hdr.dst_port);
            }
        }
    }

    fn owe_orphan_rst(&mut self, peer_port: u32, local_port: u32) {
        // If too many are owed the peer times out instead; nothing breaks.
        if self.orphan_count < self.orphan_rsts.len() {
            self.orphan_rsts[self.orphan_count] = (peer_port, local_port);
            self.orphan_count += 1;
        }
    }

    /// Queues one packet on tx; false if no tx buffer is free.
    fn send_packet(&mut self, mut hdr: Header, payload: &[u8]) -> bool {
        if self.tx.free_count() == 0 {
            while self.tx.pop_used().is_some() {}
        }
        if self.tx.free_count() == 0 {
            return false;
        }
        let size = HDR_SIZE + TX_PAYLOAD;
        let n = payload.len().min(TX_PAYLOAD);
        hdr.len = n as u32;
        hdr.src_cid = self.guest_cid;
        hdr.dst_cid = HOST_CID;
        hdr.type_ = TYPE_STREAM;
        // The id the queue hands out is the buffer index (queue size = buffer count).
        let Some(&id) = self.peek_free_tx() else {
            return false;
        };
        let start = id as usize * size;
        let buf = &mut self.tx_bufs[start..start + size];
        buf[..HDR_SIZE].copy_from_slice(&hdr.to_bytes());
        buf[HDR_SIZE..HDR_SIZE + n].copy_from_slice(&payload[..n]);
        // SAFETY: the buffer lives in `tx_bufs`; the driver writes it again
        // only after the device returned its descriptor.
        let got = unsafe { self.tx.add(buf.as_ptr(), (HDR_SIZE + n) as u32, false) };
        debug_assert_eq!(got, Some(id));
        self.stats.packets_out += 1;
        true
    }

    fn peek_free_tx(&self) -> Option<&u16> {
        self.tx.peek_free()
    }

    fn conn_header(c: &Conn, op: u16, flags: u32) -> Header {
        Header {
            src_port: c.local_port,
            dst_port: c.peer_port,
            op,
            flags,
            buf_alloc: c.rx.capacity() as u32,
            fwd_cnt: c.fwd_cnt,
            ..Header::default()
        }
    }

    /// Sends owed control packets; true if any went out.
    fn flush_pending(&mut self) -> bool {
        let mut sent = false;
        while self.orphan_count > 0 {
            let (peer, local) = self.orphan_rsts[self.orphan_count - 1];
            let hdr = Header {
                src_port: local,
                dst_port: peer,
                op: op::RST,
                ..Header::default()
            };
            if !self.send_packet(hdr, &[]) {
                break;
            }
            self.orphan_count -= 1;
            sent = true;
        }
        for i in 0..self.conns.len() {
            for (bit, op, flags) in [
                (pending::RESPONSE, op::RESPONSE, 0),
                (pending::CREDIT_UPDATE, op::CREDIT_UPDATE, 0),
                (pending::SHUTDOWN, op::SHUTDOWN, SHUTDOWN_BOTH),
                (pending::RST, op::RST, 0),
            ] {
                if self.conns[i].pending & bit == 0 {
                    continue;
                }
                let hdr = Self::conn_header(&self.conns[i], op, flags);
                if !self.send_packet(hdr, &[]) {
                    break;
                }
                let c = &mut self.conns[i];
                c.pending &= !bit;
                c.last_fwd_sent = c.fwd_cnt;
                sent = true;
                if bit == pending::RST && c.state == ConnState::Closing {
                    c.free();
                }
            }
        }
        if sent {
            self.notify(TXQ);
        }
        sent
    }

    fn expire_closing(&mut self) {
        let Some(khz) = clock::tsc_khz() else { return };
        let now = clock::rdtsc();
        for c in &mut self.conns {
            if c.state == ConnState::Closing
                && clock::ticks_to_us(now.wrapping_sub(c.closing_since), khz) > CLOSE_TIMEOUT_US
            {
                c.free();
            }
        }
    }

    fn conn(&self, id: ConnId) -> Option<&Conn> {
        self.conns
            .get(id.slot as usize)
            .filter(|c| c.is_open() && c.generation == id.generation)
    }

    fn conn_mut(&mut self, id: ConnId) -> Option<&mut Conn> {
        self.conns
            .get_mut(id.slot as usize)
            .filter(|c| c.is_open() && c.generation == id.generation)
    }

    /// A connection the host made to a listening port, not yet accepted.
    pub fn accept(&mut self) -> Option<ConnId> {
        let (i, c) = self.conns.iter_mut().enumerate().find(|(_, c)| {
            matches!(c.state, ConnState::Established | ConnState::PeerClosed) && !c.accepted
        })?;
        c.accepted = true;
        Some(ConnId {
            slot: i as u16,
            generation: c.generation,
        })
    }

    /// Waits (polling and sleeping) for a connection.
    pub fn accept_wait(&mut self) -> ConnId {
        loop {
            if let Some(c) = self.accept() {
                return c;
            }
            self.wait_for_work(1_000_000);
        }
    }

    /// The local port a connection was made to.
    pub fn local_port(&self, id: ConnId) -> Option<u32> {
        self.conn(id).map(|c| c.local_port)
    }

    /// Bytes buffered for reading.
    pub fn readable(&self, id: ConnId) -> usize {
        self.conn(id).map_or(0, |c| c.rx.len())
    }

    /// Reads buffered bytes. `Ok(0)` is end of stream (the peer will send
    /// no more); `WouldBlock` means nothing yet.
    pub fn recv(&mut self, id: ConnId, buf: &mut [u8]) -> Result<usize, VsockError> {
        let c = self.conn_mut(id).ok_or(VsockError::Closed)?;
        if c.state == ConnState::Closing {
            return Err(VsockError::Closed);
        }
        let n = c.rx.pop(buf);
        if n == 0 {
            if buf.is_empty() {
                return Ok(0);
            }
            return if c.state == ConnState::PeerClosed || c.peer_shutdown & SHUTDOWN_SEND != 0 {
                Ok(0)
            } else {
                Err(VsockError::WouldBlock)
            };
        }
        c.fwd_cnt = c.fwd_cnt.wrapping_add(n as u32);
        // Tell the peer about freed room before it runs dry; each data
        // packet the guest sends carries fwd_cnt too.
        if c.state == ConnState::Established
            && c.fwd_cnt.wrapping_sub(c.last_fwd_sent) as usize >= c.rx.capacity() / 4
        {
            c.pending |= pending::CREDIT_UPDATE;
            self.flush_pending();
        }
        Ok(n)
    }

    /// Reads at least one byte, waiting for it; `Ok(0)` at end of stream.
    pub fn recv_wait(&mut self, id: ConnId, buf: &mut [u8]) -> Result<usize, VsockError> {
        loop {
            match self.recv(id, buf) {
                Err(VsockError::WouldBlock) => {
                    self.wait_for_work(1_000_000);
                }
                r => return r,
            }
        }
    }

    /// Reads one line (up to and including `\n`) into `buf`, waiting for it.
    /// Returns its length; shorter than a full line only at end of stream or
    /// when `buf` is full.
    pub fn read_line(&mut self, id: ConnId, buf: &mut [u8]) -> Result<usize, VsockError> {
        let mut n = 0;
        while n < buf.len() {
            match self.recv_wait(id, &mut buf[n..n + 1])? {
                0 => break,
                _ => {
                    n += 1;
                    if buf[n - 1] == b'\n' {
                        break;
                    }
                }
            }
        }
        Ok(n)
    }

    /// Sends what the peer's credit and free tx buffers allow; returns the
    /// bytes queued (0 if none could be). Notifies the device once.
    pub fn send(&mut self, id: ConnId, data: &[u8]) -> Result<usize, VsockError> {
        let c = self.conn(id).ok_or(VsockError::Closed)?;
        if c.state != ConnState::Established || c.peer_shutdown & SHUTDOWN_RCV != 0 {
            return Err(VsockError::Closed);
        }
        let slot = id.slot as usize;
        let mut sent = 0;
        while sent < data.len() {
            let c = &self.conns[slot];
            let credit = c.peer_credit() as usize;
            if credit == 0 {
                break;
            }
            let n = (data.len() - sent).min(credit).min(TX_PAYLOAD);
            let hdr = Self::conn_header(c, op::RW, 0);
            if !self.send_packet(hdr, &data[sent..sent + n]) {
                break;
            }
            let c = &mut self.conns[slot];
            c.tx_cnt = c.tx_cnt.wrapping_add(n as u32);
            c.last_fwd_sent = c.fwd_cnt;
            c.pending &= !pending::CREDIT_UPDATE;
            sent += n;
        }
        if sent > 0 {
            self.notify(TXQ);
        }
        self.flush_pending();
        Ok(sent)
    }

    /// Sends all of `data`, waiting for credit and tx buffers as needed.
    pub fn write_all(&mut self, id: ConnId, mut data: &[u8]) -> Result<(), VsockError> {
        while !data.is_empty() {
            let n = self.send(id, data)?;
            data = &data[n..];
            if n == 0 {
                self.wait_for_work(1_000_000);
            }
        }
        Ok(())
    }

    /// Closes a connection: the peer gets a shutdown, then the slot is freed
    /// when it answers with RST (or after a timeout). The id is stale after.
    pub fn close(&mut self, id: ConnId) {
        let Some(c) = self.conn_mut(id) else { return };
        match c.state {
            ConnState::Established => {
                c.state = ConnState::Closing;
                c.closing_since = clock::rdtsc();
                c.pending = (c.pending & pending::RESPONSE) | pending::SHUTDOWN;
                // Without a TSC frequency the timeout cannot run: end at once.
                if clock::tsc_khz().is_none() {
                    c.pending |= pending::RST;
                }
            }
            ConnState::PeerClosed => {
                if c.pending & pending::RST == 0 {
                    c.free();
                } else {
                    c.state = ConnState::Closing;
                    c.closing_since = clock::rdtsc();
                }
            }
            _ => {}
        }
        self.flush_pending();
    }

    /// Whether the peer has closed (or reset) the connection and every byte
    /// it sent has been read.
    pub fn at_eof(&self, id: ConnId) -> bool {
        match self.conn(id) {
            None => true,
            Some(c) => {
                c.rx.is_empty()
                    && (c.state != ConnState::Established || c.peer_shutdown & SHUTDOWN_SEND != 0)
            }
        }
    }
}
