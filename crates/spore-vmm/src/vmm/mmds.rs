//! The MMDS data store behind `PUT`/`PATCH`/`GET /mmds`: one JSON value,
//! replaced by PUT, merged by PATCH (RFC 7396 JSON merge patch), bounded in
//! serialized size (Firecracker's `--mmds-size-limit`, by default its API
//! payload limit). It lives in the VMM process, before and after boot, and
//! is not part of a snapshot (Firecracker does not save it either).
//! `PUT /mmds/config` needs a network interface, which spore does not have
//! yet: it is refused with Firecracker's unknown-interface answer.

use serde_json::Value;

use super::{bad, Vmm};
use crate::api::ApiError;
use crate::config::MmdsConfig;

/// Firecracker's default data store limit (its default API payload limit).
pub const DEFAULT_MMDS_SIZE_LIMIT: usize = 51200;

/// The store and its limit.
#[derive(Debug)]
pub struct MmdsStore {
    data: Value,
    /// PATCH needs a PUT first, as in Firecracker.
    initialized: bool,
    limit: usize,
}

impl Default for MmdsStore {
    fn default() -> Self {
        Self {
            data: Value::Object(Default::default()),
            initialized: false,
            limit: DEFAULT_MMDS_SIZE_LIMIT,
        }
    }
}

/// Firecracker's answers, status and words.
fn too_large() -> ApiError {
    ApiError::PayloadTooLarge(
        "MMDS limit exceeded error: The MMDS patch request doesn't fit.".into(),
    )
}

fn encoded_len(v: &Value) -> usize {
    // Serializing a Value cannot fail (all keys are strings).
    serde_json::to_vec(v).map_or(usize::MAX, |b| b.len())
}

impl MmdsStore {
    pub fn put(&mut self, data: Value) -> Result<(), ApiError> {
        if encoded_len(&data) > self.limit {
            return Err(too_large());
        }
        self.data = data;
        self.initialized = true;
        Ok(())
    }

    pub fn patch(&mut self, patch: &Value) -> Result<(), ApiError> {
        if !self.initialized {
            return Err(bad("MMDS error: The MMDS data store is not initialized."));
        }
        let mut merged = self.data.clone();
        merge_patch(&mut merged, patch);
        if encoded_len(&merged) > self.limit {
            return Err(too_large());
        }
        self.data = merged;
        Ok(())
    }

    pub fn get(&self) -> Value {
        self.data.clone()
    }
}

/// RFC 7396: an object patch merges key by key (`null` removes the key);
/// anything else replaces the target.
fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Default::default());
    }
    if let Value::Object(t) = target {
        for (k, v) in p {
            if v.is_null() {
                t.remove(k);
            } else {
                merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }
}

/// As Firecracker: a data store that nobody made before the microVM
/// started (no `PUT /mmds`, no MMDS config) does not exist afterwards, and
/// every `/mmds` request says so.
fn started_without_store(inner: &super::Inner) -> Result<(), ApiError> {
    if inner.vm().is_some() && !inner.mmds.initialized && inner.config.mmds_config.is_none() {
        return Err(bad("MMDS error: The MMDS data store is not initialized."));
    }
    Ok(())
}

impl Vmm {
    /// `--mmds-size-limit`: the largest serialized data store, in bytes.
    pub fn set_mmds_size_limit(&self, limit: usize) {
        self.lock().mmds.limit = limit;
    }

    /// `PUT /mmds` (and `--metadata`).
    pub fn put_mmds(&self, data: Value) -> Result<(), ApiError> {
        let mut inner = self.lock();
        started_without_store(&inner)?;
        inner.mmds.put(data)
    }

    /// `PATCH /mmds`.
    pub fn patch_mmds(&self, patch: &Value) -> Result<(), ApiError> {
        self.lock().mmds.patch(patch)
    }

    /// `GET /mmds`.
    pub fn mmds(&self) -> Result<Value, ApiError> {
        let inner = self.lock();
        started_without_store(&inner)?;
        Ok(inner.mmds.get())
    }

    /// `PUT /mmds/config`: checked against the VM's network interfaces as
    /// Firecracker checks it; a valid one is still refused, because the
    /// network device does not route MMDS requests yet.
    pub fn set_mmds_config(&self, c: MmdsConfig) -> Result<(), ApiError> {
        let mut inner = self.lock();
        crate::config::check_mmds_config(&c, &inner.config.network_interfaces).map_err(bad)?;
        super::preboot::configure(&mut inner, |cfg| cfg.mmds_config = Some(c))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn put_patch_get_as_firecracker() {
        let mut s = MmdsStore::default();
        assert_eq!(s.get(), json!({}));
        let e = s.patch(&json!({"a": 1})).unwrap_err();
        assert!(e.to_string().contains("not initialized"), "{e}");
        s.put(json!({"a": {"b": 1, "c": [1]}, "d": "x"})).unwrap();
        s.patch(&json!({"a": {"b": null, "e": true}, "d": null}))
            .unwrap();
        assert_eq!(s.get(), json!({"a": {"c": [1], "e": true}}));
        // A non-object patch replaces the whole store (RFC 7396).
        s.patch(&json!([2])).unwrap();
        assert_eq!(s.get(), json!([2]));
        s.patch(&json!({"k": "v"})).unwrap();
        assert_eq!(s.get(), json!({"k": "v"}));
    }

    #[test]
    fn size_limit_refuses_with_413_and_keeps_the_store() {
        let mut s = MmdsStore {
            limit: 100,
            ..Default::default()
        };
        let big = json!({"a": "x".repeat(120)});
        assert!(matches!(s.put(big), Err(ApiError::PayloadTooLarge(_))));
        let fits = json!({"a": "x".repeat(80)});
        s.put(fits.clone()).unwrap();
        let e = s.patch(&json!({"b": "y".repeat(30)})).unwrap_err();
        assert!(matches!(e, ApiError::PayloadTooLarge(ref m) if m.contains("doesn't fit")));
        assert_eq!(s.get(), fits);
    }
}
