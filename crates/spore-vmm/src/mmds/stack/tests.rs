//! The endpoint driven by a real TCP/IP client (smoltcp, Ethernet medium,
//! as a guest's kernel would be) through frames only.

use serde_json::json;
use smoltcp::iface::{Config, Interface, SocketSet};
use smoltcp::phy::Medium;
use smoltcp::socket::tcp;
use smoltcp::wire::{EthernetAddress, HardwareAddress, IpAddress, IpCidr};

use super::*;
use crate::config::{MmdsConfig, MmdsVersion};
use crate::mmds::Mmds;

struct Guest {
    iface: Interface,
    /// What the guest sends is `to_guest` here, what it gets `from_guest`:
    /// the stack's device seen from the other end.
    wire: Packets,
    sockets: SocketSet<'static>,
    now: i64,
}

const GUEST_MAC: [u8; 6] = [0x06, 0, 0xa, 0, 0, 2];

impl Guest {
    fn new() -> Self {
        let mut wire = Packets::new(Medium::Ethernet);
        let config = Config::new(HardwareAddress::Ethernet(EthernetAddress(GUEST_MAC)));
        let mut iface = Interface::new(config, &mut wire, smoltcp::time::Instant::ZERO);
        iface.update_ip_addrs(|a| {
            let _ = a.push(IpCidr::new(IpAddress::v4(169, 254, 0, 2), 16));
        });
        Self {
            iface,
            wire,
            sockets: SocketSet::new(Vec::new()),
            now: 0,
        }
    }

    /// Moves frames both ways until nothing moves; returns the frames the
    /// guest sent that were not for the MMDS.
    fn pump(&mut self, stack: &mut MmdsStack) -> Vec<Vec<u8>> {
        let mut elsewhere = Vec::new();
        for _ in 0..200 {
            self.now += 5;
            let t = smoltcp::time::Instant::from_millis(self.now);
            self.iface.poll(t, &mut self.wire, &mut self.sockets);
            let mut moved = false;
            while let Some(f) = self.wire.to_guest.pop_front() {
                moved = true;
                if stack.is_mmds_frame(&f) {
                    stack.receive(&f);
                } else {
                    elsewhere.push(f);
                }
            }
            stack.poll();
            while let Some(f) = stack.next_frame() {
                moved = true;
                self.wire.from_guest.push_back(f);
            }
            if !moved && self.wire.from_guest.is_empty() {
                break;
            }
        }
        elsewhere
    }

    /// One HTTP exchange on a new connection: the whole response.
    fn http(&mut self, stack: &mut MmdsStack, port: u16, request: &str) -> String {
        let socket = tcp::Socket::new(
            tcp::SocketBuffer::new(vec![0u8; 65536]),
            tcp::SocketBuffer::new(vec![0u8; 8192]),
        );
        let h = self.sockets.add(socket);
        let remote = (IpAddress::v4(169, 254, 169, 254), 80);
        self.sockets
            .get_mut::<tcp::Socket>(h)
            .connect(self.iface.context(), remote, port)
            .unwrap();
        let mut sent = false;
        let mut got = Vec::new();
        for _ in 0..50 {
            self.pump(stack);
            let s = self.sockets.get_mut::<tcp::Socket>(h);
            if !sent && s.can_send() {
                s.send_slice(request.as_bytes()).unwrap();
                sent = true;
            }
            while s.can_recv() {
                s.recv(|d| {
                    got.extend_from_slice(d);
                    (d.len(), ())
                })
                .unwrap();
            }
            if sent && !s.may_recv() {
                break;
            }
        }
        self.sockets.get_mut::<tcp::Socket>(h).close();
        self.pump(stack);
        self.sockets.remove(h);
        String::from_utf8(got).unwrap()
    }
}

fn stack(version: MmdsVersion) -> MmdsStack {
    let mmds = Mmds::shared();
    {
        let mut m = lock(&mmds);
        m.configure(&MmdsConfig {
            version,
            network_interfaces: vec!["eth0".into()],
            ipv4_address: None,
            imds_compat: false,
        });
        m.put(json!({"latest": {"meta-data": {"instance-id": "i-42"}}}))
            .unwrap();
    }
    MmdsStack::new(DEFAULT_MMDS_IPV4, mmds)
}

