//! `PUT`/`PATCH`/`GET /mmds` and `PUT /mmds/config`: the API's side of
//! the MMDS data store ([`crate::mmds`]), which lives in the VMM process
//! before and after boot and is shared with the network interfaces that
//! route the guest's MMDS requests. A snapshot keeps it (and each clone
//! starts with a copy); Firecracker keeps only the MMDS settings.

use serde_json::Value;

use super::{bad, Vmm};
use crate::api::ApiError;
use crate::config::MmdsConfig;
use crate::host::lock;
use crate::mmds::StoreError;

fn api_error(e: StoreError) -> ApiError {
    match e {
        StoreError::TooLarge => ApiError::PayloadTooLarge(e.to_string()),
        StoreError::NotInitialized => bad(e),
    }
}

/// As Firecracker: a data store that nobody made before the microVM
/// started (no `PUT /mmds`, no MMDS config) does not exist afterwards, and
/// every `/mmds` request says so.
fn started_without_store(inner: &super::Inner) -> Result<(), ApiError> {
    if inner.vm().is_some()
        && !lock(&inner.mmds).is_initialized()
        && inner.config.mmds_config.is_none()
    {
        return Err(bad("MMDS error: The MMDS data store is not initialized."));
    }
    Ok(())
}

impl Vmm {
    /// `--mmds-size-limit`: the largest serialized data store, in bytes.
    pub fn set_mmds_size_limit(&self, limit: usize) {
        lock(&self.lock().mmds).set_limit(limit);
    }

    /// `PUT /mmds` (and `--metadata`).
    pub fn put_mmds(&self, data: Value) -> Result<(), ApiError> {
        let inner = self.lock();
        started_without_store(&inner)?;
        let result = lock(&inner.mmds).put(data).map_err(api_error);
        result
    }

    /// `PATCH /mmds`.
    pub fn patch_mmds(&self, patch: &Value) -> Result<(), ApiError> {
        lock(&self.lock().mmds).patch(patch).map_err(api_error)
    }

    /// `GET /mmds`.
    pub fn mmds(&self) -> Result<Value, ApiError> {
        let inner = self.lock();
        started_without_store(&inner)?;
        let data = lock(&inner.mmds).get();
        Ok(data)
    }

    /// `PUT /mmds/config` (before boot): checked against the VM's network
    /// interfaces as Firecracker checks it.
    pub fn set_mmds_config(&self, c: MmdsConfig) -> Result<(), ApiError> {
        let mut inner = self.lock();
        crate::config::check_mmds_config(&c, &inner.config.network_interfaces).map_err(bad)?;
        super::preboot::configure(&mut inner, |cfg| cfg.mmds_config = Some(c))
    }
}
