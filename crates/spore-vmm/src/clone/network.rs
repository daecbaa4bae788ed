//! A clone's place on the network (`PUT /clone`'s `network` object).
//!
//! Every clone restores the source's network interfaces, and a tap can be
//! held by one process only: so each clone process first enters its own
//! network namespace (`netns_template` with `{n}` replaced by its clone
//! number, e.g. `/run/netns/spore-{n}`, a file made by `ip netns add`),
//! where a tap of the same name waits, and only then reopens its taps. The
//! guests keep their IP and MAC addresses and are told apart by namespace;
//! optionally an interface gets a new MAC (`guest_mac_template`, `{n}` is
//! the clone number as two bytes `HH:LL`) and a new IPv4 address
//! (`ipv4`, `{n}` in decimal, with an optional `gateway`), given to the
//! guest as `crate::clone::identity` describes.
//!
//! Expanded and checked on the source for every clone number before any
//! clone starts; the clone process expands it again for its own number.

use std::fs::File;
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::config::{MacAddr, VmConfig};

/// `PUT /clone`'s `network`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CloneNetwork {
    /// The namespace file each clone enters before opening its taps.
    pub netns_template: String,
    /// Instead of entering its namespace (which an unprivileged clone may
    /// not): the Unix socket (`{n}` its number) clone n connects to, to be
    /// given one `/dev/net/tun` descriptor per tap (in the VM's interface
    /// order) opened in its namespace, where a tap finds its device.
    /// (Always serialized: the handoff's bincode needs every field.)
    #[serde(default)]
    pub tun_socket_template: Option<String>,
    /// New identities per interface (interfaces left out keep theirs).
    #[serde(default)]
    pub interfaces: Vec<CloneInterface>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
/// (Every field always serialized: the clone handoff carries it as bincode,
/// which has no field names to skip by.)
pub struct CloneInterface {
    pub iface_id: String,
    #[serde(default)]
    pub guest_mac_template: Option<String>,
    /// `A.B.C.D/P`, with `{n}` for the clone number.
    #[serde(default)]
    pub ipv4: Option<String>,
    #[serde(default)]
    pub gateway: Option<Ipv4Addr>,
}

/// One interface's new identity, as a clone gets it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetIdentityChange {
    pub iface_id: String,
    pub mac: Option<MacAddr>,
    /// (address, prefix length).
    pub ipv4: Option<(Ipv4Addr, u8)>,
    pub gateway: Option<Ipv4Addr>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CloneNetworkError {
    #[error(
        "network.netns_template must contain {{n}} (each clone needs its own namespace), got {0:?}"
    )]
    NoNumberInNetns(String),
    #[error("network.interfaces: {0:?} is not a network interface of this VM")]
    UnknownInterface(String),
    #[error("network.interfaces: {iface_id}: guest_mac_template {template:?} gives {got:?} for clone {n}, not a MAC address (write {{n}} for the last two bytes, as 06:00:ac:10:{{n}})")]
    Mac {
        iface_id: String,
        template: String,
        got: String,
        n: u64,
    },
    #[error("network.interfaces: {iface_id}: ipv4 {template:?} gives {got:?} for clone {n}, not an address A.B.C.D/P")]
    Ipv4 {
        iface_id: String,
        template: String,
        got: String,
        n: u64,
    },
    #[error("this VM has network interfaces ({0}) and a tap can be held by one process only: give PUT /clone a network.netns_template so that each clone reopens its taps in its own network namespace")]
    NeedsNamespace(String),
    #[error("cannot open the clone's network namespace {path}: {detail} (make it first, e.g. `ip netns add`, with the tap inside)")]
    OpenNetns { path: PathBuf, detail: String },
    #[error("cannot enter the clone's network namespace {path}: {detail}")]
    Setns { path: PathBuf, detail: String },
    #[error("network.tun_socket_template must contain {{n}} (each clone has its own), got {0:?}")]
    NoNumberInTunSocket(String),
    #[error("cannot receive the clone's /dev/net/tun descriptors from {path}: {detail}")]
    TunSocket { path: PathBuf, detail: String },
}

impl CloneNetwork {
    /// Checks the settings against the VM's configuration for clone numbers
    /// `numbers` (each must expand to valid addresses).
    pub fn check(
        &self,
        config: &VmConfig,
        numbers: impl Iterator<Item = u64>,
    ) -> Result<(), CloneNetworkError> {
        if !self.netns_template.contains("{n}") {
            return Err(CloneNetworkError::NoNumberInNetns(
                self.netns_template.clone(),
            ));
        }
        if let Some(t) = self
            .tun_socket_template
            .as_ref()
            .filter(|t| !t.contains("{n}"))
        {
            return Err(CloneNetworkError::NoNumberInTunSocket(t.clone()));
        }
        for i in &self.interfaces {
            if !config
                .network_interfaces
                .iter()
                .any(|c| c.iface_id == i.iface_id)
            {
                return Err(CloneNetworkError::UnknownInterface(i.iface_id.clone()));
            }
        }
        for n in numbers {
            self.identities(n)?;
        }
        Ok(())
    }

