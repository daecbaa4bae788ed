//! blkrate: reads its first virtio-blk disk in rounds, for the rate limiter
//! and drive-swap tests.
//!
//! Every round it reads sector 0 and prints its text (so a test sees a
//! swapped image), then reads `mib` MiB from sector 0 on in `chunk_kib`
//! requests and prints how long that took by the guest's clock, then
//! sleeps `sleep_ms`.
//!
//! Lines: `blkrate start capacity=SECTORS`, `blk round=R sector0=TEXT`,
//! `blk round=R read_mib=M us=T`, `blkrate done`.
//! Exit: 0 after `rounds`, 2 = a disk request failed, 3 = no disk.
#![no_std]
#![no_main]

extern crate alloc;

use spore_uk::virtio::blk::{VirtioBlk, SECTOR};
use spore_uk::{println, wait, BootInfo};

spore_uk::entry!(main);

fn text(sector: &[u8]) -> &str {
    let end = sector
        .iter()
        .position(|&b| b == 0 || b == b'\n')
        .unwrap_or(sector.len())
        .min(32);
    core::str::from_utf8(&sector[..end]).unwrap_or("<binary>")
}

fn main(info: &BootInfo) -> i32 {
    let arg = |k, d: u64| spore_uk::arg(k).and_then(|v| v.parse().ok()).unwrap_or(d);
    let rounds = arg("rounds", 1);
    let mib = arg("mib", 4);
    let chunk = (arg("chunk_kib", 128).clamp(1, 1024) as usize) << 10;
    let sleep_us = arg("sleep_ms", 100)
        .saturating_mul(1000)
        .min(u32::MAX as u64) as u32;
    let Ok(mut disk) = VirtioBlk::new(info, 0) else {
        println!("blkrate: no virtio-blk disk");
        return 3;
    };
    println!("blkrate start capacity={}", disk.capacity());
    let mut buf = alloc::vec![0u8; chunk];
    let disk_bytes = disk.capacity() * SECTOR as u64;
    for round in 0..rounds {
        if disk.read(0, &mut buf[..SECTOR]).is_err() {
            println!("blk round={round} sector0 read failed");
            return 2;
        }
        println!("blk round={round} sector0={}", text(&buf[..SECTOR]));
        let start = spore_uk::clock::Instant::now();
        let mut done = 0u64;
        while done < mib << 20 {
            // Wraps around a disk smaller than `mib`.
            let at = done % disk_bytes.max(1);
            let n = (chunk as u64).min(disk_bytes - at) as usize;
            if disk.read(at / SECTOR as u64, &mut buf[..n]).is_err() {
                println!("blk round={round} read failed at byte {done}");
                return 2;
            }
            done += n as u64;
        }
        let us = start.elapsed_us().unwrap_or(0);
        println!("blk round={round} read_mib={mib} us={us}");
        wait(sleep_us);
    }
    println!("blkrate done");
    0
}
