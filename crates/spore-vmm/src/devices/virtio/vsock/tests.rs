//! End-to-end tests of the vsock device: the real worker thread, driven
//! through mock split queues by a test playing the guest driver, against
//! real Unix sockets on the host side.
#![allow(
    clippy::cast_possible_truncation,
    reason = "test fixtures: byte patterns and addresses the test builds itself"
)]

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use virtio_bindings::bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::desc::split::Descriptor as SplitDescriptor;
use virtio_queue::desc::RawDescriptor;
use virtio_queue::mock::MockSplitQueue;
use virtio_queue::Queue;
use vm_memory::{Address, Bytes, GuestAddress};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::connection::{CONNECT_TIMEOUT, TX_BUF_SIZE};
use super::event_loop::{EVENT_QUEUE, RX_QUEUE, TX_QUEUE};
use super::muxer::LOCAL_PORT_BASE;
use super::packet::{Header, Op, HDR_SIZE, HOST_CID, SHUTDOWN_BOTH, TYPE_STREAM};
use super::*;
use crate::devices::virtio::interrupt::INT_VRING;
use crate::devices::virtio::{GuestMemoryMmap, VirtioInterrupt};
use crate::devices::wake::GuestWake;

const CID: u64 = 3;
const QSIZE: u16 = QUEUE_SIZE;
const MEM_SIZE: usize = 16 << 20;
const RX_BASE: u64 = 0x10_0000;
const RX_SLOT: u64 = 0x2000;
/// Linux's rx buffer: 4 KiB of payload after the header.
const RX_BUF_LEN: u32 = 4096 + HDR_SIZE as u32;
const TX_BASE: u64 = 0x20_0000;
const TX_SLOT: u64 = 0x1_1000;
const TX_SLOTS: u16 = 64;
const EV_BASE: u64 = 0x80_0000;
const WAIT: Duration = Duration::from_secs(5);

/// A unique socket path, with `<path>_*` files removed at the end.
struct TempPath(PathBuf);

impl TempPath {
    fn new(name: &str) -> Self {
        TempPath(std::env::temp_dir().join(format!("spore-vsock-{}-{name}", std::process::id())))
    }

    fn port(&self, port: u32) -> PathBuf {
        PathBuf::from(format!("{}_{port}", self.0.display()))
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
        let (Some(dir), Some(name)) = (self.0.parent(), self.0.file_name()) else {
            return;
        };
        let prefix = format!("{}_", name.to_string_lossy());
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.flatten() {
                if e.file_name().to_string_lossy().starts_with(&prefix) {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
    }
}

fn new_mem() -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_SIZE)]).unwrap()
}

fn hdr(op: Op, src_port: u32, dst_port: u32) -> Header {
    Header {
        src_cid: CID,
        dst_cid: HOST_CID,
        src_port,
        dst_port,
        len: 0,
        type_: TYPE_STREAM,
        op: op as u16,
        flags: 0,
        buf_alloc: 64 * 1024,
        fwd_cnt: 0,
    }
}

fn desc(addr: u64, len: u32, flags: u32, next: u16) -> RawDescriptor {
    RawDescriptor::from(SplitDescriptor::new(addr, len, flags as u16, next))
}

/// The test's stand-in for the guest's virtio-vsock driver.
struct Guest<'a> {
    mem: &'a GuestMemoryMmap,
    queues: Vec<MockSplitQueue<'a, GuestMemoryMmap>>,
    kicks: Vec<EventFd>,
    avail: [u16; 3],
    used_seen: [u16; 3],
    tx_next: u16,
    inbox: VecDeque<(Header, Vec<u8>)>,
    interrupt: Arc<VirtioInterrupt>,
    dev: Vsock,
}

impl<'a> Guest<'a> {
    fn start(mem: &'a GuestMemoryMmap, uds: &Path) -> Self {
        Self::attach(mem, Vsock::new(CID, uds.to_owned()).unwrap())
    }

