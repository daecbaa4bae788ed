//! One VM's tmem object store: keys → values in VMM memory, with byte
//! accounting, a quota, optional lz4 compression and counters.
//!
//! The pool never sees guest memory: the device hands it owned keys and
//! values (already bounded by the ABI's limits) and reads stored values back
//! through [`Pool::get_with`]. What counts against the quota is what the
//! VMM actually spends ([`super::accounting`]): each key and each stored
//! (possibly compressed) value as the allocator's chunk for it, and the
//! object's share of the hash table at its worst load, so that a guest
//! storing millions of empty values is bounded too.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use spore_abi::tmem::{TmemStats, MAX_KEY_LEN, MAX_VALUE_LEN};

use super::host_cap::{HostCap, HostCapError};
use super::Object;
pub use crate::config::Compression;

/// Why a put was refused; the pool is unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuotaExceeded;

/// Per-operation counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    pub puts: u64,
    pub gets: u64,
    pub get_hits: u64,
    pub invalidates: u64,
    pub flushes: u64,
    pub batches: u64,
    /// Puts refused for the quota.
    pub refused: u64,
    /// Calls refused as malformed (bad address, length, op or request).
    pub invalid: u64,
}

/// A snapshot of the pool's state, as `GET /tmem` reports it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PoolStats {
    pub objects: u64,
    /// Keys and values as the guest gave them.
    pub bytes_used: u64,
    /// What the VMM holds for them: keys, stored values, per-object overhead.
    pub bytes_stored: u64,
    pub quota_bytes: u64,
    pub compression: Compression,
    #[serde(flatten)]
    pub counters: Counters,
    /// The host-wide cap this pool draws on, when one is set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_cap: Option<HostCapStats>,
}

/// This VMM's part of the host-wide cap (`GET /tmem` as `host_cap`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct HostCapStats {
    pub cap_bytes: u64,
    /// What this VMM has reserved of it (whole granules above its use).
    pub reserved_bytes: u64,
    /// Puts refused because the host's cap was reached (also in `refused`).
    pub refused: u64,
}

impl PoolStats {
    /// The guest-visible form (`STATS`).
    pub fn to_abi(&self) -> TmemStats {
        TmemStats {
            objects: self.objects,
            bytes_used: self.bytes_used,
            bytes_stored: self.bytes_stored,
            quota_bytes: self.quota_bytes,
            puts: self.counters.puts,
            gets: self.counters.gets,
            get_hits: self.counters.get_hits,
            invalidates: self.counters.invalidates,
            flushes: self.counters.flushes,
            batches: self.counters.batches,
            refused: self.counters.refused,
        }
    }
}

pub struct Pool {
    objects: HashMap<Box<[u8]>, Object>,
    bytes_used: u64,
    bytes_stored: u64,
    quota_bytes: u64,
    compression: Compression,
    pub counters: Counters,
    host: Option<HostCap>,
}

/// A looked-up value, to be copied out by the caller.
pub enum Value<'a> {
    Raw(&'a [u8]),
    /// lz4 block; decompresses to `len` bytes.
    Lz4 {
        block: &'a [u8],
        len: usize,
    },
}

impl Value<'_> {
    pub fn len(&self) -> usize {
        match self {
            Value::Raw(b) => b.len(),
            Value::Lz4 { len, .. } => *len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Decompresses (or copies) into `out`, which must be `len()` bytes.
    pub fn copy_to(&self, out: &mut [u8]) -> Result<(), lz4_flex::block::DecompressError> {
        match self {
            Value::Raw(b) => out.copy_from_slice(b),
            Value::Lz4 { block, len } => {
                let n = lz4_flex::block::decompress_into(block, out)?;
                if n != *len {
                    return Err(lz4_flex::block::DecompressError::ExpectedAnotherByte);
                }
            }
        }
        Ok(())
    }
}

/// One stored object in a snapshot: as the pool holds it (still compressed).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectState {
    /// Bytes, not sequences of u8: the same bincode layout, copied whole
    /// rather than byte by byte (a pool can hold gigabytes).
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    /// The value's length as the guest gave it.
    pub len: u64,
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
    pub compressed: bool,
}

/// A pool's snapshot state: every object, the quota and the counters. The
/// byte totals are recomputed on restore rather than trusted.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolState {
    pub quota_bytes: u64,
    pub compression: Compression,
    pub counters: Counters,
    /// Sorted by key, so equal pools give equal snapshots.
    pub objects: Vec<ObjectState>,
}

