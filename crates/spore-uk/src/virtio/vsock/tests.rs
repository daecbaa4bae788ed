//! The vsock driver against a device played by the test: the "MMIO
//! registers" are a plain memory block (reads return what was written, so
//! status and feature handshakes succeed), and the test reads the driver's
//! available rings and fills its used rings as the VMM would.

use alloc::vec;
use alloc::vec::Vec;

use spore_abi::boot::MmioDevice;

use super::*;

const GUEST_CID: u64 = 3;

/// A register file that acts as a virtio-mmio vsock device at rest.
fn fake_registers() -> Vec<u32> {
    let mut r = vec![0u32; 0x110 / 4];
    r[0] = 0x7472_6976; // magic
    r[1] = 2; // version
    r[2] = device_id::VSOCK;
    r[0x10 / 4] = 1; // device features: read for both halves, so bit 32 is set
    r[0x34 / 4] = 256; // queue num max
    r[0x100 / 4] = GUEST_CID as u32;
    r
}

struct Device {
    last_avail: [u16; 3],
    used_idx: [u16; 3],
}

fn rd<T: Copy>(addr: u64) -> T {
    // SAFETY: addresses come from the driver's own queue memory.
    unsafe { core::ptr::read_volatile(addr as *const T) }
}

fn wr<T: Copy>(addr: u64, v: T) {
    // SAFETY: as for `rd`.
    unsafe { core::ptr::write_volatile(addr as *mut T, v) }
}

impl Device {
    fn new() -> Self {
        Device {
            last_avail: [0; 3],
            used_idx: [0; 3],
        }
    }

    /// The next available buffer of queue `q`: (id, addr, len).
    fn pop_avail(&mut self, v: &Vsock, q: u16) -> Option<(u16, u64, u32)> {
        let (desc, avail, _, size) = v.queue_layout(q);
        let idx: u16 = rd(avail + 2);
        let last = &mut self.last_avail[q as usize];
        if idx == *last {
            return None;
        }
        let id: u16 = rd(avail + 4 + 2 * (*last % size) as u64);
        *last = last.wrapping_add(1);
        let d = desc + 16 * id as u64;
        Some((id, rd(d), rd(d + 8)))
    }

    fn push_used(&mut self, v: &Vsock, q: u16, id: u16, len: u32) {
        let (_, _, used, size) = v.queue_layout(q);
        let i = self.used_idx[q as usize];
        let e = used + 4 + 8 * (i % size) as u64;
        wr(e, id as u32);
        wr(e + 4, len);
        self.used_idx[q as usize] = i.wrapping_add(1);
        wr(used + 2, i.wrapping_add(1));
    }

    /// Puts one host packet into the next rx buffer.
    fn deliver(&mut self, v: &Vsock, mut hdr: Header, payload: &[u8]) {
        let (id, addr, len) = self.pop_avail(v, RXQ).expect("no rx buffer posted");
        assert!(len as usize >= HDR_SIZE + payload.len());
        hdr.len = payload.len() as u32;
        let bytes = hdr.to_bytes();
        for (i, b) in bytes.iter().chain(payload).enumerate() {
            wr(addr + i as u64, *b);
        }
        self.push_used(v, RXQ, id, (HDR_SIZE + payload.len()) as u32);
    }

    /// Every packet the driver queued on tx.
    fn take_tx(&mut self, v: &Vsock) -> Vec<(Header, Vec<u8>)> {
        let mut out = vec![];
        while let Some((id, addr, len)) = self.pop_avail(v, TXQ) {
            let mut hb = [0u8; HDR_SIZE];
            for (i, b) in hb.iter_mut().enumerate() {
                *b = rd(addr + i as u64);
            }
            let hdr = Header::from_bytes(&hb);
            assert_eq!(hdr.len as usize, len as usize - HDR_SIZE);
            let payload = (HDR_SIZE..len as usize)
                .map(|i| rd(addr + i as u64))
                .collect();
            out.push((hdr, payload));
            self.push_used(v, TXQ, id, 0);
        }
        out
    }
}

fn host_hdr(op_: u16, host_port: u32, guest_port: u32) -> Header {
    Header {
        src_cid: HOST_CID,
        dst_cid: GUEST_CID,
        src_port: host_port,
        dst_port: guest_port,
        type_: TYPE_STREAM,
        op: op_,
        buf_alloc: 65536,
        ..Header::default()
    }
}

fn boot_info(regs: &mut [u32]) -> BootInfo {
    let mut info = BootInfo {
        mmio_device_count: 1,
        ..BootInfo::default()
    };
    info.mmio_devices[0] = MmioDevice {
        base: regs.as_mut_ptr() as u64,
        size: 0x1000,
        device_id: device_id::VSOCK,
        irq: 5,
    };
    info
}