    /// Activates `dev` with fresh queues, as a driver does after reset.
    fn attach(mem: &'a GuestMemoryMmap, mut dev: Vsock) -> Self {
        let queues: Vec<_> = (0..3u64)
            .map(|i| MockSplitQueue::create(mem, GuestAddress(0x1000 + i * 0x1_0000), QSIZE))
            .collect();
        let kicks: Vec<_> = (0..3)
            .map(|_| EventFd::new(EFD_NONBLOCK).unwrap())
            .collect();
        let interrupt = Arc::new(VirtioInterrupt::new(
            EventFd::new(EFD_NONBLOCK).unwrap(),
            Arc::new(GuestWake::new().unwrap()),
        ));
        dev.activate(ActivateContext {
            mem: mem.clone(),
            interrupt: interrupt.clone(),
            queues: queues
                .iter()
                .map(|q| q.create_queue::<Queue>().unwrap())
                .collect(),
            queue_events: kicks.iter().map(|k| k.try_clone().unwrap()).collect(),
            acked_features: dev.avail_features(),
        })
        .unwrap();
        Guest {
            mem,
            queues,
            kicks,
            avail: [0; 3],
            used_seen: [0; 3],
            tx_next: 0,
            inbox: VecDeque::new(),
            interrupt,
            dev,
        }
    }

    fn push_avail(&mut self, q: usize, head: u16) {
        let ring = self.queues[q].avail_addr();
        let idx = self.avail[q];
        let slot = ring.unchecked_add(4 + u64::from(idx % QSIZE) * 2);
        self.mem.write_obj(head, slot).unwrap();
        // The driver publishes the entry before the index.
        fence(Ordering::SeqCst);
        self.avail[q] = idx.wrapping_add(1);
        self.mem
            .write_obj(self.avail[q], ring.unchecked_add(2))
            .unwrap();
        self.kicks[q].write(1).unwrap();
    }

    fn used_idx(&self, q: usize) -> u16 {
        let ring = self.queues[q].used_addr();
        self.mem.read_obj(ring.unchecked_add(2)).unwrap()
    }

    /// (descriptor id, length) of used entry `i`.
    fn used_elem(&self, q: usize, i: u16) -> (u16, u32) {
        let at = self.queues[q]
            .used_addr()
            .unchecked_add(4 + u64::from(i % QSIZE) * 8);
        let id: u32 = self.mem.read_obj(at).unwrap();
        let len: u32 = self.mem.read_obj(at.unchecked_add(4)).unwrap();
        (id as u16, len)
    }

