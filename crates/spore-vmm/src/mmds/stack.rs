//! The MMDS endpoint on a guest's network interface: the frames the guest
//! sends to the MMDS address (ARP requests for it, IPv4 to it) are handed
//! here instead of to the tap, and the answers come back as frames for the
//! guest's rx queue, from the MMDS MAC address Firecracker uses.
//!
//! ARP and Ethernet framing are done here (a few bytes each); IPv4 and TCP
//! are smoltcp's, on a raw-IP interface that owns the MMDS address and
//! answers every host (whatever the guest's address, the reply goes back to
//! the MAC address the request came from, as in Firecracker). HTTP is
//! [`super::http`]. Everything is bounded: a few connections with small
//! buffers, built on the first MMDS frame; queues that drop what a guest
//! that does not read would pile up (TCP sends it again).

use std::collections::VecDeque;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use smoltcp::iface::{Config, Interface, SocketHandle, SocketSet};
use smoltcp::phy::{Checksum, ChecksumCapabilities, Device, DeviceCapabilities, Medium};
use smoltcp::socket::tcp;
use smoltcp::wire::{HardwareAddress, IpCidr, Ipv4Address};

use super::http::{self, Exchange, MAX_REQUEST_BYTES};
use super::SharedMmds;
use crate::host::lock;

/// The MMDS's own MAC address (Firecracker's).
pub const MMDS_MAC: [u8; 6] = [0x06, 0x01, 0x23, 0x45, 0x67, 0x01];
/// Firecracker's default MMDS address.
pub const DEFAULT_MMDS_IPV4: Ipv4Addr = Ipv4Addr::new(169, 254, 169, 254);
const HTTP_PORT: u16 = 80;
/// Connections open at once (more are refused with a reset until one ends).
const MAX_CONNECTIONS: usize = 8;
const SOCKET_TX_BYTES: usize = 16 * 1024;
/// Frames waiting either way.
const MAX_QUEUED: usize = 64;
const ETH_HEADER: usize = 14;
const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_ARP: u16 = 0x0806;
const IP_MTU: usize = 1500;

/// One interface's MMDS endpoint.
pub struct MmdsStack {
    ip: Ipv4Addr,
    mmds: SharedMmds,
    /// The guest's MAC address, from its last MMDS frame.
    guest_mac: [u8; 6],
    /// Ethernet frames for the guest.
    out: VecDeque<Vec<u8>>,
    born: Instant,
    /// Built on the first IPv4 frame: a guest that never asks costs nothing.
    tcp: Option<Box<Tcp>>,
    /// Frames the queues had no room for.
    pub dropped: u64,
}

struct Tcp {
    iface: Interface,
    device: Packets,
    sockets: SocketSet<'static>,
    conns: Vec<Conn>,
}

/// A connection's HTTP state beside its socket.
struct Conn {
    handle: SocketHandle,
    /// Request bytes not answered yet.
    input: Vec<u8>,
    /// Response bytes the socket had no room for yet.
    output: VecDeque<u8>,
    /// Close once `output` is sent.
    closing: bool,
}

/// smoltcp's device: packets from the guest, and for it (raw IPv4 here;
/// the tests' guest-like client uses the same queues with Ethernet).
struct Packets {
    medium: Medium,
    from_guest: VecDeque<Vec<u8>>,
    to_guest: VecDeque<Vec<u8>>,
}

impl Packets {
    fn new(medium: Medium) -> Self {
        Self {
            medium,
            from_guest: VecDeque::new(),
            to_guest: VecDeque::new(),
        }
    }
}

struct RxPacket(Vec<u8>);
struct TxPacket<'a>(&'a mut VecDeque<Vec<u8>>);

impl smoltcp::phy::RxToken for RxPacket {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(&self.0)
    }
}

impl smoltcp::phy::TxToken for TxPacket<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let mut packet = vec![0u8; len];
        let r = f(&mut packet);
        self.0.push_back(packet);
        r
    }
}

impl Device for Packets {
    type RxToken<'a> = RxPacket;
    type TxToken<'a> = TxPacket<'a>;

    fn receive(
        &mut self,
        _: smoltcp::time::Instant,
    ) -> Option<(Self::RxToken<'_>, Self::TxToken<'_>)> {
        let p = self.from_guest.pop_front()?;
        Some((RxPacket(p), TxPacket(&mut self.to_guest)))
    }