/// Why a pool's snapshot state cannot be restored.
#[derive(Debug, thiserror::Error)]
pub enum PoolStateError {
    #[error("tmem object {index}: {detail}")]
    Object { index: usize, detail: String },
}

impl Pool {
    /// The pool's snapshot state (copies every object).
    pub fn save(&self) -> PoolState {
        let mut objects: Vec<ObjectState> = self
            .objects
            .iter()
            .map(|(key, o)| ObjectState {
                key: key.to_vec(),
                len: u64::from(o.len),
                data: o.data.to_vec(),
                compressed: o.compressed,
            })
            .collect();
        objects.sort_unstable_by(|a, b| a.key.cmp(&b.key));
        PoolState {
            quota_bytes: self.quota_bytes,
            compression: self.compression,
            counters: self.counters,
            objects,
        }
    }

    /// Rebuilds a pool from its snapshot state, checking every object against
    /// the ABI's limits (a state file is checksummed, not trusted blindly).
    pub fn restore(state: PoolState) -> Result<Self, PoolStateError> {
        let mut pool = Pool::new(state.quota_bytes, state.compression);
        pool.counters = state.counters;
        for (index, o) in state.objects.into_iter().enumerate() {
            let bad = |detail: String| PoolStateError::Object { index, detail };
            if o.key.is_empty() || o.key.len() as u64 > MAX_KEY_LEN {
                return Err(bad(format!("key of {} bytes", o.key.len())));
            }
            if o.len > MAX_VALUE_LEN {
                return Err(bad(format!("value of {} bytes", o.len)));
            }
            if !o.compressed && o.data.len() as u64 != o.len {
                return Err(bad(format!(
                    "{} stored bytes for a {}-byte value",
                    o.data.len(),
                    o.len
                )));
            }
            if pool.objects.contains_key(o.key.as_slice()) {
                return Err(bad("duplicate key".into()));
            }
            pool.bytes_stored += Object::charge(&o.key, &o.data);
            pool.bytes_used += o.key.len() as u64 + o.len;
            #[allow(
                clippy::cast_possible_truncation,
                reason = "at most MAX_VALUE_LEN (16 MiB), checked above"
            )]
            let len = o.len as u32;
            pool.objects.insert(
                o.key.into_boxed_slice(),
                Object {
                    len,
                    data: o.data.into_boxed_slice(),
                    compressed: o.compressed,
                },
            );
        }
        Ok(pool)
    }

    pub fn new(quota_bytes: u64, compression: Compression) -> Self {
        Self {
            objects: HashMap::new(),
            bytes_used: 0,
            bytes_stored: 0,
            quota_bytes,
            compression,
            counters: Counters::default(),
            host: None,
        }
    }

    /// Draws this pool (and what it already holds) on the host-wide cap.
    pub fn attach_host_cap(&mut self, mut cap: HostCap) -> Result<(), HostCapError> {
        cap.ensure(self.bytes_stored)?;
        self.host = Some(cap);
        Ok(())
    }

    /// Gives the host's cap back what the pool no longer uses.
    fn host_shrink(&mut self) {
        if let Some(h) = &mut self.host {
            h.shrink(self.bytes_stored);
        }
    }

    pub fn set_quota(&mut self, quota_bytes: u64) {
        self.quota_bytes = quota_bytes;
    }

    /// Stores `value` under `key`, replacing any previous value. Refused (and
    /// nothing changes) if the pool would end above its quota and larger than
    /// it is now; so after the quota is lowered below use, a put that shrinks
    /// the pool still works.
    pub fn put(&mut self, key: Vec<u8>, value: Vec<u8>) -> Result<(), QuotaExceeded> {
        self.counters.puts += 1;
        let len = value.len();
        // Boxed without reallocating: the device reads values into vectors
        // of exactly their length (and lz4_flex shrinks its output).
        let (data, compressed) = match self.compression {
            Compression::Lz4 if !value.is_empty() => {
                let c = lz4_flex::block::compress(&value);
                if c.len() < value.len() {
                    (c.into_boxed_slice(), true)
                } else {
                    (value.into_boxed_slice(), false)
                }
            }
            _ => (value.into_boxed_slice(), false),
        };
        let new_charge = Object::charge(&key, &data);
        let (old_charge, old_used) = match self.objects.get(key.as_slice()) {
            Some(o) => (
                Object::charge(&key, &o.data),
                key.len() as u64 + u64::from(o.len),
            ),
            None => (0, 0),
        };
        let stored_after = self.bytes_stored - old_charge + new_charge;
        if stored_after > self.quota_bytes && stored_after > self.bytes_stored {
            self.counters.refused += 1;
            return Err(QuotaExceeded);
        }
        if let Some(h) = self
            .host
            .as_mut()
            .filter(|_| stored_after > self.bytes_stored)
        {
            if let Err(e) = h.ensure(stored_after) {
                if !matches!(e, HostCapError::NoRoom { .. }) {
                    tracing::warn!("tmem: {e}; put refused");
                }
                h.refused += 1;
                self.counters.refused += 1;
                return Err(QuotaExceeded);
            }
        }
        self.bytes_stored = stored_after;
        self.bytes_used = self.bytes_used - old_used + key.len() as u64 + len as u64;
        #[allow(
            clippy::cast_possible_truncation,
            reason = "the device (put's caller) refuses values over MAX_VALUE_LEN (16 MiB): request.rs"
        )]
        let len = len as u32;
        self.objects.insert(
            key.into_boxed_slice(),
            Object {
                len,
                data,
                compressed,
            },
        );
        self.host_shrink();
        Ok(())
    }

    /// Looks `key` up and hands its value to `f`; `None` if absent.
    pub fn get_with<R>(&mut self, key: &[u8], f: impl FnOnce(Value<'_>) -> R) -> Option<R> {
        self.counters.gets += 1;
        let o = self.objects.get(key)?;
        self.counters.get_hits += 1;
        let v = if o.compressed {
            Value::Lz4 {
                block: &o.data,
                len: o.len as usize,
            }
        } else {
            Value::Raw(&o.data)
        };
        Some(f(v))
    }

    /// Removes `key`; `false` if it was absent.
    pub fn invalidate(&mut self, key: &[u8]) -> bool {
        self.counters.invalidates += 1;
        match self.objects.remove(key) {
            Some(o) => {
                self.bytes_stored -= Object::charge(key, &o.data);
                self.bytes_used -= key.len() as u64 + u64::from(o.len);
                self.host_shrink();
                true
            }
            None => false,
        }
    }

    pub fn flush(&mut self) {
        self.counters.flushes += 1;
        self.objects = HashMap::new();
        self.bytes_used = 0;
        self.bytes_stored = 0;
        self.host_shrink();
    }

    pub fn stats(&self) -> PoolStats {
        PoolStats {
            objects: self.objects.len() as u64,
            bytes_used: self.bytes_used,
            bytes_stored: self.bytes_stored,
            quota_bytes: self.quota_bytes,
            compression: self.compression,
            counters: self.counters,
            host_cap: self.host.as_ref().map(|h| HostCapStats {
                cap_bytes: h.cap(),
                reserved_bytes: h.reserved(),
                refused: h.refused,
            }),
        }
    }
}

