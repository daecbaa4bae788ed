//! [`TmemDevice`]: handles one guest call on the vCPU thread that made it.
//!
//! A call reads the request block, lets [`super::request`] validate it, runs
//! it against the VM's [`Pool`] and writes the status (and a GET's length)
//! back into the block. Values move between guest memory and the pool with
//! one copy each way, into buffers no larger than the validated length. The
//! pool's lock is held only while a value is copied, never across guest
//! memory reads of keys and values on the PUT path.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use spore_abi::tmem::{Status, TmemStats, TMEM_ADDR_SHIFT};
use vm_memory::{Bytes, GuestAddress};

use super::host_cap::{HostCap, HostCapError};
use super::pool::{Compression, Pool, PoolState, PoolStateError, PoolStats, Value};
use super::request::{
    parse, GuestRange, RawBlock, Request, BLOCK_SIZE, STATUS_OFFSET, VALUE_LEN_OFFSET,
};
use super::timing::{CallTimer, CallTiming};
use crate::devices::virtio::GuestMemoryMmap;
use crate::host::lock;

/// The tmem device's snapshot state: the whole pool (objects, quota,
/// counters), or `None` for a VM whose tmem is disabled.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TmemState {
    pub pool: Option<PoolState>,
    pub bad_blocks: u64,
}

/// One VM's tmem device; shared by its vCPUs.
pub struct TmemDevice {
    /// `None`: disabled by the configuration; every call answers `DISABLED`.
    pool: Option<Mutex<Pool>>,
    /// Calls whose block was outside RAM or whose port write was malformed
    /// (the pool's own counters cannot see those when disabled).
    bad_blocks: AtomicU64,
    /// Handling time per operation, only when benchmarking.
    timer: Option<CallTimer>,
}

impl TmemDevice {
    pub fn new(quota_bytes: u64, compression: Compression) -> Self {
        Self {
            pool: Some(Mutex::new(Pool::new(quota_bytes, compression))),
            bad_blocks: AtomicU64::new(0),
            timer: None,
        }
    }

    pub fn disabled() -> Self {
        Self {
            pool: None,
            bad_blocks: AtomicU64::new(0),
            timer: None,
        }
    }

    /// The device's snapshot state. Take it while no vCPU runs (a paused VM):
    /// a call in progress would be half in, half out.
    pub fn save(&self) -> TmemState {
        TmemState {
            pool: self.pool.as_ref().map(|p| lock(p).save()),
            bad_blocks: self.bad_blocks.load(Ordering::Relaxed),
        }
    }

    /// Rebuilds the device of a snapshot, pool contents included.
    pub fn restore(state: &TmemState) -> Result<Self, PoolStateError> {
        let pool = match &state.pool {
            Some(p) => Some(Mutex::new(Pool::restore(p.clone())?)),
            None => None,
        };
        Ok(Self {
            pool,
            bad_blocks: AtomicU64::new(state.bad_blocks),
            timer: None,
        })
    }

    /// Draws the pool on the host-wide cap (see [`super::host_cap`]); a
    /// disabled device has nothing to draw.
    pub fn with_host_cap(self, cap: HostCap) -> Result<Self, HostCapError> {
        if let Some(p) = &self.pool {
            lock(p).attach_host_cap(cap)?;
        }
        Ok(self)
    }

    /// Times every call per operation (see [`super::timing`]).
    pub fn with_timing(mut self) -> Self {
        self.timer = Some(CallTimer::default());
        self
    }

    /// Handling times so far, `None` unless built [`with_timing`](Self::with_timing).
    pub fn timing(&self) -> Option<CallTiming> {
        self.timer.as_ref().map(CallTimer::read)
    }

    pub fn is_enabled(&self) -> bool {
        self.pool.is_some()
    }

    /// Handles an `out` of `data` to the tmem port: a 32-bit `block_gpa >> 4`.
    pub fn port_write(&self, mem: &GuestMemoryMmap, data: &[u8]) -> Status {
        match <[u8; 4]>::try_from(data) {
            Ok(b) => self.call(mem, u32::from_le_bytes(b)),
            Err(_) => {
                self.bad_blocks.fetch_add(1, Ordering::Relaxed);
                Status::BadRequest
            }
        }
    }

    /// Handles one call; `value` is what the guest wrote to the port. The
    /// returned status is also in the block when the block is in RAM.
    pub fn call(&self, mem: &GuestMemoryMmap, value: u32) -> Status {
        let start = self.timer.as_ref().map(|_| Instant::now());
        let addr = GuestAddress(u64::from(value) << TMEM_ADDR_SHIFT);
        let Some(block) = RawBlock::read(mem, addr) else {
            self.bad_blocks.fetch_add(1, Ordering::Relaxed);
            return Status::BadAddress;
        };
        let status = match &self.pool {
            None => Status::Disabled,
            Some(pool) => match parse(mem, &block, false) {
                Ok(req) => self.execute(mem, pool, addr, req),
                Err(s) => {
                    lock(pool).counters.invalid += 1;
                    s
                }
            },
        };
        write_status(mem, addr, status);
        if let (Some(timer), Some(start)) = (&self.timer, start) {
            timer.record(block.op, start);
        }
        status
    }

