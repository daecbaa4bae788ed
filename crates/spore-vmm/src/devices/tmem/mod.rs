//! Transcendent memory (tmem): the VMM side of the guest → VMM key/value call
//! defined in `spore_abi::tmem`.
//!
//! A guest writes the guest-physical address of a 64-byte request block
//! (shifted right by 4) to port `TMEM_PORT`; the vCPU thread that took the
//! exit handles the call before the guest's `out` returns, without taking any
//! bus lock. The module is split by question:
//!
//! - [`request`]: the block's wire format → a validated [`request::Request`];
//!   the only code that interprets guest addresses and lengths.
//! - [`accounting`]: what an object costs the host, charged to the quota.
//! - [`host_cap`]: one budget for the pools of every VMM on the host.
//! - [`pool`]: the VM's object store (keys → values in VMM memory), quota,
//!   compression, counters, and its snapshot state. It never sees guest memory.
//! - [`timing`]: optional per-operation handling time (for `spore bench tmem`).
//! - [`device`]: [`TmemDevice`], which runs one call: copies keys and values
//!   between guest memory and the pool and writes statuses back.
//!
//! This module must never trust a guest address or length that did not come
//! out of [`request`], and never panic on anything a guest writes.

pub mod accounting;
pub mod device;
pub mod host_cap;
pub mod pool;
pub mod request;
#[cfg(test)]
mod tests;
pub mod timing;

pub use device::{TmemDevice, TmemState};
pub use pool::{Compression, Counters, HostCapStats, PoolState, PoolStats};
pub use timing::{CallTiming, OpTiming};

/// A stored value: what the [`pool`] keeps per key, and what [`accounting`]
/// sizes a hash-table slot by. Boxed slices rather than vectors: exactly as
/// long as their contents (no spare capacity to go uncharged), and a smaller
/// slot.
struct Object {
    /// `len` bytes, or an lz4 block that decompresses to `len` bytes.
    data: Box<[u8]>,
    /// The value's length as the guest gave it (at most `MAX_VALUE_LEN`).
    len: u32,
    compressed: bool,
}

impl Object {
    /// What an object with this key and stored value is charged
    /// ([`accounting::object_charge`]).
    fn charge(key: &[u8], data: &[u8]) -> u64 {
        accounting::object_charge(key.len() as u64, data.len() as u64)
    }
}
