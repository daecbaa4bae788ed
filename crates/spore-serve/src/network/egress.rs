//! What an instance's guest may reach beyond its network namespace: E2B's
//! egress rules (`allow_internet_access`, `network.allowOut`/`denyOut`),
//! enforced by nftables in the namespace's forward hook, where every packet
//! the guest sends out of its tap passes. A destination that `allow`
//! names is reached even when `deny` names it too (E2B's precedence).
//!
//! Three shapes of table, one at a time, swapped in one `nft` transaction:
//! none (everything reached), `spore_isolated` (nothing forwarded either
//! way: the sandbox without internet access) and `spore_egress` (the
//! guest's new packets filtered by destination; answers to what it was
//! allowed to open come back).

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};

use super::namespace::in_namespace;
use super::{run, NetError, TAP_NAME};

/// The table that cuts a namespace off.
const ISOLATED: &str = "spore_isolated";
/// The table of per-destination rules.
const RULES: &str = "spore_egress";

/// The most entries of each list (each is one element of an nft set; a
/// list longer than this is a mistake, not a policy).
pub const MAX_ENTRIES: usize = 1024;

/// An instance's egress rules. The default reaches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Egress {
    /// Destinations reached whatever `deny` says.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<Ipv4Net>,
    /// Destinations cut off.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny: Vec<Ipv4Net>,
}

