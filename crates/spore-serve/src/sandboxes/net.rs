//! A sandbox's network (E2B's `allow_internet_access`, default on): the VM
//! of a template with `network = true` has `eth0` on a tap, and every VMM
//! process of it (the zygote, each clone made of it, a resumed sandbox, each
//! fork) runs in a network namespace of its own, made as a networked
//! function's are (`crate::network`): the guest is 172.16.0.2/30 behind the
//! tap's 172.16.0.1 in every namespace, so a clone or a restored snapshot
//! keeps its address and reopens `tap0` by name, and the namespace's veth
//! and the host's NAT take its traffic out. A sandbox's egress rules
//! (`allow_internet_access: false`, `network.allowOut`/`denyOut`) are
//! nftables rules in its namespace ([`crate::network::egress`]).
//!
//! The guest configures `eth0` itself from its kernel command line
//! (`spore.ip=`, `spore.gw=`, `spore.dns=`: spore-agent's sandbox mode).

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::path::Path;
use std::sync::Arc;

use crate::jail::User;
use crate::network::egress::Egress;
use crate::network::{InstanceNet, Network, GATEWAY, GUEST_ADDR, TAP_NAME};
use crate::vmm::VmmProcess;

/// The guest's MAC address (the same in every namespace, as its address).
const GUEST_MAC: &str = "06:00:ac:10:00:02";

/// The kernel command-line words spore-agent configures `eth0` from.
pub fn guest_args(dns: &[Ipv4Addr]) -> String {
    let servers = if dns.is_empty() {
        host_name_servers()
    } else {
        dns.to_vec()
    };
    let mut words = format!("spore.ip={GUEST_ADDR}/30 spore.gw={GATEWAY}");
    if !servers.is_empty() {
        let list: Vec<String> = servers.iter().map(Ipv4Addr::to_string).collect();
        words.push_str(&format!(" spore.dns={}", list.join(",")));
    }
    words
}

/// `PUT /network-interfaces/eth0`'s body.
pub fn interface() -> serde_json::Value {
    serde_json::json!({
        "iface_id": "eth0",
        "host_dev_name": TAP_NAME,
        "guest_mac": GUEST_MAC,
    })
}

/// The host's IPv4 name servers a guest can reach through the NAT: those
/// of `/etc/resolv.conf` but loopback ones (a local resolver such as
/// systemd-resolved's 127.0.0.53 is not the guest's), else those the
/// local resolver forwards to; at most 3.
fn host_name_servers() -> Vec<Ipv4Addr> {
    for file in ["/etc/resolv.conf", "/run/systemd/resolve/resolv.conf"] {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        let found = name_servers_in(&text);
        if !found.is_empty() {
            return found;
        }
    }
    Vec::new()
}

fn name_servers_in(resolv_conf: &str) -> Vec<Ipv4Addr> {
    resolv_conf
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            (words.next() == Some("nameserver"))
                .then(|| words.next()?.parse::<Ipv4Addr>().ok())
                .flatten()
        })
        .filter(|a| !a.is_loopback() && !a.is_unspecified())
        .take(3)
        .collect()
}

/// How many clones' namespaces are made at once.
const MAKE_AT_ONCE: usize = 8;

/// The daemon's networks, as sandboxes use them.
#[derive(Clone)]
pub struct SandboxNetwork {
    network: Arc<Network>,
}

impl SandboxNetwork {
    pub fn new(network: Arc<Network>) -> Self {
        SandboxNetwork { network }
    }

    /// A namespace named `<prefix>.<owner>.<instance>`, its outbound
    /// traffic as `egress` says; its tap `user`'s, for a jailed VMM.
    pub async fn make(
        &self,
        owner: &str,
        instance: &str,
        egress: &Egress,
        user: Option<&User>,
    ) -> anyhow::Result<InstanceNet> {
        self.make_for(owner, instance, egress, user, false).await
    }

    /// [`Self::make`]; with `handoff`, a `/dev/net/tun` descriptor opened
    /// in it for a jailed clone ([`crate::network::handoff`]).
    async fn make_for(
        &self,
        owner: &str,
        instance: &str,
        egress: &Egress,
        user: Option<&User>,
        handoff: bool,
    ) -> anyhow::Result<InstanceNet> {
        let (network, owner, instance, egress) = (
            self.network.clone(),
            owner.to_string(),
            instance.to_string(),
            egress.clone(),
        );
        // A jailed VMM opens its tap as its own user: the tap is its.
        let tap_owner = user.map(|u| (u.uid, u.gid));
        let net = {
            let network = network.clone();
            tokio::task::spawn_blocking(move || {
                let net = network.make(&owner, &instance, tap_owner, handoff)?;
                if egress != Egress::default() {
                    net.set_egress(&egress)?;
                }
                anyhow::Ok(net)
            })
            .await??
        };
        // The next ones made ahead, off this start's path.
        tokio::task::spawn_blocking(move || network.refill());
        Ok(net)
    }