    fn wait_until(&mut self, what: &str, mut cond: impl FnMut(&mut Self) -> bool) {
        let deadline = Instant::now() + WAIT;
        while !cond(self) {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Gives the device `n` rx buffers.
    fn post_rx(&mut self, n: u16) {
        for i in 0..n {
            let d = desc(
                RX_BASE + u64::from(i) * RX_SLOT,
                RX_BUF_LEN,
                VRING_DESC_F_WRITE,
                0,
            );
            self.queues[RX_QUEUE].desc_table().store(i, d).unwrap();
            self.push_avail(RX_QUEUE, i);
        }
    }

    /// Queues a raw tx chain (descriptors `first..`) and waits until the
    /// device has consumed it.
    fn send_chain(&mut self, descs: &[RawDescriptor]) {
        let first = self.tx_next * 2;
        for (i, d) in descs.iter().enumerate() {
            self.queues[TX_QUEUE]
                .desc_table()
                .store(first + i as u16, *d)
                .unwrap();
        }
        self.tx_next = (self.tx_next + 1) % TX_SLOTS;
        self.push_avail(TX_QUEUE, first);
        let want = self.avail[TX_QUEUE];
        self.wait_until("tx consumed", |g| g.used_idx(TX_QUEUE) == want);
    }

    fn send(&mut self, mut h: Header, payload: &[u8]) {
        h.len = payload.len() as u32;
        let base = TX_BASE + u64::from(self.tx_next) * TX_SLOT;
        self.mem
            .write_slice(&h.to_bytes(), GuestAddress(base))
            .unwrap();
        let first = self.tx_next * 2;
        if payload.is_empty() {
            self.send_chain(&[desc(base, HDR_SIZE as u32, 0, 0)]);
        } else {
            self.mem
                .write_slice(payload, GuestAddress(base + 0x1000))
                .unwrap();
            self.send_chain(&[
                desc(base, HDR_SIZE as u32, VRING_DESC_F_NEXT, first + 1),
                desc(base + 0x1000, payload.len() as u32, 0, 0),
            ]);
        }
    }

    /// Moves used rx buffers into the inbox and gives them back.
    fn poll_rx(&mut self) {
        while self.used_seen[RX_QUEUE] != self.used_idx(RX_QUEUE) {
            let (id, len) = self.used_elem(RX_QUEUE, self.used_seen[RX_QUEUE]);
            self.used_seen[RX_QUEUE] = self.used_seen[RX_QUEUE].wrapping_add(1);
            let addr = GuestAddress(RX_BASE + u64::from(id) * RX_SLOT);
            let mut raw = [0u8; HDR_SIZE];
            self.mem.read_slice(&mut raw, addr).unwrap();
            let h = Header::from_bytes(&raw);
            assert_eq!(len as usize, HDR_SIZE + h.len as usize, "used length");
            let mut payload = vec![0u8; h.len as usize];
            self.mem
                .read_slice(&mut payload, addr.unchecked_add(HDR_SIZE as u64))
                .unwrap();
            assert_eq!(
                (h.src_cid, h.dst_cid, h.type_),
                (HOST_CID, CID, TYPE_STREAM)
            );
            self.inbox.push_back((h, payload));
            self.push_avail(RX_QUEUE, id);
        }
    }

    fn recv(&mut self) -> (Header, Vec<u8>) {
        self.wait_until("a packet from the device", |g| {
            g.poll_rx();
            !g.inbox.is_empty()
        });
        self.inbox.pop_front().unwrap()
    }

    fn recv_op(&mut self, op: Op) -> (Header, Vec<u8>) {
        let (h, p) = self.recv();
        assert_eq!(h.op, op as u16, "expected {op:?}, got {h:?}");
        (h, p)
    }

    fn expect_quiet(&mut self, for_: Duration) {
        std::thread::sleep(for_);
        self.poll_rx();
        assert!(self.inbox.is_empty(), "unexpected packets {:?}", self.inbox);
    }
}

fn read_line(s: &mut UnixStream) -> String {
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while b[0] != b'\n' {
        s.read_exact(&mut b).unwrap();
        line.push(b[0]);
    }
    String::from_utf8(line).unwrap()
}

fn client(path: &Path) -> UnixStream {
    let s = UnixStream::connect(path).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    s
}

#[test]
fn host_client_reaches_guest_port() {
    let uds = TempPath::new("host-init");
    let mem = new_mem();
    let mut g = Guest::start(&mem, &uds.0);
    g.post_rx(8);

    let mut c = client(&uds.0);
    c.write_all(b"CONNECT 52\n").unwrap();
    let (req, _) = g.recv_op(Op::Request);
    assert_eq!(req.dst_port, 52);
    assert!(req.src_port >= LOCAL_PORT_BASE);
    assert_eq!(req.buf_alloc, TX_BUF_SIZE);
    let host_port = req.src_port;
    assert!(g.interrupt.status() & INT_VRING != 0);

    g.send(hdr(Op::Response, 52, host_port), &[]);
    assert_eq!(read_line(&mut c), format!("OK {host_port}\n"));

    c.write_all(b"ping").unwrap();
    let (h, p) = g.recv_op(Op::Rw);
    assert_eq!(
        (h.src_port, h.dst_port, &p[..]),
        (host_port, 52, &b"ping"[..])
    );

    g.send(hdr(Op::Rw, 52, host_port), b"pong");
    let mut buf = [0u8; 4];
    c.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"pong");

    // The client goes away: the guest hears both directions are closed.
    drop(c);
    let (h, _) = g.recv_op(Op::Shutdown);
    assert_eq!(h.flags, SHUTDOWN_BOTH);
    g.send(hdr(Op::Rst, 52, host_port), &[]);
    g.expect_quiet(Duration::from_millis(50));
}

#[test]
fn guest_reaches_host_listener() {
    let uds = TempPath::new("guest-init");
    let listener = UnixListener::bind(uds.port(5000)).unwrap();
    let mem = new_mem();
    let mut g = Guest::start(&mem, &uds.0);
    g.post_rx(8);

    g.send(hdr(Op::Request, 1234, 5000), &[]);
    let (mut s, _) = listener.accept().unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    let (h, _) = g.recv_op(Op::Response);
    assert_eq!((h.src_port, h.dst_port), (5000, 1234));

    g.send(hdr(Op::Rw, 1234, 5000), b"hello");
    let mut buf = [0u8; 5];
    s.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"hello");

    s.write_all(b"world").unwrap();
    let (_, p) = g.recv_op(Op::Rw);
    assert_eq!(p, b"world");

