//! A block allocator over the virtio-mem hotplug region: each tenant (a
//! request, a connection, a job — whatever the app frees as one) gets whole
//! device blocks, plugged on demand.
//!
//! Because no two tenants share a block, freeing a tenant leaves its blocks
//! empty at once: the allocator unplugs them in the same call, with no page
//! migration (nothing else lives there) and no zeroing (the host punches the
//! memory out; a later plug gets fresh zero pages from the host). This is
//! what Squeezy had to patch Linux for; here it is the allocator's shape.
//!
//! The block map is a `Vec<u16>` of owners (0 = unplugged); the bookkeeping
//! is separated from the device ([`BlockMap`]) so it is tested on the host.

use alloc::vec::Vec;
use core::fmt;

use crate::virtio::mem::{MemError, VirtioMem, MAX_BLOCKS_PER_REQUEST};

/// Names a tenant; 0 is reserved for "no owner".
pub type Tenant = u16;

/// A run of whole blocks given to a tenant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Blocks {
    /// Guest-physical (= identity-mapped virtual) address of the first byte.
    pub addr: u64,
    pub len: u64,
}

impl Blocks {
    /// The run as a byte slice.
    ///
    /// # Safety
    /// The blocks must still be plugged (not freed) for the slice's lifetime,
    /// and not aliased by another slice.
    pub unsafe fn as_mut_slice<'a>(&self) -> &'a mut [u8] {
        // SAFETY: the caller keeps the run plugged; the region is
        // identity-mapped, so its address is its pointer.
        unsafe { core::slice::from_raw_parts_mut(self.addr as *mut u8, self.len as usize) }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllocError {
    /// Tenant 0 is not a tenant.
    BadTenant,
    /// Zero bytes asked for, or more blocks than the region has.
    BadSize,
    /// Plugging this much would pass the host's `requested_size`, or no run
    /// of free blocks that long exists.
    NoRoom { want_blocks: u64 },
    /// The device refused or failed.
    Device(MemError),
    /// The heap could not hold the block map.
    OutOfMemory,
}

impl fmt::Display for AllocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::BadTenant => write!(f, "blockalloc: tenant 0 is reserved"),
            Self::BadSize => write!(f, "blockalloc: size is zero or larger than the region"),
            Self::NoRoom { want_blocks } => write!(
                f,
                "blockalloc: no room for {want_blocks} blocks under the host's requested size"
            ),
            Self::Device(e) => write!(f, "blockalloc: {e}"),
            Self::OutOfMemory => write!(f, "blockalloc: out of heap for the block map"),
        }
    }
}

/// Owner of every block, without the device.
#[derive(Debug)]
pub struct BlockMap {
    owners: Vec<Tenant>,
    plugged: u64,
}

impl BlockMap {
    pub fn new(blocks: usize) -> Result<Self, AllocError> {
        let mut owners = Vec::new();
        owners
            .try_reserve_exact(blocks)
            .map_err(|_| AllocError::OutOfMemory)?;
        owners.resize(blocks, 0);
        Ok(BlockMap { owners, plugged: 0 })
    }

    pub fn blocks(&self) -> usize {
        self.owners.len()
    }

    pub fn plugged(&self) -> u64 {
        self.plugged
    }

    pub fn owner(&self, block: usize) -> Option<Tenant> {
        self.owners.get(block).copied().filter(|&t| t != 0)
    }

    /// First run of `n` free blocks.
    pub fn find_free_run(&self, n: usize) -> Option<usize> {
        if n == 0 || n > self.owners.len() {
            return None;
        }
        let mut run = 0;
        for (i, &o) in self.owners.iter().enumerate() {
            run = if o == 0 { run + 1 } else { 0 };
            if run == n {
                return Some(i + 1 - n);
            }
        }
        None
    }

    pub fn assign(&mut self, first: usize, n: usize, tenant: Tenant) {
        for o in &mut self.owners[first..first + n] {
            debug_assert_eq!(*o, 0);
            *o = tenant;
        }
        self.plugged += n as u64;
    }

    pub fn release(&mut self, first: usize, n: usize) {
        for o in &mut self.owners[first..first + n] {
            *o = 0;
        }
        self.plugged -= n as u64;
    }

    /// Runs `(first, len)` of consecutive blocks owned by `tenant`, each at
    /// most `max` long.
    pub fn runs_of(&self, tenant: Tenant, max: usize) -> Vec<(usize, usize)> {
        let mut runs = Vec::new();
        let mut i = 0;
        while i < self.owners.len() {
            if self.owners[i] != tenant {
                i += 1;
                continue;
            }
            let start = i;
            while i < self.owners.len() && self.owners[i] == tenant && i - start < max {
                i += 1;
            }
            runs.push((start, i - start));
        }
        runs
    }
}

/// Statistics of one [`BlockAllocator::free_tenant`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Freed {
    pub blocks: u64,
    pub bytes: u64,
    /// UNPLUG requests sent (one per run of consecutive blocks).
    pub requests: u64,
}

/// Whole-block allocation per tenant over a virtio-mem device.
pub struct BlockAllocator {
    mem: VirtioMem,
    map: BlockMap,
}