    fn transmit(&mut self, _: smoltcp::time::Instant) -> Option<Self::TxToken<'_>> {
        (self.to_guest.len() < MAX_QUEUED).then_some(TxPacket(&mut self.to_guest))
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = self.medium;
        // (Not a match: without the tests' medium-ethernet feature, Medium
        // has one variant and a wildcard arm would be unreachable.)
        caps.max_transmission_unit = if self.medium == Medium::Ip {
            IP_MTU
        } else {
            IP_MTU + ETH_HEADER
        };
        // The guest may leave checksums to the device (VIRTIO_NET_F_CSUM):
        // nothing it sends is verified; what we send is complete.
        let mut sums = ChecksumCapabilities::default();
        sums.ipv4 = Checksum::Tx;
        sums.tcp = Checksum::Tx;
        sums.icmpv4 = Checksum::Tx;
        caps.checksum = sums;
        caps
    }
}

impl MmdsStack {
    pub fn new(ip: Ipv4Addr, mmds: SharedMmds) -> Self {
        Self {
            ip,
            mmds,
            guest_mac: [0xff; 6],
            out: VecDeque::new(),
            born: Instant::now(),
            tcp: None,
            dropped: 0,
        }
    }

    fn now(&self) -> smoltcp::time::Instant {
        smoltcp::time::Instant::from_millis(
            i64::try_from(self.born.elapsed().as_millis()).unwrap_or(i64::MAX),
        )
    }

    /// Whether `frame` (Ethernet, no virtio header) is for the MMDS: an
    /// ARP packet asking for its address, or an IPv4 packet to it.
    pub fn is_mmds_frame(&self, frame: &[u8]) -> bool {
        let ip = self.ip.octets();
        match ethertype(frame) {
            // ARP's target protocol address.
            Some(ETHERTYPE_ARP) => frame.get(ETH_HEADER + 24..ETH_HEADER + 28) == Some(&ip[..]),
            // IPv4's destination.
            Some(ETHERTYPE_IPV4) => frame.get(ETH_HEADER + 16..ETH_HEADER + 20) == Some(&ip[..]),
            _ => false,
        }
    }

    /// Takes a frame [`Self::is_mmds_frame`] accepted.
    pub fn receive(&mut self, frame: &[u8]) {
        let Some(src) = frame.get(6..12) else { return };
        match ethertype(frame) {
            Some(ETHERTYPE_ARP) => self.answer_arp(&frame[ETH_HEADER..]),
            Some(ETHERTYPE_IPV4) => {
                self.guest_mac.copy_from_slice(src);
                let packet = &frame[ETH_HEADER..];
                // Past the IPv4 total length is Ethernet padding.
                let len = packet
                    .get(2..4)
                    .map_or(0, |b| usize::from(u16::from_be_bytes([b[0], b[1]])));
                if len < 20 || len > packet.len() {
                    return;
                }
                let ip = self.ip;
                let tcp = self.tcp.get_or_insert_with(|| Box::new(Tcp::new(ip)));
                if tcp.device.from_guest.len() >= MAX_QUEUED {
                    self.dropped += 1;
                    return;
                }
                tcp.device.from_guest.push_back(packet[..len].to_vec());
                self.poll();
            }
            _ => {}
        }
    }

    /// An ARP reply to a request for the MMDS address.
    fn answer_arp(&mut self, arp: &[u8]) {
        // Ethernet/IPv4 request: htype 1, ptype 0x0800, 6, 4, oper 1.
        if arp.len() < 28 || arp[..8] != [0, 1, 8, 0, 6, 4, 0, 1] {
            return;
        }
        let (sha, spa) = (&arp[8..14], &arp[14..18]);
        let mut f = Vec::with_capacity(ETH_HEADER + 28);
        f.extend_from_slice(sha);
        f.extend_from_slice(&MMDS_MAC);
        f.extend_from_slice(&ETHERTYPE_ARP.to_be_bytes());
        f.extend_from_slice(&[0, 1, 8, 0, 6, 4, 0, 2]);
        f.extend_from_slice(&MMDS_MAC);
        f.extend_from_slice(&self.ip.octets());
        f.extend_from_slice(sha);
        f.extend_from_slice(spa);
        self.push_out(f);
    }

    fn push_out(&mut self, frame: Vec<u8>) {
        if self.out.len() >= MAX_QUEUED {
            self.dropped += 1;
        } else {
            self.out.push_back(frame);
        }
    }

    /// Runs TCP (timers, pending sends) and HTTP; frames for the guest
    /// end up behind [`Self::next_frame`].
    pub fn poll(&mut self) {
        let now = self.now();
        let Some(tcp) = self.tcp.as_mut() else { return };
        tcp.poll(now, &self.mmds);
        let packets: Vec<Vec<u8>> = tcp.device.to_guest.drain(..).collect();
        for p in packets {
            let mut f = Vec::with_capacity(ETH_HEADER + p.len());
            f.extend_from_slice(&self.guest_mac);
            f.extend_from_slice(&MMDS_MAC);
            f.extend_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
            f.extend_from_slice(&p);
            self.push_out(f);
        }
    }

