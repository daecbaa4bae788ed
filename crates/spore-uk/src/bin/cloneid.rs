//! cloneid: the clone-identity and copy-on-write disk guest.
//!
//! Every round it prints a random number from `spore_uk::random_u64` (seeded
//! from virtio-rng, reseeded when the VM's clone generation changes) and
//! sleeps in `wait`. With a virtio-blk disk, a booted VM (generation 0)
//! writes `source` into sector 0 first; a clone, when it sees its new
//! generation, reads sector 1, writes `clone G` there, and reads it back,
//! so a test can check that each clone sees only its own write.
//!
//! Lines: `cloneid start gen=G`, `disk source wrote`,
//! `vsock cid=C` (with a vsock device, at start and after a clone),
//! `cloned gen=G reseeds=R`, `disk gen=G sector0=S before=B after=A`,
//! `rand gen=G round=I value=HEX reseeds=R`, `cloneid done`.
//! Exit: 0 after `rounds`, 2 = a disk request failed, 101 = no virtio-rng.
#![no_std]
#![no_main]

use spore_uk::virtio::blk::{VirtioBlk, SECTOR};
use spore_uk::{generation, println, random, wait, BootInfo};

spore_uk::entry!(main);

/// Formats into a sector buffer (the rest stays zero).
struct SectorWriter<'a>(&'a mut [u8], usize);

impl core::fmt::Write for SectorWriter<'_> {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        let end = self.1 + s.len();
        self.0
            .get_mut(self.1..end)
            .ok_or(core::fmt::Error)?
            .copy_from_slice(s.as_bytes());
        self.1 = end;
        Ok(())
    }
}

fn text(sector: &[u8]) -> &str {
    let end = sector
        .iter()
        .position(|&b| b == 0)
        .unwrap_or(sector.len())
        .min(32);
    core::str::from_utf8(&sector[..end]).unwrap_or("<binary>")
}

/// The vsock device's guest CID straight from its config space (offset
/// 0x100 of the mmio window), without driving the device.
fn vsock_cid(info: &BootInfo) -> Option<u64> {
    let dev = spore_uk::virtio::find_device(info, spore_uk::virtio::device_id::VSOCK)?;
    let cfg = (dev.base + 0x100) as *const u32;
    // SAFETY: the boot info lists this identity-mapped mmio window; config
    // reads have no side effects on the device.
    let (lo, hi) = unsafe {
        (
            core::ptr::read_volatile(cfg),
            core::ptr::read_volatile(cfg.add(1)),
        )
    };
    Some(lo as u64 | (hi as u64) << 32)
}

fn main(info: &BootInfo) -> i32 {
    let arg = |k, d: u64| spore_uk::arg(k).and_then(|v| v.parse().ok()).unwrap_or(d);
    let rounds = arg("rounds", 1000);
    let sleep_us = arg("sleep_ms", 50)
        .saturating_mul(1000)
        .min(u32::MAX as u64) as u32;
    let mut disk = VirtioBlk::new(info, 0).ok();
    let mut seen = generation();
    println!("cloneid start gen={seen}");
    if let Some(cid) = vsock_cid(info) {
        println!("vsock cid={cid}");
    }
    let mut sector = [0u8; SECTOR];
    if let Some(d) = disk.as_mut() {
        if seen == 0 {
            sector[..6].copy_from_slice(b"source");
            if d.write(0, &sector).and_then(|()| d.flush()).is_err() {
                println!("disk source write failed");
                return 2;
            }
            println!("disk source wrote");
        }
    }
    for round in 0..rounds {
        let value = random::random_u64();
        let (reseeds, _) = random::seed_info().unwrap_or((0, 0));
        let now = generation();
        if now != seen {
            seen = now;
            println!("cloned gen={now} reseeds={reseeds}");
            if let Some(cid) = vsock_cid(info) {
                println!("vsock cid={cid}");
            }
            if let Some(d) = disk.as_mut() {
                let mut s0 = [0u8; SECTOR];
                let mut before = [0u8; SECTOR];
                let mut after = [0u8; SECTOR];
                let mut mine = [0u8; SECTOR];
                let _ =
                    core::fmt::write(&mut SectorWriter(&mut mine, 0), format_args!("clone {now}"));
                let ok = d.read(0, &mut s0).is_ok()
                    && d.read(1, &mut before).is_ok()
                    && d.write(1, &mine).is_ok()
                    && d.flush().is_ok()
                    && d.read(1, &mut after).is_ok();
                if !ok {
                    println!("disk gen={now} request failed");
                    return 2;
                }
                println!(
                    "disk gen={now} sector0={} before={} after={}",
                    text(&s0),
                    text(&before),
                    text(&after)
                );
            }
        }
        println!("rand gen={now} round={round} value={value:016x} reseeds={reseeds}");
        wait(sleep_us);
    }
    println!("cloneid done");
    0
}
