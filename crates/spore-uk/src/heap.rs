//! The global heap: a talc allocator over every `MEM_FREE` region of the boot
//! info. Guest memory is identity-mapped, so a region's guest-physical address
//! is also its pointer.

use core::sync::atomic::{AtomicUsize, Ordering};

use spore_abi::boot::{MEM_FREE, MIN_IMAGE_ADDR};
use talc::{ErrOnOom, Span, Talc, Talck};

use crate::BootInfo;

#[cfg_attr(not(test), global_allocator)]
static ALLOCATOR: Talck<spin::Mutex<()>, ErrOnOom> = Talc::new(ErrOnOom).lock();

static HEAP_BYTES: AtomicUsize = AtomicUsize::new(0);

/// Gives every free region to the allocator; returns the bytes claimed.
///
/// # Safety
/// The free regions of `info` must be RAM that nothing else uses, as the
/// protocol guarantees. Call once.
pub(crate) unsafe fn init(info: &BootInfo) -> usize {
    let mut total = 0usize;
    let mut talc = ALLOCATOR.lock();
    for r in info.mem_regions().iter().filter(|r| r.kind == MEM_FREE) {
        // Free RAM never lies below the image; refusing it keeps a confused
        // VMM from handing out the page tables or the null page.
        let start = r.addr.max(MIN_IMAGE_ADDR);
        let end = r.addr.saturating_add(r.size);
        if end <= start {
            continue;
        }
        let span = Span::from_base_size(start as *mut u8, (end - start) as usize);
        // SAFETY: the caller guarantees the region is unused RAM, mapped 1:1.
        if let Ok(claimed) = unsafe { talc.claim(span) } {
            total += claimed.size();
        }
    }
    HEAP_BYTES.store(total, Ordering::Relaxed);
    total
}

/// Bytes of RAM given to the heap at start.
pub fn heap_size() -> usize {
    HEAP_BYTES.load(Ordering::Relaxed)
}
