//! Split virtqueues (virtio 1.2 §2.7) in guest memory, driver side.
//!
//! A queue is one zeroed, page-aligned heap block holding the descriptor
//! table, the available (driver) ring and the used (device) ring. Each buffer
//! is one descriptor (no chains, no indirect descriptors): the drivers here
//! keep header and payload contiguous, which every device model accepts.
//!
//! The device (a VMM thread) reads and writes the rings concurrently, so ring
//! fields are accessed with volatile operations and fences order the
//! descriptor writes before the index that publishes them.

use alloc::alloc::{alloc_zeroed, dealloc, Layout};
use alloc::vec::Vec;
use core::sync::atomic::{fence, Ordering};

use super::VirtioError;

const DESC_F_NEXT: u16 = 1;
const DESC_F_WRITE: u16 = 2;
const USED_F_NO_NOTIFY: u16 = 1;
/// `chained` entry of a descriptor that heads no two-descriptor chain.
const NO_NEXT: u16 = u16::MAX;
const PAGE: usize = 4096;
/// Longest chain [`VirtQueue::add_chain`] builds.
pub const MAX_CHAIN: usize = 8;

#[repr(C)]
struct Desc {
    addr: u64,
    len: u32,
    flags: u16,
    next: u16,
}

/// One split virtqueue.
pub struct VirtQueue {
    index: u16,
    size: u16,
    mem: *mut u8,
    layout: Layout,
    desc: *mut Desc,
    /// flags, idx, ring[size], used_event.
    avail: *mut u16,
    /// flags, idx, ring[size] of (id: u32, len: u32), avail_event.
    used: *mut u8,
    /// Descriptor ids not handed to the device.
    free: Vec<u16>,
    /// For the head of a chain from [`VirtQueue::add_pair`], its second
    /// descriptor (returned to `free` with the head); else `NO_NEXT`.
    chained: Vec<u16>,
    next_avail: u16,
    last_used: u16,
}

/// A buffer the device has finished with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Used {
    /// The id [`VirtQueue::add`] returned.
    pub id: u16,
    /// Bytes the device wrote into it (device-writable buffers).
    pub len: u32,
}

fn align_up(v: usize, a: usize) -> usize {
    v.div_ceil(a) * a
}

impl VirtQueue {
    /// Allocates a queue of `size` entries (a power of two).
    pub fn new(index: u16, size: u16) -> Result<Self, VirtioError> {
        let n = size as usize;
        let avail_off = align_up(16 * n, 2);
        let used_off = align_up(avail_off + 6 + 2 * n, PAGE);
        let total = align_up(used_off + 6 + 8 * n, PAGE);
        let layout = Layout::from_size_align(total, PAGE).map_err(|_| VirtioError::OutOfMemory)?;
        let mut free = Vec::new();
        free.try_reserve_exact(n)
            .map_err(|_| VirtioError::OutOfMemory)?;
        free.extend((0..size).rev());
        let mut chained = Vec::new();
        chained
            .try_reserve_exact(n)
            .map_err(|_| VirtioError::OutOfMemory)?;
        chained.resize(n, NO_NEXT);
        // SAFETY: layout has a non-zero size.
        let mem = unsafe { alloc_zeroed(layout) };
        if mem.is_null() {
            return Err(VirtioError::OutOfMemory);
        }
        Ok(VirtQueue {
            index,
            size,
            mem,
            layout,
            desc: mem as *mut Desc,
            // SAFETY: the offset lies inside the block allocated above.
            avail: unsafe { mem.add(avail_off) } as *mut u16,
            // SAFETY: as for `avail`.
            used: unsafe { mem.add(used_off) },
            free,
            chained,
            next_avail: 0,
            last_used: 0,
        })
    }

    pub fn index(&self) -> u16 {
        self.index
    }

    pub fn size(&self) -> u16 {
        self.size
    }

    /// Guest-physical addresses of the descriptor table, available ring and
    /// used ring, for the transport's registers.
    pub fn addresses(&self) -> (u64, u64, u64) {
        (self.desc as u64, self.avail as u64, self.used as u64)
    }

    /// Free descriptors left.
    pub fn free_count(&self) -> usize {
        self.free.len()
    }

    /// The id the next [`add`](Self::add) will return.
    pub fn peek_free(&self) -> Option<&u16> {
        self.free.last()
    }

    /// Makes the buffer `addr..addr+len` available to the device, writable
    /// by it if `device_writes`. Returns its id, or None if the queue is
    /// full. The caller notifies the device (once for several buffers).
    ///
    /// # Safety
    /// The buffer must stay valid, and untouched by the driver, until the
    /// device returns it through [`pop_used`](Self::pop_used).
    pub unsafe fn add(&mut self, addr: *const u8, len: u32, device_writes: bool) -> Option<u16> {
        let id = self.free.pop()?;
        let d = Desc {
            addr: addr as u64,
            len,
            flags: if device_writes { DESC_F_WRITE } else { 0 },
            next: 0,
        };
        // SAFETY: id < size: the write stays inside the descriptor table.
        unsafe { core::ptr::write_volatile(self.desc.add(id as usize), d) };
        self.publish(id);
        Some(id)
    }

