//! clonetest: the clone scenarios' guest.
//!
//! `mode=pattern` (default): fills `mib=N` MiB (default 4) with a pattern
//! keyed by its id (0 for the source), then forks `clones=N` clones (default
//! 20; 0 = the VMM's configured count). Each clone checks it sees its
//! parent's pattern, writes its own (id = parent id × 100 + clone number),
//! holds it `hold_ms=N` (default 200) while its siblings write theirs, and
//! checks it reads back its own: it prints `clone ID ok depth D` (or
//! `clone ID FAILED ...` and exits 3). With `levels=L` (default 1) a clone
//! forks `nest=N` (default 2) clones of its own, down to depth L. A source
//! that goes on (continue mode) waits `hold_ms` twice, checks it still holds
//! its own pattern, prints `source ID ok` and exits 0. At the end a clone
//! does what `after=` says: `done` (default: signal DONE), `stay` (sleep in
//! WAIT forever), or `exit` (exit 0).
//!
//! `mode=bench`: forks with count 0 (the VMM's configured count), and each
//! clone marks 1 at once (its first instruction after the fork) and does
//! `after=`; so does a source that goes on.
//!
//! `mode=loop`: forks one clone at a time for as long as the VMM lets it
//! (in continue mode the source and every clone go on forking: a fork
//! bomb), then prints `id ID: fork refused after N forks` and stays in
//! WAIT; each clone prints `forked id ID` first.
#![no_std]
#![no_main]

extern crate alloc;

use alloc::alloc::{alloc, Layout};
use alloc::vec::Vec;

use spore_uk::{println, BootInfo};

spore_uk::entry!(main);

const CHUNK: usize = 1 << 20;
const WORDS: usize = CHUNK / 8;

fn num(key: &str, default: u64) -> u64 {
    spore_uk::arg(key)
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn pattern(id: u64, chunk: usize, word: usize) -> u64 {
    let x = ((chunk as u64) << 32 | word as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x ^ id.wrapping_mul(0xff51_afd7_ed55_8ccd) ^ 0xa5a5_5a5a_0f0f_f0f0
}

fn fill(chunks: &[*mut u64], id: u64) {
    for (c, &p) in chunks.iter().enumerate() {
        for w in 0..WORDS {
            // SAFETY: w < WORDS words of a live 1 MiB allocation.
            unsafe { p.add(w).write_volatile(pattern(id, c, w)) };
        }
    }
}

/// The first mismatch, if any: (MiB, word, value).
fn check(chunks: &[*mut u64], id: u64) -> Option<(usize, usize, u64)> {
    for (c, &p) in chunks.iter().enumerate() {
        for w in 0..WORDS {
            // SAFETY: as in `fill`.
            let v = unsafe { p.add(w).read_volatile() };
            if v != pattern(id, c, w) {
                return Some((c, w, v));
            }
        }
    }
    None
}

fn sleep_ms(ms: u64) {
    let start = spore_uk::clock::Instant::now();
    let total = ms * 1000;
    loop {
        let left = match start.elapsed_us() {
            Some(us) if us >= total => return,
            Some(us) => total - us,
            None => return,
        };
        spore_uk::wait(left.min(1_000_000) as u32);
    }
}

fn after() -> i32 {
    match spore_uk::arg("after") {
        Some("stay") => loop {
            spore_uk::wait(1_000_000);
        },
        Some("exit") => 0,
        _ => spore_uk::done(),
    }
}

/// `mode=loop`: fork until refused, then stay.
fn fork_loop() -> i32 {
    let mut id = 0u64;
    let mut forks = 0u64;
    loop {
        match spore_uk::fork(1) {
            None => break,
            Some(0) => forks += 1,
            Some(k) => {
                id = id.wrapping_mul(100).wrapping_add(u64::from(k));
                forks = 0;
                println!("forked id {id}");
            }
        }
    }
    println!("id {id}: fork refused after {forks} forks");
    loop {
        spore_uk::wait(1_000_000);
    }
}

fn main(_info: &BootInfo) -> i32 {
    if spore_uk::arg("mode") == Some("bench") {
        return match spore_uk::fork(0) {
            None => {
                println!("fork failed");
                3
            }
            Some(0) => after(),
            Some(_) => {
                spore_uk::mark(1);
                after()
            }
        };
    }
    if spore_uk::arg("mode") == Some("loop") {
        return fork_loop();
    }
    let mib = num("mib", 4) as usize;
    let clones = num("clones", 20) as u32;
    let hold = num("hold_ms", 200);
    let levels = num("levels", 1);
    let nest = num("nest", 2) as u32;
    let Ok(layout) = Layout::from_size_align(CHUNK, 4096) else {
        return 2;
    };
    let mut chunks: Vec<*mut u64> = Vec::with_capacity(mib);
    for c in 0..mib {
        // SAFETY: non-zero-sized layout; the pointer is checked for null.
        let p = unsafe { alloc(layout) } as *mut u64;
        if p.is_null() {
            println!("out of memory after {c} MiB");
            return 2;
        }
        chunks.push(p);
    }
    let mut id = 0u64;
    let mut depth = 0u64;
    fill(&chunks, id);
    println!("source filled {mib} MiB");
    while depth < levels {
        let n = if depth == 0 { clones } else { nest };
        match spore_uk::fork(n) {
            None => {
                println!("id {id}: fork failed");
                return 3;
            }
            Some(0) => {
                sleep_ms(2 * hold);
                if let Some((c, w, v)) = check(&chunks, id) {
                    println!("source {id} FAILED at MiB {c} word {w}: {v:#x}");
                    return 3;
                }
                println!("source {id} ok");
                return 0;
            }
            Some(k) => {
                if let Some((c, w, v)) = check(&chunks, id) {
                    println!("clone of {id} FAILED: parent pattern at MiB {c} word {w}: {v:#x}");
                    return 3;
                }
                id = id * 100 + u64::from(k);
                depth += 1;
                fill(&chunks, id);
                sleep_ms(hold);
                if let Some((c, w, v)) = check(&chunks, id) {
                    println!("clone {id} FAILED at MiB {c} word {w}: {v:#x}");
                    return 3;
                }
                println!("clone {id} ok depth {depth}");
            }
        }
    }
    after()
}
