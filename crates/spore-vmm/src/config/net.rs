//! `PUT /network-interfaces/{iface_id}` and the `network-interfaces` section
//! of a `--config-file`: Firecracker's `NetworkInterface` shape, validated
//! here (ids, tap names, MAC addresses, duplicates between interfaces). The
//! tap itself is opened when the VM is built; nothing here touches the host.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{null_is_default, RateLimiterConfig};

/// Longest interface name Linux takes (IFNAMSIZ less the NUL).
pub const MAX_TAP_NAME_LEN: usize = 15;
/// VIRTIO_NET_F_MTU's range, as Firecracker's API gives it.
pub const MTU_RANGE: std::ops::RangeInclusive<u16> = 68..=65535;

/// An Ethernet MAC address, written `AA:BB:CC:DD:EE:FF` (either case).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MacAddr(pub [u8; 6]);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid MAC address {0:?}: expected six hex bytes separated by ':', as AA:BB:CC:DD:EE:FF")]
pub struct MacAddrError(pub String);

impl FromStr for MacAddr {
    type Err = MacAddrError;

    fn from_str(s: &str) -> Result<Self, MacAddrError> {
        let err = || MacAddrError(s.chars().take(64).collect());
        let mut bytes = [0u8; 6];
        let mut parts = s.split(':');
        for b in &mut bytes {
            let part = parts.next().ok_or_else(err)?;
            if part.len() != 2 || !part.bytes().all(|c| c.is_ascii_hexdigit()) {
                return Err(err());
            }
            *b = u8::from_str_radix(part, 16).map_err(|_| err())?;
        }
        if parts.next().is_some() {
            return Err(err());
        }
        Ok(MacAddr(bytes))
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

impl Serialize for MacAddr {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for MacAddr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// One guest network interface backed by a host tap device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkInterfaceConfig {
    pub iface_id: String,
    /// The host's tap device, opened by name (`ip tuntap add dev <name> mode tap`).
    pub host_dev_name: String,
    /// The guest's MAC (in the device's config space); without one the
    /// guest driver picks a random one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_mac: Option<MacAddr>,
    /// Advertised to the guest through VIRTIO_NET_F_MTU when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx_rate_limiter: Option<RateLimiterConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tx_rate_limiter: Option<RateLimiterConfig>,
}

/// `PATCH /network-interfaces/{iface_id}` (Firecracker's
/// `PartialNetworkInterface`): new limits for a running VM's interface; a
/// limiter left out keeps its setting.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartialNetworkInterface {
    pub iface_id: String,
    #[serde(default, deserialize_with = "null_is_default")]
    pub rx_rate_limiter: Option<RateLimiterConfig>,
    #[serde(default, deserialize_with = "null_is_default")]
    pub tx_rate_limiter: Option<RateLimiterConfig>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NetConfigError {
    #[error("iface_id must be non-empty and made of letters, digits, '_' and '-', got {0:?}")]
    IfaceId(String),
    #[error("iface_id in the path ({path}) differs from iface_id in the body ({body})")]
    IdMismatch { path: String, body: String },
    #[error("host_dev_name must not be empty")]
    EmptyTapName,
    #[error("host_dev_name {name:?} is {len} bytes; Linux interface names are at most {MAX_TAP_NAME_LEN}")]
    TapNameTooLong { name: String, len: usize },
    #[error("host_dev_name {0:?} may not contain '/' or NUL")]
    TapNameChars(String),
    #[error("mtu {0} is outside 68..=65535")]
    Mtu(u16),
    /// Firecracker's message.
    #[error("The MAC address is already in use: {0}")]
    GuestMacInUse(MacAddr),
    #[error(
        "Open tap device failed: the host device {0} is already used by another network interface"
    )]
    TapInUse(String),
}

