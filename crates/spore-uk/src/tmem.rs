//! Transcendent memory client: key/value objects kept in a pool in VMM
//! memory, moved with a synchronous call (see [`spore_abi::tmem`]).
//!
//! Each call fills a 16-byte-aligned [`TmemRequest`] on the stack, writes its
//! address (shifted) to [`TMEM_PORT`] and reads the status the VMM wrote
//! before the `out` returned. A VMM without the device leaves the status at
//! `PENDING`, which comes back as [`TmemError::NoDevice`].
//!
//! Keys and values are borrowed slices: all RAM is identity-mapped, so their
//! pointers are the guest-physical addresses the VMM reads and writes.

use alloc::vec::Vec;
use core::fmt;

use spore_abi::tmem::{op, Status, TmemRequest, TMEM_ADDR_SHIFT, TMEM_PORT};
pub use spore_abi::tmem::{TmemStats, MAX_BATCH, MAX_KEY_LEN, MAX_VALUE_LEN};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TmemError {
    NotFound,
    /// The buffer was too small; the object needs this many bytes.
    BufferTooSmall {
        needed: usize,
    },
    QuotaExceeded,
    BadAddress,
    BadLength,
    BadOp,
    BadRequest,
    /// The VM's tmem pool is disabled.
    Disabled,
    /// Nothing answered the call: the VMM has no tmem device.
    NoDevice,
    /// The VMM wrote a status this client does not know.
    Unknown(u32),
    /// The guest heap could not hold the batch or the value.
    OutOfMemory,
}

impl fmt::Display for TmemError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotFound => write!(f, "tmem: no such key"),
            Self::BufferTooSmall { needed } => {
                write!(f, "tmem: buffer too small, the value has {needed} bytes")
            }
            Self::QuotaExceeded => write!(f, "tmem: the VM's pool quota is exhausted"),
            Self::BadAddress => write!(f, "tmem: address outside guest memory"),
            Self::BadLength => write!(
                f,
                "tmem: key must be 1..={MAX_KEY_LEN} bytes, value at most {MAX_VALUE_LEN}"
            ),
            Self::BadOp => write!(f, "tmem: unknown operation"),
            Self::BadRequest => write!(f, "tmem: malformed request"),
            Self::Disabled => write!(f, "tmem: disabled for this VM"),
            Self::NoDevice => write!(f, "tmem: the VMM has no tmem device"),
            Self::Unknown(s) => write!(f, "tmem: unknown status {s:#x}"),
            Self::OutOfMemory => write!(f, "tmem: out of guest heap"),
        }
    }
}

fn status_to_result(status: u32, value_len: u64) -> Result<(), TmemError> {
    match Status::from_u32(status) {
        Some(Status::Ok) => Ok(()),
        Some(Status::NotFound) => Err(TmemError::NotFound),
        Some(Status::BufferTooSmall) => Err(TmemError::BufferTooSmall {
            needed: value_len as usize,
        }),
        Some(Status::QuotaExceeded) => Err(TmemError::QuotaExceeded),
        Some(Status::BadAddress) => Err(TmemError::BadAddress),
        Some(Status::BadLength) => Err(TmemError::BadLength),
        Some(Status::BadOp) => Err(TmemError::BadOp),
        Some(Status::BadRequest) => Err(TmemError::BadRequest),
        Some(Status::Disabled) => Err(TmemError::Disabled),
        Some(Status::Pending) => Err(TmemError::NoDevice),
        None => Err(TmemError::Unknown(status)),
    }
}

/// Issues one call for `req` (whose status is set to PENDING first).
fn call(req: &mut TmemRequest) {
    req.status = Status::Pending as u32;
    let addr = req as *mut TmemRequest as u64;
    let value = (addr >> TMEM_ADDR_SHIFT) as u32;
    // SAFETY: the VMM reads the block and the buffers it names and writes
    // the status (and GET data) before the `out` returns. No `nomem`: the
    // compiler must treat the instruction as reading and writing memory, so
    // the request is stored before it and re-read after it.
    unsafe {
        core::arch::asm!("out dx, eax", in("dx") TMEM_PORT, in("eax") value, options(nostack, preserves_flags));
    }
}

fn read_status(req: &TmemRequest) -> (u32, u64) {
    // SAFETY: plain reads of fields of a live struct the VMM wrote.
    unsafe {
        (
            core::ptr::read_volatile(&req.status),
            core::ptr::read_volatile(&req.value_len),
        )
    }
}

fn request(op: u32, key: &[u8], value_addr: u64, value_len: u64) -> TmemRequest {
    TmemRequest {
        op,
        key_addr: key.as_ptr() as u64,
        key_len: key.len() as u64,
        value_addr,
        value_len,
        ..TmemRequest::default()
    }
}

/// Stores `value` under `key`, replacing what was there.
pub fn put(key: &[u8], value: &[u8]) -> Result<(), TmemError> {
    let mut req = request(op::PUT, key, value.as_ptr() as u64, value.len() as u64);
    call(&mut req);
    let (s, l) = read_status(&req);
    status_to_result(s, l)
}

/// Copies the value of `key` into `buf`; returns its length. A buffer too
/// small gets nothing and `BufferTooSmall` with the size needed.
pub fn get(key: &[u8], buf: &mut [u8]) -> Result<usize, TmemError> {
    let mut req = request(op::GET, key, buf.as_mut_ptr() as u64, buf.len() as u64);
    call(&mut req);
    let (s, l) = read_status(&req);
    status_to_result(s, l)?;
    Ok((l as usize).min(buf.len()))
}

