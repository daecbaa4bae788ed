//! What one stored object costs the host, as charged against the quota.
//!
//! The quota bounds the VMM's memory, not the guest's bytes, so each object
//! is charged what the process really spends on it (an upper bound):
//!
//! - its key and its stored value, each as the allocator's chunk for that
//!   many bytes ([`alloc_cost`]): glibc's header and 16-byte rounding with a
//!   32-byte minimum, or whole pages once a block is large enough to be
//!   `mmap`ed (glibc does from 128 KiB up, unless it raised its threshold, in
//!   which case the chunk is smaller than what is charged);
//! - its slot in the hash table at the table's worst load ([`SLOT_CHARGE`]):
//!   right after the table doubles, 16/7 slots per object, plus the old
//!   table's 8/7 while the new one is being filled.
//!
//! What is *not* per object is bounded separately and documented (README,
//! "tmem accounting"): while a call runs, its vCPU holds the value being
//! put or got (and, with lz4, its compressed or decompressed copy), at most
//! [`IN_FLIGHT_PER_VCPU`] bytes; the allocator keeps some freed memory for
//! reuse ([`FIXED_OVERHEAD`]).

use spore_abi::tmem::MAX_VALUE_LEN;

use super::Object;

/// glibc's malloc: blocks of this size and more are `mmap`ed (its default
/// threshold; it can only move up, which makes chunks cheaper than charged).
const MMAP_THRESHOLD: u64 = 128 << 10;
const PAGE: u64 = 4096;

/// Bytes the allocator spends on a block of `n` bytes (0 for none).
pub const fn alloc_cost(n: u64) -> u64 {
    if n == 0 {
        0
    } else if n + 8 >= MMAP_THRESHOLD {
        // An mmapped chunk: a 16-byte header, whole pages.
        (n + 16).div_ceil(PAGE) * PAGE
    } else {
        // A heap chunk: an 8-byte size field, 16-byte granules, 32 at least.
        let c = (n + 8).div_ceil(16) * 16;
        if c < 32 {
            32
        } else {
            c
        }
    }
}

/// One entry of the pool's hash table: the key's and the object's headers.
const SLOT: u64 = (core::mem::size_of::<(Box<[u8]>, Object)>() + 1) as u64;

/// Table bytes charged per object: a slot and its control byte at the
/// table's worst load (16/7 right after it doubles) plus the old table
/// (8/7) while it is rehashed.
pub const SLOT_CHARGE: u64 = (SLOT * 24).div_ceil(7);

/// Bytes charged for an object with a `key_len`-byte key whose stored value
/// is `stored_len` bytes.
pub const fn object_charge(key_len: u64, stored_len: u64) -> u64 {
    alloc_cost(key_len) + alloc_cost(stored_len) + SLOT_CHARGE
}

/// Transient bytes one vCPU may hold during a call, beyond what is charged:
/// the value read from the guest and its lz4 compression buffer (a put), or
/// the decompressed copy (a get).
pub const IN_FLIGHT_PER_VCPU: u64 = 2 * (MAX_VALUE_LEN + 64 * 1024);

/// Bytes the allocator may keep beyond live blocks (free chunks awaiting
/// reuse, per-thread arenas' tops), measured by the `kvm_tmem_accounting`
/// test against a pool filled with every size of value.
pub const FIXED_OVERHEAD: u64 = 8 << 20;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_cover_allocator_chunks() {
        assert_eq!(alloc_cost(0), 0);
        assert_eq!(alloc_cost(1), 32);
        assert_eq!(alloc_cost(24), 32);
        assert_eq!(alloc_cost(25), 48);
        assert_eq!(alloc_cost(4096), 4112);
        assert_eq!(alloc_cost(1 << 20), (1 << 20) + PAGE);
        // A slot is a boxed key, a boxed value, its length and flag.
        assert_eq!(SLOT, 41);
        assert_eq!(SLOT_CHARGE, 141);
        assert_eq!(object_charge(12, 0), 32 + 141);
    }
}