impl NetworkInterfaceConfig {
    pub fn validate(&self) -> Result<(), NetConfigError> {
        validate_iface_id(&self.iface_id)?;
        validate_tap_name(&self.host_dev_name)?;
        if let Some(m) = self.mtu.filter(|m| !MTU_RANGE.contains(m)) {
            return Err(NetConfigError::Mtu(m));
        }
        Ok(())
    }
}

pub fn validate_iface_id(id: &str) -> Result<(), NetConfigError> {
    let ok = !id.is_empty()
        && id
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-');
    if ok {
        Ok(())
    } else {
        Err(NetConfigError::IfaceId(id.chars().take(64).collect()))
    }
}

/// A Linux interface name: 1..=15 bytes, no '/' or NUL.
pub fn validate_tap_name(name: &str) -> Result<(), NetConfigError> {
    if name.is_empty() {
        return Err(NetConfigError::EmptyTapName);
    }
    if name.len() > MAX_TAP_NAME_LEN {
        return Err(NetConfigError::TapNameTooLong {
            name: name.chars().take(64).collect(),
            len: name.len(),
        });
    }
    if name.bytes().any(|c| c == b'/' || c == 0) {
        return Err(NetConfigError::TapNameChars(name.into()));
    }
    Ok(())
}

/// Adds `new` to `ifaces` or replaces the interface with its id, as Firecracker
/// does, refusing a tap name or guest MAC another interface already has.
pub fn upsert_interface(
    ifaces: &mut Vec<NetworkInterfaceConfig>,
    new: NetworkInterfaceConfig,
) -> Result<(), NetConfigError> {
    check_unique(ifaces, &new)?;
    match ifaces.iter_mut().find(|i| i.iface_id == new.iface_id) {
        Some(i) => *i = new,
        None => ifaces.push(new),
    }
    Ok(())
}

/// Refuses `new`'s tap or MAC when another interface (another id) has it.
fn check_unique(
    ifaces: &[NetworkInterfaceConfig],
    new: &NetworkInterfaceConfig,
) -> Result<(), NetConfigError> {
    for other in ifaces.iter().filter(|i| i.iface_id != new.iface_id) {
        if let Some(mac) = new.guest_mac.filter(|m| other.guest_mac == Some(*m)) {
            return Err(NetConfigError::GuestMacInUse(mac));
        }
        if other.host_dev_name == new.host_dev_name {
            return Err(NetConfigError::TapInUse(new.host_dev_name.clone()));
        }
    }
    Ok(())
}

