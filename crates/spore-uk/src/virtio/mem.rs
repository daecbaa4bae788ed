//! The virtio-mem driver (device id 24, virtio 1.2 §5.15): the unikernel
//! plugs and unplugs blocks of the device's hotplug region itself.
//!
//! The region lies above boot RAM; the VMM stretches the identity map over
//! it, so a plugged block is usable memory at its guest-physical address.
//! Unplugged blocks have no backing (`VIRTIO_MEM_F_UNPLUGGED_INACCESSIBLE` is
//! accepted): touching one stops the VM, which is the point — freed memory
//! is really gone from the guest and from the host.
//!
//! Requests go one at a time on the device's single queue as a chain of a
//! 24-byte request (read by the device) and a 10-byte response (written by
//! it); the driver polls the used ring and sleeps in the signal port's
//! `wait` until the device's (unseen) interrupt wakes it. The device answers
//! on its own VMM thread, so a request costs one notify exit and one wait.

use alloc::boxed::Box;
use core::fmt;

use super::mmio::{Transport, F_VERSION_1};
use super::queue::VirtQueue;
use super::{device_id, find_device, VirtioError};
use crate::BootInfo;

/// VIRTIO_MEM_F_UNPLUGGED_INACCESSIBLE: the driver never reads unplugged
/// blocks (this one never touches them at all).
pub const F_UNPLUGGED_INACCESSIBLE: u64 = 1 << 1;

const REQ_PLUG: u16 = 0;
const REQ_UNPLUG: u16 = 1;
const REQ_UNPLUG_ALL: u16 = 2;
const REQ_STATE: u16 = 3;

const RESP_ACK: u16 = 0;
const RESP_NACK: u16 = 1;
const RESP_BUSY: u16 = 2;
const RESP_ERROR: u16 = 3;

const STATE_PLUGGED: u16 = 0;
const STATE_UNPLUGGED: u16 = 1;
const STATE_MIXED: u16 = 2;

const REQUEST_LEN: usize = 24;
const RESPONSE_LEN: usize = 10;
/// A request carries its block count in 16 bits.
pub const MAX_BLOCKS_PER_REQUEST: u64 = u16::MAX as u64;
/// How long one request may take before the driver gives up on the device.
const REQUEST_TIMEOUT_US: u64 = 10_000_000;

/// The device configuration space (§5.15.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemConfig {
    pub block_size: u64,
    pub node_id: u16,
    pub addr: u64,
    pub region_size: u64,
    pub usable_region_size: u64,
    pub plugged_size: u64,
    pub requested_size: u64,
}

/// A range's state as the device reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockState {
    Plugged,
    Unplugged,
    Mixed,
}

/// Why a request failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemError {
    /// The device refused for now (PLUG beyond `requested_size`): retry
    /// once the host raises the target.
    Nack,
    /// The device is busy (e.g. migrating): retry later.
    Busy,
    /// The request was invalid for the device (a range outside the usable
    /// region, misaligned, or unplugging unplugged blocks).
    Error,
    /// The range is empty, misaligned or outside the region: not sent.
    BadRange { addr: u64, nb_blocks: u64 },
    /// The device answered with something the spec does not define.
    BadResponse { resp_type: u16, state: u16 },
    /// No answer within the timeout (the device is broken).
    Timeout,
    /// The queue had no room for the request (a previous one never came back).
    QueueFull,
}

impl fmt::Display for MemError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Nack => write!(f, "virtio-mem: NACK (beyond the host's requested size)"),
            Self::Busy => write!(f, "virtio-mem: device busy"),
            Self::Error => write!(f, "virtio-mem: the device refused the request as invalid"),
            Self::BadRange { addr, nb_blocks } => write!(
                f,
                "virtio-mem: {nb_blocks} blocks at {addr:#x} is not a range of whole blocks in the region"
            ),
            Self::BadResponse { resp_type, state } => write!(
                f,
                "virtio-mem: undefined response type {resp_type} state {state}"
            ),
            Self::Timeout => write!(f, "virtio-mem: no answer from the device"),
            Self::QueueFull => write!(f, "virtio-mem: request queue full"),
        }
    }
}

/// Counters for apps and benchmarks.
#[derive(Clone, Copy, Debug, Default)]
pub struct MemStats {
    pub requests: u64,
    pub waits: u64,
    pub nacks: u64,
}

/// The driver of one virtio-mem device.
pub struct VirtioMem {
    transport: Transport,
    queue: VirtQueue,
    /// Request and response buffers, reused: one request is in flight at a time.
    req: Box<[u8; REQUEST_LEN]>,
    resp: Box<[u8; 16]>,
    block_size: u64,
    addr: u64,
    region_size: u64,
    stats: MemStats,
}