    /// The namespace file of clone `n`.
    pub fn netns_path(&self, n: u64) -> PathBuf {
        PathBuf::from(self.netns_template.replace("{n}", &n.to_string()))
    }

    /// The new identities of clone `n`.
    pub fn identities(&self, n: u64) -> Result<Vec<NetIdentityChange>, CloneNetworkError> {
        self.interfaces
            .iter()
            .map(|i| {
                let mac = match &i.guest_mac_template {
                    None => None,
                    Some(t) => {
                        let got =
                            t.replace("{n}", &format!("{:02x}:{:02x}", n >> 8 & 0xff, n & 0xff));
                        let mac = got.parse::<MacAddr>().ok().filter(|_| n <= 0xffff);
                        Some(mac.ok_or_else(|| CloneNetworkError::Mac {
                            iface_id: i.iface_id.clone(),
                            template: t.clone(),
                            got,
                            n,
                        })?)
                    }
                };
                let ipv4 = match &i.ipv4 {
                    None => None,
                    Some(t) => {
                        let got = t.replace("{n}", &n.to_string());
                        Some(parse_cidr(&got).ok_or_else(|| CloneNetworkError::Ipv4 {
                            iface_id: i.iface_id.clone(),
                            template: t.clone(),
                            got,
                            n,
                        })?)
                    }
                };
                Ok(NetIdentityChange {
                    iface_id: i.iface_id.clone(),
                    mac,
                    ipv4,
                    gateway: i.gateway,
                })
            })
            .collect()
    }

    /// Gets clone `n` onto its network before its taps open: its
    /// `/dev/net/tun` descriptors from its socket (`taps` of them), or else
    /// its namespace entered.
    pub fn join(&self, n: u64, taps: usize) -> Result<(), CloneNetworkError> {
        match &self.tun_socket_template {
            Some(t) => receive_tuns(&PathBuf::from(t.replace("{n}", &n.to_string())), taps),
            None => self.enter_netns(n),
        }
    }

    /// Moves the calling thread (the clone process's main thread, which
    /// then opens the taps) into clone `n`'s network namespace.
    pub fn enter_netns(&self, n: u64) -> Result<(), CloneNetworkError> {
        let path = self.netns_path(n);
        let file = File::open(&path).map_err(|e| CloneNetworkError::OpenNetns {
            path: path.clone(),
            detail: e.to_string(),
        })?;
        // SAFETY: setns on an fd we own; the result is checked.
        if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(CloneNetworkError::Setns {
                path,
                detail: std::io::Error::last_os_error().to_string(),
            });
        }
        tracing::info!("clone {n}: in network namespace {}", path.display());
        Ok(())
    }
}

/// Connects to `path` and receives `taps` descriptors of `/dev/net/tun`
/// (checked to be character devices), kept for the taps to open.
fn receive_tuns(path: &std::path::Path, taps: usize) -> Result<(), CloneNetworkError> {
    use std::os::unix::fs::FileTypeExt as _;
    use std::os::unix::net::UnixStream;

    use vmm_sys_util::sock_ctrl_msg::ScmSocket as _;
    let failed = |detail: String| CloneNetworkError::TunSocket {
        path: path.to_path_buf(),
        detail,
    };
    let sock = UnixStream::connect(path).map_err(|e| failed(format!("connecting: {e}")))?;
    sock.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .map_err(|e| failed(e.to_string()))?;
    let mut byte = [0u8; 1];
    let mut iov = [libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: byte.len(),
    }];
    // At most a few more than asked: extra ones are closed, and counted.
    let mut fds = [-1; 8];
    // SAFETY: the iovec points into `byte`, which outlives the call; the
    // descriptors received are new, owned by this process, and wrapped in
    // `File`s right below.
    let (_, got) = unsafe { sock.recv_with_fds(&mut iov, &mut fds) }
        .map_err(|e| failed(format!("receiving: {e}")))?;
    let files: Vec<File> = fds[..got]
        .iter()
        // SAFETY: each is a fresh descriptor received above, owned by nobody else.
        .map(|&fd| unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) })
        .collect();
    if files.len() != taps {
        return Err(failed(format!(
            "{} descriptors for {taps} taps",
            files.len()
        )));
    }
    for f in &files {
        let is_tun = f.metadata().is_ok_and(|m| m.file_type().is_char_device());
        if !is_tun {
            return Err(failed("a descriptor that is not a device".into()));
        }
    }
    crate::privilege::give_tuns(files);
    tracing::info!(
        "clone: {taps} /dev/net/tun descriptor(s) received from {}",
        path.display()
    );
    Ok(())
}

