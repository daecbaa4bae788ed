//! Snapshot state of a virtio-net device: which interface it is, the tap it
//! used, its config space and its rate limiters' buckets. The queues (and
//! the features the driver acked) are the transport's state. A restore
//! reopens the tap by name, the saved one or the one a `network_overrides`
//! entry (or a clone's namespace) gives, so the restored VM is on the
//! network again; frames in flight at the snapshot are lost, as on a wire.

use serde::{Deserialize, Serialize};

use super::device::NetConfigSpace;
use super::{Net, NetError};
use crate::config::NetworkInterfaceConfig;
use crate::host::lock;
use crate::persist::Persist;
use crate::rate_limiter::{RateLimiter, RateLimiterState};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetState {
    pub iface_id: String,
    /// The tap the snapshot's VM used (a restore's configuration may name another).
    pub tap_name: String,
    /// The config space the guest read (a clone may have changed its MAC).
    pub mac: [u8; 6],
    pub mtu: u16,
    pub rx_rate_limiter: RateLimiterState,
    pub tx_rate_limiter: RateLimiterState,
}

#[derive(Debug, thiserror::Error)]
pub enum NetStateError {
    #[error(transparent)]
    Open(#[from] NetError),
    #[error("network interface {saved}: the configuration names interface {config} instead")]
    IfaceMismatch { saved: String, config: String },
    #[error("network interface {0}: cannot create its rate limiter timers: {1}")]
    Timer(String, #[source] std::io::Error),
}

impl Persist for Net {
    type State = NetState;
    /// The interface as the restored VM's configuration describes it (its
    /// `host_dev_name` is the tap reopened).
    type Args = NetworkInterfaceConfig;
    type Error = NetStateError;

    fn save(&self) -> NetState {
        let (rx, tx) = self.limiters();
        let config = self.config_space();
        NetState {
            iface_id: self.iface_id().to_string(),
            tap_name: self.tap_name().to_string(),
            mac: config.mac,
            mtu: config.mtu,
            rx_rate_limiter: lock(rx).save(),
            tx_rate_limiter: lock(tx).save(),
        }
    }

    fn restore(cfg: NetworkInterfaceConfig, state: &NetState) -> Result<Self, NetStateError> {
        if cfg.iface_id != state.iface_id {
            return Err(NetStateError::IfaceMismatch {
                saved: state.iface_id.clone(),
                config: cfg.iface_id,
            });
        }
        let net = Net::open(&cfg)?;
        restore_into(net, state)
    }
}

/// Puts a saved state into a device made from the configuration.
pub(super) fn restore_into(mut net: Net, state: &NetState) -> Result<Net, NetStateError> {
    let timer = |e| NetStateError::Timer(state.iface_id.clone(), e);
    let rx = RateLimiter::restore(&state.rx_rate_limiter).map_err(timer)?;
    let tx = RateLimiter::restore(&state.tx_rate_limiter).map_err(timer)?;
    net.set_limiters(rx, tx);
    net.set_config_space(NetConfigSpace {
        mac: state.mac,
        mtu: state.mtu,
    });
    Ok(net)
}