/// A driver with one accepted connection from host port 1024 to 6379.
fn connected(regs: &mut [u32], conn_buffer: usize) -> (Vsock, Device, ConnId) {
    let info = boot_info(regs);
    let cfg = VsockConfig {
        max_connections: 2,
        conn_buffer,
    };
    let mut v = Vsock::new(&info, cfg).unwrap();
    assert_eq!(v.guest_cid(), GUEST_CID);
    v.listen(6379).unwrap();
    let mut d = Device::new();
    d.deliver(&v, host_hdr(op::REQUEST, 1024, 6379), &[]);
    v.poll();
    let c = v.accept().expect("connection not accepted");
    let tx = d.take_tx(&v);
    assert_eq!(tx.len(), 1);
    let (h, _) = &tx[0];
    assert_eq!((h.op, h.src_port, h.dst_port), (op::RESPONSE, 6379, 1024));
    assert_eq!((h.src_cid, h.dst_cid), (GUEST_CID, HOST_CID));
    assert_eq!(h.buf_alloc as usize, conn_buffer);
    (v, d, c)
}

#[test]
fn accepts_exchanges_data_and_refuses_other_ports() {
    let mut regs = fake_registers();
    let (mut v, mut d, c) = connected(&mut regs, 4096);
    assert_eq!(v.local_port(c), Some(6379));
    assert_eq!(v.recv(c, &mut [0u8; 8]), Err(VsockError::WouldBlock));
    d.deliver(&v, host_hdr(op::RW, 1024, 6379), b"PING\r\n");
    v.poll();
    let mut buf = [0u8; 16];
    assert_eq!(v.recv(c, &mut buf), Ok(6));
    assert_eq!(&buf[..6], b"PING\r\n");
    assert_eq!(v.send(c, b"+PONG\r\n"), Ok(7));
    let tx = d.take_tx(&v);
    assert_eq!(tx.len(), 1);
    assert_eq!(tx[0].0.op, op::RW);
    assert_eq!(tx[0].1, b"+PONG\r\n");
    assert_eq!(tx[0].0.fwd_cnt, 6, "data packets carry the consumed count");

    // Nobody listens on 80, and a second connection cannot be accepted twice.
    d.deliver(&v, host_hdr(op::REQUEST, 1025, 80), &[]);
    v.poll();
    let tx = d.take_tx(&v);
    assert_eq!(tx.len(), 1);
    assert_eq!((tx[0].0.op, tx[0].0.dst_port), (op::RST, 1025));
    assert_eq!(v.accept(), None);
    assert_eq!(v.stats().refused, 1);
}

#[test]
fn sends_within_the_peer_credit_only() {
    let mut regs = fake_registers();
    let (mut v, mut d, c) = connected(&mut regs, 4096);
    let mut h = host_hdr(op::CREDIT_UPDATE, 1024, 6379);
    h.buf_alloc = 10;
    d.deliver(&v, h, &[]);
    v.poll();
    let data = [7u8; 25];
    assert_eq!(v.send(c, &data), Ok(10));
    assert_eq!(v.send(c, &data[10..]), Ok(0));
    // The host consumed 8 of them.
    h.fwd_cnt = 8;
    d.deliver(&v, h, &[]);
    v.poll();
    assert_eq!(v.send(c, &data[10..]), Ok(8));
    let sent: usize = d.take_tx(&v).iter().map(|(_, p)| p.len()).sum();
    assert_eq!(sent, 18);
}

#[test]
fn returns_credit_and_drops_overruns() {
    let mut regs = fake_registers();
    let (mut v, mut d, c) = connected(&mut regs, 64);
    // 100 bytes into a 64-byte window: the excess is dropped and counted.
    d.deliver(&v, host_hdr(op::RW, 1024, 6379), &[1u8; 100]);
    v.poll();
    assert_eq!(v.readable(c), 64);
    assert_eq!(v.stats().overrun_bytes, 36);
    let mut buf = [0u8; 20];
    assert_eq!(v.recv(c, &mut buf), Ok(20));
    // A quarter of the window was read: the host hears about it.
    let tx = d.take_tx(&v);
    assert_eq!(tx.len(), 1);
    assert_eq!((tx[0].0.op, tx[0].0.fwd_cnt), (op::CREDIT_UPDATE, 20));
    // A credit request is answered.
    d.deliver(&v, host_hdr(op::CREDIT_REQUEST, 1024, 6379), &[]);
    v.poll();
    let tx = d.take_tx(&v);
    assert_eq!(tx.len(), 1);
    assert_eq!(tx[0].0.op, op::CREDIT_UPDATE);
}

#[test]
fn peer_shutdown_gives_eof_after_the_data_and_frees_the_slot() {
    let mut regs = fake_registers();
    let (mut v, mut d, c) = connected(&mut regs, 4096);
    d.deliver(&v, host_hdr(op::RW, 1024, 6379), b"last words");
    let mut h = host_hdr(op::SHUTDOWN, 1024, 6379);
    h.flags = SHUTDOWN_BOTH;
    d.deliver(&v, h, &[]);
    v.poll();
    let tx = d.take_tx(&v);
    assert_eq!(tx.len(), 1);
    assert_eq!(tx[0].0.op, op::RST);
    assert_eq!(v.send(c, b"x"), Err(VsockError::Closed));
    let mut buf = [0u8; 32];
    assert_eq!(v.recv(c, &mut buf), Ok(10));
    assert!(v.at_eof(c));
    assert_eq!(v.recv(c, &mut buf), Ok(0));
    v.close(c);
    assert_eq!(v.recv(c, &mut buf), Err(VsockError::Closed), "stale id");
    // Both slots are free again: two new connections fit.
    for port in [2000, 2001] {
        d.deliver(&v, host_hdr(op::REQUEST, port, 6379), &[]);
    }
    v.poll();
    assert!(v.accept().is_some() && v.accept().is_some());
    assert!(d.take_tx(&v).iter().all(|(h, _)| h.op == op::RESPONSE));
}

