//! The network of a function that asks for it (`SporeNetwork.Enabled`):
//! every VMM process of such a function (a cold boot, a restore, each clone
//! of the zygote) runs in a network namespace of its own, where
//!
//! - a tap `tap0` holds the guest's gateway address [`GATEWAY`]`/30` (and
//!   the same MAC address everywhere); the guest is [`GUEST_ADDR`] in every
//!   namespace (the same address everywhere, which is what lets a clone keep
//!   its source's address and a snapshot reopen `tap0` by name);
//! - a veth pair joins it to the host: one /30 of the pool
//!   (`--net-pool`, default [`DEFAULT_POOL`]) per instance, the host's end
//!   `.1`, the namespace's end (`veth0`) `.2` and its default route;
//! - forwarding is on and the guest's traffic is masqueraded to `veth0`'s
//!   address (nftables, table `ip spore`, inside the namespace);
//! - on the host, the pool is masqueraded out to the world (nftables table
//!   `ip spore_<hash>`, one per daemon) and IPv4 forwarding is turned on.
//!
//! Names: a namespace is `sp<hash>.<function>.<instance>` (`/run/netns/…`,
//! as `ip netns` makes them), a host-side veth `sp<hash>v<slot>` (at most
//! 15 bytes), where `<hash>` is 6 hex digits of the state directory's
//! SHA-256: two daemons on one host never touch each other's, and a
//! restarted daemon finds its predecessor's leftovers by prefix
//! ([`Network::remove_leftovers`]).
//!
//! Everything here is done with iproute2 (`ip`) and nftables (`nft`)
//! commands, each checked and its stderr reported: a netlink crate
//! (rtnetlink) covers links and addresses but not named namespaces (the
//! bind mount under `/run/netns` that `ip netns` and the VMM's
//! `--netns`/`netns_template` rely on) nor nftables (no maintained Rust
//! crate without libnftnl), so the commands are the one dependency that
//! covers all of it (`scripts/ensure-deps.sh` installs `iproute2` and
//! `nftables`). Everything is blocking: async callers go through
//! `spawn_blocking`. Never run as anything but root.

use std::collections::BTreeSet;
use std::io::Write as _;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use sha2::Digest as _;

use crate::mutex::lock;

pub mod egress;
pub(crate) mod handoff;
mod namespace;

use namespace::{in_namespace, open_tun_in, rename_namespace, set_sysctl, tap_in};

/// The guest's address, the same in every instance's namespace.
pub const GUEST_ADDR: Ipv4Addr = Ipv4Addr::new(172, 16, 0, 2);
/// The address of `tap0`, the guest's gateway.
pub const GATEWAY: Ipv4Addr = Ipv4Addr::new(172, 16, 0, 1);
/// The tap every instance's VMM opens, in its own namespace.
pub const TAP_NAME: &str = "tap0";
/// The tap's MAC address, the same in every namespace as [`GATEWAY`] is: a
/// clone or a restored guest keeps its neighbour entry for its gateway, and
/// a tap drops frames sent to any other address (with a new random MAC per
/// namespace, such a guest would be cut off until its entry went stale,
/// 15 to 45 s later).
const GATEWAY_MAC: &str = "02:73:70:00:00:01";
/// The namespace's end of its veth pair.
const NS_VETH: &str = "veth0";
/// Where `ip netns` keeps named namespaces.
const NETNS_DIR: &str = "/run/netns";
/// The default `--net-pool`.
pub const DEFAULT_POOL: &str = "10.200.0.0/16";

/// The guest's command-line words for its network (spore-uk's `ip=`/`gw=`).
pub fn guest_cmdline() -> String {
    format!("ip={GUEST_ADDR}/30 gw={GATEWAY}")
}

