//! A sandbox guest's network, from its kernel command line (`spore serve`
//! puts it there for a template with a network):
//!
//! ```text
//! spore.ip=A.B.C.D/P [spore.gw=A.B.C.D] [spore.dns=A.B.C.D,...] [spore.if=NAME]
//! ```
//!
//! The interface (default `eth0`) gets the address and comes up, the
//! gateway becomes the default route, and the name servers are written to
//! `/etc/resolv.conf`. Done with the kernel's interface and route ioctls:
//! the images need no `ip` (a sandbox image is whatever its template
//! installs), and a netlink crate would be a dependency for three calls.

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

use super::config::cmdline_value;
use crate::ioctl::request;

/// What the command line asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetConfig {
    pub iface: String,
    pub addr: Ipv4Addr,
    pub prefix: u8,
    pub gateway: Option<Ipv4Addr>,
    pub dns: Vec<Ipv4Addr>,
}

/// The network the command line names; `Ok(None)` without `spore.ip`.
pub fn from_cmdline(cmdline: &str) -> Result<Option<NetConfig>, String> {
    let Some(ip) = cmdline_value(cmdline, "spore.ip") else {
        return Ok(None);
    };
    let bad = |what: &str, v: &str| format!("{what}={v:?}: not what spore-agent understands");
    let (addr, prefix) = ip.split_once('/').ok_or_else(|| bad("spore.ip", ip))?;
    let addr: Ipv4Addr = addr.parse().map_err(|_| bad("spore.ip", ip))?;
    let prefix: u8 = prefix
        .parse()
        .ok()
        .filter(|p| (1..=32).contains(p))
        .ok_or_else(|| bad("spore.ip", ip))?;
    let gateway = cmdline_value(cmdline, "spore.gw")
        .map(|g| g.parse().map_err(|_| bad("spore.gw", g)))
        .transpose()?;
    let dns = match cmdline_value(cmdline, "spore.dns") {
        Some(list) => list
            .split(',')
            .map(|a| a.parse().map_err(|_| bad("spore.dns", list)))
            .collect::<Result<Vec<_>, _>>()?,
        None => Vec::new(),
    };
    let iface = cmdline_value(cmdline, "spore.if").unwrap_or("eth0");
    if iface.is_empty() || iface.len() >= libc::IFNAMSIZ {
        return Err(bad("spore.if", iface));
    }
    Ok(Some(NetConfig {
        iface: iface.to_string(),
        addr,
        prefix,
        gateway,
        dns,
    }))
}

/// Configures the interface, the default route and `/etc/resolv.conf`.
pub fn apply(cfg: &NetConfig) -> io::Result<()> {
    // SAFETY: socket(2); the descriptor is owned at once.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor nobody else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let mask = Ipv4Addr::from(u32::MAX << (32 - u32::from(cfg.prefix)));
    set_if_addr(&sock, &cfg.iface, libc::SIOCSIFADDR, cfg.addr)?;
    set_if_addr(&sock, &cfg.iface, libc::SIOCSIFNETMASK, mask)?;
    bring_up(&sock, &cfg.iface)?;
    if let Some(gw) = cfg.gateway {
        add_default_route(&sock, gw)?;
    }
    if !cfg.dns.is_empty() {
        write_resolv_conf(Path::new("/etc/resolv.conf"), &cfg.dns)?;
    }
    Ok(())
}

/// AF_INET in `sin_family`'s type.
#[allow(clippy::cast_possible_truncation, reason = "AF_INET is 2")]
const INET_FAMILY: libc::sa_family_t = libc::AF_INET as libc::sa_family_t;

/// IFF_UP in `ifr_flags`' type.
#[allow(clippy::cast_possible_truncation, reason = "IFF_UP is 1")]
const IF_UP: libc::c_short = libc::IFF_UP as libc::c_short;

fn sockaddr_of(addr: Ipv4Addr) -> libc::sockaddr {
    let sin = libc::sockaddr_in {
        sin_family: INET_FAMILY,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from(addr).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: sockaddr_in and sockaddr are both 16 bytes of plain data; the
    // kernel reads an AF_INET sockaddr as a sockaddr_in.
    unsafe { std::mem::transmute::<libc::sockaddr_in, libc::sockaddr>(sin) }
}

fn ifreq_for(iface: &str) -> libc::ifreq {
    // SAFETY: ifreq is plain data; zero is a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    // The name was checked shorter than IFNAMSIZ: a NUL stays at its end.
    for (dst, src) in ifr.ifr_name.iter_mut().zip(iface.bytes()) {
        *dst = src as libc::c_char;
    }
    ifr
}

fn set_if_addr(sock: &OwnedFd, iface: &str, op: libc::c_ulong, addr: Ipv4Addr) -> io::Result<()> {
    let mut ifr = ifreq_for(iface);
    ifr.ifr_ifru.ifru_addr = sockaddr_of(addr);
    // SAFETY: ifr is a valid ifreq naming the interface; the kernel reads it.
    if unsafe { libc::ioctl(sock.as_raw_fd(), request(op), &ifr) } < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("{iface}: {addr}: {e}")));
    }
    Ok(())
}