#[test]
fn app_close_shuts_down_then_waits_for_the_reset() {
    let mut regs = fake_registers();
    let (mut v, mut d, c) = connected(&mut regs, 4096);
    // No TSC frequency in a host test, so close ends with an RST at once.
    v.close(c);
    let ops: Vec<u16> = d.take_tx(&v).iter().map(|(h, _)| h.op).collect();
    assert_eq!(ops, [op::SHUTDOWN, op::RST]);
    assert_eq!(v.send(c, b"x"), Err(VsockError::Closed));
    // A packet for the forgotten connection is answered with RST.
    d.deliver(&v, host_hdr(op::RW, 1024, 6379), b"late");
    v.poll();
    let tx = d.take_tx(&v);
    assert_eq!(tx.len(), 1);
    assert_eq!(tx[0].0.op, op::RST);
}

#[test]
fn notifies_rx_only_when_the_device_ran_dry() {
    let mut regs = fake_registers();
    let (mut v, mut d, _c) = connected(&mut regs, 1 << 20);
    let before = v.stats().notifies;
    d.deliver(&v, host_hdr(op::CREDIT_UPDATE, 1024, 6379), &[]);
    v.poll();
    assert_eq!(
        v.stats().notifies,
        before,
        "re-posting one buffer needs no exit"
    );
    let size = v.queue_layout(RXQ).3;
    for _ in 0..size {
        d.deliver(&v, host_hdr(op::CREDIT_UPDATE, 1024, 6379), &[]);
    }
    v.poll();
    assert_eq!(
        v.stats().notifies,
        before + 1,
        "a starved device is notified"
    );
    // Every buffer is posted again.
    for _ in 0..size {
        d.deliver(&v, host_hdr(op::CREDIT_UPDATE, 1024, 6379), &[]);
    }
}

#[test]
fn ignores_packets_for_other_cids_and_transport_resets_close_everything() {
    let mut regs = fake_registers();
    let (mut v, mut d, c) = connected(&mut regs, 4096);
    let mut h = host_hdr(op::RW, 1024, 6379);
    h.dst_cid = 99;
    d.deliver(&v, h, b"not for us");
    v.poll();
    assert_eq!(v.readable(c), 0);
    assert_eq!(d.take_tx(&v)[0].0.op, op::RST);
    // VIRTIO_VSOCK_EVENT_TRANSPORT_RESET on the event queue.
    let (id, addr, _) = d.pop_avail(&v, EVQ).unwrap();
    wr(addr, EVENT_TRANSPORT_RESET);
    d.push_used(&v, EVQ, id, 4);
    v.poll();
    assert!(v.at_eof(c));
    assert_eq!(v.recv(c, &mut [0u8; 4]), Err(VsockError::Closed));
}

#[test]
fn a_transport_reset_spares_a_request_that_arrived_with_it() {
    // After a snapshot restore the device posts the reset and may deliver a
    // new host request before the driver polls: the reset is for the old
    // connections only.
    let mut regs = fake_registers();
    let (mut v, mut d, old) = connected(&mut regs, 4096);
    // Both slots taken: the reset must make room for the new request.
    d.deliver(&v, host_hdr(op::REQUEST, 1026, 6379), &[]);
    v.poll();
    let other = v.accept().expect("second connection");
    d.take_tx(&v);
    d.deliver(&v, host_hdr(op::REQUEST, 1025, 6379), &[]);
    let (id, addr, _) = d.pop_avail(&v, EVQ).unwrap();
    wr(addr, EVENT_TRANSPORT_RESET);
    d.push_used(&v, EVQ, id, 4);
    v.poll();
    assert!(
        v.at_eof(old),
        "the connections of before the reset are gone"
    );
    assert!(v.at_eof(other));
    assert_eq!(v.recv(other, &mut [0u8; 4]), Err(VsockError::Closed));
    let new = v.accept().expect("the new request must be accepted");
    assert!(!v.at_eof(new));
    v.close(old);
    v.close(other);
    assert!(
        !v.at_eof(new),
        "closing a stale id must not touch its slot's new tenant"
    );
    let tx = d.take_tx(&v);
    assert!(
        tx.iter()
            .any(|(h, _)| (h.op, h.dst_port) == (op::RESPONSE, 1025)),
        "{:?}",
        tx.iter()
            .map(|(h, _)| (h.op, h.dst_port))
            .collect::<Vec<_>>()
    );
    // The driver handed the event buffer back and told the device.
    assert!(d.pop_avail(&v, EVQ).is_some());
}
