//! The tmem wire format: a guest request block → a typed, validated [`Request`].
//!
//! This is the only place that interprets guest-provided addresses and
//! lengths. A block is copied out of guest memory once (so a guest changing
//! it from another vCPU cannot make a checked field differ from a used one),
//! then every address range it names is checked against guest memory with
//! overflow-checked arithmetic. Everything after this module trusts the
//! [`GuestRange`]s it returns: they lie inside guest RAM and are no longer
//! than the ABI's limits, so allocating their length is bounded.
//!
//! Check order (so a request with several faults gets one predictable
//! status): non-zero `flags`/`reserved` → `BAD_REQUEST`; unknown op →
//! `BAD_OP`; lengths → `BAD_LENGTH`; alignment → `BAD_REQUEST`; addresses →
//! `BAD_ADDRESS`.

use spore_abi::tmem::{op, Status, TmemStats, MAX_BATCH, MAX_KEY_LEN, MAX_VALUE_LEN, TMEM_ALIGN};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

use crate::devices::virtio::GuestMemoryMmap;
use crate::host_usize;

/// Size of one request block in guest memory.
pub const BLOCK_SIZE: u64 = 64;
/// Byte offsets of the fields the VMM writes back.
pub const STATUS_OFFSET: u64 = 4;
pub const VALUE_LEN_OFFSET: u64 = 40;
/// Bytes `STATS` writes.
pub const STATS_SIZE: u64 = core::mem::size_of::<TmemStats>() as u64;

/// The raw fields of a block, as read from guest memory (little-endian).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RawBlock {
    pub op: u32,
    pub flags: u64,
    pub key_addr: u64,
    pub key_len: u64,
    pub value_addr: u64,
    pub value_len: u64,
    pub reserved: [u64; 2],
}

impl RawBlock {
    pub fn from_bytes(b: &[u8; host_usize::from_u64(BLOCK_SIZE)]) -> Self {
        let u64_at = |o: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[o..o + 8]);
            u64::from_le_bytes(w)
        };
        Self {
            op: u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            // b[4..8] is the status: output only.
            flags: u64_at(8),
            key_addr: u64_at(16),
            key_len: u64_at(24),
            value_addr: u64_at(32),
            value_len: u64_at(40),
            reserved: [u64_at(48), u64_at(56)],
        }
    }

    /// Reads the block at `addr`; `None` if any of its 64 bytes is outside RAM.
    pub fn read(mem: &GuestMemoryMmap, addr: GuestAddress) -> Option<Self> {
        checked_range(mem, addr.0, BLOCK_SIZE)?;
        let mut b = [0u8; host_usize::from_u64(BLOCK_SIZE)];
        mem.read_slice(&mut b, addr).ok()?;
        Some(Self::from_bytes(&b))
    }
}

/// A range of guest memory known to lie inside RAM (in one contiguous run of
/// regions) and to be at most [`MAX_VALUE_LEN`] (or a batch array) long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GuestRange {
    pub addr: GuestAddress,
    pub len: usize,
}

impl GuestRange {
    const EMPTY: GuestRange = GuestRange {
        addr: GuestAddress(0),
        len: 0,
    };
}

/// A validated request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    Put {
        key: GuestRange,
        value: GuestRange,
    },
    /// `buffer.len` is the guest's capacity, capped at `MAX_VALUE_LEN` (no
    /// object is larger, so the rest of a bigger buffer is never touched).
    Get {
        key: GuestRange,
        buffer: GuestRange,
    },
    Invalidate {
        key: GuestRange,
    },
    Flush,
    Stats {
        out: GuestRange,
    },
    /// `count` blocks of [`BLOCK_SIZE`] bytes starting at `entries.addr`.
    Batch {
        entries: GuestRange,
        count: usize,
    },
}

/// `Some(range)` if `[addr, addr + len)` lies in guest RAM without overflow.
/// An empty range is always valid and never touched.
fn checked_range(mem: &GuestMemoryMmap, addr: u64, len: u64) -> Option<GuestRange> {
    if len == 0 {
        return Some(GuestRange::EMPTY);
    }
    let len_usize = usize::try_from(len).ok()?;
    addr.checked_add(len)?;
    let addr = GuestAddress(addr);
    // `check_range` also refuses a range that crosses a hole between regions.
    if !mem.check_range(addr, len_usize) {
        return None;
    }
    Some(GuestRange {
        addr,
        len: len_usize,
    })
}

fn range(mem: &GuestMemoryMmap, addr: u64, len: u64) -> Result<GuestRange, Status> {
    checked_range(mem, addr, len).ok_or(Status::BadAddress)
}

fn key_len_ok(len: u64) -> Result<(), Status> {
    if len == 0 || len > MAX_KEY_LEN {
        return Err(Status::BadLength);
    }
    Ok(())
}

