//! boot-mark: signals mark 1 as its very first action, so the VMM can time a
//! boot from its start to the guest's first instruction of app code. With
//! `hold_ms=N` it then sleeps N ms in the signal port's WAIT (so a benchmark
//! can read the VMM's memory use while the guest is alive), and exits 0.
#![no_std]
#![no_main]

use spore_uk::BootInfo;

spore_uk::entry!(main);

fn main(_info: &BootInfo) -> i32 {
    spore_uk::mark(1);
    let hold_ms: u32 = spore_uk::arg("hold_ms")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    if hold_ms > 0 {
        let start = spore_uk::clock::Instant::now();
        let hold_us = u64::from(hold_ms) * 1000;
        while start.elapsed_us().is_some_and(|us| us < hold_us) {
            spore_uk::wait(hold_ms.saturating_mul(1000));
        }
    }
    0
}
