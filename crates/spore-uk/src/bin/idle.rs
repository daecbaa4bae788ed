//! idle: sleeps through the signal port's WAIT for `secs=N` seconds of TSC
//! time (default one second), then prints how often it woke. Shows that an
//! idle unikernel costs the host no CPU.
#![no_std]
#![no_main]

use spore_uk::clock::Instant;
use spore_uk::{println, wait, BootInfo};

spore_uk::entry!(main);

const WAIT_US: u64 = 1_000_000;

fn main(_info: &BootInfo) -> i32 {
    let secs: u64 = spore_uk::arg("secs")
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let total_us = secs.saturating_mul(1_000_000);
    let start = Instant::now();
    // Without a TSC frequency, assume each wait lasted its whole timeout.
    let mut assumed_us = 0u64;
    let (mut woken, mut timed_out) = (0u64, 0u64);
    loop {
        let elapsed = start.elapsed_us().unwrap_or(assumed_us);
        if elapsed >= total_us {
            break;
        }
        let timeout = (total_us - elapsed).min(WAIT_US);
        if wait(timeout as u32) {
            woken += 1;
        } else {
            timed_out += 1;
        }
        assumed_us += timeout;
    }
    println!(
        "idle: {} wakeups ({woken} by devices, {timed_out} timeouts) in {secs} s",
        woken + timed_out
    );
    0
}
