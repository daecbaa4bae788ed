//! virtio-net driven end to end: a mock driver on two mock split queues,
//! the mmio transport, the real worker thread, and a datagram socketpair
//! standing in for the tap (one datagram per frame, header included).
#![allow(
    clippy::cast_possible_truncation,
    reason = "test fixtures: byte patterns and addresses the test builds itself"
)]

use std::os::unix::net::UnixDatagram;
use std::sync::Arc;
use std::time::{Duration, Instant};

use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_net::{VIRTIO_NET_F_MAC, VIRTIO_NET_F_MRG_RXBUF};
use virtio_bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::desc::split::Descriptor as SplitDescriptor;
use virtio_queue::desc::RawDescriptor;
use virtio_queue::mock::MockSplitQueue;
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::header::{NetHeader, VNET_HDR_LEN};
use super::tap::SocketBackend;
use super::*;
use crate::config::{NetworkInterfaceConfig, RateLimiterConfig, TokenBucketConfig};
use crate::devices::bus::BusDevice;
use crate::devices::virtio::mmio::MmioTransport;
use crate::devices::virtio::{GuestMemoryMmap, VirtioDevice, VirtioInterrupt};
use crate::devices::wake::GuestWake;
use crate::persist::Persist;

const W: u16 = VRING_DESC_F_WRITE as u16;
const R: u16 = 0;
const MEM_SIZE: usize = 0x80_0000;
const RX_RING: u64 = 0;
const TX_RING: u64 = 0x1_0000;
const WAIT: Duration = Duration::from_secs(5);

fn memory() -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_SIZE)]).unwrap()
}

fn iface() -> NetworkInterfaceConfig {
    NetworkInterfaceConfig {
        iface_id: "eth0".into(),
        host_dev_name: "unused".into(),
        guest_mac: Some("06:00:ac:10:00:02".parse().unwrap()),
        mtu: None,
        rx_rate_limiter: None,
        tx_rate_limiter: None,
    }
}

/// A device over a socketpair; the other end is the host's side of the wire.
fn device(cfg: &NetworkInterfaceConfig) -> (Net, UnixDatagram) {
    let (ours, host) = SocketBackend::pair().unwrap();
    host.set_read_timeout(Some(WAIT)).unwrap();
    (Net::with_backend(cfg, Box::new(ours)).unwrap(), host)
}

fn wr(t: &mut MmioTransport, offset: u64, v: u32) {
    t.write(offset, &v.to_le_bytes());
}

/// A mock driver: two queues, chains added by hand, completions awaited.
struct Driver<'a> {
    mem: &'a GuestMemoryMmap,
    rx: MockSplitQueue<'a, GuestMemoryMmap>,
    tx: MockSplitQueue<'a, GuestMemoryMmap>,
    next_desc: [u16; 2],
    next_buf: u64,
}

impl<'a> Driver<'a> {
    fn new(mem: &'a GuestMemoryMmap) -> Self {
        Driver {
            mem,
            rx: MockSplitQueue::create(mem, GuestAddress(RX_RING), QUEUE_SIZE),
            tx: MockSplitQueue::create(mem, GuestAddress(TX_RING), QUEUE_SIZE),
            next_desc: [0, 0],
            next_buf: 0x10_0000,
        }
    }

    /// Plays device initialization (virtio 1.2, §3.1.1) with `features`.
    fn activate(&self, device: Net, features: u64) -> MmioTransport {
        let interrupt = Arc::new(VirtioInterrupt::new(
            EventFd::new(EFD_NONBLOCK).unwrap(),
            Arc::new(GuestWake::new().unwrap()),
        ));
        let mut t = MmioTransport::new(Box::new(device), self.mem.clone(), interrupt).unwrap();
        wr(&mut t, 0x70, 1);
        wr(&mut t, 0x70, 3);
        wr(&mut t, 0x24, 0);
        wr(&mut t, 0x20, features as u32);
        wr(&mut t, 0x24, 1);
        wr(&mut t, 0x20, (features >> 32) as u32);
        wr(&mut t, 0x70, 0xb);
        assert_eq!(t.status(), 0xb, "features refused");
        for (i, vq) in [&self.rx, &self.tx].into_iter().enumerate() {
            wr(&mut t, 0x30, i as u32);
            wr(&mut t, 0x38, u32::from(QUEUE_SIZE));
            for (reg, addr) in [
                (0x80, vq.desc_table_addr().0),
                (0x90, vq.avail_addr().0),
                (0xa0, vq.used_addr().0),
            ] {
                wr(&mut t, reg, addr as u32);
                wr(&mut t, reg + 4, (addr >> 32) as u32);
            }
            wr(&mut t, 0x44, 1);
        }
        wr(&mut t, 0x70, 0xf);
        assert!(t.is_activated());
        t
    }

