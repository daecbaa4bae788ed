//! tmem-bench: times tmem calls from inside the guest for `spore bench tmem`.
//!
//! Each call is timed with the TSC around the call (request fill, the `out`
//! and its exit, the VMM's handling, the status read), so with the VMM's own
//! handling time (`spore run --tmem-timing`) the bench can split a call into
//! VMM handling and exit + guest overhead.
//!
//! Command line: `mode=latency` (default): `runs=N` 1 MiB puts and gets of
//! one key (after warm-up calls sent as BATCH), one result line each; `mode=batch`: `runs=N` rounds of
//! `objects=N` 4 KiB puts, first one call each, then `batch=N` per BATCH
//! call, the pool flushed between them. Result lines start `tmem-bench: `
//! and hold `name=value` pairs; the last one is `tmem-bench: done`. Exits 0
//! on success, 1 when a call failed or a value read back wrong, 2 without a
//! tmem device, 3 without a TSC frequency.
#![no_std]
#![no_main]

extern crate alloc;

use alloc::vec;
use alloc::vec::Vec;

use spore_uk::clock::{rdtsc, tsc_khz};
use spore_uk::tmem::{self, Batch, TmemError};
use spore_uk::{arg, println};

spore_uk::entry!(main);

const MIB: usize = 1 << 20;
const PAGE: usize = 4096;

fn num(name: &str, default: usize) -> usize {
    arg(name).and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn ns(ticks: u64, khz: u64) -> u64 {
    (u128::from(ticks) * 1_000_000 / u128::from(khz.max(1))).min(u128::from(u64::MAX)) as u64
}

/// Text-like bytes (as the host-side bench uses), different per `seed`.
fn fill(buf: &mut [u8], seed: u64) {
    let mut x = seed | 1;
    for chunk in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        for (b, s) in chunk.iter_mut().zip(x.to_le_bytes()) {
            *b = b'a' + (s & 15);
        }
    }
}

fn main(_info: &spore_uk::BootInfo) -> i32 {
    let Some(khz) = tsc_khz() else {
        println!("tmem-bench: the VMM reported no TSC frequency");
        return 3;
    };
    if let Err(TmemError::NoDevice) = tmem::stats() {
        println!("tmem-bench: the VMM has no tmem device");
        return 2;
    }
    let runs = num("runs", 50).max(1);
    let r = match arg("mode").unwrap_or("latency") {
        "latency" => latency(runs, khz),
        "batch" => batch(
            runs,
            num("objects", 4096).max(1),
            num("batch", 64).clamp(1, tmem::MAX_BATCH as usize),
            khz,
        ),
        other => Err(alloc::format!("unknown mode {other:?}")),
    };
    match r {
        Ok(()) => {
            println!("tmem-bench: done");
            0
        }
        Err(e) => {
            println!("tmem-bench: FAILED: {e}");
            1
        }
    }
}

fn latency(runs: usize, khz: u64) -> Result<(), alloc::string::String> {
    let mut value = vec![0u8; MIB];
    fill(&mut value, 1);
    let mut buf = vec![0u8; MIB];
    let key = b"tmem-bench-1m";
    // Warm up the VMM's allocator and the host pages behind the pool with
    // the same puts and gets sent as one-entry BATCH calls: the VMM times
    // those under `batch`, so its `put`/`get` timing covers exactly the
    // calls timed below.
    for _ in 0..5 {
        let mut b = Batch::with_capacity(1).map_err(|e| alloc::format!("{e}"))?;
        b.put(key, &value).map_err(|e| alloc::format!("{e}"))?;
        b.submit().map_err(|e| alloc::format!("warm-up put: {e}"))?;
        b.result(0)
            .map_err(|e| alloc::format!("warm-up put: {e}"))?;
        drop(b);
        let mut b = Batch::with_capacity(1).map_err(|e| alloc::format!("{e}"))?;
        b.get(key, &mut buf).map_err(|e| alloc::format!("{e}"))?;
        b.submit().map_err(|e| alloc::format!("warm-up get: {e}"))?;
        b.result(0)
            .map_err(|e| alloc::format!("warm-up get: {e}"))?;
    }
    for i in 0..runs {
        let t0 = rdtsc();
        let p = tmem::put(key, &value);
        let t1 = rdtsc();
        let g = tmem::get(key, &mut buf);
        let t2 = rdtsc();
        p.map_err(|e| alloc::format!("put {i}: {e}"))?;
        match g {
            Ok(n) if n == MIB => {}
            other => return Err(alloc::format!("get {i}: {other:?}")),
        }
        println!(
            "tmem-bench: put_1m_ns={} get_1m_ns={}",
            ns(t1 - t0, khz),
            ns(t2 - t1, khz)
        );
    }
    if buf != value {
        return Err("the 1 MiB value read back different".into());
    }
    tmem::invalidate(key).map_err(|e| alloc::format!("invalidate: {e}"))?;
    Ok(())
}

fn check_objects(want: usize) -> Result<(), alloc::string::String> {
    match tmem::stats() {
        Ok(s) if s.objects == want as u64 => Ok(()),
        Ok(s) => Err(alloc::format!(
            "{} objects stored, expected {want}",
            s.objects
        )),
        Err(e) => Err(alloc::format!("stats: {e}")),
    }
}

fn batch(
    runs: usize,
    objects: usize,
    per_call: usize,
    khz: u64,
) -> Result<(), alloc::string::String> {
    let mut values: Vec<u8> = Vec::new();
    values
        .try_reserve_exact(objects * PAGE)
        .map_err(|_| "guest heap too small for the values (raise --mem or lower objects=)")?;
    values.resize(objects * PAGE, 0);
    fill(&mut values, 2);
    let keys: Vec<[u8; 12]> = (0..objects)
        .map(|i| {
            let mut k = *b"k-0000000000";
            let mut n = i;
            for d in k[2..].iter_mut().rev() {
                *d = b'0' + (n % 10) as u8;
                n /= 10;
            }
            k
        })
        .collect();
    tmem::flush().map_err(|e| alloc::format!("flush: {e}"))?;
    for round in 0..runs {
        let t0 = rdtsc();
        for (k, v) in keys.iter().zip(values.chunks(PAGE)) {
            tmem::put(k, v).map_err(|e| alloc::format!("single put: {e}"))?;
        }
        let t1 = rdtsc();
        check_objects(objects)?;
        tmem::flush().map_err(|e| alloc::format!("flush: {e}"))?;

        let mut calls = 0usize;
        let t2 = rdtsc();
        for (ks, vs) in keys.chunks(per_call).zip(values.chunks(per_call * PAGE)) {
            let mut b = Batch::with_capacity(ks.len()).map_err(|e| alloc::format!("{e}"))?;
            for (k, v) in ks.iter().zip(vs.chunks(PAGE)) {
                b.put(k, v)
                    .map_err(|e| alloc::format!("batch entry: {e}"))?;
            }
            b.submit().map_err(|e| alloc::format!("batch: {e}"))?;
            calls += 1;
            for i in 0..b.len() {
                b.result(i)
                    .map_err(|e| alloc::format!("batch entry {i}: {e}"))?;
            }
        }
        let t3 = rdtsc();
        check_objects(objects)?;
        tmem::flush().map_err(|e| alloc::format!("flush: {e}"))?;
        println!(
            "tmem-bench: round={round} objects={objects} single_ns={} single_calls={objects} batched_ns={} batched_calls={calls}",
            ns(t1 - t0, khz),
            ns(t3 - t2, khz)
        );
    }
    Ok(())
}
