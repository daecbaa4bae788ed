//! Transcendent memory (tmem): key/value objects a guest moves into a pool in
//! VMM memory with a synchronous call.
//!
//! A call: the guest fills a [`TmemRequest`] block in its memory (16-byte
//! aligned) and writes `block_gpa >> 4` with a 32-bit `out` to [`TMEM_PORT`].
//! The VMM handles it on the vCPU thread before the `out` returns: it writes
//! the [`Status`] into `status` (and, for `GET`, the value's length into
//! `value_len`). A 32-bit `in` from the port returns the status of the vCPU's
//! last call too, which is the only answer when the block itself is not in
//! guest memory.
//!
//! | op           | key            | value                                   |
//! |--------------|----------------|-----------------------------------------|
//! | `PUT`        | `key_addr/len` | `value_addr/len`: copied into the pool  |
//! | `GET`        | `key_addr/len` | `value_addr` buffer of `value_len` bytes; on return `value_len` = the object's length; if the buffer is too small: `BUFFER_TOO_SMALL`, nothing copied |
//! | `INVALIDATE` | `key_addr/len` | —                                       |
//! | `FLUSH`      | —              | — (drops every object of this VM)       |
//! | `STATS`      | —              | `value_addr/len` ≥ `size_of::<TmemStats>()`: filled |
//! | `BATCH`      | —              | `value_addr` = array of `value_len` requests (≤ [`MAX_BATCH`]), each PUT, GET or INVALIDATE, each with its own status; the batch's own status is `OK` once every entry was looked at |
//!
//! Keys are 1..=[`MAX_KEY_LEN`] bytes, values 0..=[`MAX_VALUE_LEN`] bytes, both
//! arbitrary. Every address and length is checked against guest memory.

/// I/O port of the tmem call register.
pub const TMEM_PORT: u16 = 0x0518;

/// The request block's guest-physical address is written shifted by this.
pub const TMEM_ADDR_SHIFT: u32 = 4;
/// Required alignment of a request block (and of batch arrays).
pub const TMEM_ALIGN: u64 = 1 << TMEM_ADDR_SHIFT;

pub const MAX_KEY_LEN: u64 = 64 * 1024;
pub const MAX_VALUE_LEN: u64 = 16 * 1024 * 1024;
pub const MAX_BATCH: u64 = 4096;

/// Operation codes.
pub mod op {
    pub const PUT: u32 = 1;
    pub const GET: u32 = 2;
    pub const INVALIDATE: u32 = 3;
    pub const FLUSH: u32 = 4;
    pub const STATS: u32 = 5;
    pub const BATCH: u32 = 6;
}

/// Result of a call, written to [`TmemRequest::status`].
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Ok = 0,
    /// GET or INVALIDATE of a key the pool does not hold.
    NotFound = 1,
    /// GET into a buffer smaller than the object; `value_len` holds the size needed.
    BufferTooSmall = 2,
    /// PUT would take this VM's pool past its quota; nothing changed.
    QuotaExceeded = 3,
    /// An address or length reaches outside guest memory (or overflows).
    BadAddress = 4,
    /// Key empty or longer than MAX_KEY_LEN, value longer than MAX_VALUE_LEN,
    /// batch longer than MAX_BATCH or nested.
    BadLength = 5,
    /// Unknown operation.
    BadOp = 6,
    /// Misaligned block, non-zero reserved fields or flags.
    BadRequest = 7,
    /// This VM has no tmem pool (disabled by its configuration).
    Disabled = 8,
    /// Set by the guest before a call; the VMM never returns it.
    Pending = 0xffff_ffff,
}

impl Status {
    pub const fn from_u32(v: u32) -> Option<Self> {
        Some(match v {
            0 => Self::Ok,
            1 => Self::NotFound,
            2 => Self::BufferTooSmall,
            3 => Self::QuotaExceeded,
            4 => Self::BadAddress,
            5 => Self::BadLength,
            6 => Self::BadOp,
            7 => Self::BadRequest,
            8 => Self::Disabled,
            0xffff_ffff => Self::Pending,
            _ => return None,
        })
    }
}

/// One request; 64 bytes, little-endian, 16-byte aligned in guest memory.
#[repr(C, align(16))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TmemRequest {
    pub op: u32,
    /// Written by the VMM.
    pub status: u32,
    /// Must be 0.
    pub flags: u64,
    pub key_addr: u64,
    pub key_len: u64,
    pub value_addr: u64,
    /// GET: buffer capacity in, object length out. BATCH: entry count.
    pub value_len: u64,
    /// Must be 0.
    pub reserved: [u64; 2],
}

/// Filled by `STATS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TmemStats {
    pub objects: u64,
    /// Bytes of keys and values as the guest gave them (before compression).
    pub bytes_used: u64,
    /// Bytes the pool holds for them (after compression, if enabled).
    pub bytes_stored: u64,
    pub quota_bytes: u64,
    pub puts: u64,
    pub gets: u64,
    pub get_hits: u64,
    pub invalidates: u64,
    pub flushes: u64,
    pub batches: u64,
    pub refused: u64,
}

const _: () = assert!(core::mem::size_of::<TmemRequest>() == 64);
const _: () = assert!(core::mem::align_of::<TmemRequest>() as u64 == TMEM_ALIGN);