    fn vq(&self, q: usize) -> &MockSplitQueue<'a, GuestMemoryMmap> {
        if q == RX_QUEUE {
            &self.rx
        } else {
            &self.tx
        }
    }

    /// A fresh guest buffer of `len` bytes.
    fn buf(&mut self, len: u32) -> u64 {
        let at = self.next_buf;
        self.next_buf += u64::from(len).next_multiple_of(0x1000);
        at
    }

    /// Adds one chain of (addr, len, flags) to queue `q` and kicks it.
    fn submit(&mut self, t: &mut MmioTransport, q: usize, parts: &[(u64, u32, u16)]) {
        let first = self.next_desc[q];
        let descs: Vec<RawDescriptor> = parts
            .iter()
            .enumerate()
            .map(|(i, &(addr, len, flags))| {
                let last = i == parts.len() - 1;
                let flags = if last {
                    flags
                } else {
                    flags | VRING_DESC_F_NEXT as u16
                };
                let next = if last { 0 } else { first + i as u16 + 1 };
                RawDescriptor::from(SplitDescriptor::new(addr, len, flags, next))
            })
            .collect();
        self.vq(q).add_desc_chains(&descs, first).unwrap();
        self.next_desc[q] += parts.len() as u16;
        wr(t, 0x50, q as u32);
    }

    /// A tx chain: the header and `payload`, split in two descriptors.
    fn send(&mut self, t: &mut MmioTransport, payload: &[u8]) {
        let h = self.buf(VNET_HDR_LEN as u32);
        self.mem
            .write_slice(&NetHeader::default().to_bytes(), GuestAddress(h))
            .unwrap();
        let p = self.buf(payload.len() as u32);
        self.mem.write_slice(payload, GuestAddress(p)).unwrap();
        self.submit(
            t,
            TX_QUEUE,
            &[(h, VNET_HDR_LEN as u32, R), (p, payload.len() as u32, R)],
        );
    }

    /// Offers one rx buffer of `len` bytes; returns its address.
    fn offer_rx(&mut self, t: &mut MmioTransport, len: u32) -> u64 {
        let at = self.buf(len);
        self.submit(t, RX_QUEUE, &[(at, len, W)]);
        at
    }

    fn used(&self, q: usize) -> u16 {
        self.vq(q).used().idx().load()
    }

    /// Waits until queue `q` has `n` used entries; returns their lengths.
    fn wait_used(&self, q: usize, n: u16) -> Vec<u32> {
        let deadline = Instant::now() + WAIT;
        while self.used(q) < n {
            assert!(
                Instant::now() < deadline,
                "queue {q}: {} used, not {n}",
                self.used(q)
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        (0..n as usize)
            .map(|i| self.vq(q).used().ring().ref_at(i).unwrap().load().len())
            .collect()
    }

    fn read(&self, at: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.mem.read_slice(&mut v, GuestAddress(at)).unwrap();
        v
    }
}

fn features(mergeable: bool) -> u64 {
    let mut f = 1 << VIRTIO_F_VERSION_1 | 1 << VIRTIO_NET_F_MAC;
    if mergeable {
        f |= 1 << VIRTIO_NET_F_MRG_RXBUF;
    }
    f
}

/// A frame as the tap gives it: a header (num_buffers 0), then `payload`.
fn tap_frame(payload: &[u8]) -> Vec<u8> {
    let mut f = NetHeader::default().to_bytes().to_vec();
    f.extend_from_slice(payload);
    f
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 13 + i / 256) as u8).collect()
}

#[test]
fn config_space_and_features() {
    let (net, _host) = device(&iface());
    let f = net.avail_features();
    assert_ne!(f & 1 << VIRTIO_NET_F_MAC, 0);
    assert_ne!(f & 1 << VIRTIO_NET_F_MRG_RXBUF, 0);
    let mut cfg = [0u8; 10];
    net.read_config(0, &mut cfg);
    assert_eq!(&cfg[..6], &[6, 0, 0xac, 0x10, 0, 2]);
    assert_eq!(u16::from_le_bytes([cfg[6], cfg[7]]), 1, "LINK_UP");
    assert_eq!(u16::from_le_bytes([cfg[8], cfg[9]]), 1, "one queue pair");
    let mut no_mac = iface();
    no_mac.guest_mac = None;
    let (net, _host) = device(&no_mac);
    assert_eq!(net.avail_features() & 1 << VIRTIO_NET_F_MAC, 0);
}

