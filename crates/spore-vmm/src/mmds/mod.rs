//! The microVM metadata service (MMDS), as Firecracker serves it.
//!
//! - this module: the data store the API fills (`PUT`/`PATCH`/`GET /mmds`)
//!   and the guest reads, shared between the API thread and every network
//!   interface that routes MMDS requests ([`SharedMmds`]), and its snapshot
//!   state;
//! - [`http`]: the guest's HTTP requests and their answers (V1, V2 session
//!   tokens, JSON and IMDS formats);
//! - [`token`]: V2 session tokens;
//! - [`stack`]: the TCP/IP endpoint at the MMDS address, which the
//!   virtio-net worker hands the guest's MMDS frames to.

pub mod http;
pub mod stack;
pub mod token;

use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::config::{MmdsConfig, MmdsVersion};

/// Firecracker's default data store limit (its default API payload limit).
pub const DEFAULT_MMDS_SIZE_LIMIT: usize = 51200;

/// The store, its settings and its token authority.
#[derive(Debug)]
pub struct Mmds {
    data: Value,
    /// PATCH needs a PUT first, as in Firecracker.
    initialized: bool,
    limit: usize,
    version: MmdsVersion,
    /// Always answer in IMDS format, whatever `Accept` says.
    imds_compat: bool,
    tokens: token::TokenAuthority,
}

/// What the API thread and the network workers share.
pub type SharedMmds = Arc<Mutex<Mmds>>;

/// Why a store change was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum StoreError {
    #[error("MMDS limit exceeded error: The MMDS patch request doesn't fit.")]
    TooLarge,
    #[error("MMDS error: The MMDS data store is not initialized.")]
    NotInitialized,
}

/// The store as a snapshot keeps it (so that a restored VM, and each clone,
/// has the metadata its source had; tokens are not kept: a restored VM
/// asks for new ones).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MmdsState {
    /// The data, as JSON text (bincode cannot carry a `Value`).
    pub data_json: String,
    pub initialized: bool,
    pub limit: u64,
}

impl Default for Mmds {
    fn default() -> Self {
        Self {
            data: Value::Object(Default::default()),
            initialized: false,
            limit: DEFAULT_MMDS_SIZE_LIMIT,
            version: MmdsVersion::V1,
            imds_compat: false,
            tokens: token::TokenAuthority::new(),
        }
    }
}

fn encoded_len(v: &Value) -> usize {
    // Serializing a Value cannot fail (all keys are strings).
    serde_json::to_vec(v).map_or(usize::MAX, |b| b.len())
}

impl Mmds {
    pub fn shared() -> SharedMmds {
        Arc::new(Mutex::new(Self::default()))
    }

    /// `--mmds-size-limit`: the largest serialized data store, in bytes.
    pub fn set_limit(&mut self, limit: usize) {
        self.limit = limit;
    }

    pub fn is_initialized(&self) -> bool {
        self.initialized
    }

    /// The version and format `PUT /mmds/config` chose.
    pub fn configure(&mut self, config: &MmdsConfig) {
        self.version = config.version;
        self.imds_compat = config.imds_compat;
    }

    pub fn put(&mut self, data: Value) -> Result<(), StoreError> {
        if encoded_len(&data) > self.limit {
            return Err(StoreError::TooLarge);
        }
        self.data = data;
        self.initialized = true;
        Ok(())
    }

    pub fn patch(&mut self, patch: &Value) -> Result<(), StoreError> {
        if !self.initialized {
            return Err(StoreError::NotInitialized);
        }
        let mut merged = self.data.clone();
        merge_patch(&mut merged, patch);
        if encoded_len(&merged) > self.limit {
            return Err(StoreError::TooLarge);
        }
        self.data = merged;
        Ok(())
    }

    pub fn get(&self) -> Value {
        self.data.clone()
    }

    pub fn save(&self) -> MmdsState {
        MmdsState {
            data_json: self.data.to_string(),
            initialized: self.initialized,
            limit: self.limit as u64,
        }
    }

    /// Takes a snapshot's store (its tokens are not carried over).
    pub fn restore(&mut self, state: &MmdsState) -> Result<(), serde_json::Error> {
        self.data = serde_json::from_str(&state.data_json)?;
        self.initialized = state.initialized;
        self.limit = usize::try_from(state.limit).unwrap_or(usize::MAX);
        self.tokens = token::TokenAuthority::new();
        Ok(())
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn put_patch_get_as_firecracker() {
        let mut s = Mmds::default();
        assert_eq!(s.get(), json!({}));
        assert_eq!(s.patch(&json!({"a": 1})), Err(StoreError::NotInitialized));
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
    fn size_limit_refuses_and_keeps_the_store() {
        let mut s = Mmds::default();
        s.set_limit(100);
        let big = json!({"a": "x".repeat(120)});
        assert_eq!(s.put(big), Err(StoreError::TooLarge));
        let fits = json!({"a": "x".repeat(80)});
        s.put(fits.clone()).unwrap();
        assert_eq!(
            s.patch(&json!({"b": "y".repeat(30)})),
            Err(StoreError::TooLarge)
        );
        assert_eq!(s.get(), fits);
    }

    #[test]
    fn the_store_survives_save_and_restore_without_its_tokens() {
        let mut s = Mmds::default();
        s.put(json!({"latest": {"meta-data": {"id": "i-1"}}}))
            .unwrap();
        let token = s.tokens.issue(60).unwrap();
        assert!(s.tokens.is_valid(&token));
        let state = s.save();
        let mut r = Mmds::default();
        r.restore(&state).unwrap();
        assert_eq!(r.get(), s.get());
        assert!(r.is_initialized());
        assert!(!r.tokens.is_valid(&token));
    }
}
