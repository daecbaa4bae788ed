//! A clone's new network identity, as the generation notice carries it
//! (`spore_abi::signal`, "Clone generation"): after `generation N`, one line
//! per changed interface, in the VM's `network-interfaces` order:
//!
//! ```text
//! mac IFACE_ID XX:XX:XX:XX:XX:XX
//! ipv4 IFACE_ID A.B.C.D/P GATEWAY      (GATEWAY is `-` for none)
//! ```
//!
//! `spore-reseed` applies them with busybox `ip` (it is in every spore
//! initramfs): for a new MAC, `ip link set dev IF down`, `... address MAC`,
//! `... up` (taking the link down drops the routes through it, so the
//! default route it had is put back unless an `ipv4` line replaces it); for
//! an address, `ip addr flush dev IF`, `ip addr add A.B.C.D/P dev IF`,
//! `ip link set dev IF up` and, with a gateway,
//! `ip route replace default via GATEWAY dev IF`.
//!
//! Which guest interface an `IFACE_ID` means: the interface of that name
//! (`eth0` is both Firecracker's usual id and Linux's first name); else,
//! when the guest has exactly one interface besides `lo`, that one.

use std::fmt;
use std::net::Ipv4Addr;

/// What a notice says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Notice {
    /// `generation N` (the first line).
    pub generation: Option<u64>,
    /// `time SECONDS.NANOSECONDS`: the host's wall clock (`CLOCK_REALTIME`)
    /// when the notice was made; a restored or cloned guest's clock is the
    /// snapshot's, so the guest steps its own to it.
    pub time: Option<(i64, u32)>,
    /// The `mac`/`ipv4` lines, merged per interface, in first-seen order.
    pub interfaces: Vec<IfaceChange>,
    /// Lines that were neither (logged, never applied).
    pub unknown: Vec<String>,
}

/// The new identity of one interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IfaceChange {
    pub iface_id: String,
    pub mac: Option<Mac>,
    pub ipv4: Option<Ipv4Config>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mac(pub [u8; 6]);

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

impl std::str::FromStr for Mac {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let mut out = [0u8; 6];
        let mut parts = s.split(':');
        for b in &mut out {
            let p = parts.next().ok_or_else(|| format!("bad MAC '{s}'"))?;
            if p.len() != 2 {
                return Err(format!("bad MAC '{s}'"));
            }
            *b = u8::from_str_radix(p, 16).map_err(|_| format!("bad MAC '{s}'"))?;
        }
        if parts.next().is_some() {
            return Err(format!("bad MAC '{s}'"));
        }
        Ok(Mac(out))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ipv4Config {
    pub addr: Ipv4Addr,
    pub prefix_len: u8,
    pub gateway: Option<Ipv4Addr>,
}

impl fmt::Display for Ipv4Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix_len)?;
        match self.gateway {
            Some(g) => write!(f, " via {g}"),
            None => write!(f, " (no gateway)"),
        }
    }
}

fn parse_ipv4(cidr: &str, gw: &str) -> Result<Ipv4Config, String> {
    let (a, p) = cidr
        .split_once('/')
        .ok_or_else(|| format!("bad address '{cidr}' (want A.B.C.D/P)"))?;
    let addr: Ipv4Addr = a.parse().map_err(|_| format!("bad address '{cidr}'"))?;
    let prefix_len: u8 = p.parse().map_err(|_| format!("bad prefix in '{cidr}'"))?;
    if prefix_len > 32 {
        return Err(format!("bad prefix in '{cidr}'"));
    }
    let gateway = if gw == "-" {
        None
    } else {
        Some(gw.parse().map_err(|_| format!("bad gateway '{gw}'"))?)
    };
    Ok(Ipv4Config {
        addr,
        prefix_len,
        gateway,
    })
}