#[test]
fn tx_frames_reach_the_tap_whole() {
    let mem = memory();
    let mut d = Driver::new(&mem);
    let (net, host) = device(&iface());
    let handle = net.handle();
    let mut t = d.activate(net, features(true));
    let payload = pattern(1500);
    d.send(&mut t, &payload);
    d.send(&mut t, b"short frame");
    assert_eq!(d.wait_used(TX_QUEUE, 2), vec![0, 0]);
    let mut buf = vec![0u8; 70_000];
    let n = host.recv(&mut buf).unwrap();
    assert_eq!(&buf[..n], tap_frame(&payload).as_slice());
    let n = host.recv(&mut buf).unwrap();
    assert_eq!(&buf[..n], tap_frame(b"short frame").as_slice());
    assert_eq!(handle.counters()[1], 2);
}

#[test]
fn bad_tx_chains_are_dropped_and_counted() {
    let mem = memory();
    let mut d = Driver::new(&mem);
    let (net, host) = device(&iface());
    let handle = net.handle();
    let mut t = d.activate(net, features(true));
    // A writable descriptor, a chain shorter than the header, a buffer
    // outside guest memory: each returned unused, nothing sent.
    let b = d.buf(64);
    d.submit(&mut t, TX_QUEUE, &[(b, 64, W)]);
    d.submit(&mut t, TX_QUEUE, &[(b, 4, R)]);
    d.submit(&mut t, TX_QUEUE, &[(MEM_SIZE as u64 - 8, 64, R)]);
    d.send(&mut t, b"good");
    assert_eq!(d.wait_used(TX_QUEUE, 4), vec![0; 4]);
    assert_eq!(handle.counters()[4], 3);
    let mut buf = [0u8; 64];
    let n = host.recv(&mut buf).unwrap();
    assert_eq!(&buf[..n], tap_frame(b"good").as_slice());
    host.set_nonblocking(true).unwrap();
    assert!(host.recv(&mut buf).is_err(), "only the good frame was sent");
}

#[test]
fn rx_frames_span_mergeable_buffers() {
    let mem = memory();
    let mut d = Driver::new(&mem);
    let (net, host) = device(&iface());
    let mut t = d.activate(net, features(true));
    let a = d.offer_rx(&mut t, 2048);
    let b = d.offer_rx(&mut t, 2048);
    let payload = pattern(3000);
    host.send(&tap_frame(&payload)).unwrap();
    let lens = d.wait_used(RX_QUEUE, 2);
    assert_eq!(lens, vec![2048, (3000 + VNET_HDR_LEN - 2048) as u32]);
    let mut got = d.read(a, 2048);
    got.extend(d.read(b, lens[1] as usize));
    let hdr = NetHeader::from_bytes(&got[..VNET_HDR_LEN].try_into().unwrap());
    assert_eq!(hdr.num_buffers, 2);
    assert_eq!(&got[VNET_HDR_LEN..], payload.as_slice());
}

#[test]
fn rx_without_mergeable_buffers_takes_one_chain_per_frame() {
    let mem = memory();
    let mut d = Driver::new(&mem);
    let (net, host) = device(&iface());
    let handle = net.handle();
    let mut t = d.activate(net, features(false));
    // Too small for the first frame: dropped, the chain returned empty.
    d.offer_rx(&mut t, 100);
    host.send(&tap_frame(&pattern(500))).unwrap();
    assert_eq!(d.wait_used(RX_QUEUE, 1), vec![0]);
    assert_eq!(handle.counters()[2], 1);
    let at = d.offer_rx(&mut t, 1600);
    host.send(&tap_frame(b"hello")).unwrap();
    assert_eq!(d.wait_used(RX_QUEUE, 2)[1], (VNET_HDR_LEN + 5) as u32);
    let got = d.read(at, VNET_HDR_LEN + 5);
    assert_eq!(
        NetHeader::from_bytes(&got[..12].try_into().unwrap()).num_buffers,
        1
    );
    assert_eq!(&got[12..], b"hello");
}