impl VirtioMem {
    /// Finds the virtio-mem device in the boot info and brings it up.
    pub fn new(info: &BootInfo) -> Result<VirtioMem, VirtioError> {
        let dev = find_device(info, device_id::MEM).ok_or(VirtioError::NoDevice(device_id::MEM))?;
        // SAFETY: the boot info lists this window as a virtio-mmio device,
        // identity-mapped by the boot protocol; only this driver uses it.
        let (transport, _) =
            unsafe { Transport::init(&dev, F_VERSION_1, F_UNPLUGGED_INACCESSIBLE)? };
        let queue = transport.setup_queue(0, 8)?;
        let req = Box::try_new_in_heap()?;
        let resp = Box::try_new_in_heap()?;
        transport.driver_ok();
        let mut m = VirtioMem {
            transport,
            queue,
            req,
            resp,
            block_size: 0,
            addr: 0,
            region_size: 0,
            stats: MemStats::default(),
        };
        let c = m.config();
        m.block_size = c.block_size;
        m.addr = c.addr;
        m.region_size = c.region_size;
        Ok(m)
    }

    fn config_u64(&self, offset: usize) -> u64 {
        // The two halves are separate reads; the device may change the value
        // between them (requested_size, plugged_size), so read until stable.
        loop {
            let lo = self.transport.config_u32(offset) as u64;
            let hi = self.transport.config_u32(offset + 4) as u64;
            if self.transport.config_u32(offset) as u64 == lo {
                return lo | hi << 32;
            }
        }
    }

    /// Reads the whole configuration space.
    pub fn config(&self) -> MemConfig {
        MemConfig {
            block_size: self.config_u64(0x00),
            node_id: self.transport.config_u32(0x08) as u16,
            addr: self.config_u64(0x10),
            region_size: self.config_u64(0x18),
            usable_region_size: self.config_u64(0x20),
            plugged_size: self.config_u64(0x28),
            requested_size: self.config_u64(0x30),
        }
    }

    /// The size the host wants plugged (it changes at run time).
    pub fn requested_size(&self) -> u64 {
        self.config_u64(0x30)
    }

    /// What the device counts as plugged.
    pub fn plugged_size(&self) -> u64 {
        self.config_u64(0x28)
    }

    pub fn block_size(&self) -> u64 {
        self.block_size
    }

    /// Guest-physical start of the hotplug region.
    pub fn region_addr(&self) -> u64 {
        self.addr
    }

    pub fn region_size(&self) -> u64 {
        self.region_size
    }

    pub fn stats(&self) -> MemStats {
        self.stats
    }

    /// Acknowledges the device's interrupt status (a config change: the
    /// host moved `requested_size`). Returns the status bits.
    pub fn ack_interrupt(&self) -> u32 {
        self.transport.ack_interrupt()
    }

    /// Plugs `nb_blocks` blocks from `addr` (split into requests of at most
    /// [`MAX_BLOCKS_PER_REQUEST`]; on failure the earlier parts stay plugged).
    pub fn plug(&mut self, addr: u64, nb_blocks: u64) -> Result<(), MemError> {
        self.ranged(REQ_PLUG, addr, nb_blocks)
    }

    /// Unplugs `nb_blocks` blocks from `addr`; the memory is gone from the
    /// guest (and returned to the host) when this returns Ok.
    pub fn unplug(&mut self, addr: u64, nb_blocks: u64) -> Result<(), MemError> {
        self.ranged(REQ_UNPLUG, addr, nb_blocks)
    }

    /// Unplugs every block (a fresh driver's first request when the device
    /// says blocks are still plugged from before).
    pub fn unplug_all(&mut self) -> Result<(), MemError> {
        match self.request(REQ_UNPLUG_ALL, 0, 0)? {
            (RESP_ACK, _) => Ok(()),
            other => Err(Self::failure(other)),
        }
    }

    /// Waits until every block unplugged so far is unreachable. The device
    /// answers UNPLUG once the memory is back with the host, and deletes the
    /// KVM slot of a chunk it emptied once its queue has been quiet for a
    /// while (off the driver's wait); it finishes that before answering a
    /// STATE request, so one STATE round trip is the barrier. Until then a stray touch of an emptied
    /// chunk may still find (zeroed) memory.
    pub fn sync(&mut self) -> Result<(), MemError> {
        let addr = self.addr;
        self.state(addr, 1).map(|_| ())
    }

