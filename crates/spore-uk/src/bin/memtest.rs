//! memtest: drives the virtio-mem device from the unikernel.
//!
//! Every mode first waits (up to 30 s) for the host to set a requested size
//! (`PATCH /hotplug/memory`) of at least `need=` MiB (default: what the mode
//! uses).
//!
//! - `mode=random blocks=N seed=S`: N plug/unplug operations on random
//!   blocks, each answer checked against a guest-side model (PLUG past the
//!   requested size → NACK, UNPLUG of an unplugged block → ERROR, STATE of a
//!   random range → PLUGGED/UNPLUGGED/MIXED); every plugged block gets a
//!   pattern written, and is read back before it is unplugged.
//! - `mode=touch-unplugged`: plugs a block, writes it, unplugs it, then
//!   waits for the VMM to retire the emptied KVM slot (`VirtioMem::sync`)
//!   and `hold_ms` (0), and writes to it again. The VMM must stop the VM; if the write goes through
//!   the app exits 1.
//! - `mode=reclaim size=MIB`: gives one tenant `size` MiB of blocks, fills
//!   every page, frees the tenant (unplug) and prints the TSC-timed unplug:
//!   `memtest: reclaim bytes=… plug_us=… fill_us=… unplug_us=…`.
//!   `hold_ms=N` sleeps N ms after printing `memtest: filled` and again after
//!   `memtest: reclaimed`, so a host can read the VMM's RSS at both points.
//!   `other=MIB` first gives a second tenant that much, filled and kept (the
//!   seed's first memory hog: with whole-block tenants nothing of it moves).
//! - `mode=persist size=MIB`: gives one tenant `size` MiB, writes a pattern
//!   word in every page, prints `memtest: filled`, holds (a host snapshots
//!   the VM here and restores it elsewhere: see "Snapshot holds" below),
//!   checks every page
//!   (`memtest: verified pages=…`), holds again, frees the tenant (unplug),
//!   prints `memtest: reclaimed` and holds a third time. The snapshot
//!   tests' guest: a restored VM must keep its plugged memory and give it
//!   back afterwards.
//!
//! - `mode=diff`: the diff snapshot tests' guest (blocks of the region by
//!   index, 4 per chunk with `slot_size_mib` = 4 × the block size; pattern
//!   A, B, C = generations 1, 2, 3, one word per page). Phase 1 plugs blocks
//!   0..32 and writes A everywhere. Phase 2 writes B in all of block 1 and
//!   in the first 16 pages of block 2, unplugs 3 and 4, unplugs and
//!   re-plugs 5 writing B in its first page only, and plugs 32 and 33
//!   writing B. Phase 3 writes C in the first page of block 0, unplugs 32,
//!   writes B in block 28 and unplugs the whole chunk 28..32 (its KVM slot
//!   is retired), then re-plugs 3 (writing nothing) and 29 (C in its first
//!   page). After each phase it prints `memtest: phase N`, holds (a host
//!   snapshots the VM here: a full, then diffs), and checks every
//!   block of the phase's model (unplugged blocks by STATE; released and
//!   re-plugged ones read zero where not rewritten: nothing older comes
//!   back), printing `memtest: verified phase N`. Finally it re-plugs 4, 28
//!   and 32 (zero) and prints `memtest: diff done`.
//!
//! Snapshot holds (persist and diff modes) last `snap_hold_ms` (default
//! `hold_ms`) at most, and end early when the host moves the requested size
//! (its "snapshot taken, go on") or in the VM restored from that snapshot.
//!
//! Exit codes: 0 ok, 1 a check failed (printed), 2 no virtio-mem device,
//! 3 the host never set the requested size.
#![no_std]
#![no_main]

extern crate alloc;

use alloc::vec::Vec;
use core::sync::atomic::{AtomicBool, Ordering};

use spore_uk::blockalloc::BlockAllocator;
use spore_uk::clock::Instant;
use spore_uk::println;
use spore_uk::signal::WaitStatus;
use spore_uk::virtio::mem::{BlockState, MemError, VirtioMem};

spore_uk::entry!(main);

const MIB: u64 = 1 << 20;
const PAGE: u64 = 4096;

macro_rules! check {
    ($cond:expr, $($msg:tt)*) => {
        if !$cond {
            println!("memtest: FAILED: {}", format_args!($($msg)*));
            return 1;
        }
    };
}