#[test]
fn rx_waits_in_the_tap_until_the_guest_offers_buffers() {
    let mem = memory();
    let mut d = Driver::new(&mem);
    let (net, host) = device(&iface());
    let handle = net.handle();
    let mut t = d.activate(net, features(true));
    for i in 0..3u8 {
        host.send(&tap_frame(&[i; 60])).unwrap();
    }
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(d.used(RX_QUEUE), 0);
    assert_eq!(handle.counters()[2], 0, "nothing dropped while waiting");
    let bufs: Vec<u64> = (0..3).map(|_| d.offer_rx(&mut t, 1526)).collect();
    assert_eq!(d.wait_used(RX_QUEUE, 3), vec![72; 3]);
    for (i, at) in bufs.into_iter().enumerate() {
        assert_eq!(d.read(at + 12, 60), vec![i as u8; 60]);
    }
}

#[test]
fn bad_rx_chains_drop_the_frame_not_the_device() {
    let mem = memory();
    let mut d = Driver::new(&mem);
    let (net, host) = device(&iface());
    let handle = net.handle();
    let mut t = d.activate(net, features(true));
    let b = d.buf(2048);
    d.submit(&mut t, RX_QUEUE, &[(b, 2048, R)]);
    host.send(&tap_frame(b"lost")).unwrap();
    assert_eq!(d.wait_used(RX_QUEUE, 1), vec![0]);
    assert_eq!(handle.counters()[4], 1);
    let at = d.offer_rx(&mut t, 2048);
    host.send(&tap_frame(b"kept")).unwrap();
    d.wait_used(RX_QUEUE, 2);
    assert_eq!(d.read(at + 12, 4), b"kept");
}

fn ops_limit(per_100ms: u64) -> RateLimiterConfig {
    RateLimiterConfig {
        bandwidth: None,
        ops: Some(TokenBucketConfig {
            size: per_100ms,
            one_time_burst: None,
            refill_time: 100,
        }),
    }
}

#[test]
fn tx_limiter_defers_chains_until_its_timer() {
    let mem = memory();
    let mut d = Driver::new(&mem);
    let mut cfg = iface();
    cfg.tx_rate_limiter = Some(ops_limit(1));
    let (net, host) = device(&cfg);
    let mut t = d.activate(net, features(true));
    let start = Instant::now();
    for _ in 0..3 {
        d.send(&mut t, b"x");
    }
    d.wait_used(TX_QUEUE, 3);
    // One op per 100 ms: the third frame waits for two refills.
    assert!(
        start.elapsed() >= Duration::from_millis(150),
        "{:?}",
        start.elapsed()
    );
    let mut buf = [0u8; 64];
    for _ in 0..3 {
        host.recv(&mut buf).unwrap();
    }
}