#[cfg(test)]
#[allow(
    clippy::cast_possible_truncation,
    reason = "test fixtures: byte patterns and addresses the test builds itself"
)]
mod tests {
    use super::*;
    use crate::devices::tmem::accounting::object_charge;

    fn read(p: &mut Pool, key: &[u8]) -> Option<Vec<u8>> {
        p.get_with(key, |v| {
            let mut out = vec![0; v.len()];
            v.copy_to(&mut out).unwrap();
            out
        })
    }

    #[test]
    fn accounting_follows_replacements() {
        let mut p = Pool::new(1 << 20, Compression::None);
        p.put(b"k".to_vec(), vec![1; 100]).unwrap();
        assert_eq!(p.stats().bytes_used, 101);
        assert_eq!(p.stats().bytes_stored, object_charge(1, 100));
        p.put(b"k".to_vec(), vec![2; 10]).unwrap();
        assert_eq!(p.stats().objects, 1);
        assert_eq!(p.stats().bytes_used, 11);
        assert_eq!(read(&mut p, b"k"), Some(vec![2; 10]));
        assert!(p.invalidate(b"k"));
        assert!(!p.invalidate(b"k"));
        assert_eq!((p.stats().bytes_used, p.stats().bytes_stored), (0, 0));
    }

    #[test]
    fn quota_refusal_keeps_old_value() {
        let mut p = Pool::new(1000, Compression::None);
        p.put(b"a".to_vec(), vec![7; 500]).unwrap();
        assert_eq!(p.put(b"a".to_vec(), vec![8; 1000]), Err(QuotaExceeded));
        assert_eq!(p.put(b"b".to_vec(), vec![8; 500]), Err(QuotaExceeded));
        assert_eq!(read(&mut p, b"a"), Some(vec![7; 500]));
        assert_eq!(p.stats().counters.refused, 2);
        // Lowered below use: growing puts refused, shrinking ones accepted.
        p.set_quota(10);
        assert_eq!(p.put(b"c".to_vec(), vec![]), Err(QuotaExceeded));
        p.put(b"a".to_vec(), vec![9; 5]).unwrap();
        assert_eq!(read(&mut p, b"a"), Some(vec![9; 5]));
    }

