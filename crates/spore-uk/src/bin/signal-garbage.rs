//! signal-garbage: a misbehaving guest. It writes malformed values of every
//! width and opcode to the signal port, reads it at odd widths, then says it
//! survived and exits 0. The VMM must ignore the junk and keep running.
//!
//! With `flood=N` it then writes junk N more times, busy-waits `pause_ms`
//! (default 0), and writes one last junk value: a guest trying to fill the
//! host's disk through the VMM's warnings, which the log's rate limit must
//! stop (and later report what it dropped).
#![no_std]
#![no_main]

use core::arch::asm;

use spore_abi::signal::SIGNAL_PORT;
use spore_uk::{println, BootInfo};

spore_uk::entry!(main);

fn out8(v: u8) {
    // SAFETY: port I/O to the signal port; it has no memory effects.
    unsafe { asm!("out dx, al", in("dx") SIGNAL_PORT, in("al") v, options(nomem, nostack)) }
}

fn out16(v: u16) {
    // SAFETY: as for out8.
    unsafe { asm!("out dx, ax", in("dx") SIGNAL_PORT, in("ax") v, options(nomem, nostack)) }
}

fn in8() -> u8 {
    let v: u8;
    // SAFETY: as for out8.
    unsafe { asm!("in al, dx", in("dx") SIGNAL_PORT, out("al") v, options(nomem, nostack)) }
    v
}

fn main(_info: &BootInfo) -> i32 {
    out8(0x01);
    out16(0x0100);
    let _ = in8();
    for op in [0x00u32, 0x07, 0x42, 0x7f, 0xff] {
        spore_uk::port::outl(SIGNAL_PORT, (op << 24) | 0xab_cdef);
    }
    // FORK and DONE are real operations now (they clone and end the VM):
    // not garbage, so not sent here.
    // Ports next to the signal port hit no device.
    spore_uk::port::outl(SIGNAL_PORT + 1, 0xffff_ffff);
    let flood: u64 = spore_uk::cmdline::arg("flood")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    if flood > 0 {
        for _ in 0..flood {
            spore_uk::port::outl(SIGNAL_PORT, 0x7f00_0000);
        }
        let pause_us = spore_uk::cmdline::arg("pause_ms")
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
            * 1000;
        let start = spore_uk::clock::Instant::now();
        while start.elapsed_us().is_some_and(|us| us < pause_us) {
            core::hint::spin_loop();
        }
        spore_uk::port::outl(SIGNAL_PORT, 0x7f00_0000);
        println!("flooded {flood} (tsc {:?} kHz)", spore_uk::clock::tsc_khz());
    }
    println!("survived");
    0
}