/// A rule list entry spore cannot take.
#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    #[error(
        "{list}: {entry:?} is not an IPv4 address or CIDR block (domain names are not \
         supported: spore filters by address)"
    )]
    NotAnAddress { list: &'static str, entry: String },
    #[error("{list}: {count} entries, at most {MAX_ENTRIES}")]
    TooMany { list: &'static str, count: usize },
}

impl Egress {
    /// Everything denied (E2B's `allow_internet_access: false`).
    pub fn closed() -> Egress {
        Egress {
            allow: Vec::new(),
            deny: vec![Ipv4Net::default()],
        }
    }

    /// From E2B's lists (`list` names them in errors: `allowOut`,
    /// `denyOut`): IPv4 addresses and CIDR blocks, normalised (host bits
    /// cleared, duplicates dropped).
    pub fn parse(allow: &[String], deny: &[String]) -> Result<Egress, EgressError> {
        Ok(Egress {
            allow: parse_list("allowOut", allow)?,
            deny: parse_list("denyOut", deny)?,
        })
    }

    /// Whether nothing is denied but what it allows: E2B's
    /// `allow_internet_access` as `get_info` reports it (false once
    /// `0.0.0.0/0` is denied, whatever is allowed).
    pub fn internet(&self) -> bool {
        !self.deny.iter().any(|n| n.prefix_len() == 0)
    }

    /// Denies everything too (`allow_internet_access: false` on top of
    /// lists): what `allow` names is still reached.
    pub fn and_closed(mut self) -> Egress {
        if self.internet() {
            self.deny = vec![Ipv4Net::default()];
        }
        self
    }

    /// The nft script that puts these rules in place of any earlier ones,
    /// in one transaction (creating a table before deleting it makes the
    /// delete valid whether or not it existed).
    pub fn nft_script(&self) -> String {
        let mut script = format!(
            "table ip {ISOLATED}\ndelete table ip {ISOLATED}\n\
             table ip {RULES}\ndelete table ip {RULES}\n"
        );
        if self.deny.is_empty() {
            return script;
        }
        if self.allow.is_empty() && !self.internet() {
            script.push_str(&format!(
                "table ip {ISOLATED} {{\n\
                   chain forward {{\n\
                     type filter hook forward priority filter; policy drop;\n\
                   }}\n\
                 }}\n"
            ));
            return script;
        }
        // Overlapping blocks merged: older nft refuses them in one set.
        let set = |nets: &[Ipv4Net]| {
            Ipv4Net::aggregate(&nets.to_vec())
                .iter()
                .map(Ipv4Net::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        script.push_str(&format!(
            "table ip {RULES} {{\n  chain forward {{\n    \
               type filter hook forward priority filter; policy accept;\n"
        ));
        if !self.allow.is_empty() {
            script.push_str(&format!(
                "    iifname \"{TAP_NAME}\" ip daddr {{ {} }} accept\n",
                set(&self.allow)
            ));
        }
        script.push_str(&format!(
            "    iifname \"{TAP_NAME}\" ip daddr {{ {} }} drop\n  }}\n}}\n",
            set(&self.deny)
        ));
        script
    }

    /// Puts these rules in force in namespace `name` (blocking).
    pub fn apply_in(&self, name: &str) -> Result<(), NetError> {
        let script = self.nft_script();
        in_namespace(name, move || run("nft", &["-f", "-"], Some(&script)))
    }
}

fn parse_list(list: &'static str, entries: &[String]) -> Result<Vec<Ipv4Net>, EgressError> {
    if entries.len() > MAX_ENTRIES {
        return Err(EgressError::TooMany {
            list,
            count: entries.len(),
        });
    }
    let mut nets: Vec<Ipv4Net> = Vec::with_capacity(entries.len());
    for entry in entries {
        let text = entry.trim();
        let net = match text.parse::<Ipv4Net>() {
            Ok(n) => n.trunc(),
            Err(_) => match text.parse::<Ipv4Addr>() {
                Ok(a) => Ipv4Net::from(a),
                Err(_) => {
                    return Err(EgressError::NotAnAddress {
                        list,
                        entry: entry.clone(),
                    })
                }
            },
        };
        if !nets.contains(&net) {
            nets.push(net);
        }
    }
    Ok(nets)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn egress(allow: &[&str], deny: &[&str]) -> Result<Egress, EgressError> {
        let owned = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        Egress::parse(&owned(allow), &owned(deny))
    }

    #[test]
    fn addresses_and_blocks_are_taken_and_normalised() {
        let e = egress(&["1.1.1.1", "10.1.2.3/8", "10.0.0.0/8"], &["0.0.0.0/0"]).unwrap();
        assert_eq!(
            e.allow,
            vec![
                "1.1.1.1/32".parse::<Ipv4Net>().unwrap(),
                "10.0.0.0/8".parse().unwrap()
            ]
        );
        assert!(!e.internet());
        assert!(egress(&[], &["192.168.0.0/16"]).unwrap().internet());
    }

    #[test]
    fn names_ipv6_and_nonsense_are_refused() {
        for bad in [
            "example.com",
            "*.example.com",
            "::1",
            "2001:db8::/32",
            "1.2.3.4/33",
            "",
        ] {
            assert!(
                matches!(egress(&[bad], &[]), Err(EgressError::NotAnAddress { .. })),
                "{bad}"
            );
            assert!(egress(&[], &[bad]).is_err(), "{bad}");
        }
        let many: Vec<String> = (0..=MAX_ENTRIES)
            .map(|i| format!("10.0.{}.{}", i / 256, i % 256))
            .collect();
        assert!(matches!(
            Egress::parse(&many, &[]),
            Err(EgressError::TooMany { .. })
        ));
    }

    #[test]
    fn each_policy_gets_its_own_table_in_one_transaction() {
        let open = Egress::default().nft_script();
        assert!(open.contains("delete table ip spore_isolated"));
        assert!(open.contains("delete table ip spore_egress"));
        assert!(!open.contains("chain"));
        let closed = Egress::closed().nft_script();
        assert!(closed.contains("table ip spore_isolated {"));
        assert!(closed.contains("policy drop"));
        let rules = egress(&["8.8.8.8"], &["0.0.0.0/0"]).unwrap().nft_script();
        let allow = rules.find("ip daddr { 8.8.8.8/32 } accept").unwrap();
        let deny = rules.find("ip daddr { 0.0.0.0/0 } drop").unwrap();
        assert!(allow < deny, "allowOut comes first: {rules}");
        assert!(rules.contains("iifname \"tap0\""));
        assert!(!rules.contains("table ip spore_isolated {"));
        // Overlapping blocks merged (older nft refuses them in one set).
        let deny_some = egress(&[], &["10.0.0.0/8", "1.2.3.4", "10.1.0.0/16"])
            .unwrap()
            .nft_script();
        assert!(
            deny_some.contains("ip daddr { 1.2.3.4/32, 10.0.0.0/8 } drop"),
            "{deny_some}"
        );
        assert!(!deny_some.contains("accept\n    iifname"));
    }

    #[test]
    fn closing_keeps_what_is_allowed() {
        let e = egress(&["8.8.8.8"], &["10.0.0.0/8"]).unwrap().and_closed();
        assert!(!e.internet());
        assert_eq!(e.allow.len(), 1);
        assert_eq!(Egress::default().and_closed(), Egress::closed());
    }
}