    #[test]
    fn snapshot_state_round_trips_and_is_checked() {
        let mut p = Pool::new(1 << 20, Compression::Lz4);
        p.put(b"zeros".to_vec(), vec![0; 4096]).unwrap();
        p.put(b"a".to_vec(), vec![1, 2, 3]).unwrap();
        p.put(b"empty".to_vec(), vec![]).unwrap();
        read(&mut p, b"a");
        let state = p.save();
        assert_eq!(state.objects[0].key, b"a");
        assert!(state.objects.iter().any(|o| o.compressed));
        let bytes = bincode::serialize(&state).unwrap();
        let back: PoolState = bincode::deserialize(&bytes).unwrap();
        let mut q = Pool::restore(back).unwrap();
        assert_eq!(q.stats(), p.stats());
        assert_eq!(read(&mut q, b"zeros"), Some(vec![0; 4096]));
        assert_eq!(read(&mut q, b"a"), Some(vec![1, 2, 3]));
        assert_eq!(read(&mut q, b"empty"), Some(vec![]));

        let mut bad = state.clone();
        bad.objects[0].data.push(9);
        assert!(Pool::restore(bad).is_err(), "length mismatch");
        let mut bad = state.clone();
        bad.objects[1].key.clear();
        assert!(Pool::restore(bad).is_err(), "empty key");
        let mut bad = state.clone();
        bad.objects.push(bad.objects[0].clone());
        assert!(Pool::restore(bad).is_err(), "duplicate key");
        let mut bad = state;
        bad.objects[0].len = MAX_VALUE_LEN + 1;
        assert!(Pool::restore(bad).is_err(), "oversized value");
    }

    #[test]
    fn the_host_cap_refuses_like_the_quota_and_bounds_a_restore() {
        let dir = std::env::temp_dir().join(format!("spore-pool-cap-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let cap = 8 << 20;
        let mut p = Pool::new(1 << 30, Compression::None);
        p.attach_host_cap(HostCap::open(&dir, cap).unwrap())
            .unwrap();
        let mut n = 0u32;
        while p.put(n.to_le_bytes().to_vec(), vec![1; 1 << 20]).is_ok() {
            n += 1;
        }
        let s = p.stats();
        assert!(
            s.bytes_stored <= cap && s.bytes_stored > cap - (2 << 20),
            "{s:?}"
        );
        assert_eq!(s.counters.refused, 1);
        assert_eq!(s.host_cap.map(|h| (h.cap_bytes, h.refused)), Some((cap, 1)));
        // Shrinking puts still work; a flush gives the reservation back.
        p.put(0u32.to_le_bytes().to_vec(), vec![]).unwrap();
        p.flush();
        assert_eq!(p.stats().host_cap.map(|h| h.reserved_bytes), Some(0));
        // A saved pool larger than what the cap leaves is refused whole.
        let mut big = Pool::new(1 << 30, Compression::None);
        for i in 0..9u32 {
            big.put(i.to_le_bytes().to_vec(), vec![2; 1 << 20]).unwrap();
        }
        let mut back = Pool::restore(big.save()).unwrap();
        let e = back
            .attach_host_cap(HostCap::open(&dir, cap).unwrap())
            .unwrap_err();
        assert!(matches!(e, HostCapError::NoRoom { .. }), "{e}");
        drop(p);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn lz4_round_trip_and_savings() {
        let mut p = Pool::new(1 << 30, Compression::Lz4);
        let text: Vec<u8> = (0..1 << 20).map(|i| (i % 7) as u8).collect();
        p.put(b"t".to_vec(), text.clone()).unwrap();
        let random: Vec<u8> = (0..4096u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        p.put(b"r".to_vec(), random.clone()).unwrap();
        p.put(b"e".to_vec(), vec![]).unwrap();
        let s = p.stats();
        assert!(s.bytes_stored < s.bytes_used / 10, "{s:?}");
        assert_eq!(read(&mut p, b"t"), Some(text));
        assert_eq!(read(&mut p, b"r"), Some(random));
        assert_eq!(read(&mut p, b"e"), Some(vec![]));
        p.flush();
        assert_eq!(p.stats().objects, 0);
        assert_eq!(read(&mut p, b"t"), None);
    }
}