#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("--net-pool {0:?}: want A.B.C.D/P with P from 14 to 30 (a host veth's name holds at most 5 digits of slot) and no bits set past P")]
    BadPool(String),
    #[error("the network pool {pool} has no free /30 left ({slots} instances have one)")]
    PoolExhausted { pool: String, slots: u32 },
    #[error("`{command}` failed ({status}): {stderr}")]
    Command {
        command: String,
        status: String,
        stderr: String,
    },
    #[error(
        "cannot run `{command}`: {detail} (install iproute2 and nftables: scripts/ensure-deps.sh)"
    )]
    Spawn { command: String, detail: String },
    #[error("network namespace {name}: {detail}")]
    Namespace { name: String, detail: String },
}

/// The host's pool of /30s for instances' veth pairs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NetPool {
    base: u32,
    prefix: u8,
}

impl NetPool {
    pub fn parse(s: &str) -> Result<Self, NetError> {
        let bad = || NetError::BadPool(s.to_string());
        let (addr, prefix) = s.split_once('/').ok_or_else(bad)?;
        let addr: Ipv4Addr = addr.parse().map_err(|_| bad())?;
        let prefix: u8 = prefix.parse().map_err(|_| bad())?;
        if !(14..=30).contains(&prefix) {
            return Err(bad());
        }
        let base = u32::from(addr);
        let mask = if prefix == 0 {
            0
        } else {
            u32::MAX << (32 - prefix)
        };
        if base & !mask != 0 {
            return Err(bad());
        }
        Ok(NetPool { base, prefix })
    }

    /// How many /30s the pool holds.
    pub fn slots(&self) -> u32 {
        1u32 << (30 - self.prefix)
    }

    /// The host's and the namespace's addresses of slot `i`.
    pub fn addresses(&self, slot: u32) -> (Ipv4Addr, Ipv4Addr) {
        let net = self.base + slot * 4;
        (Ipv4Addr::from(net + 1), Ipv4Addr::from(net + 2))
    }
}

impl std::fmt::Display for NetPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", Ipv4Addr::from(self.base), self.prefix)
    }
}

/// The daemon's instance networks: names, the pool, the host's NAT.
pub struct Network {
    /// `sp` + 6 hex digits of the state directory's hash.
    prefix: String,
    pool: NetPool,
    used: Mutex<BTreeSet<u32>>,
    /// The host's table and forwarding are set up (on first use).
    host_ready: Mutex<bool>,
    /// Namespaces made ahead (`spare_target`), taken by the next
    /// instances: making one runs four commands (~25–45 ms measured), which
    /// would otherwise be on every networked start's path.
    spares: Mutex<Vec<InstanceNet>>,
    /// How many spares to keep (`--net-spares`, default [`SPARE_NETWORKS`]).
    spare_target: usize,
    /// A thread is making spares.
    refilling: AtomicBool,
    /// The daemon stops: no more spares.
    closed: AtomicBool,
}

/// Networks kept made ahead once a networked instance was started (each
/// holds a /30 of the pool): the default `--net-spares`.
pub const SPARE_NETWORKS: usize = 2;

/// The prefix of what a daemon of `state_dir` makes on the host (network
/// namespaces, links, cgroups): `sp` and 6 hex digits of the path's hash.
pub fn prefix_of(state_dir: &Path) -> String {
    let hash = sha2::Sha256::digest(state_dir.as_os_str().as_encoded_bytes());
    format!("sp{:02x}{:02x}{:02x}", hash[0], hash[1], hash[2])
}

impl Network {
    pub fn new(state_dir: &Path, pool: NetPool) -> Self {
        Network {
            prefix: prefix_of(state_dir),
            pool,
            used: Mutex::new(BTreeSet::new()),
            host_ready: Mutex::new(false),
            spares: Mutex::new(Vec::new()),
            spare_target: SPARE_NETWORKS,
            refilling: AtomicBool::new(false),
            closed: AtomicBool::new(false),
        }
    }

    /// Keeps `n` networks made ahead instead of [`SPARE_NETWORKS`].
    pub fn keeping_spares(mut self, n: usize) -> Self {
        self.spare_target = n;
        self
    }