fn bring_up(sock: &OwnedFd, iface: &str) -> io::Result<()> {
    let mut ifr = ifreq_for(iface);
    // SAFETY: ifr names the interface; the kernel fills ifru_flags.
    if unsafe { libc::ioctl(sock.as_raw_fd(), request(libc::SIOCGIFFLAGS), &mut ifr) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: SIOCGIFFLAGS set the flags member of the union.
    unsafe {
        ifr.ifr_ifru.ifru_flags |= IF_UP;
    }
    // SAFETY: as above; the kernel only reads ifr.
    if unsafe { libc::ioctl(sock.as_raw_fd(), request(libc::SIOCSIFFLAGS), &ifr) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn add_default_route(sock: &OwnedFd, gateway: Ipv4Addr) -> io::Result<()> {
    // SAFETY: rtentry is plain data (a null rt_dev lets the kernel pick the
    // interface the gateway is on); zero is a valid value.
    let mut rt: libc::rtentry = unsafe { std::mem::zeroed() };
    rt.rt_dst = sockaddr_of(Ipv4Addr::UNSPECIFIED);
    rt.rt_genmask = sockaddr_of(Ipv4Addr::UNSPECIFIED);
    rt.rt_gateway = sockaddr_of(gateway);
    rt.rt_flags = libc::RTF_UP | libc::RTF_GATEWAY;
    // SAFETY: rt is a valid rtentry; the kernel only reads it.
    if unsafe { libc::ioctl(sock.as_raw_fd(), request(libc::SIOCADDRT), &rt) } < 0 {
        let e = io::Error::last_os_error();
        // A clone or restored guest keeps its route: that is fine.
        if e.raw_os_error() != Some(libc::EEXIST) {
            return Err(io::Error::new(
                e.kind(),
                format!("default route via {gateway}: {e}"),
            ));
        }
    }
    Ok(())
}

/// `nameserver` lines, written atomically (a temporary file renamed over
/// the old one, which may have been a dangling symlink).
fn write_resolv_conf(path: &Path, servers: &[Ipv4Addr]) -> io::Result<()> {
    let mut text = String::from("# written by spore-agent from the kernel command line\n");
    for s in servers {
        text.push_str(&format!("nameserver {s}\n"));
    }
    let tmp = path.with_extension("spore-tmp");
    std::fs::write(&tmp, text)?;
    std::fs::File::open(&tmp)?.sync_all()?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_names_the_network() {
        let cfg = from_cmdline(
            "console=ttyS0 spore.mode=sandbox spore.ip=172.16.0.2/30 spore.gw=172.16.0.1 \
             spore.dns=10.0.2.3,1.1.1.1 quiet",
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            cfg,
            NetConfig {
                iface: "eth0".into(),
                addr: Ipv4Addr::new(172, 16, 0, 2),
                prefix: 30,
                gateway: Some(Ipv4Addr::new(172, 16, 0, 1)),
                dns: vec![Ipv4Addr::new(10, 0, 2, 3), Ipv4Addr::new(1, 1, 1, 1)],
            }
        );
        assert_eq!(from_cmdline("spore.mode=sandbox").unwrap(), None);
        for bad in [
            "spore.ip=172.16.0.2",
            "spore.ip=172.16.0.2/33",
            "spore.ip=x/24",
            "spore.ip=10.0.0.2/24 spore.gw=10.0.0",
            "spore.ip=10.0.0.2/24 spore.dns=1.1.1.1,",
            "spore.ip=10.0.0.2/24 spore.if=averyveryverylongname",
        ] {
            assert!(from_cmdline(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn addresses_reach_the_kernel_in_network_order() {
        let sa = sockaddr_of(Ipv4Addr::new(172, 16, 0, 2));
        assert_eq!(i32::from(sa.sa_family), libc::AF_INET);
        assert_eq!(&sa.sa_data[2..6], &[172u8 as libc::c_char, 16, 0, 2]);
    }

    #[test]
    fn resolv_conf_is_replaced_whole() {
        let dir = std::env::temp_dir().join(format!("spore-resolv-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("resolv.conf");
        std::fs::write(&path, "nameserver 127.0.0.53\n").unwrap();
        write_resolv_conf(&path, &[Ipv4Addr::new(10, 0, 2, 3)]).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.ends_with("nameserver 10.0.2.3\n"), "{text}");
        assert!(!text.contains("127.0.0.53"));
        assert!(!path.with_extension("spore-tmp").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