#[test]
fn a_tcp_client_reads_metadata_through_frames() {
    let mut s = stack(MmdsVersion::V1);
    let mut g = Guest::new();
    let r = g.http(
        &mut s,
        40000,
        "GET /latest/meta-data/instance-id HTTP/1.0\r\n\r\n",
    );
    assert!(r.starts_with("HTTP/1.0 200"), "{r}");
    assert!(r.ends_with("\r\n\r\ni-42"), "{r}");
    // Many connections one after another: each one's socket is reused.
    for port in 40001..40030 {
        let r = g.http(
            &mut s,
            port,
            "GET /latest HTTP/1.1\r\nConnection: close\r\n\r\n",
        );
        assert!(r.ends_with("\r\n\r\nmeta-data/"), "port {port}: {r}");
    }
}

#[test]
fn v2_session_over_tcp() {
    let mut s = stack(MmdsVersion::V2);
    let mut g = Guest::new();
    let r = g.http(
        &mut s,
        40100,
        "PUT /latest/api/token HTTP/1.1\r\nX-metadata-token-ttl-seconds: 60\r\nConnection: close\r\n\r\n",
    );
    let token = r.split("\r\n\r\n").nth(1).unwrap().to_string();
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    let r = g.http(&mut s, 40101, "GET /latest HTTP/1.0\r\n\r\n");
    assert!(r.starts_with("HTTP/1.0 401"), "{r}");
    let req =
        format!("GET /latest/meta-data/instance-id HTTP/1.0\r\nX-metadata-token: {token}\r\n\r\n");
    let r = g.http(&mut s, 40102, &req);
    assert!(r.ends_with("\r\n\r\ni-42"), "{r}");
}

#[test]
fn only_mmds_frames_are_taken() {
    let s = stack(MmdsVersion::V1);
    let mut arp_other = vec![0xffu8; 6];
    arp_other.extend_from_slice(&GUEST_MAC);
    arp_other.extend_from_slice(&[0x08, 0x06, 0, 1, 8, 0, 6, 4, 0, 1]);
    arp_other.extend_from_slice(&GUEST_MAC);
    arp_other.extend_from_slice(&[169, 254, 0, 2, 0, 0, 0, 0, 0, 0]);
    let mut arp_mmds = arp_other.clone();
    arp_other.extend_from_slice(&[10, 0, 0, 1]);
    arp_mmds.extend_from_slice(&[169, 254, 169, 254]);
    assert!(!s.is_mmds_frame(&arp_other));
    assert!(s.is_mmds_frame(&arp_mmds));
    // Too short to say: not MMDS (and never read out of bounds).
    assert!(!s.is_mmds_frame(&arp_mmds[..20]));
    assert!(!s.is_mmds_frame(&[]));
}

#[test]
fn hostile_frames_are_dropped_without_harm() {
    let mut s = stack(MmdsVersion::V1);
    let mut f = vec![0u8; 12];
    f.extend_from_slice(&[0x08, 0x00]);
    // IPv4 header claiming 60000 bytes in a 40-byte frame, then garbage.
    let mut ip = vec![
        0x45, 0, 0xea, 0x60, 0, 0, 0, 0, 64, 6, 0, 0, 1, 2, 3, 4, 169, 254, 169, 254,
    ];
    ip.extend_from_slice(&[0xff; 20]);
    f.extend_from_slice(&ip);
    assert!(s.is_mmds_frame(&f));
    s.receive(&f);
    // Garbage TCP in a well-formed IPv4 header.
    f[16..18].copy_from_slice(&40u16.to_be_bytes());
    for _ in 0..1000 {
        s.receive(&f);
    }
    s.poll();
    let mut n = 0;
    while s.next_frame().is_some() {
        n += 1;
    }
    assert!(n <= MAX_QUEUED, "{n} frames queued");
}