/// Validates a block. `in_batch` refuses the operations a batch may not hold.
pub fn parse(mem: &GuestMemoryMmap, b: &RawBlock, in_batch: bool) -> Result<Request, Status> {
    if b.flags != 0 || b.reserved != [0, 0] {
        return Err(Status::BadRequest);
    }
    match b.op {
        op::PUT => {
            key_len_ok(b.key_len)?;
            if b.value_len > MAX_VALUE_LEN {
                return Err(Status::BadLength);
            }
            Ok(Request::Put {
                key: range(mem, b.key_addr, b.key_len)?,
                value: range(mem, b.value_addr, b.value_len)?,
            })
        }
        op::GET => {
            key_len_ok(b.key_len)?;
            Ok(Request::Get {
                key: range(mem, b.key_addr, b.key_len)?,
                buffer: range(mem, b.value_addr, b.value_len.min(MAX_VALUE_LEN))?,
            })
        }
        op::INVALIDATE => {
            key_len_ok(b.key_len)?;
            Ok(Request::Invalidate {
                key: range(mem, b.key_addr, b.key_len)?,
            })
        }
        op::BATCH if in_batch => Err(Status::BadLength),
        op::FLUSH | op::STATS if in_batch => Err(Status::BadOp),
        op::FLUSH => Ok(Request::Flush),
        op::STATS => {
            if b.value_len < STATS_SIZE {
                return Err(Status::BadLength);
            }
            Ok(Request::Stats {
                out: range(mem, b.value_addr, STATS_SIZE)?,
            })
        }
        op::BATCH => {
            if b.value_len > MAX_BATCH {
                return Err(Status::BadLength);
            }
            if !b.value_addr.is_multiple_of(TMEM_ALIGN) {
                return Err(Status::BadRequest);
            }
            // value_len <= MAX_BATCH, so this cannot overflow.
            let bytes = b.value_len * BLOCK_SIZE;
            Ok(Request::Batch {
                entries: range(mem, b.value_addr, bytes)?,
                count: host_usize::from_u64(b.value_len),
            })
        }
        _ => Err(Status::BadOp),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mem() -> GuestMemoryMmap {
        // Two regions with a hole between them, like RAM around the MMIO gap.
        GuestMemoryMmap::from_ranges(&[
            (GuestAddress(0), 0x10000),
            (GuestAddress(0x20000), 0x10000),
        ])
        .unwrap()
    }

    fn put(key_addr: u64, key_len: u64, value_addr: u64, value_len: u64) -> RawBlock {
        RawBlock {
            op: op::PUT,
            key_addr,
            key_len,
            value_addr,
            value_len,
            ..Default::default()
        }
    }

    #[test]
    fn ranges_are_checked() {
        let m = mem();
        assert!(matches!(
            parse(&m, &put(0x100, 8, 0x200, 16), false),
            Ok(Request::Put { .. })
        ));
        // Key in the hole, value straddling the end of the first region,
        // straddling the end of RAM, and overflowing u64.
        for b in [
            put(0x18000, 8, 0x200, 16),
            put(0x100, 8, 0xfff8, 16),
            put(0x100, 8, 0x2fff8, 16),
            put(0x100, 8, u64::MAX - 4, 16),
            put(u64::MAX, 1, 0x200, 0),
        ] {
            assert_eq!(parse(&m, &b, false), Err(Status::BadAddress), "{b:?}");
        }
        // An empty value needs no address.
        assert!(parse(&m, &put(0x100, 8, u64::MAX, 0), false).is_ok());
        // Lengths past the ABI's limits are refused before their addresses.
        assert_eq!(
            parse(&m, &put(0x100, 0, 0, 0), false),
            Err(Status::BadLength)
        );
        assert_eq!(
            parse(&m, &put(0x100, MAX_KEY_LEN + 1, 0, 0), false),
            Err(Status::BadLength)
        );
        assert_eq!(
            parse(&m, &put(0x100, 8, 0, u64::MAX), false),
            Err(Status::BadLength)
        );
    }

    #[test]
    fn reserved_ops_and_batches() {
        let m = mem();
        let mut b = put(0x100, 8, 0x200, 16);
        b.flags = 1;
        assert_eq!(parse(&m, &b, false), Err(Status::BadRequest));
        b.flags = 0;
        b.reserved[1] = 1;
        assert_eq!(parse(&m, &b, false), Err(Status::BadRequest));
        b.reserved[1] = 0;
        b.op = 99;
        assert_eq!(parse(&m, &b, false), Err(Status::BadOp));
        b.op = op::BATCH;
        b.value_addr = 0x208;
        assert_eq!(parse(&m, &b, false), Err(Status::BadRequest));
        b.value_addr = 0x200;
        b.value_len = MAX_BATCH + 1;
        assert_eq!(parse(&m, &b, false), Err(Status::BadLength));
        b.value_len = MAX_BATCH; // 256 KiB: more than the region holds
        assert_eq!(parse(&m, &b, false), Err(Status::BadAddress));
        b.value_len = 4;
        assert!(matches!(
            parse(&m, &b, false),
            Ok(Request::Batch { count: 4, .. })
        ));
        assert_eq!(parse(&m, &b, true), Err(Status::BadLength));
        b.op = op::FLUSH;
        assert_eq!(parse(&m, &b, true), Err(Status::BadOp));
        b.op = op::STATS;
        b.value_len = STATS_SIZE - 1;
        assert_eq!(parse(&m, &b, false), Err(Status::BadLength));
    }

    #[test]
    fn block_read_bounds() {
        let m = mem();
        assert!(RawBlock::read(&m, GuestAddress(0xffc0)).is_some());
        assert!(RawBlock::read(&m, GuestAddress(0xffd0)).is_none());
        assert!(RawBlock::read(&m, GuestAddress(0x2fff0)).is_none());
        assert!(RawBlock::read(&m, GuestAddress(0x40000)).is_none());
    }
}