    fn execute(
        &self,
        mem: &GuestMemoryMmap,
        pool: &Mutex<Pool>,
        block: GuestAddress,
        req: Request,
    ) -> Status {
        match req {
            Request::Put { key, value } => {
                let (Some(key), Some(value)) = (read_vec(mem, key), read_vec(mem, value)) else {
                    return Status::BadAddress;
                };
                match lock(pool).put(key, value) {
                    Ok(()) => Status::Ok,
                    Err(_) => Status::QuotaExceeded,
                }
            }
            Request::Get { key, buffer } => {
                let Some(key) = read_vec(mem, key) else {
                    return Status::BadAddress;
                };
                let found = lock(pool).get_with(&key, |v| copy_out(mem, v, buffer));
                match found {
                    None => Status::NotFound,
                    Some((status, len)) => {
                        if mem
                            .write_obj(len, block.unchecked_add(VALUE_LEN_OFFSET))
                            .is_err()
                        {
                            return Status::BadAddress;
                        }
                        status
                    }
                }
            }
            Request::Invalidate { key } => {
                let Some(key) = read_vec(mem, key) else {
                    return Status::BadAddress;
                };
                if lock(pool).invalidate(&key) {
                    Status::Ok
                } else {
                    Status::NotFound
                }
            }
            Request::Flush => {
                lock(pool).flush();
                Status::Ok
            }
            Request::Stats { out } => {
                let bytes = stats_bytes(&lock(pool).stats().to_abi());
                match mem.write_slice(&bytes, out.addr) {
                    Ok(()) => Status::Ok,
                    Err(_) => Status::BadAddress,
                }
            }
            Request::Batch { entries, count } => {
                lock(pool).counters.batches += 1;
                for i in 0..count as u64 {
                    // Inside the validated array: i * 64 < count * 64.
                    let entry = entries.addr.unchecked_add(i * BLOCK_SIZE);
                    let status = match RawBlock::read(mem, entry) {
                        None => Status::BadAddress,
                        Some(raw) => match parse(mem, &raw, true) {
                            Ok(req) => self.execute(mem, pool, entry, req),
                            Err(s) => {
                                lock(pool).counters.invalid += 1;
                                s
                            }
                        },
                    };
                    write_status(mem, entry, status);
                }
                Status::Ok
            }
        }
    }

    /// The pool's state, `None` when disabled.
    pub fn stats(&self) -> Option<PoolStats> {
        self.pool.as_ref().map(|p| {
            let mut s = lock(p).stats();
            s.counters.invalid += self.bad_blocks.load(Ordering::Relaxed);
            s
        })
    }

    /// Changes the quota; objects already stored stay even above it.
    /// `false` when disabled.
    pub fn set_quota(&self, quota_bytes: u64) -> bool {
        match &self.pool {
            Some(p) => {
                lock(p).set_quota(quota_bytes);
                true
            }
            None => false,
        }
    }
}

impl crate::persist::Persist for TmemDevice {
    type State = TmemState;
    type Args = ();
    type Error = PoolStateError;

    /// See [`TmemDevice::save`]: only on a paused VM.
    fn save(&self) -> TmemState {
        TmemDevice::save(self)
    }

    fn restore((): (), state: &TmemState) -> Result<Self, PoolStateError> {
        TmemDevice::restore(state)
    }
}

trait UncheckedAdd {
    fn unchecked_add(self, off: u64) -> Self;
}

impl UncheckedAdd for GuestAddress {
    /// Only for offsets inside a block or array already checked to be in RAM.
    fn unchecked_add(self, off: u64) -> Self {
        GuestAddress(self.0.wrapping_add(off))
    }
}

fn write_status(mem: &GuestMemoryMmap, block: GuestAddress, status: Status) {
    // The block was read from RAM, so this cannot fail; if it did, the
    // guest still gets the status from the port.
    let _ = mem.write_obj(status as u32, block.unchecked_add(STATUS_OFFSET));
}

/// Copies a validated range out of guest memory into a buffer of exactly its
/// length (appended into reserved capacity: one pass, no zero-fill first).
fn read_vec(mem: &GuestMemoryMmap, r: GuestRange) -> Option<Vec<u8>> {
    let mut v = Vec::with_capacity(r.len);
    if r.len > 0 {
        mem.write_all_volatile_to(r.addr, &mut v, r.len).ok()?;
    }
    (v.len() == r.len).then_some(v)
}

/// Copies a value into the guest's buffer if it fits; returns the status and
/// the value's length for `value_len`.
fn copy_out(mem: &GuestMemoryMmap, v: Value<'_>, buffer: GuestRange) -> (Status, u64) {
    let len = v.len();
    if len > buffer.len {
        return (Status::BufferTooSmall, len as u64);
    }
    if len == 0 {
        return (Status::Ok, 0);
    }
    let written = match v {
        Value::Raw(bytes) => mem.write_slice(bytes, buffer.addr).is_ok(),
        lz4 @ Value::Lz4 { .. } => {
            let mut out = vec![0u8; len];
            match lz4.copy_to(&mut out) {
                Ok(()) => mem.write_slice(&out, buffer.addr).is_ok(),
                Err(e) => {
                    // The pool compressed this itself: a failure is a VMM bug.
                    tracing::error!("tmem: stored lz4 value does not decompress: {e}");
                    return (Status::NotFound, len as u64);
                }
            }
        }
    };
    if written {
        (Status::Ok, len as u64)
    } else {
        (Status::BadAddress, len as u64)
    }
}

/// `TmemStats` in its guest layout: eleven little-endian u64s.
fn stats_bytes(s: &TmemStats) -> Vec<u8> {
    [
        s.objects,
        s.bytes_used,
        s.bytes_stored,
        s.quota_bytes,
        s.puts,
        s.gets,
        s.get_hits,
        s.invalidates,
        s.flushes,
        s.batches,
        s.refused,
    ]
    .iter()
    .flat_map(|v| v.to_le_bytes())
    .collect()
}