    /// The state of `nb_blocks` blocks from `addr` (at most
    /// [`MAX_BLOCKS_PER_REQUEST`]).
    pub fn state(&mut self, addr: u64, nb_blocks: u64) -> Result<BlockState, MemError> {
        self.check_range(addr, nb_blocks)?;
        if nb_blocks > MAX_BLOCKS_PER_REQUEST {
            return Err(MemError::BadRange { addr, nb_blocks });
        }
        match self.request(REQ_STATE, addr, nb_blocks)? {
            (RESP_ACK, STATE_PLUGGED) => Ok(BlockState::Plugged),
            (RESP_ACK, STATE_UNPLUGGED) => Ok(BlockState::Unplugged),
            (RESP_ACK, STATE_MIXED) => Ok(BlockState::Mixed),
            other => Err(Self::failure(other)),
        }
    }

    fn check_range(&self, addr: u64, nb_blocks: u64) -> Result<(), MemError> {
        let bad = MemError::BadRange { addr, nb_blocks };
        let bs = self.block_size;
        if nb_blocks == 0 || bs == 0 || addr < self.addr || !(addr - self.addr).is_multiple_of(bs) {
            return Err(bad);
        }
        let end = nb_blocks
            .checked_mul(bs)
            .and_then(|len| addr.checked_add(len))
            .ok_or(bad)?;
        if end > self.addr.saturating_add(self.region_size) {
            return Err(bad);
        }
        Ok(())
    }

    fn ranged(&mut self, kind: u16, addr: u64, nb_blocks: u64) -> Result<(), MemError> {
        self.check_range(addr, nb_blocks)?;
        let mut at = addr;
        let mut left = nb_blocks;
        while left > 0 {
            let n = left.min(MAX_BLOCKS_PER_REQUEST);
            match self.request(kind, at, n)? {
                (RESP_ACK, _) => {}
                other => return Err(Self::failure(other)),
            }
            at += n * self.block_size;
            left -= n;
        }
        Ok(())
    }

    fn failure((resp_type, state): (u16, u16)) -> MemError {
        match resp_type {
            RESP_NACK => MemError::Nack,
            RESP_BUSY => MemError::Busy,
            RESP_ERROR => MemError::Error,
            _ => MemError::BadResponse { resp_type, state },
        }
    }

    /// Sends one request and waits for its answer: (type, state).
    fn request(&mut self, kind: u16, addr: u64, nb_blocks: u64) -> Result<(u16, u16), MemError> {
        let r = &mut *self.req;
        r.fill(0);
        r[0..2].copy_from_slice(&kind.to_le_bytes());
        r[8..16].copy_from_slice(&addr.to_le_bytes());
        r[16..18].copy_from_slice(&(nb_blocks as u16).to_le_bytes());
        // An all-ones response is no valid answer: a device that writes
        // nothing is caught below.
        self.resp.fill(0xff);
        // SAFETY: both buffers are owned by self and untouched until the
        // device returns the chain (this function waits for it, or gives the
        // device up for good on timeout by failing it).
        let head = unsafe {
            self.queue.add_pair(
                self.req.as_ptr(),
                REQUEST_LEN as u32,
                self.resp.as_mut_ptr(),
                RESPONSE_LEN as u32,
            )
        }
        .ok_or(MemError::QueueFull)?;
        self.transport.notify(0);
        self.stats.requests += 1;
        let start = crate::clock::Instant::now();
        loop {
            if let Some(used) = self.queue.pop_used() {
                if used.id != head {
                    continue;
                }
                if (used.len as usize) < RESPONSE_LEN {
                    return Err(MemError::BadResponse {
                        resp_type: u16::MAX,
                        state: used.len as u16,
                    });
                }
                // SAFETY: the device is done with the buffer (it is used).
                let b = unsafe { core::ptr::read_volatile(&*self.resp) };
                let resp_type = u16::from_le_bytes([b[0], b[1]]);
                let state = u16::from_le_bytes([b[8], b[9]]);
                if resp_type == RESP_NACK {
                    self.stats.nacks += 1;
                }
                return Ok((resp_type, state));
            }
            // Without a TSC frequency there is no timeout; the device thread
            // always answers, so this only matters for a broken VMM.
            if start.elapsed_us().is_some_and(|us| us > REQUEST_TIMEOUT_US) {
                self.transport.fail();
                return Err(MemError::Timeout);
            }
            self.stats.waits += 1;
            crate::signal::wait(100_000);
            self.transport.ack_interrupt();
        }
    }
}

/// Fallible boxing of zeroed arrays (the heap may be full).
trait TryNewInHeap: Sized {
    fn try_new_in_heap() -> Result<Self, VirtioError>;
}

impl<const N: usize> TryNewInHeap for Box<[u8; N]> {
    fn try_new_in_heap() -> Result<Self, VirtioError> {
        let mut v = alloc::vec::Vec::new();
        v.try_reserve_exact(N)
            .map_err(|_| VirtioError::OutOfMemory)?;
        v.resize(N, 0u8);
        v.into_boxed_slice()
            .try_into()
            .map_err(|_| VirtioError::OutOfMemory)
    }
}
