//! `PUT /mmds/config`: which network interfaces forward MMDS requests, the
//! MMDS version and address. Checked as Firecracker checks it, in its order:
//! the address, an empty list, then interfaces that do not exist.

use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};

/// MMDS protocol version: V1 (plain GETs) or V2 (session tokens).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum MmdsVersion {
    #[default]
    V1,
    V2,
}

/// Firecracker's `MmdsConfig` body.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MmdsConfig {
    #[serde(default)]
    pub version: MmdsVersion,
    pub network_interfaces: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv4_address: Option<Ipv4Addr>,
    #[serde(default)]
    pub imds_compat: bool,
}

/// Firecracker's messages, prefixed as it prefixes them.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MmdsConfigError {
    #[error("MMMDS config error: The MMDS IPv4 address is not link local.")]
    NotLinkLocal,
    #[error("MMMDS config error: The list of network interface IDs that allow forwarding MMDS requests is empty.")]
    EmptyInterfaces,
    #[error("MMMDS config error: The list of network interface IDs provided contains at least one ID that does not correspond to any existing network interface.")]
    UnknownInterface,
}

impl MmdsConfig {
    /// `existing`: the ids of the VM's network interfaces.
    pub fn validate(&self, existing: &[&str]) -> Result<(), MmdsConfigError> {
        if let Some(a) = self.ipv4_address {
            if !is_usable_link_local(a) {
                return Err(MmdsConfigError::NotLinkLocal);
            }
        }
        if self.network_interfaces.is_empty() {
            return Err(MmdsConfigError::EmptyInterfaces);
        }
        if self
            .network_interfaces
            .iter()
            .any(|i| !existing.contains(&i.as_str()))
        {
            return Err(MmdsConfigError::UnknownInterface);
        }
        Ok(())
    }
}

/// 169.254.1.0 – 169.254.254.255: link-local without the two reserved /24s.
fn is_usable_link_local(a: Ipv4Addr) -> bool {
    let [x, y, z, _] = a.octets();
    x == 169 && y == 254 && (1..=254).contains(&z)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(ifaces: &[&str], ip: Option<&str>) -> MmdsConfig {
        MmdsConfig {
            version: MmdsVersion::V2,
            network_interfaces: ifaces.iter().map(|s| s.to_string()).collect(),
            ipv4_address: ip.map(|s| s.parse().unwrap()),
            imds_compat: false,
        }
    }

    #[test]
    fn checks_in_firecrackers_order() {
        assert_eq!(
            cfg(&[], Some("1.2.3.4")).validate(&[]),
            Err(MmdsConfigError::NotLinkLocal)
        );
        assert_eq!(
            cfg(&[], Some("169.254.0.1")).validate(&[]),
            Err(MmdsConfigError::NotLinkLocal)
        );
        assert_eq!(
            cfg(&[], None).validate(&[]),
            Err(MmdsConfigError::EmptyInterfaces)
        );
        assert_eq!(
            cfg(&["eth0"], Some("169.254.169.254")).validate(&[]),
            Err(MmdsConfigError::UnknownInterface)
        );
        assert_eq!(cfg(&["eth0"], None).validate(&["eth0"]), Ok(()));
    }

    #[test]
    fn parses_firecrackers_body() {
        let c: MmdsConfig = serde_json::from_str(
            r#"{"version":"V2","network_interfaces":["eth0"],"ipv4_address":"169.254.170.2","imds_compat":true}"#,
        )
        .unwrap();
        assert_eq!(c.version, MmdsVersion::V2);
        assert!(c.imds_compat);
        assert!(serde_json::from_str::<MmdsConfig>(r#"{"version":"V2"}"#).is_err());
        assert!(
            serde_json::from_str::<MmdsConfig>(r#"{"version":"V3","network_interfaces":[]}"#)
                .is_err()
        );
    }
}