    // The guest closes: it gets its RST, the host sees EOF.
    let mut sd = hdr(Op::Shutdown, 1234, 5000);
    sd.flags = SHUTDOWN_BOTH;
    g.send(sd, &[]);
    let (h, _) = g.recv_op(Op::Rst);
    assert_eq!((h.src_port, h.dst_port), (5000, 1234));
    assert_eq!(s.read(&mut buf).unwrap(), 0);
}

#[test]
fn resets_requests_nobody_listens_to() {
    let uds = TempPath::new("no-listener");
    let mem = new_mem();
    let mut g = Guest::start(&mem, &uds.0);
    g.post_rx(8);

    g.send(hdr(Op::Request, 1234, 6000), &[]);
    let (h, _) = g.recv_op(Op::Rst);
    assert_eq!((h.src_port, h.dst_port), (6000, 1234));

    // Data for a connection that does not exist is reset too.
    g.send(hdr(Op::Rw, 1234, 6000), b"x");
    g.recv_op(Op::Rst);
    // An RST is never answered.
    g.send(hdr(Op::Rst, 1234, 6000), &[]);
    g.expect_quiet(Duration::from_millis(50));
}

#[test]
fn survives_malformed_packets() {
    let uds = TempPath::new("malformed");
    let mem = new_mem();
    let mut g = Guest::start(&mem, &uds.0);
    g.post_rx(8);

    // Misaddressed: dropped without an answer.
    let mut h = hdr(Op::Request, 1234, 6000);
    h.src_cid = 99;
    g.send(h, &[]);
    let mut h = hdr(Op::Request, 1234, 6000);
    h.dst_cid = 5;
    g.send(h, &[]);
    // Outside guest memory, and too short: consumed, nothing else happens.
    g.send_chain(&[desc(MEM_SIZE as u64 + 0x1000, 44, 0, 0)]);
    g.send_chain(&[desc(TX_BASE, 10, 0, 0)]);
    g.expect_quiet(Duration::from_millis(50));

    // Unknown op, wrong type, lying len: reset.
    let mut h = hdr(Op::Rw, 1234, 6000);
    h.op = 42;
    g.send(h, &[]);
    g.recv_op(Op::Rst);
    let mut h = hdr(Op::Request, 1234, 6001);
    h.type_ = 2;
    g.send(h, &[]);
    assert_eq!(g.recv_op(Op::Rst).0.src_port, 6001);
    let base = TX_BASE + u64::from(g.tx_next) * TX_SLOT;
    let mut h = hdr(Op::Rw, 1234, 6002);
    h.len = 1000;
    mem.write_slice(&h.to_bytes(), GuestAddress(base)).unwrap();
    let first = g.tx_next * 2;
    g.send_chain(&[
        desc(base, 44, VRING_DESC_F_NEXT, first + 1),
        desc(base + 0x1000, 10, 0, 0),
    ]);
    assert_eq!(g.recv_op(Op::Rst).0.src_port, 6002);
}

#[test]
fn host_to_guest_respects_guest_credit() {
    let uds = TempPath::new("credit-rx");
    let listener = UnixListener::bind(uds.port(7000)).unwrap();
    let mem = new_mem();
    let mut g = Guest::start(&mem, &uds.0);
    g.post_rx(16);

    let guest_buf: u32 = 5000;
    let mut req = hdr(Op::Request, 1234, 7000);
    req.buf_alloc = guest_buf;
    g.send(req, &[]);
    let (mut s, _) = listener.accept().unwrap();
    g.recv_op(Op::Response);

    let data: Vec<u8> = (0..40_000u32).map(|i| (i % 251) as u8).collect();
    s.write_all(&data).unwrap();
    let mut got = Vec::new();
    let mut fwd_cnt = 0u32;
    while got.len() < data.len() {
        let (h, p) = g.recv();
        match h.op {
            op if op == Op::Rw as u16 => got.extend_from_slice(&p),
            op if op == Op::CreditRequest as u16 => {}
            other => panic!("unexpected op {other}"),
        }
        let in_flight = got.len() as u32 - fwd_cnt;
        assert!(in_flight <= guest_buf, "{in_flight} bytes beyond credit");
        if in_flight == guest_buf {
            // The device must stop here until the guest frees space; it
            // may ask for credit.
            std::thread::sleep(Duration::from_millis(20));
            g.poll_rx();
            while let Some((h, _)) = g.inbox.pop_front() {
                assert_eq!(h.op, Op::CreditRequest as u16, "{h:?} beyond credit");
            }
            fwd_cnt = got.len() as u32;
            let mut up = hdr(Op::CreditUpdate, 1234, 7000);
            up.buf_alloc = guest_buf;
            up.fwd_cnt = fwd_cnt;
            g.send(up, &[]);
        }
    }
    assert_eq!(got, data);
}

