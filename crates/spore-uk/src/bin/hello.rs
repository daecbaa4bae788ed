//! hello: greets, checks the heap with 64 MiB of 1 MiB allocations (a pattern
//! written into and read back from every page), and exits with `exit=N` from
//! the command line (default 0), or 1 if the heap check fails. A `panic` word
//! on the command line makes it panic instead, to show the panic path (101);
//! `fault` makes it execute an invalid instruction (a vCPU error).
#![no_std]
#![no_main]

extern crate alloc;

use alloc::alloc::{alloc, dealloc, Layout};

use spore_uk::clock::Instant;
use spore_uk::heap::heap_size;
use spore_uk::{println, BootInfo};

spore_uk::entry!(main);

const CHUNK: usize = 1 << 20;
const CHUNKS: usize = 64;
const PAGE: usize = 4096;

fn main(_info: &BootInfo) -> i32 {
    println!("hello from spore-uk");
    println!(
        "cmdline: \"{}\"; heap: {} MiB",
        spore_uk::cmdline(),
        heap_size() >> 20
    );
    if spore_uk::arg("panic").is_some() {
        panic!("asked to panic by the command line");
    }
    if spore_uk::arg("fault").is_some() {
        // An invalid opcode with no IDT: the CPU cannot deliver the fault and
        // shuts down; the VMM must stop with an error naming that exit.
        // SAFETY: never returns; the VM stops here.
        unsafe { core::arch::asm!("ud2", options(noreturn)) }
    }
    let code = match spore_uk::arg("exit") {
        None => 0,
        Some(v) => match v.parse::<u8>() {
            Ok(c) => i32::from(c),
            Err(_) => {
                println!("exit={v} is not a number from 0 to 255");
                return 1;
            }
        },
    };
    let start = Instant::now();
    match heap_check() {
        Ok(()) => match start.elapsed_us() {
            Some(us) => println!("heap check passed: {CHUNKS} x 1 MiB in {us} us"),
            None => println!("heap check passed: {CHUNKS} x 1 MiB"),
        },
        Err(e) => {
            println!("heap check failed: {e}");
            return 1;
        }
    }
    code
}

fn pattern(chunk: usize, word: usize) -> u64 {
    ((chunk as u64) << 40 | word as u64) ^ 0x5a5a_0000_c3c3_0000
}

fn heap_check() -> Result<(), &'static str> {
    let layout = Layout::from_size_align(CHUNK, PAGE).map_err(|_| "bad layout")?;
    let mut chunks = [core::ptr::null_mut::<u64>(); CHUNKS];
    let mut result = Ok(());
    for slot in chunks.iter_mut() {
        // SAFETY: layout has a non-zero size.
        let p = unsafe { alloc(layout) } as *mut u64;
        if p.is_null() {
            result = Err("heap too small for 64 MiB");
            break;
        }
        *slot = p;
    }
    if result.is_ok() {
        let words = CHUNK / 8;
        // Volatile accesses so the writes really reach every page.
        for (i, &p) in chunks.iter().enumerate() {
            for w in 0..words {
                // SAFETY: p points to CHUNK bytes we own.
                unsafe { p.add(w).write_volatile(pattern(i, w)) };
            }
        }
        'verify: for (i, &p) in chunks.iter().enumerate() {
            for w in 0..words {
                // SAFETY: as above.
                if unsafe { p.add(w).read_volatile() } != pattern(i, w) {
                    result = Err("pattern mismatch");
                    break 'verify;
                }
            }
        }
    }
    for &p in chunks.iter().filter(|p| !p.is_null()) {
        // SAFETY: allocated above with this layout.
        unsafe { dealloc(p as *mut u8, layout) };
    }
    result
}
