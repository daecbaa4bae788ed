//! IPv4 settings: from the command line (`ip=A.B.C.D/P gw=A.B.C.D`), and
//! from the identity block a clone's VMM writes ([`NetIdentity`]).
//! Pure functions, so the host tests run them.

use core::fmt;

use spore_abi::net::{NetIdentity, NET_IDENTITY_ADDR};

/// An interface's IPv4 address, prefix and default gateway.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ipv4Config {
    pub addr: [u8; 4],
    pub prefix_len: u8,
    pub gateway: Option<[u8; 4]>,
}

/// Why the command line's network settings were refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigError {
    BadAddress,
    BadGateway,
    /// `gw=` without `ip=`.
    GatewayWithoutAddress,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::BadAddress => write!(f, "ip= wants A.B.C.D/P (prefix 0..=32)"),
            Self::BadGateway => write!(f, "gw= wants A.B.C.D"),
            Self::GatewayWithoutAddress => write!(f, "gw= needs ip="),
        }
    }
}

/// Dotted-quad `A.B.C.D`, each part a decimal 0..=255 without sign.
pub fn parse_ipv4(s: &str) -> Option<[u8; 4]> {
    let mut out = [0u8; 4];
    let mut parts = s.split('.');
    for byte in out.iter_mut() {
        let p = parts.next()?;
        if p.is_empty() || p.len() > 3 || !p.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        *byte = p.parse().ok()?;
    }
    parts.next().is_none().then_some(out)
}

/// `A.B.C.D/P`; a bare address means /24.
pub fn parse_cidr(s: &str) -> Option<([u8; 4], u8)> {
    let (addr, prefix) = match s.split_once('/') {
        Some((a, p)) => {
            if p.is_empty() || p.len() > 2 || !p.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            (a, p.parse().ok().filter(|&p: &u8| p <= 32)?)
        }
        None => (s, 24),
    };
    Some((parse_ipv4(addr)?, prefix))
}

/// The settings given by `ip=` and `gw=` in `cmdline`; None without `ip=`.
pub fn from_cmdline(cmdline: &str) -> Result<Option<Ipv4Config>, ConfigError> {
    let ip = crate::cmdline::find_arg(cmdline, "ip");
    let gw = crate::cmdline::find_arg(cmdline, "gw");
    let gateway = match gw {
        Some(g) => Some(parse_ipv4(g).ok_or(ConfigError::BadGateway)?),
        None => None,
    };
    let Some(ip) = ip else {
        return match gateway {
            Some(_) => Err(ConfigError::GatewayWithoutAddress),
            None => Ok(None),
        };
    };
    let (addr, prefix_len) = parse_cidr(ip).ok_or(ConfigError::BadAddress)?;
    Ok(Some(Ipv4Config {
        addr,
        prefix_len,
        gateway,
    }))
}

/// The settings after a clone generation change: the identity block wins
/// when it is valid, for interface 0, and written for the MAC the device
/// now has (or names no MAC). A block left over from an earlier clone (an
/// older MAC) is ignored, and so is an all-zero one (a booted VM): the
/// interface keeps `current`.
pub fn apply_identity(
    current: Option<Ipv4Config>,
    identity: &NetIdentity,
    device_mac: [u8; 6],
) -> Option<Ipv4Config> {
    let mac_matches = identity.mac == [0; 6] || identity.mac == device_mac;
    if !identity.is_valid() || identity.iface != 0 || !mac_matches {
        return current;
    }
    Some(Ipv4Config {
        addr: identity.ipv4,
        prefix_len: identity.prefix_len,
        gateway: (identity.gateway != [0; 4]).then_some(identity.gateway),
    })
}

/// The identity block the VMM writes for a clone (zeros in a booted VM).
#[cfg(not(test))]
pub fn read_identity() -> NetIdentity {
    // SAFETY: the boot protocol identity-maps the boot-info page and
    // reserves these 32 bytes (8-aligned, below the generation word) for
    // the block; the VMM writes it while the guest is paused, hence the
    // volatile read.
    unsafe { core::ptr::read_volatile(NET_IDENTITY_ADDR as *const NetIdentity) }
}

/// Host tests have no boot-info page.
#[cfg(test)]
pub fn read_identity() -> NetIdentity {
    let _ = NET_IDENTITY_ADDR;
    NetIdentity::default()
}

/// Writes `addr` as `A.B.C.D`.
pub struct DisplayIpv4(pub [u8; 4]);

impl fmt::Display for DisplayIpv4 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d] = self.0;
        write!(f, "{a}.{b}.{c}.{d}")
    }
}

/// Writes a MAC as `aa:bb:cc:dd:ee:ff`.
pub struct DisplayMac(pub [u8; 6]);

impl fmt::Display for DisplayMac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