#[test]
fn guest_to_host_bulk_follows_device_credit() {
    let uds = TempPath::new("credit-tx");
    let listener = UnixListener::bind(uds.port(7001)).unwrap();
    let mem = new_mem();
    let mut g = Guest::start(&mem, &uds.0);
    g.post_rx(16);

    g.send(hdr(Op::Request, 1234, 7001), &[]);
    let (mut s, _) = listener.accept().unwrap();
    let (resp, _) = g.recv_op(Op::Response);
    let total = 1usize << 20;
    // A slow host reader, so the device has to buffer and pace the guest.
    let reader = std::thread::spawn(move || {
        let mut all = Vec::new();
        let mut buf = [0u8; 8192];
        loop {
            std::thread::sleep(Duration::from_micros(200));
            match s.read(&mut buf).unwrap() {
                0 => return all,
                n => all.extend_from_slice(&buf[..n]),
            }
        }
    });

    let data: Vec<u8> = (0..total as u32).map(|i| (i % 253) as u8).collect();
    let (mut buf_alloc, mut fwd_cnt) = (resp.buf_alloc, resp.fwd_cnt);
    let mut sent = 0usize;
    while sent < total {
        let credit = buf_alloc.saturating_sub(sent as u32 - fwd_cnt) as usize;
        if credit == 0 {
            let (h, _) = g.recv();
            (buf_alloc, fwd_cnt) = (h.buf_alloc, h.fwd_cnt);
            continue;
        }
        let n = credit.min(64 * 1024).min(total - sent);
        g.send(hdr(Op::Rw, 1234, 7001), &data[sent..sent + n]);
        sent += n;
        g.poll_rx();
        while let Some((h, _)) = g.inbox.pop_front() {
            (buf_alloc, fwd_cnt) = (h.buf_alloc, h.fwd_cnt);
        }
    }
    let mut sd = hdr(Op::Shutdown, 1234, 7001);
    sd.flags = SHUTDOWN_BOTH;
    g.send(sd, &[]);
    g.recv_op(Op::Rst);
    assert_eq!(reader.join().unwrap(), data);
}

#[test]
fn unanswered_request_times_out() {
    let uds = TempPath::new("timeout");
    let mem = new_mem();
    let mut g = Guest::start(&mem, &uds.0);
    g.post_rx(8);

    let mut c = client(&uds.0);
    c.write_all(b"CONNECT 52\n").unwrap();
    let started = Instant::now();
    let (req, _) = g.recv_op(Op::Request);
    let mut buf = [0u8; 8];
    assert_eq!(c.read(&mut buf).unwrap(), 0, "client must be closed");
    assert!(started.elapsed() >= CONNECT_TIMEOUT - Duration::from_millis(100));
    let (rst, _) = g.recv_op(Op::Rst);
    assert_eq!(rst.src_port, req.src_port);
}

#[test]
fn bad_handshakes_are_closed() {
    let uds = TempPath::new("handshake");
    let mem = new_mem();
    let mut g = Guest::start(&mem, &uds.0);
    g.post_rx(8);

    for line in [&b"HELLO 52\n"[..], b"CONNECT x\n", &[b'9'; 40]] {
        let mut c = client(&uds.0);
        c.write_all(line).unwrap();
        let mut buf = [0u8; 8];
        // Closed with unread bytes, the client may see a reset instead of EOF.
        let r = c.read(&mut buf);
        assert!(
            matches!(&r, Ok(0))
                || matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
            "{line:?}: {r:?}"
        );
    }
    g.expect_quiet(Duration::from_millis(20));
}

