//! tmem-check: exercises the tmem client against the VMM's tmem device.
//!
//! Round trips of 1 B, 4 KiB and 1 MiB values, a get into a too-small
//! buffer, invalidate then get, a batch of puts and gets, stats and flush,
//! then 10,000 random puts, gets and invalidates over 64 keys checked
//! against a model the guest keeps (each value is regenerated from its seed,
//! so the model costs a few bytes per key).
//! Exits 0 when every check passed, 1 on a failed check (printed), 2 when
//! the VMM has no tmem device.
#![no_std]
#![no_main]

extern crate alloc;

use alloc::vec;
use alloc::vec::Vec;

use spore_uk::println;
use spore_uk::tmem::{self, Batch, TmemError};

spore_uk::entry!(main);

fn pattern(seed: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (seed * 151 + i * 13 + (i >> 9)) as u8)
        .collect()
}

macro_rules! check {
    ($cond:expr, $($msg:tt)*) => {
        if !$cond {
            println!("tmem-check: FAILED: {}", format_args!($($msg)*));
            return 1;
        }
    };
}

fn main(_info: &spore_uk::BootInfo) -> i32 {
    if let Err(TmemError::NoDevice) = tmem::stats() {
        println!("tmem-check: the VMM has no tmem device");
        return 2;
    }
    for (i, len) in [1usize, 4096, 1 << 20].into_iter().enumerate() {
        let key = [b'k', i as u8];
        let v = pattern(i, len);
        check!(tmem::put(&key, &v).is_ok(), "put of {len} bytes");
        let got = tmem::get_vec(&key, 16);
        check!(
            got.as_deref() == Ok(&v[..]),
            "get of {len} bytes: {:?}",
            got.err()
        );
        if len > 1 {
            let mut small = vec![0u8; len - 1];
            let r = tmem::get(&key, &mut small);
            check!(
                r == Err(TmemError::BufferTooSmall { needed: len }),
                "short get: {r:?}"
            );
            check!(small.iter().all(|&b| b == 0), "a short get copied data");
        }
        check!(tmem::invalidate(&key).is_ok(), "invalidate");
        let r = tmem::get(&key, &mut [0u8; 8]);
        check!(r == Err(TmemError::NotFound), "get after invalidate: {r:?}");
    }

    // 64 puts of 4 KiB in one call, then 64 gets in one call.
    let keys: Vec<[u8; 3]> = (0..64u8).map(|i| [b'b', i, 0]).collect();
    let values: Vec<Vec<u8>> = (0..64).map(|i| pattern(100 + i, 4096)).collect();
    let mut batch = match Batch::with_capacity(64) {
        Ok(b) => b,
        Err(e) => {
            println!("tmem-check: FAILED: {e}");
            return 1;
        }
    };
    for (k, v) in keys.iter().zip(&values) {
        check!(batch.put(k, v).is_ok(), "batch put");
    }
    check!(batch.submit().is_ok(), "batch of puts");
    for i in 0..64 {
        check!(
            batch.result(i) == Ok(0),
            "batch put {i}: {:?}",
            batch.result(i)
        );
    }
    drop(batch);
    let mut bufs: Vec<Vec<u8>> = (0..64).map(|_| vec![0u8; 4096]).collect();
    let mut batch = match Batch::with_capacity(64) {
        Ok(b) => b,
        Err(e) => {
            println!("tmem-check: FAILED: {e}");
            return 1;
        }
    };
    for (k, b) in keys.iter().zip(bufs.iter_mut()) {
        check!(batch.get(k, b).is_ok(), "batch get");
    }
    check!(batch.submit().is_ok(), "batch of gets");
    for i in 0..64 {
        check!(
            batch.result(i) == Ok(4096),
            "batch get {i}: {:?}",
            batch.result(i)
        );
    }
    drop(batch);
    check!(bufs == values, "batch gets returned other data");

    match tmem::stats() {
        Ok(s) => check!(s.objects == 64, "stats: {} objects, expected 64", s.objects),
        Err(e) => check!(false, "stats: {e}"),
    }
    check!(tmem::flush().is_ok(), "flush");
    match tmem::stats() {
        Ok(s) => check!(s.objects == 0, "stats after flush: {} objects", s.objects),
        Err(e) => check!(false, "stats: {e}"),
    }
    if let Err(msg) = random_ops(10_000, 0x5eed_cafe) {
        println!("tmem-check: FAILED: {msg}");
        return 1;
    }
    println!("tmem-check: passed");
    0
}

/// xorshift64*: deterministic, seeded, good enough to pick operations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> usize {
        (self.next() % n) as usize
    }
}

/// `ops` random operations over 64 keys; the model holds (seed, length) per key.
fn random_ops(ops: usize, seed: u64) -> Result<(), alloc::string::String> {
    use alloc::format;
    const KEYS: usize = 64;
    let mut rng = Rng(seed);
    let mut model: Vec<Option<(usize, usize)>> = vec![None; KEYS];
    let mut buf = vec![0u8; 16 * 1024];
    for op in 0..ops {
        let k = rng.below(KEYS as u64);
        // Keys of varied length, 1..=40 bytes, all distinct per index.
        let key: Vec<u8> = (0..=(k % 40)).map(|i| (k * 7 + i) as u8).collect();
        match rng.below(3) {
            0 => {
                let len = match rng.below(16) {
                    0 => 0,
                    1 => 16 * 1024,
                    _ => rng.below(4096) + 1,
                };
                tmem::put(&key, &pattern(op, len))
                    .map_err(|e| format!("op {op}: put {k} ({len} B): {e}"))?;
                model[k] = Some((op, len));
            }
            1 => match (tmem::get(&key, &mut buf), model[k]) {
                (Ok(n), Some((vseed, len))) if n == len && buf[..n] == pattern(vseed, len)[..] => {}
                (Err(TmemError::NotFound), None) => {}
                (got, want) => {
                    return Err(format!("op {op}: get {k}: {got:?}, model {want:?}"));
                }
            },
            _ => match (tmem::invalidate(&key), model[k].take()) {
                (Ok(()), Some(_)) | (Err(TmemError::NotFound), None) => {}
                (got, want) => {
                    return Err(format!("op {op}: invalidate {k}: {got:?}, model {want:?}"));
                }
            },
        }
    }
    let live = model.iter().filter(|m| m.is_some()).count() as u64;
    let stats = tmem::stats().map_err(|e| format!("stats: {e}"))?;
    if stats.objects != live {
        return Err(format!("stats: {} objects, model {live}", stats.objects));
    }
    println!("tmem-check: {ops} random operations matched the model ({live} objects)");
    Ok(())
}