/// Checks a whole list (a config file's section): each interface, then
/// duplicate ids, taps and MACs.
pub fn validate_interfaces(ifaces: &[NetworkInterfaceConfig]) -> Result<(), NetConfigError> {
    for (n, i) in ifaces.iter().enumerate() {
        i.validate()?;
        let earlier = &ifaces[..n];
        if earlier.iter().any(|e| e.iface_id == i.iface_id) {
            return Err(NetConfigError::IfaceId(format!(
                "{} (given twice)",
                i.iface_id
            )));
        }
        check_unique(earlier, i)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iface(id: &str, tap: &str, mac: Option<&str>) -> NetworkInterfaceConfig {
        NetworkInterfaceConfig {
            iface_id: id.into(),
            host_dev_name: tap.into(),
            guest_mac: mac.map(|m| m.parse().unwrap()),
            mtu: None,
            rx_rate_limiter: None,
            tx_rate_limiter: None,
        }
    }

    #[test]
    fn mac_addresses_parse_and_print() {
        let m: MacAddr = "AA:bb:0C:dd:EE:0f".parse().unwrap();
        assert_eq!(m.0, [0xaa, 0xbb, 0x0c, 0xdd, 0xee, 0x0f]);
        assert_eq!(m.to_string(), "aa:bb:0c:dd:ee:0f");
        for bad in [
            "",
            "aa:bb:cc:dd:ee",
            "aa:bb:cc:dd:ee:ff:00",
            "aa:bb:cc:dd:ee:f",
            "aa:bb:cc:dd:ee:fff",
            "aa-bb-cc-dd-ee-ff",
            "gg:bb:cc:dd:ee:ff",
            "+a:bb:cc:dd:ee:ff",
        ] {
            assert!(bad.parse::<MacAddr>().is_err(), "{bad}");
        }
    }

    #[test]
    fn body_parses_firecrackers_shape() {
        let i: NetworkInterfaceConfig = serde_json::from_str(
            r#"{"iface_id":"eth0","host_dev_name":"tap0","guest_mac":"06:00:AC:10:00:02",
                "rx_rate_limiter":{"bandwidth":{"size":1000,"refill_time":100}},
                "tx_rate_limiter":null}"#,
        )
        .unwrap();
        assert_eq!(i.guest_mac.unwrap().0[5], 2);
        assert!(i.rx_rate_limiter.is_some() && i.tx_rate_limiter.is_none());
        let e = serde_json::from_str::<NetworkInterfaceConfig>(
            r#"{"iface_id":"eth0","host_dev_name":"tap0","guest_mac":"06:00:AC:10:00"}"#,
        )
        .unwrap_err();
        assert!(e.to_string().contains("invalid MAC address"), "{e}");
        assert!(serde_json::from_str::<NetworkInterfaceConfig>(
            r#"{"iface_id":"eth0","host_dev_name":"tap0","allow_mmds_requests":true}"#
        )
        .is_err());
        let s = serde_json::to_string(&i).unwrap();
        assert!(s.contains(r#""guest_mac":"06:00:ac:10:00:02""#), "{s}");
    }

    #[test]
    fn ids_and_tap_names_are_checked() {
        assert!(iface("eth0", "tap0", None).validate().is_ok());
        assert!(iface("a_b-C9", "tap0", None).validate().is_ok());
        for id in ["", "eth 0", "eth/0", "é"] {
            assert!(matches!(
                iface(id, "tap0", None).validate(),
                Err(NetConfigError::IfaceId(_))
            ));
        }
        assert_eq!(
            iface("eth0", "", None).validate(),
            Err(NetConfigError::EmptyTapName)
        );
        assert!(iface("eth0", "123456789012345", None).validate().is_ok());
        assert!(matches!(
            iface("eth0", "1234567890123456", None).validate(),
            Err(NetConfigError::TapNameTooLong { len: 16, .. })
        ));
        assert!(iface("eth0", "a/b", None).validate().is_err());
        let mut m = iface("eth0", "tap0", None);
        m.mtu = Some(67);
        assert_eq!(m.validate(), Err(NetConfigError::Mtu(67)));
    }

    #[test]
    fn duplicates_are_refused_and_same_id_replaces() {
        let mut v = Vec::new();
        upsert_interface(&mut v, iface("eth0", "tap0", Some("06:00:00:00:00:01"))).unwrap();
        // Same tap, other id.
        assert_eq!(
            upsert_interface(&mut v, iface("eth1", "tap0", None)),
            Err(NetConfigError::TapInUse("tap0".into()))
        );
        // Same MAC, other id.
        assert!(matches!(
            upsert_interface(&mut v, iface("eth1", "tap1", Some("06:00:00:00:00:01"))),
            Err(NetConfigError::GuestMacInUse(_))
        ));
        // Same id: replaced, even with the same tap and MAC.
        upsert_interface(&mut v, iface("eth0", "tap0", Some("06:00:00:00:00:01"))).unwrap();
        upsert_interface(&mut v, iface("eth0", "tap9", None)).unwrap();
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].host_dev_name, "tap9");
        upsert_interface(&mut v, iface("eth1", "tap0", None)).unwrap();
        assert_eq!(v.len(), 2);
        assert!(validate_interfaces(&v).is_ok());
        v.push(iface("eth2", "tap0", None));
        assert!(validate_interfaces(&v).is_err());
    }
}
