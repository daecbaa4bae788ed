//! tmem-check: exercises the tmem client against the VMM's tmem device.
//!
//! Round trips of 1 B, 4 KiB and 1 MiB values, a get into a too-small
//! buffer, invalidate then get, a batch of puts and gets, stats and flush.
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
    println!("tmem-check: passed");
    0
}