#[test]
fn transport_reset_drops_connections_and_tells_the_guest() {
    let uds = TempPath::new("reset");
    let listener = UnixListener::bind(uds.port(5000)).unwrap();
    let mem = new_mem();
    let mut g = Guest::start(&mem, &uds.0);
    g.post_rx(8);
    for i in 0..2u16 {
        let d = desc(EV_BASE + u64::from(i) * 16, 8, VRING_DESC_F_WRITE, 0);
        g.queues[EVENT_QUEUE].desc_table().store(i, d).unwrap();
        g.push_avail(EVENT_QUEUE, i);
    }
    mem.write_obj(0xffff_ffffu32, GuestAddress(EV_BASE))
        .unwrap();

    g.send(hdr(Op::Request, 1234, 5000), &[]);
    let (mut s, _) = listener.accept().unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    g.recv_op(Op::Response);

    g.dev.transport_reset();
    g.wait_until("the reset event", |g| g.used_idx(EVENT_QUEUE) == 1);
    assert_eq!(g.used_elem(EVENT_QUEUE, 0), (0, 4));
    let id: u32 = mem.read_obj(GuestAddress(EV_BASE)).unwrap();
    assert_eq!(id, spore_abi::vsock::EVENT_TRANSPORT_RESET);
    let mut buf = [0u8; 4];
    assert_eq!(s.read(&mut buf).unwrap(), 0, "host side must be closed");
    g.expect_quiet(Duration::from_millis(20));
}

/// How long the reset tests' devices hold host clients at most.
const ACK_TIMEOUT: Duration = Duration::from_millis(1500);

/// A guest driver with two event buffers, after a transport reset it got.
fn guest_after_reset<'a>(mem: &'a GuestMemoryMmap, uds: &Path) -> Guest<'a> {
    guest_after_reset_waiting(mem, uds, ACK_TIMEOUT, ACK_TIMEOUT)
}

/// As [`guest_after_reset`], the device holding clients `unposted` /
/// `posted` at most.
fn guest_after_reset_waiting<'a>(
    mem: &'a GuestMemoryMmap,
    uds: &Path,
    unposted: Duration,
    posted: Duration,
) -> Guest<'a> {
    let mut dev = Vsock::new(CID, uds.to_owned()).unwrap();
    dev.set_reset_ack_timeouts(unposted, posted);
    let mut g = Guest::attach(mem, dev);
    g.post_rx(8);
    for i in 0..2u16 {
        let d = desc(EV_BASE + u64::from(i) * 16, 8, VRING_DESC_F_WRITE, 0);
        g.queues[EVENT_QUEUE].desc_table().store(i, d).unwrap();
        g.push_avail(EVENT_QUEUE, i);
    }
    g.dev.transport_reset();
    g.wait_until("the reset event", |g| g.used_idx(EVENT_QUEUE) == 1);
    g
}

#[test]
fn host_clients_wait_until_the_guest_handled_a_transport_reset() {
    // A driver that accepted a connection before handling the reset event
    // would reset that new connection with the stale ones.
    let uds = TempPath::new("reset-hold");
    let mem = new_mem();
    let mut g = guest_after_reset(&mem, &uds.0);
    let mut c = client(&uds.0);
    c.write_all(b"CONNECT 52\n").unwrap();
    g.expect_quiet(Duration::from_millis(200));
    // The driver handled the event and gives its buffer back.
    g.push_avail(EVENT_QUEUE, 0);
    let (req, _) = g.recv_op(Op::Request);
    assert_eq!(req.dst_port, 52);
    g.send(hdr(Op::Response, 52, req.src_port), &[]);
    assert_eq!(read_line(&mut c), format!("OK {}\n", req.src_port));
}

#[test]
fn two_resets_before_the_guest_handled_either_hold_clients_until_both_are_handled() {
    // A restore resets the transport, then a clone identity (new CID) resets
    // it again before the paused guest ran: two events in two buffers. A
    // client let through when the guest gave back the first buffer would be
    // accepted, then silently reset by the second event.
    let uds = TempPath::new("reset-twice");
    let mem = new_mem();
    let mut g = guest_after_reset(&mem, &uds.0);
    g.dev.transport_reset();
    g.wait_until("the second reset event", |g| g.used_idx(EVENT_QUEUE) == 2);
    let mut c = client(&uds.0);
    c.write_all(b"CONNECT 52\n").unwrap();
    g.expect_quiet(Duration::from_millis(200));
    // The driver handled the first event only.
    g.push_avail(EVENT_QUEUE, 0);
    g.expect_quiet(Duration::from_millis(200));
    // And the second.
    g.push_avail(EVENT_QUEUE, 1);
    let (req, _) = g.recv_op(Op::Request);
    assert_eq!(req.dst_port, 52);
    drop(c);
}

