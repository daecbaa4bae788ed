//! snaptest: the snapshot scenario's guest. Fills `mib=N` MiB (default 32)
//! of heap with a pattern that depends on every word's position, then counts
//! `rounds=N` rounds (default 60), printing `count I` and sleeping
//! `sleep_ms=N` (default 50) in the signal port's `WAIT` each round. Finally
//! it checks every word of the pattern, prints `verify ok checksum=X` (or
//! `verify FAILED ...`) and exits 0 (or 3).
//!
//! With `rewrite=N` (default 0), each round first rewrites N MiB of the
//! pattern, the chunks after the previous round's, with a new generation
//! (every third generation is all zeros), so memory keeps changing between
//! snapshots; verify checks each chunk against its last generation. This is
//! what diff snapshots must capture, zeroed pages included.
//!
//! Snapshotted mid-count and restored, it must go on counting where it
//! stopped and find its pattern intact.
//!
//! With `point=T`, right after filling it asks the VMM for a snapshot tagged
//! T (a guest-triggered snapshot point) and prints
//! `snapshot point T: Taken|Restored|Failed|NotConfigured` before counting:
//! a VM restored from that snapshot prints `Restored` first of all.
#![no_std]
#![no_main]

extern crate alloc;

use alloc::alloc::{alloc, Layout};

use spore_uk::{println, BootInfo};

spore_uk::entry!(main);

const CHUNK: usize = 1 << 20;
const WORDS: usize = CHUNK / 8;

fn num(key: &str, default: u64) -> u64 {
    spore_uk::arg(key)
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn pattern(chunk: usize, word: usize) -> u64 {
    let x = ((chunk as u64) << 32 | word as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x ^ 0xa5a5_5a5a_0f0f_f0f0
}

/// The word of a chunk rewritten to generation `gen` (0: the first fill).
fn value(chunk: usize, word: usize, gen: u64) -> u64 {
    match gen {
        0 => pattern(chunk, word),
        g if g % 3 == 0 => 0,
        g => pattern(chunk, word) ^ g.wrapping_mul(0x2545_f491_4f6c_dd1d),
    }
}

fn main(_info: &BootInfo) -> i32 {
    let mib = num("mib", 32) as usize;
    let rounds = num("rounds", 60);
    let sleep_us = (num("sleep_ms", 50) * 1000).min(10_000_000) as u32;
    let rewrite = num("rewrite", 0) as usize;
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
    println!("filled {mib} MiB");
    if let Some(tag) = spore_uk::arg("point").and_then(|v| v.parse::<u32>().ok()) {
        let r = spore_uk::snapshot_point(tag);
        println!("snapshot point {tag}: {r:?}");
    }
    let mut gens = alloc::vec![0u64; mib];
    let mut next_chunk = 0;
    let mut next_gen = 1;
    for i in 0..rounds {
        for _ in 0..rewrite.min(mib) {
            let c = next_chunk;
            next_chunk = (next_chunk + 1) % mib;
            for w in 0..WORDS {
                // SAFETY: w < WORDS words of a live 1 MiB allocation.
                unsafe { chunks[c].add(w).write_volatile(value(c, w, next_gen)) };
            }
            gens[c] = next_gen;
            next_gen += 1;
        }
        println!("count {i}");
        let start = spore_uk::clock::Instant::now();
        // WAIT may end early; sleep the whole interval.
        loop {
            let left = match start.elapsed_us() {
                Some(us) if us >= u64::from(sleep_us) => break,
                Some(us) => u64::from(sleep_us) - us,
                None => u64::from(sleep_us),
            };
            spore_uk::wait(left as u32);
            if start.elapsed_us().is_none() {
                break;
            }
        }
    }
    let mut sum: u64 = 0;
    for (c, &p) in chunks.iter().enumerate() {
        for w in 0..WORDS {
            // SAFETY: as above.
            let v = unsafe { p.add(w).read_volatile() };
            if v != value(c, w, gens[c]) {
                println!("verify FAILED at MiB {c} word {w}: {v:#x}");
                return 3;
            }
            sum = sum.wrapping_add(v);
        }
    }
    println!("verify ok checksum={sum:#x} pages={}", mib * CHUNK / 4096);
    0
}