    /// The prefix of every namespace and host link this daemon makes.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn pool(&self) -> NetPool {
        self.pool
    }

    /// The name of the host's nftables table (`ip` family).
    fn host_table(&self) -> String {
        format!("spore_{}", &self.prefix[2..])
    }

    /// The namespace name of `instance` of `function` (function names are
    /// `[A-Za-z0-9_-]`, so the dots delimit them).
    pub fn namespace_name(&self, function: &str, instance: &str) -> String {
        // A function key of an account (`ACCOUNT:NAME`) with a `.`, which
        // no function name has: names stay unique and `ip` takes them.
        let function = function.replace(':', ".");
        format!("{}.{function}.{instance}", self.prefix)
    }

    /// The file a process enters namespace `name` by.
    pub fn namespace_path(name: &str) -> PathBuf {
        Path::new(NETNS_DIR).join(name)
    }

    fn take_slot(&self) -> Result<u32, NetError> {
        let mut used = lock(&self.used);
        let slot = (0..self.pool.slots())
            .find(|s| !used.contains(s))
            .ok_or_else(|| NetError::PoolExhausted {
                pool: self.pool.to_string(),
                slots: self.pool.slots(),
            })?;
        used.insert(slot);
        Ok(slot)
    }

    /// The network of `instance` of `function`: its namespace (tap, veth,
    /// forwarding, NAT) and the host's end, a spare renamed when one is
    /// ready, else made now. On failure nothing made is left. With
    /// `tap_owner` (a jailed VMM's uid and gid), the tap is that user's,
    /// which lets the VMM open it without any capability; with `handoff`
    /// (a jailed clone, which may not enter the namespace) a tun descriptor
    /// opened there is kept for it ([`InstanceNet::take_handoff_tun`]).
    /// Start [`Network::refill`] afterwards, off the start's path.
    pub fn make(
        self: &Arc<Self>,
        function: &str,
        instance: &str,
        tap_owner: Option<(u32, u32)>,
        handoff: bool,
    ) -> Result<InstanceNet, NetError> {
        let name = self.namespace_name(function, instance);
        let spare = lock(&self.spares).pop();
        if let Some(mut net) = spare {
            match net.adopt(&name, tap_owner, handoff) {
                Ok(()) => return Ok(net),
                Err(e) => tracing::warn!("network: a spare namespace could not be used: {e}"),
            }
        }
        let mut net = self.make_named(name, tap_owner)?;
        if handoff {
            net.handoff_tun = Some(open_tun_in(&net.name)?);
        }
        Ok(net)
    }

    /// Makes spares until `--net-spares` are ready (one thread at a
    /// time; a full pool or a failure just leaves fewer). Blocking.
    pub fn refill(self: &Arc<Self>) {
        if self.refilling.swap(true, Ordering::AcqRel) {
            return;
        }
        let mut made = 0u32;
        while !self.closed.load(Ordering::Acquire) && lock(&self.spares).len() < self.spare_target {
            // A name no instance's has: function names are never empty.
            let name = format!("{}..spare{made}-{}", self.prefix, crate::clock::unix_ms());
            made += 1;
            match self.make_named(name, None) {
                Ok(net) => lock(&self.spares).push(net),
                Err(e) => {
                    tracing::debug!("network: no spare namespace made ahead: {e}");
                    break;
                }
            }
        }
        self.refilling.store(false, Ordering::Release);
        if self.closed.load(Ordering::Acquire) {
            lock(&self.spares).clear();
        }
    }

    fn make_named(
        self: &Arc<Self>,
        name: String,
        tap_owner: Option<(u32, u32)>,
    ) -> Result<InstanceNet, NetError> {
        self.ensure_host()?;
        let slot = self.take_slot()?;
        let mut net = InstanceNet {
            network: self.clone(),
            name: name.clone(),
            veth: format!("{}v{slot}", self.prefix),
            slot,
            removed: false,
            handoff_tun: None,
        };
        // A namespace of that name left by a daemon that died (or an
        // earlier instance whose removal failed) goes first.
        if Network::namespace_path(&name).exists() {
            let _ = run("ip", &["netns", "del", &name], None);
        }
        run("ip", &["netns", "add", &name], None)?;
        let made = self.configure(&net, tap_owner);
        match made {
            Ok(()) => Ok(net),
            Err(e) => {
                net.remove();
                Err(e)
            }
        }
    }

    fn configure(&self, net: &InstanceNet, tap_owner: Option<(u32, u32)>) -> Result<(), NetError> {
        let (host, inner) = self.pool.addresses(net.slot);
        // A veth of this slot left by a killed predecessor goes first.
        if Path::new("/sys/class/net").join(&net.veth).exists() {
            let _ = run("ip", &["link", "del", &net.veth], None);
        }
        let host_side = format!(
            "link add {veth} type veth peer name {NS_VETH} netns {ns}\n\
             addr add {host}/30 dev {veth}\n\
             link set {veth} up\n",
            veth = net.veth,
            ns = net.name,
        );
        run("ip", &["-batch", "-"], Some(&host_side))?;
        let owner = tap_owner.map_or_else(String::new, |(u, g)| format!(" user {u} group {g}"));
        let inside = format!(
            "link set lo up\n\
             tuntap add dev {TAP_NAME} mode tap{owner}\n\
             link set {TAP_NAME} address {GATEWAY_MAC}\n\
             addr add {GATEWAY}/30 dev {TAP_NAME}\n\
             link set {TAP_NAME} up\n\
             addr add {inner}/30 dev {NS_VETH}\n\
             link set {NS_VETH} up\n\
             route add default via {host}\n"
        );
        // The namespace's own settings, and nft has no `-n`: done from a
        // thread that entered it (the commands it starts run there too).
        let rules = format!(
            "table ip spore {{\n\
               chain postrouting {{\n\
                 type nat hook postrouting priority srcnat; policy accept;\n\
                 oifname \"{NS_VETH}\" masquerade\n\
               }}\n\
             }}\n"
        );
        in_namespace(&net.name, move || {
            set_sysctl("net/ipv4/ip_forward", true)?;
            // No IPv6 in the namespace, before tap0 comes up: the kernel
            // would otherwise send the tap router solicitations, MLD
            // reports and neighbour probes nobody asked for, into the rx
            // ring of every instance (and, before the VMM kept a zygote's
            // devices stopped across a snapshot, into the template its
            // clones map from).
            set_sysctl("net/ipv6/conf/all/disable_ipv6", false)?;
            set_sysctl("net/ipv6/conf/default/disable_ipv6", false)?;
            run("ip", &["-batch", "-"], Some(&inside))?;
            run("nft", &["-f", "-"], Some(&rules))
        })
    }

    /// The host's side, once per daemon: IPv4 forwarding on, and the pool
    /// masqueraded out (to anything but the pool itself; traffic to the
    /// host's own addresses is not forwarded and keeps its source).
    fn ensure_host(&self) -> Result<(), NetError> {
        let mut ready = lock(&self.host_ready);
        if *ready {
            return Ok(());
        }
        let forwarding = std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward")
            .map(|s| s.trim() == "1")
            .unwrap_or(false);
        if !forwarding {
            std::fs::write("/proc/sys/net/ipv4/ip_forward", b"1").map_err(|e| {
                NetError::Namespace {
                    name: "(host)".into(),
                    detail: format!("turning on IPv4 forwarding: {e}"),
                }
            })?;
            tracing::info!("network: IPv4 forwarding turned on (net.ipv4.ip_forward=1) for instances' outbound NAT");
        }
        let table = self.host_table();
        let pool = self.pool;
        let _ = run("nft", &["delete", "table", "ip", &table], None);
        let rules = format!(
            "table ip {table} {{\n\
               chain postrouting {{\n\
                 type nat hook postrouting priority srcnat; policy accept;\n\
                 ip saddr {pool} ip daddr != {pool} masquerade\n\
               }}\n\
               chain forward {{\n\
                 type filter hook forward priority filter; policy accept;\n\
                 ip saddr {pool} accept\n\
                 ip daddr {pool} ct state established,related accept\n\
               }}\n\
             }}\n"
        );
        run("nft", &["-f", "-"], Some(&rules))?;
        *ready = true;
        Ok(())
    }

    /// Removes the spares and the host's table (daemon shutdown; instances
    /// are gone).
    pub fn teardown(&self) {
        self.closed.store(true, Ordering::Release);
        lock(&self.spares).clear();
        let mut ready = lock(&self.host_ready);
        if *ready {
            let _ = run("nft", &["delete", "table", "ip", &self.host_table()], None);
            *ready = false;
        }
    }

    /// Namespaces whose name starts with `prefix` (e.g. this daemon's, or
    /// one function's: `<prefix>.<function>.`).
    pub fn namespaces_with(prefix: &str) -> Vec<String> {
        names_with(Path::new(NETNS_DIR), prefix)
    }

    /// Host links whose name starts with `prefix`.
    pub fn links_with(prefix: &str) -> Vec<String> {
        names_with(Path::new("/sys/class/net"), prefix)
    }

    /// Removes what a previous daemon of this state directory left (killed
    /// before it could): its namespaces, its host veths, its nftables
    /// table. Returns how many things were removed.
    pub fn remove_leftovers(&self) -> usize {
        let mut removed = 0;
        for ns in Network::namespaces_with(&format!("{}.", self.prefix)) {
            let _ = run("ip", &["-n", &ns, "link", "del", NS_VETH], None);
            if run("ip", &["netns", "del", &ns], None).is_ok() {
                removed += 1;
            }
        }
        for link in Network::links_with(&format!("{}v", self.prefix)) {
            if run("ip", &["link", "del", &link], None).is_ok() {
                removed += 1;
            }
        }
        if Command::new("nft")
            .args(["list", "table", "ip", &self.host_table()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
            && run("nft", &["delete", "table", "ip", &self.host_table()], None).is_ok()
        {
            removed += 1;
        }
        removed
    }
}

/// One instance's network namespace and veth pair; removed (and its /30
/// given back) when dropped.
pub struct InstanceNet {
    network: Arc<Network>,
    pub name: String,
    veth: String,
    slot: u32,
    removed: bool,
    /// A tun descriptor opened in it for a jailed clone.
    handoff_tun: Option<std::fs::File>,
}

impl InstanceNet {
    /// The file the instance's VMM enters (`spore vmm --netns`).
    pub fn path(&self) -> PathBuf {
        Network::namespace_path(&self.name)
    }

    /// The host's address on this instance's veth.
    pub fn host_addr(&self) -> Ipv4Addr {
        self.network.pool.addresses(self.slot).0
    }

    /// Makes this spare `name`'s: its namespace renamed (bound at the new
    /// name, unbound at the old, as `ip netns` keeps names), its tap given
    /// to `tap_owner` and, with `handoff`, a tun descriptor opened there.
    fn adopt(
        &mut self,
        name: &str,
        tap_owner: Option<(u32, u32)>,
        handoff: bool,
    ) -> Result<(), NetError> {
        let spare = self.name.clone();
        let failed = |detail: String| NetError::Namespace {
            name: spare.clone(),
            detail,
        };
        let (old, new) = (
            Network::namespace_path(&spare),
            Network::namespace_path(name),
        );
        rename_namespace(&old, &new).map_err(|e| failed(format!("renaming to {name}: {e}")))?;
        self.name = name.to_string();
        if tap_owner.is_some() || handoff {
            self.handoff_tun = tap_in(name, tap_owner, handoff)?;
        }
        Ok(())
    }

    /// Puts `egress` in force for its guest ([`egress::Egress`]): a
    /// sandbox without `allow_internet_access` reaches neither the host nor
    /// the world. Its tap stays: a clone or a restored snapshot of a VM
    /// with `eth0` needs one to open.
    pub fn set_egress(&self, egress: &egress::Egress) -> Result<(), NetError> {
        egress.apply_in(&self.name)
    }

    /// The `/dev/net/tun` opened in its namespace for a jailed clone
    /// ([`Network::make`] with `handoff`).
    pub fn take_handoff_tun(&mut self) -> Option<std::fs::File> {
        self.handoff_tun.take()
    }

    /// Deletes the veth pair (both ends go with the host's) and the
    /// namespace's name; the namespace itself goes with its last process.
    pub fn remove(&mut self) {
        if self.removed {
            return;
        }
        self.removed = true;
        if let Err(e) = run("ip", &["link", "del", &self.veth], None) {
            if Path::new("/sys/class/net").join(&self.veth).exists() {
                tracing::warn!("network: {e}");
            }
        }
        if Network::namespace_path(&self.name).exists() {
            if let Err(e) = run("ip", &["netns", "del", &self.name], None) {
                tracing::warn!("network: {e}");
            }
        }
        lock(&self.network.used).remove(&self.slot);
    }
}

impl Drop for InstanceNet {
    fn drop(&mut self) {
        self.remove();
    }
}

/// The entries of `dir` whose name starts with `prefix` (none if `dir`
/// cannot be read).
fn names_with(dir: &Path, prefix: &str) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with(prefix))
        .collect()
}

