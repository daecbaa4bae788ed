//! The network interface and its sockets, and the loop helpers an app
//! needs: [`NetStack::poll`], [`NetStack::wait`] and clone handling.
//!
//! A clone starts with a copy of its source's stack: same MAC, same
//! address, same TCP connections and the same random state (hence the same
//! TCP initial sequence numbers). When the clone generation changes,
//! [`NetStack::poll`] re-reads the MAC and the identity block, rebuilds the
//! interface with a seed drawn from the (reseeded) random source, and
//! replaces every TCP socket with a closed one of the same size, without
//! sending anything: the connections belong to the source.

use core::fmt;

use smoltcp::iface::{Config, Interface, SocketSet};
use smoltcp::socket::{tcp, Socket};
use smoltcp::time::Instant;
use smoltcp::wire::{EthernetAddress, HardwareAddress, IpCidr, Ipv4Address};

use super::config::{self, ConfigError, Ipv4Config};
use crate::virtio::net::VirtioNet;
use crate::virtio::VirtioError;
use crate::{clock, generation, BootInfo};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NetError {
    Device(VirtioError),
    Config(ConfigError),
}

impl fmt::Display for NetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Device(e) => write!(f, "virtio-net: {e}"),
            Self::Config(e) => write!(f, "network settings: {e}"),
        }
    }
}

/// What a clone generation change did to the interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Readdressed {
    pub generation: u64,
    pub mac: [u8; 6],
    pub ipv4: Option<Ipv4Config>,
    /// TCP sockets that were replaced by closed ones.
    pub sockets_reset: usize,
}

pub struct NetStack {
    pub device: VirtioNet,
    pub iface: Interface,
    pub sockets: SocketSet<'static>,
    ipv4: Option<Ipv4Config>,
    generation: u64,
}

/// The stack's clock: microseconds since the runtime started.
pub fn now() -> Instant {
    Instant::from_micros(clock::since_start_us().min(i64::MAX as u64) as i64)
}

/// A seed for smoltcp's generator (TCP initial sequence numbers, ports,
/// IP ids), from the runtime's random source, reseeded in every clone. A
/// VM without virtio-rng falls back on the TSC, which at least differs
/// between a clone and its source by the time they draw it.
fn random_seed() -> u64 {
    crate::random::try_random_u64().unwrap_or_else(|_| clock::rdtsc())
}

fn build_interface(device: &mut VirtioNet, ipv4: Option<Ipv4Config>) -> Interface {
    let mut config = Config::new(HardwareAddress::Ethernet(EthernetAddress(device.mac())));
    config.random_seed = random_seed();
    let mut iface = Interface::new(config, device, now());
    if let Some(ip) = ipv4 {
        let [a, b, c, d] = ip.addr;
        iface.update_ip_addrs(|addrs| {
            // One address fits the interface's fixed list.
            let _ = addrs.push(IpCidr::new(
                Ipv4Address::new(a, b, c, d).into(),
                ip.prefix_len,
            ));
        });
        if let Some([a, b, c, d]) = ip.gateway {
            let _ = iface
                .routes_mut()
                .add_default_ipv4_route(Ipv4Address::new(a, b, c, d));
        }
    }
    iface
}

impl NetStack {
    /// Brings up the first virtio-net device with the command line's
    /// settings (overridden by a valid identity block, as after a clone).
    pub fn new(info: &BootInfo) -> Result<NetStack, NetError> {
        let from_cmdline = config::from_cmdline(crate::cmdline()).map_err(NetError::Config)?;
        let mut device = VirtioNet::new(info).map_err(NetError::Device)?;
        let ipv4 = config::apply_identity(from_cmdline, &config::read_identity(), device.mac());
        let iface = build_interface(&mut device, ipv4);
        Ok(NetStack {
            device,
            iface,
            sockets: SocketSet::new(alloc::vec::Vec::new()),
            ipv4,
            generation: generation(),
        })
    }

    pub fn mac(&self) -> [u8; 6] {
        self.device.mac()
    }

    pub fn ipv4(&self) -> Option<Ipv4Config> {
        self.ipv4
    }

    /// Adds a TCP socket with buffers of these sizes.
    pub fn add_tcp_socket(&mut self, rx: usize, tx: usize) -> smoltcp::iface::SocketHandle {
        self.sockets.add(new_tcp_socket(rx, tx))
    }

    /// Re-addresses the interface if the VM was cloned since the last
    /// call; cheap otherwise (one memory read).
    pub fn check_generation(&mut self) -> Option<Readdressed> {
        let now_generation = generation();
        if now_generation == self.generation {
            return None;
        }
        self.generation = now_generation;
        let mac = self.device.reread_mac();
        self.ipv4 = config::apply_identity(self.ipv4, &config::read_identity(), mac);
        self.iface = build_interface(&mut self.device, self.ipv4);
        let mut sockets_reset = 0;
        for (_, socket) in self.sockets.iter_mut() {
            #[allow(irrefutable_let_patterns)]
            if let Socket::Tcp(tcp) = socket {
                // A fresh socket, not `abort()`: an RST from here would
                // reset the source's connections.
                *tcp = new_tcp_socket(tcp.recv_capacity(), tcp.send_capacity());
                sockets_reset += 1;
            }
        }
        Some(Readdressed {
            generation: now_generation,
            mac,
            ipv4: self.ipv4,
            sockets_reset,
        })
    }

    /// Moves frames between the device and the sockets, then sends the
    /// notifications owed. Returns true if a socket's state may have
    /// changed.
    pub fn poll(&mut self) -> bool {
        let changed = self.iface.poll(now(), &mut self.device, &mut self.sockets);
        self.device.flush();
        changed == smoltcp::iface::PollResult::SocketStateChanged
    }

    /// Sleeps in the signal port's `wait` until the device has work, a
    /// stack timer (retransmission, delayed ACK) is due, or `max_us`
    /// passed. Returns at once if a frame is already waiting.
    pub fn wait(&mut self, max_us: u32) {
        self.device.flush();
        if self.device.has_frame() {
            return;
        }
        let delay_us = self
            .iface
            .poll_delay(now(), &self.sockets)
            .map_or(u64::MAX, |d| d.total_micros());
        let us = delay_us.min(max_us as u64) as u32;
        if us > 0 {
            crate::signal::wait(us);
        }
    }
}

fn new_tcp_socket(rx: usize, tx: usize) -> tcp::Socket<'static> {
    tcp::Socket::new(
        tcp::SocketBuffer::new(alloc::vec![0u8; rx]),
        tcp::SocketBuffer::new(alloc::vec![0u8; tx]),
    )
}
