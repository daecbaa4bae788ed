//! snapbench: the guest of `spore bench snapshot`.
//!
//! Fills `mib=N` MiB (default 64) of heap with a position-dependent pattern,
//! marks 1 and prints `ready`, then polls the signal port (short `WAIT`s)
//! until the VMM reports it was restored from a snapshot. Right then it
//! marks 2 (its first instructions after the restore), reads one word of
//! each of `touch_pages=N` pages (default 1024) spread pseudo-randomly over
//! the filled memory, checking each against the pattern (with `write=1` it
//! also writes the word back), marks 3, prints `touched N ok` (or
//! `touch FAILED ...`) and exits 0 (or 3).
#![no_std]
#![no_main]

extern crate alloc;

use alloc::alloc::{alloc, Layout};

use spore_uk::signal::{wait_status, WaitStatus};
use spore_uk::{println, BootInfo};

spore_uk::entry!(main);

const CHUNK: usize = 1 << 20;
const WORDS: usize = CHUNK / 8;
const PAGES_PER_CHUNK: usize = CHUNK / 4096;
/// A prime: stepping by it visits every page once, far apart.
const STRIDE: u64 = 2_654_435_761;

fn num(key: &str, default: u64) -> u64 {
    spore_uk::arg(key)
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn pattern(chunk: usize, word: usize) -> u64 {
    ((chunk as u64) << 32 | word as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5a5a_a5a5_f0f0_0f0f
}

fn main(_info: &BootInfo) -> i32 {
    let mib = num("mib", 64).max(1) as usize;
    let touch = num("touch_pages", 1024);
    let write = num("write", 0) != 0;
    let Ok(layout) = Layout::from_size_align(CHUNK, 4096) else {
        return 2;
    };
    let mut chunks = alloc::vec::Vec::with_capacity(mib);
    for c in 0..mib {
        // SAFETY: non-zero-sized layout; the pointer is checked for null.
        let p = unsafe { alloc(layout) } as *mut u64;
        if p.is_null() {
            println!("out of memory after {c} MiB");
            return 2;
        }
        for w in 0..WORDS {
            // SAFETY: w < WORDS words of a live 1 MiB allocation.
            unsafe { p.add(w).write_volatile(pattern(c, w)) };
        }
        chunks.push(p);
    }
    spore_uk::mark(1);
    println!("ready");
    while wait_status(200) != WaitStatus::Restored {}
    spore_uk::mark(2);
    let pages = (mib * PAGES_PER_CHUNK) as u64;
    let touch = touch.min(pages);
    for i in 0..touch {
        let page = (i.wrapping_mul(STRIDE) % pages) as usize;
        let (c, pc) = (page / PAGES_PER_CHUNK, page % PAGES_PER_CHUNK);
        let w = pc * 512;
        // SAFETY: c < mib chunks, w < WORDS.
        let p = unsafe { chunks[c].add(w) };
        // SAFETY: as above.
        let v = unsafe { p.read_volatile() };
        if v != pattern(c, w) {
            println!("touch FAILED at page {page}: {v:#x}");
            return 3;
        }
        if write {
            // SAFETY: as above.
            unsafe { p.write_volatile(v) };
        }
    }
    spore_uk::mark(3);
    println!("touched {touch} ok");
    0
}