    /// Makes a two-descriptor chain available: `out` (read by the device)
    /// then `inp` (written by it), as request/response devices such as
    /// virtio-mem want. Returns the head's id, or None if fewer than two
    /// descriptors are free.
    ///
    /// # Safety
    /// As for [`add`](Self::add), for both buffers.
    pub unsafe fn add_pair(
        &mut self,
        out: *const u8,
        out_len: u32,
        inp: *mut u8,
        inp_len: u32,
    ) -> Option<u16> {
        if self.free.len() < 2 {
            return None;
        }
        let head = self.free.pop()?;
        let tail = self.free.pop()?;
        let first = Desc {
            addr: out as u64,
            len: out_len,
            flags: DESC_F_NEXT,
            next: tail,
        };
        let second = Desc {
            addr: inp as u64,
            len: inp_len,
            flags: DESC_F_WRITE,
            next: 0,
        };
        // SAFETY: both ids < size: the writes stay inside the table.
        unsafe {
            core::ptr::write_volatile(self.desc.add(head as usize), first);
            core::ptr::write_volatile(self.desc.add(tail as usize), second);
        }
        self.chained[head as usize] = tail;
        self.publish(head);
        Some(head)
    }

    /// Makes a chain of buffers `(addr, len, device_writes)` available, in
    /// order (virtio-blk: header, data, status). Returns the head's id, or
    /// None if fewer than `bufs.len()` descriptors are free, or `bufs` is
    /// empty or longer than [`MAX_CHAIN`].
    ///
    /// # Safety
    /// As for [`add`](Self::add), for every buffer.
    pub unsafe fn add_chain(&mut self, bufs: &[(*const u8, u32, bool)]) -> Option<u16> {
        if bufs.is_empty() || bufs.len() > MAX_CHAIN || self.free.len() < bufs.len() {
            return None;
        }
        // The ids this chain takes, in chain order (no allocation here).
        let mut ids = [0u16; MAX_CHAIN];
        for id in ids.iter_mut().take(bufs.len()) {
            *id = self.free.pop()?;
        }
        for (i, &(addr, len, writes)) in bufs.iter().enumerate() {
            let last = i + 1 == bufs.len();
            let d = Desc {
                addr: addr as u64,
                len,
                flags: if writes { DESC_F_WRITE } else { 0 } | if last { 0 } else { DESC_F_NEXT },
                next: if last { 0 } else { ids[i + 1] },
            };
            // SAFETY: ids are < size: the writes stay inside the table.
            unsafe { core::ptr::write_volatile(self.desc.add(ids[i] as usize), d) };
            self.chained[ids[i] as usize] = if last { NO_NEXT } else { ids[i + 1] };
        }
        self.publish(ids[0]);
        Some(ids[0])
    }

    /// Puts descriptor `id` in the next available-ring slot and publishes it.
    fn publish(&mut self, id: u16) {
        let mask = self.size - 1;
        // SAFETY: the slot index is masked to size: inside the ring.
        unsafe {
            core::ptr::write_volatile(self.avail.add(2 + (self.next_avail & mask) as usize), id);
        }
        self.next_avail = self.next_avail.wrapping_add(1);
        // The descriptor and ring slot must be visible before the index.
        fence(Ordering::SeqCst);
        // SAFETY: avail[1] is the ring's idx field.
        unsafe { core::ptr::write_volatile(self.avail.add(1), self.next_avail) };
    }

    /// False when the device set VIRTQ_USED_F_NO_NOTIFY: it polls the
    /// queue itself, so a notification (a VM exit) would be wasted.
    pub fn device_wants_notify(&self) -> bool {
        // SAFETY: offset 0 of the used ring is its flags field.
        let flags = unsafe { core::ptr::read_volatile(self.used as *const u16) };
        flags & USED_F_NO_NOTIFY == 0
    }

    /// Used elements the device has published that are not popped yet.
    pub fn used_pending(&self) -> u16 {
        // SAFETY: offset 2 of the used ring is its idx field.
        let idx = unsafe { core::ptr::read_volatile(self.used.add(2) as *const u16) };
        idx.wrapping_sub(self.last_used)
    }

    /// The next buffer the device has used, if any.
    pub fn pop_used(&mut self) -> Option<Used> {
        // SAFETY: offset 2 of the used ring is its idx field.
        let idx = unsafe { core::ptr::read_volatile(self.used.add(2) as *const u16) };
        if idx == self.last_used {
            return None;
        }
        // Read the element only after seeing the index that published it.
        fence(Ordering::SeqCst);
        let slot = (self.last_used & (self.size - 1)) as usize;
        // SAFETY: slot < size; elements start at offset 4, 8 bytes each.
        let (id, len) = unsafe {
            let e = self.used.add(4 + 8 * slot) as *const u32;
            (
                core::ptr::read_volatile(e),
                core::ptr::read_volatile(e.add(1)),
            )
        };
        self.last_used = self.last_used.wrapping_add(1);
        // A device that reports an id it never got is broken; ignoring the
        // element keeps the free list consistent.
        if id >= self.size as u32 || self.free.contains(&(id as u16)) {
            return self.pop_used();
        }
        self.free.push(id as u16);
        // Return the rest of the chain (each link names the next one).
        let mut next = core::mem::replace(&mut self.chained[id as usize], NO_NEXT);
        while next != NO_NEXT && (next as usize) < self.chained.len() {
            self.free.push(next);
            next = core::mem::replace(&mut self.chained[next as usize], NO_NEXT);
        }
        Some(Used { id: id as u16, len })
    }
}