/// Parses a whole notice. A malformed `mac`/`ipv4` line is an error (the
/// VMM wrote it; applying half of an identity would be worse than none).
pub fn parse(msg: &[u8]) -> Result<Notice, String> {
    let text = std::str::from_utf8(msg).map_err(|_| "notice is not UTF-8".to_string())?;
    let mut n = Notice::default();
    for (i, line) in text.lines().map(str::trim).enumerate() {
        if line.is_empty() {
            continue;
        }
        let words: Vec<&str> = line.split_ascii_whitespace().collect();
        match words.as_slice() {
            ["generation", g] if i == 0 => {
                n.generation = Some(g.parse().map_err(|_| format!("bad generation '{g}'"))?);
            }
            ["time", t] => n.time = Some(parse_time(t)?),
            ["mac", id, mac] => n.entry(id).mac = Some(mac.parse()?),
            ["ipv4", id, cidr, gw] => n.entry(id).ipv4 = Some(parse_ipv4(cidr, gw)?),
            ["mac", ..] | ["ipv4", ..] => return Err(format!("malformed line '{line}'")),
            _ => n.unknown.push(line.to_string()),
        }
    }
    Ok(n)
}

/// `SECONDS.NANOSECONDS` (nine digits after the point) of a `time` line.
fn parse_time(t: &str) -> Result<(i64, u32), String> {
    let bad = || format!("bad time '{t}'");
    let (secs, nanos) = t.split_once('.').ok_or_else(bad)?;
    if nanos.len() != 9 {
        return Err(bad());
    }
    let secs: i64 = secs.parse().map_err(|_| bad())?;
    let nanos: u32 = nanos.parse().map_err(|_| bad())?;
    if secs < 0 {
        return Err(bad());
    }
    Ok((secs, nanos))
}

impl Notice {
    fn entry(&mut self, id: &str) -> &mut IfaceChange {
        if let Some(i) = self.interfaces.iter().position(|c| c.iface_id == id) {
            return &mut self.interfaces[i];
        }
        self.interfaces.push(IfaceChange {
            iface_id: id.to_string(),
            mac: None,
            ipv4: None,
        });
        self.interfaces.last_mut().unwrap()
    }
}

/// The guest interface an `IFACE_ID` names, given the guest's interface
/// names (`/sys/class/net`): the one of that name, else the only one that
/// is not `lo`.
pub fn resolve_iface(iface_id: &str, guest_ifaces: &[String]) -> Option<String> {
    if guest_ifaces.iter().any(|n| n == iface_id) {
        return Some(iface_id.to_string());
    }
    let mut others = guest_ifaces.iter().filter(|n| n.as_str() != "lo");
    match (others.next(), others.next()) {
        (Some(only), None) => Some(only.clone()),
        _ => None,
    }
}

/// The `ip` commands (argument lists) that apply `change` to guest
/// interface `dev`. `old_gateway` is the default route through `dev` before
/// the change (restored after a MAC change when no `ipv4` line says
/// otherwise).
pub fn commands(
    change: &IfaceChange,
    dev: &str,
    old_gateway: Option<Ipv4Addr>,
) -> Vec<Vec<String>> {
    let c = |args: &[&str]| args.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let mut out = Vec::new();
    if let Some(mac) = change.mac {
        let mac = mac.to_string();
        out.push(c(&["link", "set", "dev", dev, "down"]));
        out.push(c(&["link", "set", "dev", dev, "address", &mac]));
        out.push(c(&["link", "set", "dev", dev, "up"]));
    }
    match change.ipv4 {
        Some(ip) => {
            let cidr = format!("{}/{}", ip.addr, ip.prefix_len);
            out.push(c(&["addr", "flush", "dev", dev]));
            out.push(c(&["addr", "add", &cidr, "dev", dev]));
            out.push(c(&["link", "set", "dev", dev, "up"]));
            if let Some(g) = ip.gateway {
                out.push(c(&[
                    "route",
                    "replace",
                    "default",
                    "via",
                    &g.to_string(),
                    "dev",
                    dev,
                ]));
            }
        }
        None => {
            if let (Some(_), Some(g)) = (change.mac, old_gateway) {
                out.push(c(&[
                    "route",
                    "replace",
                    "default",
                    "via",
                    &g.to_string(),
                    "dev",
                    dev,
                ]));
            }
        }
    }
    out
}

