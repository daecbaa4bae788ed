//! tmem-fill: fills the VM's tmem pool until the quota refuses every kind of
//! value, holds, then reads every stored object back and checks it.
//!
//! What the host-tier tests use it for: the VMM's memory while the pool is
//! full (its RSS must stay within the quota plus the documented overhead),
//! the host-wide cap across VMMs, and a pool bigger than 256 MiB across a
//! snapshot.
//!
//! Command line:
//! - `mode=mixed` (default): ten kinds of values (empty, 16 B, 200 B, 4 KiB,
//!   64 KiB and 1 MiB; random and half-compressible), each kind putting about
//!   256 KiB per round (small ones in BATCH calls of up to 256 entries), a
//!   kind dropping out at its first refusal, until every kind was refused.
//! - `mode=big mib=N`: N random 1 MiB values (stops at the first refusal).
//! - `hold_ms=N` (default 0): after `tmem-fill: full ...`, wait N ms (a test
//!   measures the VMM or snapshots the VM meanwhile), then verify.
//! - `ready_ms=N` (default 0): after touching its buffers, print
//!   `tmem-fill: ready` and wait N ms before filling (a test takes its
//!   baseline then).
//!
//! Prints `tmem-fill: verified N objects` and exits 0 when every stored
//! object read back as put; 1 on a failed check, 2 without a tmem device.
#![no_std]
#![no_main]

extern crate alloc;

use alloc::string::String;
use alloc::vec::Vec;
use alloc::{format, vec};

use spore_uk::clock::Instant;
use spore_uk::tmem::{self, Batch, TmemError};
use spore_uk::{arg, println, wait};

spore_uk::entry!(main);

const MIB: usize = 1 << 20;
/// Bytes each kind puts per round in `mixed` mode.
const ROUND_BYTES: usize = 256 << 10;
/// Entries per BATCH call.
const BATCH: usize = 256;
/// (value length, half-compressible).
const KINDS: [(usize, bool); 10] = [
    (0, false),
    (16, false),
    (200, false),
    (200, true),
    (4096, false),
    (4096, true),
    (65536, false),
    (65536, true),
    (MIB, false),
    (MIB, true),
];

fn num(name: &str, default: usize) -> usize {
    arg(name).and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn key(kind: usize, n: u32) -> [u8; 12] {
    let mut k = *b"f00000000000";
    k[1] = b'a' + kind as u8;
    for (i, b) in k[4..].iter_mut().enumerate() {
        *b = b'0' + ((n >> (28 - 4 * i)) & 15) as u8;
    }
    k
}

/// The value of object `n` of `kind`, regenerated for the check. Random
/// bytes; when compressible, every other 64-byte run is one repeated byte
/// (lz4 roughly halves it).
fn value(kind: usize, n: u32, out: &mut [u8]) {
    let compressible = KINDS[kind].1;
    let mut x = ((kind as u64 + 1) << 40) | u64::from(n) | 1;
    for (c, chunk) in out.chunks_mut(64).enumerate() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        if compressible && c % 2 == 0 {
            chunk.fill(x as u8);
            continue;
        }
        for w in chunk.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            for (b, s) in w.iter_mut().zip(x.to_le_bytes()) {
                *b = s;
            }
        }
    }
}

fn sleep_ms(ms: usize) {
    let start = Instant::now();
    let total = ms as u64 * 1000;
    let mut assumed = 0u64;
    loop {
        let e = start.elapsed_us().unwrap_or(assumed);
        if e >= total {
            return;
        }
        let t = (total - e).min(100_000);
        wait(t as u32);
        assumed += t;
    }
}

/// One kind's progress: the objects stored, and whether it was refused.
struct Filler {
    kind: usize,
    stored: Vec<u32>,
    next: u32,
    refused: bool,
}