impl BlockAllocator {
    /// Takes over the device. Blocks a previous driver left plugged are
    /// unplugged first (UNPLUG_ALL), so the map starts true.
    pub fn new(mut mem: VirtioMem) -> Result<Self, AllocError> {
        if mem.plugged_size() != 0 {
            mem.unplug_all().map_err(AllocError::Device)?;
        }
        let bs = mem.block_size().max(1);
        let blocks = usize::try_from(mem.region_size() / bs).map_err(|_| AllocError::BadSize)?;
        Ok(BlockAllocator {
            mem,
            map: BlockMap::new(blocks)?,
        })
    }

    pub fn device(&mut self) -> &mut VirtioMem {
        &mut self.mem
    }

    pub fn map(&self) -> &BlockMap {
        &self.map
    }

    pub fn block_size(&self) -> u64 {
        self.mem.block_size()
    }

    /// Bytes plugged for tenants.
    pub fn plugged_bytes(&self) -> u64 {
        self.map.plugged() * self.mem.block_size()
    }

    /// Plugs enough whole blocks for `bytes` and gives them to `tenant`. The
    /// blocks are consecutive, so the result is one contiguous range; it
    /// reads as zeros (fresh host pages).
    pub fn alloc(&mut self, tenant: Tenant, bytes: u64) -> Result<Blocks, AllocError> {
        if tenant == 0 {
            return Err(AllocError::BadTenant);
        }
        let bs = self.mem.block_size();
        if bytes == 0 || bs == 0 {
            return Err(AllocError::BadSize);
        }
        let n = bytes.div_ceil(bs);
        if n > self.map.blocks() as u64 {
            return Err(AllocError::BadSize);
        }
        // The host's target is a ceiling: asking past it only earns NACKs.
        let after = (self.map.plugged() + n).saturating_mul(bs);
        if after > self.mem.requested_size() {
            return Err(AllocError::NoRoom { want_blocks: n });
        }
        let first = self
            .map
            .find_free_run(n as usize)
            .ok_or(AllocError::NoRoom { want_blocks: n })?;
        let addr = self.mem.region_addr() + first as u64 * bs;
        match self.mem.plug(addr, n) {
            Ok(()) => {}
            // The host lowered the target meanwhile.
            Err(MemError::Nack) => return Err(AllocError::NoRoom { want_blocks: n }),
            Err(e) => {
                // A long run is sent in parts; undo the parts that went in.
                let _ = self.unplug_quietly(first, n as usize);
                return Err(AllocError::Device(e));
            }
        }
        self.map.assign(first, n as usize, tenant);
        Ok(Blocks { addr, len: n * bs })
    }

    fn unplug_quietly(&mut self, first: usize, n: usize) -> Result<(), MemError> {
        let bs = self.mem.block_size();
        for b in first..first + n {
            let addr = self.mem.region_addr() + b as u64 * bs;
            if self.mem.state(addr, 1)? == crate::virtio::mem::BlockState::Plugged {
                self.mem.unplug(addr, 1)?;
            }
        }
        Ok(())
    }

    /// Frees every block of `tenant` and unplugs them now: one UNPLUG per
    /// run of consecutive blocks, nothing copied, nothing zeroed.
    pub fn free_tenant(&mut self, tenant: Tenant) -> Result<Freed, AllocError> {
        if tenant == 0 {
            return Err(AllocError::BadTenant);
        }
        let bs = self.mem.block_size();
        let mut freed = Freed::default();
        for (first, n) in self.map.runs_of(tenant, MAX_BLOCKS_PER_REQUEST as usize) {
            let addr = self.mem.region_addr() + first as u64 * bs;
            self.mem
                .unplug(addr, n as u64)
                .map_err(AllocError::Device)?;
            self.map.release(first, n);
            freed.blocks += n as u64;
            freed.requests += 1;
        }
        freed.bytes = freed.blocks * bs;
        Ok(freed)
    }

    /// Frees one range [`alloc`](Self::alloc) returned.
    pub fn free(&mut self, blocks: Blocks) -> Result<(), AllocError> {
        let bs = self.mem.block_size();
        let base = self.mem.region_addr();
        if bs == 0 || blocks.addr < base || blocks.len == 0 {
            return Err(AllocError::BadSize);
        }
        let first = ((blocks.addr - base) / bs) as usize;
        let n = (blocks.len / bs) as usize;
        if first + n > self.map.blocks() || (first..first + n).any(|b| self.map.owner(b).is_none())
        {
            return Err(AllocError::BadSize);
        }
        self.mem
            .unplug(blocks.addr, n as u64)
            .map_err(AllocError::Device)?;
        self.map.release(first, n);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_and_ownership() {
        let mut m = BlockMap::new(10).unwrap();
        assert_eq!(m.find_free_run(10), Some(0));
        assert_eq!(m.find_free_run(11), None);
        assert_eq!(m.find_free_run(0), None);
        m.assign(0, 3, 1);
        m.assign(3, 2, 2);
        m.assign(5, 1, 1);
        assert_eq!(m.plugged(), 6);
        assert_eq!(m.find_free_run(4), Some(6));
        assert_eq!(m.find_free_run(5), None);
        assert_eq!(m.runs_of(1, 100), [(0, 3), (5, 1)]);
        assert_eq!(m.runs_of(1, 2), [(0, 2), (2, 1), (5, 1)]);
        m.release(0, 3);
        assert_eq!(m.owner(0), None);
        assert_eq!(m.owner(3), Some(2));
        assert_eq!(m.find_free_run(3), Some(0));
        assert_eq!(m.plugged(), 3);
    }
}