/// The value of `key` in a new vector, allocated fallibly (a first try with
/// `hint` bytes, then exactly the size the pool reports).
pub fn get_vec(key: &[u8], hint: usize) -> Result<Vec<u8>, TmemError> {
    let mut v: Vec<u8> = Vec::new();
    let mut want = hint.min(MAX_VALUE_LEN as usize);
    for _ in 0..3 {
        v.clear();
        v.try_reserve_exact(want)
            .map_err(|_| TmemError::OutOfMemory)?;
        v.resize(want, 0);
        match get(key, &mut v) {
            Ok(n) => {
                v.truncate(n);
                return Ok(v);
            }
            // The object may change between calls; retry with its new size.
            Err(TmemError::BufferTooSmall { needed }) => want = needed,
            Err(e) => return Err(e),
        }
    }
    Err(TmemError::BufferTooSmall { needed: want })
}

/// Drops `key`.
pub fn invalidate(key: &[u8]) -> Result<(), TmemError> {
    let mut req = request(op::INVALIDATE, key, 0, 0);
    call(&mut req);
    let (s, l) = read_status(&req);
    status_to_result(s, l)
}

/// Drops every object of this VM.
pub fn flush() -> Result<(), TmemError> {
    let mut req = request(op::FLUSH, &[], 0, 0);
    call(&mut req);
    let (s, l) = read_status(&req);
    status_to_result(s, l)
}

/// The pool's counters for this VM.
pub fn stats() -> Result<TmemStats, TmemError> {
    let mut out = TmemStats::default();
    let mut req = request(
        op::STATS,
        &[],
        &mut out as *mut TmemStats as u64,
        core::mem::size_of::<TmemStats>() as u64,
    );
    call(&mut req);
    let (s, l) = read_status(&req);
    status_to_result(s, l)?;
    // SAFETY: the VMM filled `out` during the call.
    Ok(unsafe { core::ptr::read_volatile(&out) })
}

/// Many puts, gets and invalidates in one call (one VM exit).
///
/// Entries borrow their keys and buffers until [`Batch::submit`]; each
/// entry then has its own result ([`Batch::result`]).
pub struct Batch<'a> {
    reqs: Vec<TmemRequest>,
    _borrows: core::marker::PhantomData<&'a mut [u8]>,
}

impl<'a> Batch<'a> {
    /// A batch with room for `capacity` entries (at most [`MAX_BATCH`]),
    /// allocated fallibly.
    pub fn with_capacity(capacity: usize) -> Result<Self, TmemError> {
        let mut reqs = Vec::new();
        reqs.try_reserve_exact(capacity.min(MAX_BATCH as usize))
            .map_err(|_| TmemError::OutOfMemory)?;
        Ok(Batch {
            reqs,
            _borrows: core::marker::PhantomData,
        })
    }

    pub fn len(&self) -> usize {
        self.reqs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    fn push(&mut self, r: TmemRequest) -> Result<usize, TmemError> {
        if self.reqs.len() >= MAX_BATCH as usize {
            return Err(TmemError::BadLength);
        }
        self.reqs
            .try_reserve(1)
            .map_err(|_| TmemError::OutOfMemory)?;
        self.reqs.push(r);
        Ok(self.reqs.len() - 1)
    }

    /// Adds a put; returns the entry's index.
    pub fn put(&mut self, key: &'a [u8], value: &'a [u8]) -> Result<usize, TmemError> {
        self.push(request(
            op::PUT,
            key,
            value.as_ptr() as u64,
            value.len() as u64,
        ))
    }

    /// Adds a get into `buf`; returns the entry's index.
    pub fn get(&mut self, key: &'a [u8], buf: &'a mut [u8]) -> Result<usize, TmemError> {
        self.push(request(
            op::GET,
            key,
            buf.as_mut_ptr() as u64,
            buf.len() as u64,
        ))
    }

    /// Adds an invalidate; returns the entry's index.
    pub fn invalidate(&mut self, key: &'a [u8]) -> Result<usize, TmemError> {
        self.push(request(op::INVALIDATE, key, 0, 0))
    }

    /// Runs every entry in one call. The error is the batch's own (then no
    /// entry ran); entry results come from [`result`](Self::result).
    pub fn submit(&mut self) -> Result<(), TmemError> {
        for r in &mut self.reqs {
            r.status = Status::Pending as u32;
        }
        let mut req = TmemRequest {
            op: op::BATCH,
            value_addr: self.reqs.as_mut_ptr() as u64,
            value_len: self.reqs.len() as u64,
            ..TmemRequest::default()
        };
        call(&mut req);
        let (s, l) = read_status(&req);
        status_to_result(s, l)
    }

    /// Entry `i` after `submit`: Ok(value length) for gets, Ok(0) otherwise.
    pub fn result(&self, i: usize) -> Result<usize, TmemError> {
        let r = self.reqs.get(i).ok_or(TmemError::BadRequest)?;
        let (s, l) = read_status(r);
        status_to_result(s, l)?;
        Ok(if r.op == op::GET { l as usize } else { 0 })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_errors() {
        assert_eq!(status_to_result(0, 0), Ok(()));
        assert_eq!(
            status_to_result(2, 4096),
            Err(TmemError::BufferTooSmall { needed: 4096 })
        );
        assert_eq!(status_to_result(0xffff_ffff, 0), Err(TmemError::NoDevice));
        assert_eq!(status_to_result(77, 0), Err(TmemError::Unknown(77)));
    }

    #[test]
    fn requests_carry_the_slices() {
        let key = b"k1";
        let r = request(op::PUT, key, 0x1234, 9);
        assert_eq!(r.key_addr, key.as_ptr() as u64);
        assert_eq!((r.key_len, r.value_addr, r.value_len), (2, 0x1234, 9));
        assert_eq!((r.flags, r.reserved), (0, [0, 0]));
    }
}