    /// The namespaces of the next `count` clones of `source` (numbered
    /// from its `served + 1`, as the VMM numbers them), keyed by clone
    /// number, and `PUT /clone`'s `network` naming them by template. The
    /// caller holds whatever keeps other clones of `source` from being
    /// asked meanwhile. A jailed source's clones (`jailed`: their user and
    /// the directory their sockets go to) may not enter their namespaces:
    /// each is handed its tap's descriptor at `<dir>/tun-<n>.sock`.
    pub async fn for_clones(
        &self,
        source: &VmmProcess,
        owner: &str,
        stem: &str,
        count: u32,
        egress: &Egress,
        jailed: Option<(&User, &Path)>,
    ) -> anyhow::Result<(HashMap<u64, InstanceNet>, serde_json::Value)> {
        let status: serde_json::Value =
            serde_json::from_str(&source.api("GET", "/clone", None).await?)?;
        let served = status
            .get("served")
            .and_then(serde_json::Value::as_u64)
            .ok_or_else(|| anyhow::anyhow!("GET /clone answered no served count: {status}"))?;
        // A few at a time (each is a handful of `ip`/`nft` commands, tens
        // of milliseconds): a fork of 100 is not a hundred in a row. On
        // failure the ones made are dropped, which removes them.
        let mut nets = HashMap::new();
        let numbers: Vec<u64> = (served + 1..=served + u64::from(count)).collect();
        for batch in numbers.chunks(MAKE_AT_ONCE) {
            let mut made = tokio::task::JoinSet::new();
            for &n in batch {
                let (me, owner, instance, egress) = (
                    self.clone(),
                    owner.to_string(),
                    format!("{stem}c{n}"),
                    egress.clone(),
                );
                let user = jailed.map(|(u, _)| u.clone());
                made.spawn(async move {
                    let net = me
                        .make_for(&owner, &instance, &egress, user.as_ref(), user.is_some())
                        .await;
                    (n, net)
                });
            }
            while let Some(joined) = made.join_next().await {
                let (n, net) = joined?;
                nets.insert(n, net?);
            }
        }
        let template =
            Network::namespace_path(&self.network.namespace_name(owner, &format!("{stem}c{{n}}")));
        let mut network = serde_json::json!({ "netns_template": template });
        if let Some((user, dir)) = jailed {
            use crate::network::handoff::handoff_limit;
            for (n, net) in nets.iter_mut() {
                let tun = net
                    .take_handoff_tun()
                    .ok_or_else(|| anyhow::anyhow!("no tun descriptor opened for clone {n}"))?;
                let sock = dir.join(format!("tun-{n}.sock"));
                crate::network::handoff::give_tun(&sock, tun, user, handoff_limit(count))?;
            }
            network["tun_socket_template"] =
                serde_json::json!(dir.join("tun-{n}.sock").display().to_string());
        }
        Ok((nets, network))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hosts_loopback_resolvers_are_not_the_guests() {
        let conf = "# generated\nnameserver 127.0.0.53\nnameserver 10.0.2.3\noptions edns0\n\
                    nameserver ::1\nnameserver 192.168.1.1\nnameserver 8.8.8.8\nnameserver 1.1.1.1\n";
        assert_eq!(
            name_servers_in(conf),
            [
                Ipv4Addr::new(10, 0, 2, 3),
                Ipv4Addr::new(192, 168, 1, 1),
                Ipv4Addr::new(8, 8, 8, 8)
            ]
        );
        assert!(name_servers_in("nameserver 127.0.0.1\nnameserver\n").is_empty());
    }

    #[test]
    fn the_guest_is_told_its_address_gateway_and_name_servers() {
        let args = guest_args(&[Ipv4Addr::new(1, 1, 1, 1), Ipv4Addr::new(9, 9, 9, 9)]);
        assert_eq!(
            args,
            "spore.ip=172.16.0.2/30 spore.gw=172.16.0.1 spore.dns=1.1.1.1,9.9.9.9"
        );
    }
}