#[cfg(test)]
mod tests {
    use spore_abi::net::NET_IDENTITY_MAGIC;

    use super::*;

    #[test]
    fn parses_addresses() {
        assert_eq!(parse_ipv4("10.77.0.2"), Some([10, 77, 0, 2]));
        assert_eq!(parse_ipv4("255.255.255.255"), Some([255; 4]));
        for bad in [
            "",
            "1.2.3",
            "1.2.3.4.5",
            "256.1.1.1",
            "1..2.3",
            "+1.2.3.4",
            "1.2.3.4 ",
            "a.b.c.d",
            "0001.2.3.4",
        ] {
            assert_eq!(parse_ipv4(bad), None, "{bad:?}");
        }
        assert_eq!(parse_cidr("10.0.0.1/8"), Some(([10, 0, 0, 1], 8)));
        assert_eq!(parse_cidr("10.0.0.1/32"), Some(([10, 0, 0, 1], 32)));
        assert_eq!(parse_cidr("10.0.0.1"), Some(([10, 0, 0, 1], 24)));
        for bad in [
            "10.0.0.1/33",
            "10.0.0.1/",
            "10.0.0.1/-1",
            "10.0.0.1/999",
            "/24",
        ] {
            assert_eq!(parse_cidr(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn reads_the_command_line() {
        assert_eq!(
            from_cmdline("port=80 ip=10.77.0.2/24 gw=10.77.0.1"),
            Ok(Some(Ipv4Config {
                addr: [10, 77, 0, 2],
                prefix_len: 24,
                gateway: Some([10, 77, 0, 1]),
            }))
        );
        assert_eq!(
            from_cmdline("ip=192.168.1.9/16"),
            Ok(Some(Ipv4Config {
                addr: [192, 168, 1, 9],
                prefix_len: 16,
                gateway: None,
            }))
        );
        assert_eq!(from_cmdline("port=80"), Ok(None));
        assert_eq!(from_cmdline("ip=1.2.3"), Err(ConfigError::BadAddress));
        assert_eq!(
            from_cmdline("ip=1.2.3.4 gw=x"),
            Err(ConfigError::BadGateway)
        );
        assert_eq!(
            from_cmdline("gw=1.2.3.4"),
            Err(ConfigError::GatewayWithoutAddress)
        );
    }

    fn identity(mac: [u8; 6]) -> NetIdentity {
        NetIdentity {
            magic: NET_IDENTITY_MAGIC,
            iface: 0,
            ipv4: [10, 77, 0, 9],
            prefix_len: 24,
            gateway: [10, 77, 0, 1],
            mac,
            ..NetIdentity::default()
        }
    }

    #[test]
    fn identity_block_overrides_the_command_line() {
        let mac = [2, 0, 0, 0, 0, 9];
        let cmdline = Some(Ipv4Config {
            addr: [10, 77, 0, 2],
            prefix_len: 24,
            gateway: None,
        });
        let new = apply_identity(cmdline, &identity(mac), mac).unwrap();
        assert_eq!(new.addr, [10, 77, 0, 9]);
        assert_eq!(new.gateway, Some([10, 77, 0, 1]));
        // No gateway in the block means none.
        let mut id = identity([0; 6]);
        id.gateway = [0; 4];
        assert_eq!(apply_identity(cmdline, &id, mac).unwrap().gateway, None);
        // And it gives an address to a VM booted without one.
        assert!(apply_identity(None, &identity(mac), mac).is_some());
    }

    #[test]
    fn invalid_or_foreign_blocks_keep_the_address() {
        let mac = [2, 0, 0, 0, 0, 9];
        let current = Some(Ipv4Config {
            addr: [10, 77, 0, 2],
            prefix_len: 24,
            gateway: None,
        });
        assert_eq!(
            apply_identity(current, &NetIdentity::default(), mac),
            current
        );
        let mut id = identity(mac);
        id.prefix_len = 33;
        assert_eq!(apply_identity(current, &id, mac), current);
        let mut id = identity(mac);
        id.iface = 1;
        assert_eq!(apply_identity(current, &id, mac), current);
        let mut id = identity(mac);
        id.magic ^= 1;
        assert_eq!(apply_identity(current, &id, mac), current);
        // Left over from a clone whose MAC was different.
        assert_eq!(
            apply_identity(current, &identity([2, 0, 0, 0, 0, 7]), mac),
            current
        );
    }

    #[test]
    fn displays() {
        assert_eq!(DisplayIpv4([10, 77, 0, 2]).to_string(), "10.77.0.2");
        assert_eq!(
            DisplayMac([0x52, 0x54, 0, 0xab, 1, 0xff]).to_string(),
            "52:54:00:ab:01:ff"
        );
    }
}