#[test]
fn rx_limiter_leaves_frames_waiting() {
    let mem = memory();
    let mut d = Driver::new(&mem);
    let mut cfg = iface();
    cfg.rx_rate_limiter = Some(ops_limit(1));
    let (net, host) = device(&cfg);
    let handle = net.handle();
    let mut t = d.activate(net, features(true));
    for _ in 0..3 {
        d.offer_rx(&mut t, 1526);
    }
    let start = Instant::now();
    for i in 0..3u8 {
        host.send(&tap_frame(&[i; 10])).unwrap();
    }
    d.wait_used(RX_QUEUE, 3);
    assert!(
        start.elapsed() >= Duration::from_millis(150),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(handle.counters()[2], 0);
    // PATCH lifts the limit.
    handle.update_rate_limiters(
        Some(&RateLimiterConfig {
            bandwidth: None,
            ops: Some(TokenBucketConfig::default()),
        }),
        None,
    );
    assert_eq!(handle.rate_limiters().0, None);
}

#[test]
fn snapshot_state_round_trips_and_the_device_resumes() {
    let mem = memory();
    let mut d = Driver::new(&mem);
    let mut cfg = iface();
    cfg.tx_rate_limiter = Some(ops_limit(5));
    let (net, host) = device(&cfg);
    let mut t = d.activate(net, features(true));
    d.send(&mut t, b"before");
    d.wait_used(TX_QUEUE, 1);
    let mut buf = [0u8; 64];
    host.recv(&mut buf).unwrap();

    // As `snapshot::create` does: quiesce, save both, resume.
    t.quiesce().unwrap();
    let tstate = t.save();
    let any: &dyn std::any::Any = t.device();
    let state = any.downcast_ref::<Net>().unwrap().save();
    assert!(t.resume());
    assert_eq!(state.iface_id, "eth0");
    assert_eq!(state.tap_name, "unused");
    assert_eq!(state.mac, [6, 0, 0xac, 0x10, 0, 2]);
    assert!(state.tx_rate_limiter.ops.is_some());
    wr(&mut t, 0x70, 0);
    drop(t);

    let bytes = bincode::serialize(&state).unwrap();
    let state: NetState = bincode::deserialize(&bytes).unwrap();
    // Another interface's configuration is refused before any tap is opened.
    let mut wrong = cfg.clone();
    wrong.iface_id = "eth1".into();
    assert!(Net::restore(wrong, &state).is_err());
    // A new "tap"; a clone's MAC set before the restore is overwritten by
    // the snapshot's (the clone sets its own after).
    let (fresh, host2) = device(&cfg);
    fresh.handle().set_mac("06:00:00:00:00:09".parse().unwrap());
    let restored = persist::restore_into(fresh, &state).unwrap();
    assert_eq!(restored.config_space().mac, state.mac);
    let handle = restored.handle();
    let interrupt = Arc::new(VirtioInterrupt::new(
        EventFd::new(EFD_NONBLOCK).unwrap(),
        Arc::new(GuestWake::new().unwrap()),
    ));
    let mut t2 =
        MmioTransport::restore(Box::new(restored), mem.clone(), interrupt, &tstate).unwrap();
    t2.finish_restore().unwrap();
    assert!(t2.is_activated());
    d.send(&mut t2, b"restored");
    d.wait_used(TX_QUEUE, 2);
    let n = host2.recv(&mut buf).unwrap();
    assert_eq!(&buf[..n], tap_frame(b"restored").as_slice());
    // A clone's new MAC: config space and a config interrupt.
    handle.set_mac("06:00:00:00:00:0a".parse().unwrap());
    let mut mac = [0u8; 6];
    t2.device().read_config(0, &mut mac);
    assert_eq!(mac, [6, 0, 0, 0, 0, 0xa]);
    assert_ne!(
        t2.interrupt().status() & crate::devices::virtio::interrupt::INT_CONFIG,
        0
    );
}

/// An ARP request from the guest's MAC (06:00:ac:10:00:02, 172.16.0.2)
/// for `target`.
fn arp_request(target: [u8; 4]) -> Vec<u8> {
    let mac = [6, 0, 0xac, 0x10, 0, 2];
    let mut f = vec![0xff; 6];
    f.extend_from_slice(&mac);
    f.extend_from_slice(&[0x08, 0x06, 0, 1, 8, 0, 6, 4, 0, 1]);
    f.extend_from_slice(&mac);
    f.extend_from_slice(&[172, 16, 0, 2, 0, 0, 0, 0, 0, 0]);
    f.extend_from_slice(&target);
    f
}

#[test]
fn mmds_frames_are_answered_in_the_rx_queue_and_others_reach_the_tap() {
    use crate::mmds::stack::{MmdsStack, DEFAULT_MMDS_IPV4, MMDS_MAC};
    let mem = memory();
    let mut d = Driver::new(&mem);
    let (mut net, host) = device(&iface());
    net.set_mmds(MmdsStack::new(
        DEFAULT_MMDS_IPV4,
        crate::mmds::Mmds::shared(),
    ));
    let mut t = d.activate(net, features(true));
    let rx = d.offer_rx(&mut t, 2048);
    d.send(&mut t, &arp_request([169, 254, 169, 254]));
    d.send(&mut t, &arp_request([172, 16, 0, 1]));
    assert_eq!(d.wait_used(TX_QUEUE, 2), vec![0, 0]);
    // The MMDS's answer: an ARP reply from its MAC, to the guest's.
    let lens = d.wait_used(RX_QUEUE, 1);
    let reply = d.read(rx, lens[0] as usize);
    let frame = &reply[VNET_HDR_LEN..];
    assert_eq!(&frame[..6], &[6, 0, 0xac, 0x10, 0, 2]);
    assert_eq!(&frame[6..12], &MMDS_MAC);
    assert_eq!(&frame[20..22], &[0, 2], "an ARP reply");
    assert_eq!(&frame[22..28], &MMDS_MAC, "sender MAC");
    assert_eq!(&frame[28..32], &[169, 254, 169, 254], "sender IP");
    // Only the other request reached the tap.
    let mut buf = vec![0u8; 4096];
    let n = host.recv(&mut buf).unwrap();
    assert_eq!(
        &buf[..n],
        tap_frame(&arp_request([172, 16, 0, 1])).as_slice()
    );
    host.set_nonblocking(true).unwrap();
    assert!(
        host.recv(&mut buf).is_err(),
        "the MMDS request left for the tap"
    );
}