/// The gateway of the default route in `ip -4 route show` output, if one
/// goes through `dev`.
pub fn default_gateway(routes: &str, dev: &str) -> Option<Ipv4Addr> {
    routes.lines().find_map(|l| {
        let w: Vec<&str> = l.split_ascii_whitespace().collect();
        let via = w.iter().position(|x| *x == "via")?;
        let on = w.iter().position(|x| *x == "dev")?;
        (w.first() == Some(&"default") && w.get(on + 1) == Some(&dev))
            .then(|| w.get(via + 1)?.parse().ok())
            .flatten()
    })
}

/// The guest's interface names (`/sys/class/net`), sorted.
pub fn guest_interfaces() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/sys/class/net")
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn run_ip(args: &[String]) -> Result<String, String> {
    let out = std::process::Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if !out.status.success() {
        return Err(format!(
            "ip {}: {} {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Applies every interface change of `notice` with `ip`; one line per
/// interface saying what was done, or why not.
pub fn apply(notice: &Notice) -> Vec<Result<String, String>> {
    let names = guest_interfaces();
    notice
        .interfaces
        .iter()
        .map(|change| {
            let dev = resolve_iface(&change.iface_id, &names).ok_or_else(|| {
                format!(
                    "{}: no such guest interface (have {})",
                    change.iface_id,
                    names.join(", ")
                )
            })?;
            let old_gw = run_ip(&["-4".into(), "route".into(), "show".into()])
                .ok()
                .and_then(|r| default_gateway(&r, &dev));
            for cmd in commands(change, &dev, old_gw) {
                run_ip(&cmd).map_err(|e| format!("{}: {e}", change.iface_id))?;
            }
            let mut what = format!("{} ({dev}):", change.iface_id);
            if let Some(m) = change.mac {
                what += &format!(" mac {m}");
            }
            if let Some(ip) = change.ipv4 {
                what += &format!(" ipv4 {ip}");
            }
            Ok(what + " applied")
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(a: &str) -> Ipv4Addr {
        a.parse().unwrap()
    }

    #[test]
    fn generation_only() {
        let n = parse(b"generation 3\n").unwrap();
        assert_eq!(n.generation, Some(3));
        assert!(n.interfaces.is_empty() && n.unknown.is_empty());
    }

    #[test]
    fn time_line() {
        let n = parse(b"generation 2\ntime 1795000000.000000042\n").unwrap();
        assert_eq!(n.time, Some((1_795_000_000, 42)));
        assert!(n.unknown.is_empty());
        for bad in [
            "time 1795000000",
            "time 1795000000.42",
            "time -1.000000000",
            "time x.000000000",
        ] {
            assert!(
                parse(format!("generation 2\n{bad}\n").as_bytes()).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn mac_and_ipv4_lines() {
        let n = parse(
            b"generation 1\nmac eth0 02:FC:00:00:00:05\nipv4 eth0 10.0.0.3/24 10.0.0.1\nmac net1 02:fc:00:00:01:05\nipv4 net1 192.168.1.9/16 -\n",
        )
        .unwrap();
        assert_eq!(n.generation, Some(1));
        assert_eq!(n.interfaces.len(), 2);
        let e = &n.interfaces[0];
        assert_eq!(e.iface_id, "eth0");
        assert_eq!(e.mac, Some(Mac([2, 0xfc, 0, 0, 0, 5])));
        assert_eq!(
            e.ipv4,
            Some(Ipv4Config {
                addr: ip("10.0.0.3"),
                prefix_len: 24,
                gateway: Some(ip("10.0.0.1"))
            })
        );
        assert_eq!(n.interfaces[1].ipv4.unwrap().gateway, None);
        assert_eq!(n.interfaces[1].ipv4.unwrap().prefix_len, 16);
        assert_eq!(e.mac.unwrap().to_string(), "02:fc:00:00:00:05");
    }

    #[test]
    fn malformed_lines_are_errors() {
        for bad in [
            &b"generation 1\nmac eth0 02:fc:00:00:00\n"[..],
            b"generation 1\nmac eth0 02:fc:00:00:00:05:06\n",
            b"generation 1\nmac eth0 2:fc:00:00:00:05\n",
            b"generation 1\nmac eth0 zz:fc:00:00:00:05\n",
            b"generation 1\nmac eth0\n",
            b"generation 1\nipv4 eth0 10.0.0.3 10.0.0.1\n",
            b"generation 1\nipv4 eth0 10.0.0.3/33 10.0.0.1\n",
            b"generation 1\nipv4 eth0 10.0.0.300/24 10.0.0.1\n",
            b"generation 1\nipv4 eth0 10.0.0.3/24 gw\n",
            b"generation 1\nipv4 eth0 10.0.0.3/24\n",
            b"generation x\n",
            b"\xff",
        ] {
            assert!(parse(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
        // Unknown lines are kept aside, not applied, not fatal.
        let n = parse(b"generation 2\nfuture eth0 thing\n").unwrap();
        assert_eq!(n.unknown, vec!["future eth0 thing".to_string()]);
        // generation only counts as the first line.
        assert!(parse(b"mac eth0 02:fc:00:00:00:05\ngeneration 2\n")
            .unwrap()
            .generation
            .is_none());
        assert_eq!(parse(b"").unwrap(), Notice::default());
    }

    #[test]
    fn interface_resolution() {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            resolve_iface("eth0", &names(&["lo", "eth0"])),
            Some("eth0".into())
        );
        assert_eq!(
            resolve_iface("net1", &names(&["lo", "eth0"])),
            Some("eth0".into())
        );
        assert_eq!(resolve_iface("net1", &names(&["lo", "eth0", "eth1"])), None);
        assert_eq!(
            resolve_iface("eth1", &names(&["lo", "eth0", "eth1"])),
            Some("eth1".into())
        );
        assert_eq!(resolve_iface("eth0", &names(&["lo"])), None);
    }

    #[test]
    fn ip_commands() {
        let n =
            parse(b"generation 1\nmac eth0 02:fc:00:00:00:05\nipv4 eth0 10.0.0.3/24 10.0.0.1\n")
                .unwrap();
        let cmds = commands(&n.interfaces[0], "eth0", Some(ip("10.9.9.9")));
        let s: Vec<String> = cmds.iter().map(|c| c.join(" ")).collect();
        assert_eq!(
            s,
            [
                "link set dev eth0 down",
                "link set dev eth0 address 02:fc:00:00:00:05",
                "link set dev eth0 up",
                "addr flush dev eth0",
                "addr add 10.0.0.3/24 dev eth0",
                "link set dev eth0 up",
                "route replace default via 10.0.0.1 dev eth0",
            ]
        );
        // A MAC alone: the old default route comes back after the link bounce.
        let n = parse(b"generation 1\nmac eth0 02:fc:00:00:00:05\n").unwrap();
        let s: Vec<String> = commands(&n.interfaces[0], "eth0", Some(ip("10.0.0.1")))
            .iter()
            .map(|c| c.join(" "))
            .collect();
        assert_eq!(
            s.last().unwrap(),
            "route replace default via 10.0.0.1 dev eth0"
        );
        assert_eq!(s.len(), 4);
        assert_eq!(commands(&n.interfaces[0], "eth0", None).len(), 3);
        // An address without a gateway adds no route.
        let n = parse(b"generation 1\nipv4 eth0 10.0.0.3/24 -\n").unwrap();
        let s: Vec<String> = commands(&n.interfaces[0], "eth0", Some(ip("10.0.0.1")))
            .iter()
            .map(|c| c.join(" "))
            .collect();
        assert_eq!(
            s,
            [
                "addr flush dev eth0",
                "addr add 10.0.0.3/24 dev eth0",
                "link set dev eth0 up"
            ]
        );
    }

    #[test]
    fn default_gateway_of_route_output() {
        let routes =
            "default via 10.0.0.1 dev eth0 \n10.0.0.0/24 dev eth0 scope link  src 10.0.0.2 \n";
        assert_eq!(default_gateway(routes, "eth0"), Some(ip("10.0.0.1")));
        assert_eq!(default_gateway(routes, "eth1"), None);
        assert_eq!(
            default_gateway("10.0.0.0/24 dev eth0 scope link\n", "eth0"),
            None
        );
        assert_eq!(default_gateway("", "eth0"), None);
    }
}
