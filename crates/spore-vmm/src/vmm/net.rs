//! `PUT /network-interfaces/{iface_id}` before boot and `PATCH
//! /network-interfaces/{iface_id}` (new rate limits) after, with
//! Firecracker's refusals: a PUT after boot, a PATCH before, an unknown id.

use super::preboot::configure;
use super::{bad, Inner, Vmm};
use crate::api::ApiError;
use crate::config::{
    upsert_interface, ConfigError, NetworkInterfaceConfig, PartialNetworkInterface,
};

/// Firecracker's refusal of a configuration call after boot.
const NOT_AFTER_START: &str =
    "The requested operation is not supported after starting the microVM.";

impl Vmm {
    /// `PUT /network-interfaces/{iface_id}`: adds the interface or replaces
    /// the one with its id; another interface's tap or MAC is refused.
    pub fn put_network_interface(&self, n: NetworkInterfaceConfig) -> Result<(), ApiError> {
        n.validate().map_err(ConfigError::from)?;
        let mut inner = self.lock();
        if inner.built().is_ok() {
            return Err(bad(NOT_AFTER_START));
        }
        let mut ifaces = inner.config.network_interfaces.clone();
        upsert_interface(&mut ifaces, n).map_err(ConfigError::from)?;
        configure(&mut inner, |c| c.network_interfaces = ifaces)
    }

    /// `PATCH /network-interfaces/{iface_id}`: the running interface's
    /// rx/tx limits (a limiter left out is kept).
    pub fn patch_network_interface(&self, p: &PartialNetworkInterface) -> Result<(), ApiError> {
        let mut guard = self.lock();
        let Inner { config, phase, .. } = &mut *guard;
        let Ok(built) = phase.built() else {
            return Err(bad(
                "The requested operation is not supported before starting the microVM \
                 (change the interface with PUT /network-interfaces/{iface_id})",
            ));
        };
        let unknown = || bad(format!("Invalid network interface id: {}", p.iface_id));
        let handle = built
            .vm
            .nets()
            .iter()
            .find(|h| h.iface_id() == p.iface_id)
            .ok_or_else(unknown)?;
        let iface = config
            .network_interfaces
            .iter_mut()
            .find(|i| i.iface_id == p.iface_id)
            .ok_or_else(unknown)?;
        handle.update_rate_limiters(p.rx_rate_limiter.as_ref(), p.tx_rate_limiter.as_ref());
        // GET /vm/config (and a snapshot's configuration) show the limits in force.
        (iface.rx_rate_limiter, iface.tx_rate_limiter) = handle.rate_limiters();
        Ok(())
    }
}