/// `A.B.C.D/P` with P ≤ 32.
fn parse_cidr(s: &str) -> Option<(Ipv4Addr, u8)> {
    let (addr, prefix) = s.split_once('/')?;
    let prefix: u8 = prefix.parse().ok()?;
    (prefix <= 32).then_some((addr.parse().ok()?, prefix))
}

/// Refuses cloning a VM with network interfaces without namespaces.
pub fn require_namespace(
    config: &VmConfig,
    network: Option<&CloneNetwork>,
) -> Result<(), CloneNetworkError> {
    if config.network_interfaces.is_empty() || network.is_some() {
        return Ok(());
    }
    let names: Vec<String> = config
        .network_interfaces
        .iter()
        .map(|i| format!("{} on tap {}", i.iface_id, i.host_dev_name))
        .collect();
    Err(CloneNetworkError::NeedsNamespace(names.join(", ")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::NetworkInterfaceConfig;

    fn config() -> VmConfig {
        VmConfig {
            network_interfaces: vec![NetworkInterfaceConfig {
                iface_id: "eth0".into(),
                host_dev_name: "tap0".into(),
                guest_mac: None,
                mtu: None,
                rx_rate_limiter: None,
                tx_rate_limiter: None,
            }],
            ..VmConfig::default()
        }
    }

    fn network(json: &str) -> CloneNetwork {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn templates_expand_per_clone_number() {
        let n = network(
            r#"{"netns_template": "/run/netns/spore-{n}", "interfaces": [{"iface_id": "eth0",
                "guest_mac_template": "06:00:ac:10:{n}", "ipv4": "10.0.{n}.2/24", "gateway": "10.0.0.1"}]}"#,
        );
        n.check(&config(), 1..=3).unwrap();
        assert_eq!(n.netns_path(7), PathBuf::from("/run/netns/spore-7"));
        let id = &n.identities(3).unwrap()[0];
        assert_eq!(id.mac.unwrap().0, [6, 0, 0xac, 0x10, 0, 3]);
        assert_eq!(id.ipv4, Some((Ipv4Addr::new(10, 0, 3, 2), 24)));
        assert_eq!(id.gateway, Some(Ipv4Addr::new(10, 0, 0, 1)));
        // Clone 256 has no 10.0.256.2.
        assert!(matches!(
            n.identities(256),
            Err(CloneNetworkError::Ipv4 { n: 256, .. })
        ));
        assert!(n.check(&config(), 250..=256).is_err());
        let mac_only = network(
            r#"{"netns_template": "/n/{n}", "interfaces": [{"iface_id": "eth0",
                "guest_mac_template": "06:00:ac:10:{n}"}]}"#,
        );
        let id = &mac_only.identities(0x102).unwrap()[0];
        assert_eq!(id.mac.unwrap().0, [6, 0, 0xac, 0x10, 1, 2]);
        assert!(mac_only.identities(0x1_0000).is_err());
    }

    #[test]
    fn bad_settings_are_refused() {
        let c = config();
        assert!(matches!(
            network(r#"{"netns_template": "/run/netns/x"}"#).check(&c, 1..=1),
            Err(CloneNetworkError::NoNumberInNetns(_))
        ));
        assert!(matches!(
            network(r#"{"netns_template": "/n/{n}", "interfaces": [{"iface_id": "eth1"}]}"#)
                .check(&c, 1..=1),
            Err(CloneNetworkError::UnknownInterface(_))
        ));
        assert!(network(
            r#"{"netns_template": "/n/{n}", "interfaces": [{"iface_id": "eth0", "guest_mac_template": "06:{n}"}]}"#
        )
        .check(&c, 1..=1)
        .is_err());
        assert!(
            serde_json::from_str::<CloneNetwork>(r#"{"netns_template": "/n/{n}", "x": 1}"#)
                .is_err()
        );
        assert!(require_namespace(&c, None).is_err());
        assert!(require_namespace(&VmConfig::default(), None).is_ok());
        let e = network(r#"{"netns_template": "/nonexistent/netns-{n}"}"#)
            .enter_netns(1)
            .unwrap_err();
        assert!(e.to_string().contains("/nonexistent/netns-1"), "{e}");
    }
}