    /// The next frame for the guest (Ethernet, no virtio header).
    pub fn next_frame(&mut self) -> Option<Vec<u8>> {
        self.out.pop_front()
    }

    /// Puts a frame the guest had no buffer for back at the head.
    pub fn unread(&mut self, frame: Vec<u8>) {
        self.out.push_front(frame);
    }

    pub fn has_frames(&self) -> bool {
        !self.out.is_empty()
    }

    /// How long until TCP needs [`Self::poll`] again (retransmits, closes).
    pub fn poll_delay(&mut self) -> Option<Duration> {
        let now = self.now();
        let tcp = self.tcp.as_mut()?;
        tcp.iface
            .poll_delay(now, &tcp.sockets)
            .map(|d| Duration::from_micros(d.total_micros()))
    }
}

fn ethertype(frame: &[u8]) -> Option<u16> {
    frame.get(12..14).map(|b| u16::from_be_bytes([b[0], b[1]]))
}

impl Tcp {
    fn new(ip: Ipv4Addr) -> Self {
        let mut device = Packets::new(Medium::Ip);
        let mut config = Config::new(HardwareAddress::Ip);
        config.random_seed = {
            let mut seed = [0u8; 8];
            let _ = getrandom::fill(&mut seed);
            u64::from_le_bytes(seed)
        };
        let mut iface = Interface::new(config, &mut device, smoltcp::time::Instant::ZERO);
        let addr = Ipv4Address::from(ip.octets());
        iface.update_ip_addrs(|addrs| {
            let _ = addrs.push(IpCidr::new(addr.into(), 32));
        });
        // Replies go back on the one link whatever the guest's address
        // (a raw-IP interface resolves no neighbours).
        let _ = iface.routes_mut().add_default_ipv4_route(addr);
        let mut sockets = SocketSet::new(Vec::new());
        let conns = (0..MAX_CONNECTIONS)
            .map(|_| {
                let mut socket = tcp::Socket::new(
                    tcp::SocketBuffer::new(vec![0u8; MAX_REQUEST_BYTES]),
                    tcp::SocketBuffer::new(vec![0u8; SOCKET_TX_BYTES]),
                );
                // A fresh socket always takes a listen.
                let _ = socket.listen(HTTP_PORT);
                Conn {
                    handle: sockets.add(socket),
                    input: Vec::new(),
                    output: VecDeque::new(),
                    closing: false,
                }
            })
            .collect();
        Self {
            iface,
            device,
            sockets,
            conns,
        }
    }

    fn poll(&mut self, now: smoltcp::time::Instant, mmds: &SharedMmds) {
        // Twice: what HTTP answered in the first round is sent in the second.
        for _ in 0..2 {
            self.iface.poll(now, &mut self.device, &mut self.sockets);
            for conn in &mut self.conns {
                let socket = self.sockets.get_mut::<tcp::Socket>(conn.handle);
                conn.serve(socket, mmds);
            }
        }
        self.iface.poll(now, &mut self.device, &mut self.sockets);
    }
}

impl Conn {
    fn serve(&mut self, socket: &mut tcp::Socket, mmds: &SharedMmds) {
        if !socket.is_open() {
            // Ended (or never used): listen again, with nothing left over.
            self.input.clear();
            self.output.clear();
            self.closing = false;
            if let Err(e) = socket.listen(HTTP_PORT) {
                tracing::debug!("mmds: cannot listen: {e}");
            }
            return;
        }
        while socket.can_recv() && !self.closing {
            let room = MAX_REQUEST_BYTES.saturating_sub(self.input.len()).max(1);
            let input = &mut self.input;
            let read = socket.recv(|data| {
                let n = data.len().min(room);
                input.extend_from_slice(&data[..n]);
                (n, n)
            });
            if !matches!(read, Ok(n) if n > 0) {
                break;
            }
            self.answer(mmds);
        }
        while !self.output.is_empty() && socket.can_send() {
            let (front, _) = self.output.as_slices();
            match socket.send_slice(front) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    self.output.drain(..n);
                }
            }
        }
        if self.closing && self.output.is_empty() {
            socket.close();
        } else if socket.state() == tcp::State::CloseWait && self.output.is_empty() {
            // The guest closed its side and has every answer.
            socket.close();
        }
    }

    /// Answers every whole request in `input`.
    fn answer(&mut self, mmds: &SharedMmds) {
        while !self.closing && !self.input.is_empty() {
            let result = http::exchange(&lock(mmds), &self.input);
            match result {
                Exchange::Incomplete => return,
                Exchange::Answered {
                    response,
                    consumed,
                    close,
                } => {
                    self.output.extend(response);
                    self.input.drain(..consumed.min(self.input.len()));
                    self.closing = close;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