#[test]
fn a_reset_event_in_a_guest_buffer_holds_clients_until_the_guest_handled_it() {
    // The short wait is for drivers without event buffers; one that took
    // the event is waited for (a starved guest may take long to handle it).
    let uds = TempPath::new("reset-posted");
    let mem = new_mem();
    let mut g = guest_after_reset_waiting(
        &mem,
        &uds.0,
        Duration::from_millis(100),
        Duration::from_secs(120),
    );
    let mut c = client(&uds.0);
    c.write_all(b"CONNECT 52\n").unwrap();
    g.expect_quiet(Duration::from_millis(600));
    g.push_avail(EVENT_QUEUE, 0);
    let (req, _) = g.recv_op(Op::Request);
    assert_eq!(req.dst_port, 52);
    drop(c);
}

#[test]
fn without_an_event_buffer_held_clients_go_through_after_the_short_wait() {
    let uds = TempPath::new("reset-unposted");
    let mem = new_mem();
    let mut dev = Vsock::new(CID, uds.0.clone()).unwrap();
    let short = Duration::from_millis(300);
    dev.set_reset_ack_timeouts(short, Duration::from_secs(120));
    let mut g = Guest::attach(&mem, dev);
    g.post_rx(8);
    g.dev.transport_reset();
    expect_let_through_after(&mut g, &uds.0, short);
}

#[test]
fn held_host_clients_go_through_when_the_guest_never_acknowledges() {
    let uds = TempPath::new("reset-timeout");
    let mem = new_mem();
    let mut g = guest_after_reset(&mem, &uds.0);
    expect_let_through_after(&mut g, &uds.0, ACK_TIMEOUT);
}

/// A host client connecting now reaches the guest, but not before `held`
/// (less a margin) has passed.
fn expect_let_through_after(g: &mut Guest<'_>, uds: &Path, held: Duration) {
    let start = Instant::now();
    let mut c = client(uds);
    c.write_all(b"CONNECT 52\n").unwrap();
    let (req, _) = g.recv_op(Op::Request);
    let waited = start.elapsed();
    assert!(
        waited >= held - Duration::from_millis(100),
        "let through after {waited:?}"
    );
    assert_eq!(req.dst_port, 52);
    drop(c);
}

#[test]
fn device_basics() {
    let uds = TempPath::new("basics");
    assert!(matches!(
        Vsock::new(2, uds.0.clone()),
        Err(VsockError::GuestCid(2))
    ));
    assert!(matches!(
        Vsock::new(u64::from(u32::MAX), uds.0.clone()),
        Err(VsockError::GuestCid(_))
    ));
    let mut dev = Vsock::new(0x1_2345, uds.0.clone()).unwrap();
    assert_eq!(dev.device_type(), 19);
    assert_eq!(dev.queue_max_sizes(), &[256, 256, 256]);
    assert_eq!(dev.avail_features(), 1 << 32);
    let mut cfg = [0xaau8; 10];
    dev.read_config(0, &mut cfg);
    assert_eq!(cfg, [0x45, 0x23, 0x01, 0, 0, 0, 0, 0, 0, 0]);
    let mut hi = [0xaau8; 4];
    dev.read_config(u64::MAX - 1, &mut hi);
    assert_eq!(hi, [0; 4]);
    assert!(uds.0.exists());

    // Reset before activation, and a wrong number of queues, are harmless.
    dev.reset();
    let mem = new_mem();
    let err = dev.activate(ActivateContext {
        mem,
        interrupt: Arc::new(VirtioInterrupt::new(
            EventFd::new(0).unwrap(),
            Arc::new(GuestWake::new().unwrap()),
        )),
        queues: vec![],
        queue_events: vec![],
        acked_features: 0,
    });
    assert!(matches!(
        err,
        Err(ActivateError::QueueCount { expected: 3, .. })
    ));
    drop(dev);
    assert!(!uds.0.exists(), "socket file must go with the device");
}

#[test]
fn reactivates_after_driver_reset() {
    let uds = TempPath::new("reactivate");
    let listener = UnixListener::bind(uds.port(5000)).unwrap();
    let mem = new_mem();
    let mut g = Guest::start(&mem, &uds.0);
    g.post_rx(4);
    g.send(hdr(Op::Request, 1234, 5000), &[]);
    let (mut s, _) = listener.accept().unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    g.recv_op(Op::Response);

    // Driver reset: connections go, the listener stays.
    let mut dev = g.dev;
    dev.reset();
    let mut buf = [0u8; 4];
    assert_eq!(s.read(&mut buf).unwrap(), 0);

    let mut g = Guest::attach(&mem, dev);
    g.post_rx(4);
    let mut c = client(&uds.0);
    c.write_all(b"CONNECT 52\n").unwrap();
    let (req, _) = g.recv_op(Op::Request);
    g.send(hdr(Op::Response, 52, req.src_port), &[]);
    assert_eq!(read_line(&mut c), format!("OK {}\n", req.src_port));
}

