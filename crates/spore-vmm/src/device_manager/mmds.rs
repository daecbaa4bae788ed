//! The MMDS data store among a VM's devices: set up from `mmds-config` when
//! the VM is built, filled from the snapshot on a restore (so a clone starts
//! with a copy of its source's), and saved with the devices' states.

use std::net::Ipv4Addr;

use super::persist::StateLookup;
use super::DeviceError;
use crate::config::VmConfig;
use crate::host::lock;
use crate::mmds::stack::DEFAULT_MMDS_IPV4;
use crate::mmds::SharedMmds;

/// Where the guest reaches the MMDS.
pub struct MmdsRoute {
    pub store: SharedMmds,
    pub ipv4: Ipv4Addr,
    /// The interfaces that route MMDS requests.
    pub ifaces: Vec<String>,
}

impl MmdsRoute {
    pub fn serves(&self, iface_id: &str) -> bool {
        self.ifaces.iter().any(|i| i == iface_id)
    }
}

/// Restores the saved store (if the snapshot has one) and applies the
/// configuration; the route when the VM has MMDS configured.
pub(super) fn attach(
    store: &SharedMmds,
    config: &VmConfig,
    saved: Option<&mut StateLookup<'_>>,
) -> Result<Option<MmdsRoute>, DeviceError> {
    if let Some(state) = saved.map(|s| s.mmds()).transpose()?.flatten() {
        lock(store)
            .restore(state)
            .map_err(|e| DeviceError::Restore {
                id: super::persist::DeviceId::mmds(),
                detail: format!("its data is not JSON: {e}"),
            })?;
    }
    let Some(c) = &config.mmds_config else {
        return Ok(None);
    };
    lock(store).configure(c);
    Ok(Some(MmdsRoute {
        store: store.clone(),
        ipv4: c.ipv4_address.unwrap_or(DEFAULT_MMDS_IPV4),
        ifaces: c.network_interfaces.clone(),
    }))
}