fn num(key: &str, default: u64) -> u64 {
    spore_uk::arg(key)
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// The value written at `off` of a block plugged in round `gen`.
fn pattern(block: u64, gen: u64, off: u64) -> u64 {
    (block << 40) ^ (gen << 20) ^ off ^ 0x5a5a_0000_0000_0001
}

/// Writes one word per page of the block.
fn fill(addr: u64, len: u64, block: u64, gen: u64) {
    let mut off = 0;
    while off < len {
        // SAFETY: the block is plugged and identity-mapped; nothing else
        // refers to it.
        unsafe { core::ptr::write_volatile((addr + off) as *mut u64, pattern(block, gen, off)) };
        off += PAGE;
    }
}

/// Offset of the first page whose word is wrong.
fn verify(addr: u64, len: u64, block: u64, gen: u64) -> Option<u64> {
    let mut off = 0;
    while off < len {
        // SAFETY: as for `fill`.
        let v = unsafe { core::ptr::read_volatile((addr + off) as *const u64) };
        if v != pattern(block, gen, off) {
            return Some(off);
        }
        off += PAGE;
    }
    None
}

fn wait_for_target(mem: &VirtioMem, need: u64) -> bool {
    let start = Instant::now();
    let mut polls = 0u64;
    while mem.requested_size() < need {
        let timed_out = match start.elapsed_us() {
            Some(us) => us > 30_000_000,
            None => polls > 300,
        };
        if timed_out {
            return false;
        }
        spore_uk::wait(100_000);
        mem.ack_interrupt();
        polls += 1;
    }
    true
}

/// Holds where a host snapshots the VM. A fixed hold alone races the host
/// on a loaded machine (the snapshot lands after the guest moved on), so it
/// also ends early when the host says it is done, by moving the requested
/// size (a config interrupt wakes the wait), or when this VM turns out to
/// be the restored copy (the snapshot was taken here; no host snapshots
/// the copy, so its later holds end at once). `ms` bounds it.
fn hold_for_snapshot(mem: &VirtioMem, ms: u64) {
    static RESTORED: AtomicBool = AtomicBool::new(false);
    if RESTORED.load(Ordering::Relaxed) {
        return;
    }
    let requested = mem.requested_size();
    hold_until(ms, |status| {
        mem.ack_interrupt();
        if status == WaitStatus::Restored {
            RESTORED.store(true, Ordering::Relaxed);
            return true;
        }
        mem.requested_size() != requested
    });
}

fn hold(ms: u64) {
    hold_until(ms, |_| false);
}

/// Waits (in the VMM) up to `ms` milliseconds, or until `done` says so
/// after a wake-up.
fn hold_until(ms: u64, mut done: impl FnMut(WaitStatus) -> bool) {
    let start = Instant::now();
    let mut left = ms * 1000;
    while left > 0 {
        let status = spore_uk::signal::wait_status(left.min(1_000_000) as u32);
        if done(status) {
            return;
        }
        left = match start.elapsed_us() {
            Some(us) => (ms * 1000).saturating_sub(us),
            // No TSC frequency: one wait per second asked for.
            None => left.saturating_sub(1_000_000),
        };
    }
}

fn main(info: &spore_uk::BootInfo) -> i32 {
    let mem = match VirtioMem::new(info) {
        Ok(m) => m,
        Err(e) => {
            println!("memtest: {e}");
            return 2;
        }
    };
    let c = mem.config();
    println!(
        "memtest: virtio-mem block={} MiB region={:#x}+{} MiB plugged={} MiB requested={} MiB",
        c.block_size / MIB,
        c.addr,
        c.region_size / MIB,
        c.plugged_size / MIB,
        c.requested_size / MIB
    );
    match spore_uk::arg("mode").unwrap_or("random") {
        "random" => random(mem),
        "touch-unplugged" => touch_unplugged(mem),
        "reclaim" => reclaim(mem),
        "persist" => persist(mem),
        "diff" => diff(mem),
        other => {
            println!("memtest: unknown mode {other}");
            1
        }
    }
}

fn random(mut mem: VirtioMem) -> i32 {
    let ops = num("blocks", 1000);
    let mut rng = XorShift(num("seed", 1).max(1).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let bs = mem.block_size();
    let base = mem.region_addr();
    let nblocks = mem.region_size() / bs.max(1);
    check!(bs > 0 && nblocks > 0, "empty region");
    if !wait_for_target(&mem, num("need", 1) * MIB) {
        println!("memtest: the host never set the requested size");
        return 3;
    }
    if mem.plugged_size() != 0 {
        check!(mem.unplug_all().is_ok(), "UNPLUG_ALL refused");
    }
    let requested = mem.requested_size();
    let limit = requested / bs;
    // Model: generation of each plugged block (0 = unplugged).
    let mut model: Vec<u64> = alloc::vec![0; nblocks as usize];
    let mut plugged = 0u64;
    let (mut plugs, mut unplugs, mut nacks, mut errors, mut states) = (0, 0, 0, 0, 0);
    let start = Instant::now();
    for op in 1..=ops {
        let b = rng.below(nblocks);
        let addr = base + b * bs;
        let gen = op;
        if model[b as usize] != 0 {
            // Plugged: check the pattern, unplug (half the time first try a
            // double PLUG, which must fail without changing anything).
            let g = model[b as usize];
            check!(
                verify(addr, bs, b, g).is_none(),
                "block {b} lost its pattern"
            );
            if rng.below(2) == 0 {
                let r = mem.plug(addr, 1);
                check!(
                    matches!(r, Err(MemError::Error) | Err(MemError::Nack)),
                    "PLUG of plugged block {b}: {r:?}"
                );
                errors += 1;
            }
            let r = mem.unplug(addr, 1);
            check!(r.is_ok(), "op {op}: UNPLUG of plugged block {b}: {r:?}");
            model[b as usize] = 0;
            plugged -= 1;
            unplugs += 1;
        } else {
            if rng.below(4) == 0 {
                let r = mem.unplug(addr, 1);
                check!(
                    r == Err(MemError::Error),
                    "op {op}: UNPLUG of unplugged block {b}: {r:?}"
                );
                errors += 1;
            }
            let r = mem.plug(addr, 1);
            if plugged >= limit {
                check!(r == Err(MemError::Nack), "op {op}: PLUG past target: {r:?}");
                nacks += 1;
                // Make room: unplug some plugged block, chosen at random.
                let victims: Vec<usize> = (0..model.len()).filter(|&i| model[i] != 0).collect();
                let v = victims[rng.below(victims.len() as u64) as usize];
                let vaddr = base + v as u64 * bs;
                check!(
                    verify(vaddr, bs, v as u64, model[v]).is_none(),
                    "block {v} lost its pattern"
                );
                check!(mem.unplug(vaddr, 1).is_ok(), "UNPLUG of block {v}");
                model[v] = 0;
                plugged -= 1;
                unplugs += 1;
                continue;
            }
            check!(r.is_ok(), "op {op}: PLUG of block {b}: {r:?}");
            fill(addr, bs, b, gen);
            model[b as usize] = gen;
            plugged += 1;
            plugs += 1;
        }
        // Every few ops, STATE of a random range against the model.
        if op % 8 == 0 {
            let first = rng.below(nblocks);
            let n = 1 + rng.below((nblocks - first).min(16));
            let p = (first..first + n)
                .filter(|&i| model[i as usize] != 0)
                .count() as u64;
            let want = match p {
                0 => BlockState::Unplugged,
                x if x == n => BlockState::Plugged,
                _ => BlockState::Mixed,
            };
            let r = mem.state(base + first * bs, n);
            check!(
                r == Ok(want),
                "STATE of {n} blocks at {first}: {r:?}, want {want:?}"
            );
            states += 1;
        }
        check!(
            mem.plugged_size() == plugged * bs,
            "op {op}: device plugged_size {} != model {}",
            mem.plugged_size(),
            plugged * bs
        );
    }
    // Leave nothing plugged, one UNPLUG_ALL.
    check!(mem.unplug_all().is_ok(), "final UNPLUG_ALL");
    check!(mem.plugged_size() == 0, "plugged after UNPLUG_ALL");
    let s = mem.stats();
    println!(
        "memtest: random ok ops={ops} plugs={plugs} unplugs={unplugs} nacks={nacks} errors={errors} states={states} requests={} waits={} us={}",
        s.requests,
        s.waits,
        start.elapsed_us().unwrap_or(0)
    );
    0
}

fn touch_unplugged(mut mem: VirtioMem) -> i32 {
    let bs = mem.block_size();
    let base = mem.region_addr();
    if !wait_for_target(&mem, bs) {
        println!("memtest: the host never set the requested size");
        return 3;
    }
    check!(mem.plug(base, 1).is_ok(), "PLUG of the first block");
    fill(base, bs, 0, 1);
    check!(verify(base, bs, 0, 1).is_none(), "pattern");
    check!(mem.unplug(base, 1).is_ok(), "UNPLUG of the first block");
    println!("memtest: unplugged block 0 of the region");
    // The VMM deletes an emptied chunk's KVM slot just after answering the
    // UNPLUG; after `sync` it is gone, so the touch meets no memory at all.
    check!(mem.sync().is_ok(), "sync after UNPLUG");
    hold(num("hold_ms", 0));
    println!("memtest: unplugged {base:#x}, touching it");
    // SAFETY: deliberately not: the block is unplugged; the VMM must stop
    // the VM here.
    unsafe { core::ptr::write_volatile((base + 0x1008) as *mut u64, 0xdead_beef) };
    println!("memtest: FAILED: a write to unplugged memory went through");
    1
}

fn reclaim(mem: VirtioMem) -> i32 {
    let size = num("size", 1024) * MIB;
    let hold_ms = num("hold_ms", 0);
    let other = num("other", 0) * MIB;
    if !wait_for_target(&mem, size + other) {
        println!("memtest: the host never set the requested size");
        return 3;
    }
    let mut alloc = match BlockAllocator::new(mem) {
        Ok(a) => a,
        Err(e) => {
            println!("memtest: FAILED: {e}");
            return 1;
        }
    };
    const TENANT: u16 = 1;
    const OTHER: u16 = 2;
    if other > 0 {
        match alloc.alloc(OTHER, other) {
            // SAFETY: the blocks stay plugged (the tenant is never freed).
            Ok(b) => unsafe { b.as_mut_slice() }
                .chunks_mut(PAGE as usize)
                .for_each(|p| p[0] = 0xa5),
            Err(e) => {
                println!("memtest: FAILED: alloc other {other}: {e}");
                return 1;
            }
        }
    }
    let t = Instant::now();
    let blocks = match alloc.alloc(TENANT, size) {
        Ok(b) => b,
        Err(e) => {
            println!("memtest: FAILED: alloc {size}: {e}");
            return 1;
        }
    };
    let plug_us = t.elapsed_us().unwrap_or(0);
    let t = Instant::now();
    // Touch every page, as a tenant that used its memory would.
    // SAFETY: the tenant's blocks are plugged until free_tenant below.
    let bytes = unsafe { blocks.as_mut_slice() };
    for (i, page) in bytes.chunks_mut(PAGE as usize).enumerate() {
        page[0] = i as u8;
        page[PAGE as usize - 1] = !(i as u8);
    }
    let fill_us = t.elapsed_us().unwrap_or(0);
    check!(
        alloc.device().plugged_size() == blocks.len + other,
        "device plugged_size {}",
        alloc.device().plugged_size()
    );
    println!("memtest: filled {} MiB", blocks.len / MIB);
    hold(hold_ms);
    let t = Instant::now();
    let freed = match alloc.free_tenant(TENANT) {
        Ok(f) => f,
        Err(e) => {
            println!("memtest: FAILED: free: {e}");
            return 1;
        }
    };
    let unplug_us = t.elapsed_us().unwrap_or(0);
    check!(freed.bytes == blocks.len, "freed {} bytes", freed.bytes);
    check!(
        alloc.device().plugged_size() == other,
        "device still has {} plugged",
        alloc.device().plugged_size()
    );
    println!(
        "memtest: reclaim bytes={} blocks={} requests={} plug_us={plug_us} fill_us={fill_us} unplug_us={unplug_us}",
        freed.bytes, freed.blocks, freed.requests
    );
    println!("memtest: reclaimed");
    hold(hold_ms);
    0
}

fn persist(mem: VirtioMem) -> i32 {
    let size = num("size", 64) * MIB;
    let hold_ms = num("hold_ms", 0);
    let snap_hold_ms = num("snap_hold_ms", hold_ms);
    if !wait_for_target(&mem, size) {
        println!("memtest: the host never set the requested size");
        return 3;
    }
    let mut alloc = match BlockAllocator::new(mem) {
        Ok(a) => a,
        Err(e) => {
            println!("memtest: FAILED: {e}");
            return 1;
        }
    };
    const TENANT: u16 = 1;
    let blocks = match alloc.alloc(TENANT, size) {
        Ok(b) => b,
        Err(e) => {
            println!("memtest: FAILED: alloc {size}: {e}");
            return 1;
        }
    };
    let bs = alloc.block_size();
    let first = (blocks.addr - alloc.device().region_addr()) / bs.max(1);
    for b in 0..blocks.len / bs {
        fill(blocks.addr + b * bs, bs, first + b, 7);
    }
    println!(
        "memtest: filled {} MiB at {:#x}",
        blocks.len / MIB,
        blocks.addr
    );
    hold_for_snapshot(alloc.device(), snap_hold_ms);
    for b in 0..blocks.len / bs {
        if let Some(off) = verify(blocks.addr + b * bs, bs, first + b, 7) {
            println!(
                "memtest: FAILED: block {} lost its pattern at {off:#x}",
                first + b
            );
            return 1;
        }
    }
    check!(
        alloc.device().plugged_size() == blocks.len,
        "device plugged_size {} after the hold",
        alloc.device().plugged_size()
    );
    println!("memtest: verified pages={}", blocks.len / PAGE);
    hold(hold_ms);
    let t = Instant::now();
    let freed = match alloc.free_tenant(TENANT) {
        Ok(f) => f,
        Err(e) => {
            println!("memtest: FAILED: free: {e}");
            return 1;
        }
    };
    check!(freed.bytes == blocks.len, "freed {} bytes", freed.bytes);
    check!(alloc.device().plugged_size() == 0, "still plugged");
    println!(
        "memtest: reclaimed bytes={} unplug_us={}",
        freed.bytes,
        t.elapsed_us().unwrap_or(0)
    );
    hold(hold_ms);
    0
}

/// What a block of the `diff` mode's model holds: unplugged, or its first
/// `head` pages of generation `g_head` and the rest of `g_rest` (0: zero).
#[derive(Clone, Copy)]
struct Want {
    plugged: bool,
    head: u64,
    g_head: u64,
    g_rest: u64,
}

const UNPLUGGED: Want = Want {
    plugged: false,
    head: 0,
    g_head: 0,
    g_rest: 0,
};

fn all(g: u64) -> Want {
    Want {
        plugged: true,
        head: 0,
        g_head: 0,
        g_rest: g,
    }
}

fn head(n: u64, g_head: u64, g_rest: u64) -> Want {
    Want {
        plugged: true,
        head: n,
        g_head,
        g_rest,
    }
}

/// The word expected at `off` of block `b` holding generation `g` (0: zero).
fn expected(b: u64, g: u64, off: u64) -> u64 {
    if g == 0 {
        0
    } else {
        pattern(b, g, off)
    }
}

/// Checks every block of `model` against the device and memory.
fn check_model(mem: &mut VirtioMem, model: &[Want], phase: u64) -> i32 {
    let bs = mem.block_size();
    let base = mem.region_addr();
    for (b, w) in model.iter().enumerate() {
        let b = b as u64;
        let addr = base + b * bs;
        let st = mem.state(addr, 1);
        let want = if w.plugged {
            BlockState::Plugged
        } else {
            BlockState::Unplugged
        };
        check!(st == Ok(want), "phase {phase}: block {b} is {st:?}");
        if !w.plugged {
            continue;
        }
        let mut off = 0;
        while off < bs {
            let g = if off / PAGE < w.head {
                w.g_head
            } else {
                w.g_rest
            };
            // SAFETY: the block is plugged (checked above) and identity-mapped.
            let v = unsafe { core::ptr::read_volatile((addr + off) as *const u64) };
            check!(
                v == expected(b, g, off),
                "phase {phase}: block {b} page {} holds {v:#x}, want generation {g}",
                off / PAGE
            );
            off += PAGE;
        }
    }
    0
}

/// Writes generation `g` in the first `pages` pages of block `b`.
fn write_pages(mem: &VirtioMem, b: u64, pages: u64, g: u64) {
    let bs = mem.block_size();
    fill(mem.region_addr() + b * bs, pages * PAGE, b, g);
}

/// One phase's changes to the region and the model.
type Phase = fn(&mut VirtioMem, &mut [Want]) -> Result<(), &'static str>;

fn diff(mut mem: VirtioMem) -> i32 {
    const BLOCKS: u64 = 34;
    let bs = mem.block_size();
    let base = mem.region_addr();
    let snap_hold_ms = num("snap_hold_ms", num("hold_ms", 0));
    check!(mem.region_size() >= BLOCKS * bs, "region too small");
    if !wait_for_target(&mem, 32 * bs) {
        println!("memtest: the host never set the requested size");
        return 3;
    }
    let at = |b: u64| base + b * bs;
    let per_block = bs / PAGE;
    let mut model = [UNPLUGGED; BLOCKS as usize];

    // Phase 1: A everywhere in 0..32.
    check!(mem.plug(at(0), 32).is_ok(), "PLUG of blocks 0..32");
    for b in 0..32 {
        write_pages(&mem, b, per_block, 1);
        model[b as usize] = all(1);
    }
    let phases: [Phase; 3] = [|_, _| Ok(()), diff_phase2, diff_phase3];
    for (i, change) in phases.iter().enumerate() {
        let phase = i as u64 + 1;
        if let Err(e) = change(&mut mem, &mut model) {
            println!("memtest: FAILED: phase {phase}: {e}");
            return 1;
        }
        println!("memtest: phase {phase}");
        hold_for_snapshot(&mem, snap_hold_ms);
        if check_model(&mut mem, &model, phase) != 0 {
            return 1;
        }
        println!("memtest: verified phase {phase}");
    }
    // Blocks released in the last diffs (and 28, only in the first) read
    // zero when plugged again.
    for b in [4, 28, 32] {
        check!(mem.plug(at(b), 1).is_ok(), "PLUG of block {b}");
        model[b as usize] = all(0);
    }
    if check_model(&mut mem, &model, 4) != 0 {
        return 1;
    }
    println!("memtest: diff done");
    0
}

fn diff_phase2(mem: &mut VirtioMem, model: &mut [Want]) -> Result<(), &'static str> {
    let (bs, base) = (mem.block_size(), mem.region_addr());
    let at = |b: u64| base + b * bs;
    let per_block = bs / PAGE;
    write_pages(mem, 1, per_block, 2);
    model[1] = all(2);
    write_pages(mem, 2, 16, 2);
    model[2] = head(16, 2, 1);
    for b in [3, 4] {
        mem.unplug(at(b), 1).map_err(|_| "UNPLUG")?;
        model[b as usize] = UNPLUGGED;
    }
    mem.unplug(at(5), 1).map_err(|_| "UNPLUG of 5")?;
    mem.plug(at(5), 1).map_err(|_| "PLUG of 5")?;
    write_pages(mem, 5, 1, 2);
    model[5] = head(1, 2, 0);
    mem.plug(at(32), 2).map_err(|_| "PLUG of 32, 33")?;
    for b in [32, 33] {
        write_pages(mem, b, per_block, 2);
        model[b as usize] = all(2);
    }
    Ok(())
}

fn diff_phase3(mem: &mut VirtioMem, model: &mut [Want]) -> Result<(), &'static str> {
    let (bs, base) = (mem.block_size(), mem.region_addr());
    let at = |b: u64| base + b * bs;
    write_pages(mem, 0, 1, 3);
    model[0] = head(1, 3, 1);
    mem.unplug(at(32), 1).map_err(|_| "UNPLUG of 32")?;
    model[32] = UNPLUGGED;
    // Written, then the whole chunk 28..32 unplugged: its KVM slot goes
    // (sync waits for it), and its dirty log with it.
    write_pages(mem, 28, bs / PAGE, 2);
    mem.unplug(at(28), 4).map_err(|_| "UNPLUG of chunk 7")?;
    model[28..32].fill(UNPLUGGED);
    mem.sync().map_err(|_| "sync")?;
    mem.plug(at(3), 1).map_err(|_| "PLUG of 3")?;
    model[3] = all(0);
    mem.plug(at(29), 1).map_err(|_| "PLUG of 29")?;
    write_pages(mem, 29, 1, 3);
    model[29] = head(1, 3, 0);
    Ok(())
}