/// Next rx packet whatever its CID (`Guest::recv` expects the original one).
fn recv_any(g: &mut Guest) -> (Header, Vec<u8>) {
    g.wait_until("an rx packet", |g| {
        g.used_seen[RX_QUEUE] != g.used_idx(RX_QUEUE)
    });
    let (id, _) = g.used_elem(RX_QUEUE, g.used_seen[RX_QUEUE]);
    g.used_seen[RX_QUEUE] = g.used_seen[RX_QUEUE].wrapping_add(1);
    let addr = GuestAddress(RX_BASE + u64::from(id) * RX_SLOT);
    let mut raw = [0u8; HDR_SIZE];
    g.mem.read_slice(&mut raw, addr).unwrap();
    let h = Header::from_bytes(&raw);
    let mut payload = vec![0u8; h.len as usize];
    g.mem
        .read_slice(&mut payload, addr.unchecked_add(HDR_SIZE as u64))
        .unwrap();
    g.push_avail(RX_QUEUE, id);
    (h, payload)
}

/// A clone's new CID: config space at once, a transport reset, then (once
/// the guest re-posted its event buffer) a connection to the notice port
/// carrying the message, addressed to the new CID.
#[test]
fn new_guest_cid_resets_and_delivers_a_notice() {
    let uds = TempPath::new("newcid");
    let mem = new_mem();
    let mut g = Guest::start(&mem, &uds.0);
    let handle = g.dev.handle().unwrap();
    g.post_rx(8);
    for i in 0..2u16 {
        let d = desc(EV_BASE + u64::from(i) * 16, 8, VRING_DESC_F_WRITE, 0);
        g.queues[EVENT_QUEUE].desc_table().store(i, d).unwrap();
        g.push_avail(EVENT_QUEUE, i);
    }
    assert!(matches!(
        handle.set_guest_cid(2, None),
        Err(VsockError::GuestCid(2))
    ));
    let notice = Notice {
        port: 77,
        message: b"generation 5\n".to_vec(),
    };
    handle.set_guest_cid(9, Some(notice)).unwrap();
    let mut cfg = [0u8; 8];
    g.dev.read_config(0, &mut cfg);
    assert_eq!(u64::from_le_bytes(cfg), 9);
    assert_eq!(g.dev.guest_cid(), 9);
    g.wait_until("the reset event", |g| g.used_idx(EVENT_QUEUE) == 1);
    // The guest has not handled the event yet: no connection so far.
    std::thread::sleep(Duration::from_millis(30));
    assert_eq!(
        g.used_idx(RX_QUEUE),
        0,
        "notice sent before the guest saw the reset"
    );
    // The driver handled the event and re-posts its buffer.
    g.push_avail(EVENT_QUEUE, 0);
    let (req, _) = recv_any(&mut g);
    assert_eq!(req.op, Op::Request as u16, "{req:?}");
    assert_eq!((req.src_cid, req.dst_cid, req.dst_port), (HOST_CID, 9, 77));
    // A packet still carrying the old CID is dropped, not answered.
    g.send(hdr(Op::Response, 77, req.src_port), &[]);
    std::thread::sleep(Duration::from_millis(30));
    if g.used_idx(RX_QUEUE) != 1 {
        panic!(
            "old-CID packet was answered, or the connection reset: {:?}",
            recv_any(&mut g)
        );
    }
    let mut accept = hdr(Op::Response, 77, req.src_port);
    accept.src_cid = 9;
    g.send(accept, &[]);
    let mut got = Vec::new();
    let deadline = Instant::now() + WAIT;
    loop {
        assert!(Instant::now() < deadline, "no message; got {got:?}");
        let (h, p) = recv_any(&mut g);
        assert_eq!(h.dst_cid, 9);
        match h.op {
            op if op == Op::Rw as u16 => got.extend_from_slice(&p),
            op if op == Op::Shutdown as u16 => break,
            op if op == Op::CreditRequest as u16 || op == Op::CreditUpdate as u16 => {}
            other => panic!("unexpected op {other}: {h:?}"),
        }
    }
    assert_eq!(got, b"generation 5\n");
}