/// Runs `program args…` (with `stdin` piped in if given) and waits; a
/// non-zero exit is an error carrying the command and its stderr.
fn run(program: &str, args: &[&str], stdin: Option<&str>) -> Result<(), NetError> {
    let command = format!("{program} {}", args.join(" "));
    let spawn_err = |e: std::io::Error| NetError::Spawn {
        command: command.clone(),
        detail: e.to_string(),
    };
    let mut child = Command::new(program)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(spawn_err)?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes()).map_err(spawn_err)?;
    }
    let out = child.wait_with_output().map_err(spawn_err)?;
    if out.status.success() {
        return Ok(());
    }
    let mut stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
    if let Some(text) = stdin {
        stderr.push_str(&format!(" (input: {:?})", text.trim()));
    }
    Err(NetError::Command {
        command,
        status: out.status.to_string(),
        stderr,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pools_are_checked_and_cut_into_slash_30s() {
        let p = NetPool::parse(DEFAULT_POOL).unwrap();
        assert_eq!(p.slots(), 16384);
        assert_eq!(
            p.addresses(0),
            (Ipv4Addr::new(10, 200, 0, 1), Ipv4Addr::new(10, 200, 0, 2))
        );
        assert_eq!(
            p.addresses(70),
            (Ipv4Addr::new(10, 200, 1, 25), Ipv4Addr::new(10, 200, 1, 26))
        );
        assert_eq!(NetPool::parse("10.9.8.0/30").unwrap().slots(), 1);
        for bad in [
            "10.200.0.0",
            "10.200.0.1/16",
            "10.0.0.0/31",
            "10.0.0.0/8",
            "x/8",
            "10.0.0.0/33",
        ] {
            assert!(NetPool::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn names_fit_and_carry_the_daemons_prefix() {
        let n = Network::new(
            Path::new("/var/lib/spore"),
            NetPool::parse(DEFAULT_POOL).unwrap(),
        );
        assert_eq!(n.prefix().len(), 8);
        assert!(n.prefix().starts_with("sp"));
        let other = Network::new(Path::new("/var/lib/spore2"), n.pool());
        assert_ne!(n.prefix(), other.prefix());
        // The longest host veth name: slot 16383 of a /16.
        assert!(format!("{}v16383", n.prefix()).len() <= 15);
        assert_eq!(
            n.namespace_name("f-1", "r3c2"),
            format!("{}.f-1.r3c2", n.prefix())
        );
        assert_eq!(guest_cmdline(), "ip=172.16.0.2/30 gw=172.16.0.1");
    }
}