impl Drop for VirtQueue {
    fn drop(&mut self) {
        // SAFETY: `mem` came from `alloc_zeroed(self.layout)`. A driver drops
        // a queue only after resetting its device, which then no longer uses it.
        unsafe { dealloc(self.mem, self.layout) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Plays the device: puts `id` in the used ring with `len`.
    fn device_uses(q: &VirtQueue, slot: u16, id: u16, len: u32) {
        let (_, _, used) = q.addresses();
        let used = used as *mut u8;
        // SAFETY: slot < size; the used ring lies in the queue's block.
        unsafe {
            let e = used.add(4 + 8 * slot as usize) as *mut u32;
            e.write_volatile(id as u32);
            e.add(1).write_volatile(len);
            (used.add(2) as *mut u16).write_volatile(slot + 1);
        }
    }

    fn desc(q: &VirtQueue, id: u16) -> Desc {
        // SAFETY: id < size.
        unsafe { core::ptr::read_volatile(q.desc.add(id as usize)) }
    }

    #[test]
    fn chains_of_three_link_and_free_every_descriptor() {
        let mut q = VirtQueue::new(0, 4).unwrap();
        let (h, mut d, mut st) = ([0u8; 16], [0u8; 512], [0u8; 1]);
        let bufs = [
            (h.as_ptr(), 16, false),
            (d.as_mut_ptr() as *const u8, 512, true),
            (st.as_mut_ptr() as *const u8, 1, true),
        ];
        // SAFETY: the buffers outlive the queue's use of them in this test.
        let head = unsafe { q.add_chain(&bufs) }.unwrap();
        assert_eq!(q.free_count(), 1);
        let first = desc(&q, head);
        assert_eq!((first.len, first.flags), (16, DESC_F_NEXT));
        let mid = desc(&q, first.next);
        assert_eq!((mid.len, mid.flags), (512, DESC_F_WRITE | DESC_F_NEXT));
        let last = desc(&q, mid.next);
        assert_eq!((last.len, last.flags), (1, DESC_F_WRITE));
        // SAFETY: as above. Too long, empty, or more than is free: refused.
        unsafe {
            assert!(q.add_chain(&bufs).is_none());
            assert!(q.add_chain(&[]).is_none());
            assert!(q.add_chain(&[bufs[0]; MAX_CHAIN + 1]).is_none());
        }
        device_uses(&q, 0, head, 513);
        assert_eq!(q.pop_used(), Some(Used { id: head, len: 513 }));
        assert_eq!(q.free_count(), 4, "the whole chain is free again");
        // SAFETY: as above.
        assert!(unsafe { q.add_chain(&bufs) }.is_some());
    }

    #[test]
    fn pairs_chain_and_free_both_descriptors() {
        let mut q = VirtQueue::new(0, 4).unwrap();
        let req = [1u8; 24];
        let mut resp = [0u8; 10];
        // SAFETY: the buffers outlive the queue's use of them in this test.
        let head = unsafe { q.add_pair(req.as_ptr(), 24, resp.as_mut_ptr(), 10) }.unwrap();
        assert_eq!(q.free_count(), 2);
        let d = desc(&q, head);
        assert_eq!(d.flags, DESC_F_NEXT);
        assert_eq!(d.len, 24);
        let t = desc(&q, d.next);
        assert_eq!(t.flags, DESC_F_WRITE);
        assert_eq!(t.addr, resp.as_ptr() as u64);
        // SAFETY: avail[1] is idx, avail[2] the first ring slot.
        assert_eq!(unsafe { q.avail.add(2).read_volatile() }, head);
        assert_eq!(unsafe { q.avail.add(1).read_volatile() }, 1);
        assert_eq!(q.pop_used(), None);
        device_uses(&q, 0, head, 10);
        assert_eq!(q.pop_used(), Some(Used { id: head, len: 10 }));
        assert_eq!(q.free_count(), 4, "both descriptors are free again");
        // Two pairs fill a 4-entry queue; a third does not fit.
        // SAFETY: as above.
        unsafe {
            assert!(q
                .add_pair(req.as_ptr(), 24, resp.as_mut_ptr(), 10)
                .is_some());
            assert!(q
                .add_pair(req.as_ptr(), 24, resp.as_mut_ptr(), 10)
                .is_some());
            assert!(q
                .add_pair(req.as_ptr(), 24, resp.as_mut_ptr(), 10)
                .is_none());
        }
    }
}