impl Filler {
    /// Puts `count` new objects; stops the kind at its first refusal.
    fn put(&mut self, count: usize, buf: &mut [u8]) -> Result<(), String> {
        let len = KINDS[self.kind].0;
        if len >= 65536 {
            for _ in 0..count {
                let n = self.next;
                self.next += 1;
                value(self.kind, n, &mut buf[..len]);
                match tmem::put(&key(self.kind, n), &buf[..len]) {
                    Ok(()) => self.stored.push(n),
                    Err(TmemError::QuotaExceeded) => {
                        self.refused = true;
                        return Ok(());
                    }
                    Err(e) => return Err(format!("put {len} bytes: {e}")),
                }
            }
            return Ok(());
        }
        let mut left = count;
        while left > 0 && !self.refused {
            let k = left.min(BATCH);
            left -= k;
            let first = self.next;
            self.next += k as u32;
            let keys: Vec<[u8; 12]> = (0..k as u32).map(|i| key(self.kind, first + i)).collect();
            for i in 0..k {
                value(
                    self.kind,
                    first + i as u32,
                    &mut buf[i * len..(i + 1) * len],
                );
            }
            let mut b = Batch::with_capacity(k).map_err(|e| format!("batch: {e}"))?;
            for (i, kk) in keys.iter().enumerate() {
                b.put(kk, &buf[i * len..(i + 1) * len])
                    .map_err(|e| format!("batch put: {e}"))?;
            }
            b.submit().map_err(|e| format!("batch submit: {e}"))?;
            for i in 0..k {
                match b.result(i) {
                    Ok(_) => self.stored.push(first + i as u32),
                    Err(TmemError::QuotaExceeded) => self.refused = true,
                    Err(e) => return Err(format!("batch put {len} bytes: {e}")),
                }
            }
        }
        Ok(())
    }

    /// Reads every stored object back and compares it.
    fn verify(&self, want: &mut [u8], got: &mut [u8]) -> Result<usize, String> {
        let len = KINDS[self.kind].0;
        for &n in &self.stored {
            value(self.kind, n, &mut want[..len]);
            let r = tmem::get(&key(self.kind, n), &mut got[..len.max(1)]);
            if r != Ok(len) || got[..len] != want[..len] {
                return Err(format!(
                    "kind {} object {n}: get {r:?} or other bytes",
                    self.kind
                ));
            }
        }
        Ok(self.stored.len())
    }
}

fn main(_info: &spore_uk::BootInfo) -> i32 {
    if let Err(TmemError::NoDevice) = tmem::stats() {
        println!("tmem-fill: the VMM has no tmem device");
        return 2;
    }
    match run() {
        Ok(n) => {
            println!("tmem-fill: verified {n} objects");
            0
        }
        Err(e) => {
            println!("tmem-fill: FAILED: {e}");
            1
        }
    }
}

fn run() -> Result<usize, String> {
    let mut buf = vec![0u8; MIB];
    let mut check = vec![0u8; MIB];
    // Touched now, so that the guest's own pages are in before the baseline.
    buf.fill(1);
    check.fill(1);
    let ready_ms = num("ready_ms", 0);
    if ready_ms > 0 {
        println!("tmem-fill: ready");
        sleep_ms(ready_ms);
    }
    let mut fillers: Vec<Filler> = Vec::new();
    match arg("mode").unwrap_or("mixed") {
        "mixed" => {
            fillers = (0..KINDS.len())
                .map(|kind| Filler {
                    kind,
                    stored: Vec::new(),
                    next: 0,
                    refused: false,
                })
                .collect();
            while fillers.iter().any(|f| !f.refused) {
                for f in fillers.iter_mut().filter(|f| !f.refused) {
                    let count = (ROUND_BYTES / KINDS[f.kind].0.max(64)).max(1);
                    f.put(count, &mut buf)?;
                }
            }
        }
        "big" => {
            let mut f = Filler {
                kind: 8,
                stored: Vec::new(),
                next: 0,
                refused: false,
            };
            f.put(num("mib", 1), &mut buf)?;
            fillers.push(f);
        }
        other => return Err(format!("unknown mode {other:?}")),
    }
    let s = tmem::stats().map_err(|e| format!("stats: {e}"))?;
    let stored: usize = fillers.iter().map(|f| f.stored.len()).sum();
    if s.objects != stored as u64 {
        return Err(format!("stats: {} objects, stored {stored}", s.objects));
    }
    println!(
        "tmem-fill: full objects={} bytes_used={} bytes_stored={} quota_bytes={} refused={}",
        s.objects, s.bytes_used, s.bytes_stored, s.quota_bytes, s.refused
    );
    sleep_ms(num("hold_ms", 0));
    let mut n = 0;
    for f in &fillers {
        n += f.verify(&mut buf, &mut check)?;
    }
    Ok(n)
}
