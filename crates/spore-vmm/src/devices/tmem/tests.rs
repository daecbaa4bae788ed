//! Device tests against real guest memory (an mmap-backed `GuestMemoryMmap`
//! with a hole, like RAM around the MMIO gap): round trips, a random
//! workload checked against a model, quota, hostile requests, batches.
#![allow(
    clippy::cast_possible_truncation,
    reason = "test fixtures: byte patterns and addresses the test builds itself"
)]

use std::collections::HashMap;

use spore_abi::tmem::{op, Status, MAX_BATCH, MAX_KEY_LEN};
use vm_memory::{Bytes, GuestAddress};

use super::accounting::object_charge;
use super::request::{BLOCK_SIZE, STATS_SIZE};
use super::{Compression, TmemDevice};
use crate::devices::virtio::GuestMemoryMmap;
use crate::host_usize;

const LOW_END: u64 = 4 << 20;
const HIGH_START: u64 = 8 << 20;
const HIGH_END: u64 = 12 << 20;
const BLOCK: u64 = 0x1000;
const BATCH: u64 = 0x8000; // up to 512 entries before KEY
const KEY: u64 = 0x10000;
const VAL: u64 = 0x100000;
const OUT: u64 = 0x280000;

#[derive(Clone, Copy, Default)]
struct Req {
    op: u32,
    flags: u64,
    key_addr: u64,
    key_len: u64,
    value_addr: u64,
    value_len: u64,
    reserved: [u64; 2],
}

impl Req {
    fn new(op: u32, key_len: u64, value_addr: u64, value_len: u64) -> Self {
        Req {
            op,
            key_addr: KEY,
            key_len,
            value_addr,
            value_len,
            ..Default::default()
        }
    }

    fn bytes(&self) -> [u8; 64] {
        let mut b = [0u8; 64];
        b[0..4].copy_from_slice(&self.op.to_le_bytes());
        b[4..8].copy_from_slice(&(Status::Pending as u32).to_le_bytes());
        for (i, v) in [
            self.flags,
            self.key_addr,
            self.key_len,
            self.value_addr,
            self.value_len,
            self.reserved[0],
            self.reserved[1],
        ]
        .iter()
        .enumerate()
        {
            b[8 + i * 8..16 + i * 8].copy_from_slice(&v.to_le_bytes());
        }
        b
    }
}

struct Guest {
    mem: GuestMemoryMmap,
    dev: TmemDevice,
}

impl Guest {
    fn new(quota: u64, compression: Compression) -> Self {
        let mem = GuestMemoryMmap::from_ranges(&[
            (GuestAddress(0), host_usize::from_u64(LOW_END)),
            (
                GuestAddress(HIGH_START),
                host_usize::from_u64(HIGH_END - HIGH_START),
            ),
        ])
        .unwrap();
        Guest {
            mem,
            dev: TmemDevice::new(quota, compression),
        }
    }

    fn write(&self, addr: u64, data: &[u8]) {
        self.mem.write_slice(data, GuestAddress(addr)).unwrap();
    }

    fn read(&self, addr: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.mem.read_slice(&mut v, GuestAddress(addr)).unwrap();
        v
    }

    fn u64_at(&self, addr: u64) -> u64 {
        self.mem.read_obj(GuestAddress(addr)).unwrap()
    }

    /// Places `r` at `at`, calls, and checks the block's status matches.
    fn call_at(&self, at: u64, r: Req) -> Status {
        self.write(at, &r.bytes());
        let s = self.dev.call(&self.mem, (at >> 4) as u32);
        let in_block: u32 = self.mem.read_obj(GuestAddress(at + 4)).unwrap();
        assert_eq!(in_block, s as u32, "block status differs from the port's");
        s
    }

    fn call(&self, r: Req) -> Status {
        self.call_at(BLOCK, r)
    }

    fn put(&self, key: &[u8], value: &[u8]) -> Status {
        self.write(KEY, key);
        self.write(VAL, value);
        self.call(Req::new(op::PUT, key.len() as u64, VAL, value.len() as u64))
    }

    /// GET into a buffer of `cap` bytes; returns status, reported length, data.
    fn get_cap(&self, key: &[u8], cap: u64) -> (Status, u64, Vec<u8>) {
        self.write(KEY, key);
        let s = self.call(Req::new(op::GET, key.len() as u64, OUT, cap));
        let len = self.u64_at(BLOCK + 40);
        let data = if s == Status::Ok {
            self.read(OUT, host_usize::from_u64(len))
        } else {
            Vec::new()
        };
        (s, len, data)
    }

    fn get(&self, key: &[u8]) -> Result<Vec<u8>, Status> {
        match self.get_cap(key, LOW_END - OUT) {
            (Status::Ok, _, d) => Ok(d),
            (s, _, _) => Err(s),
        }
    }

    fn inval(&self, key: &[u8]) -> Status {
        self.write(KEY, key);
        self.call(Req::new(op::INVALIDATE, key.len() as u64, 0, 0))
    }

    fn objects_and_bytes(&self) -> (u64, u64, u64) {
        let s = self.dev.stats().unwrap();
        (s.objects, s.bytes_used, s.bytes_stored)
    }
}

/// A small deterministic PRNG (xorshift64*), so failures reproduce.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn bytes(&mut self, len: usize, compressible: bool) -> Vec<u8> {
        if compressible {
            let b = self.next() as u8;
            (0..len).map(|i| b.wrapping_add((i / 64) as u8)).collect()
        } else {
            (0..len).map(|_| self.next() as u8).collect()
        }
    }
}

const BOTH: [Compression; 2] = [Compression::None, Compression::Lz4];

#[test]
fn round_trips_of_1b_4k_1m() {
    for c in BOTH {
        let g = Guest::new(64 << 20, c);
        let mut rng = Rng(7);
        for (i, size) in [1usize, 4096, 1 << 20].into_iter().enumerate() {
            let key = format!("key-{i}").into_bytes();
            let value = rng.bytes(size, i % 2 == 0);
            assert_eq!(g.put(&key, &value), Status::Ok);
            assert_eq!(g.get(&key).unwrap(), value, "{c:?} {size}");
            // Too small a buffer: the size comes back, nothing is copied.
            g.write(OUT, &vec![0xaa; size]);
            let (s, len, _) = g.get_cap(&key, size as u64 - 1);
            assert_eq!((s, len), (Status::BufferTooSmall, size as u64));
            assert_eq!(g.read(OUT, size), vec![0xaa; size]);
            assert_eq!(g.inval(&key), Status::Ok);
            assert_eq!(g.get(&key), Err(Status::NotFound));
            assert_eq!(g.inval(&key), Status::NotFound);
        }
        assert_eq!(g.objects_and_bytes(), (0, 0, 0));
        let s = g.dev.stats().unwrap();
        assert_eq!((s.counters.puts, s.counters.get_hits), (3, 6));
    }
}

#[test]
fn random_operations_match_a_model() {
    for c in BOTH {
        let g = Guest::new(1 << 30, c);
        let mut model: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
        let mut rng = Rng(0x5eed + c as u64);
        for step in 0..10_000 {
            // Few keys so puts replace, gets hit and invalidates find things.
            // Mostly 1-2 byte keys (48 × 256 possible), sometimes long ones.
            let long = rng.below(50) == 0;
            let key_len = if long {
                1 + rng.below(4096)
            } else {
                1 + rng.below(2)
            };
            let mut key = rng.bytes(host_usize::from_u64(key_len), false);
            key[0] = rng.below(48) as u8;
            if key.len() == 2 {
                key[1] %= 4;
            }
            match rng.below(100) {
                0..=44 => {
                    let len = match rng.below(10) {
                        0 => 0,
                        1 => host_usize::from_u64(rng.below(128 << 10)),
                        _ => host_usize::from_u64(rng.below(8192)),
                    };
                    let compressible = rng.below(2) == 0;
                    let value = rng.bytes(len, compressible);
                    assert_eq!(g.put(&key, &value), Status::Ok, "step {step}");
                    model.insert(key, value);
                }
                45..=84 => {
                    let want = model.get(&key).cloned().ok_or(Status::NotFound);
                    assert_eq!(g.get(&key), want, "step {step}");
                }
                85..=98 => {
                    let want = if model.remove(&key).is_some() {
                        Status::Ok
                    } else {
                        Status::NotFound
                    };
                    assert_eq!(g.inval(&key), want, "step {step}");
                }
                _ => {
                    assert_eq!(g.call(Req::new(op::FLUSH, 0, 0, 0)), Status::Ok);
                    model.clear();
                }
            }
            let (objects, used, _) = g.objects_and_bytes();
            let model_used: usize = model.iter().map(|(k, v)| k.len() + v.len()).sum();
            assert_eq!((objects, used), (model.len() as u64, model_used as u64));
        }
        for (k, v) in &model {
            assert_eq!(&g.get(k).unwrap(), v);
        }
    }
}

#[test]
fn quota_refusals_keep_everything_stored() {
    for c in BOTH {
        let quota = 1 << 20;
        let g = Guest::new(quota, c);
        let mut rng = Rng(3);
        let mut stored = Vec::new();
        let refused_at = (0..1000u32)
            .find(|i| {
                let key = i.to_le_bytes().to_vec();
                let value = rng.bytes(64 << 10, false);
                match g.put(&key, &value) {
                    Status::Ok => {
                        stored.push((key, value));
                        false
                    }
                    Status::QuotaExceeded => true,
                    s => panic!("unexpected {s:?}"),
                }
            })
            .expect("the quota never refused a put");
        assert!(refused_at >= 14, "refused too early: {refused_at}");
        let before = g.objects_and_bytes();
        assert!(before.2 <= quota);
        // Replacing with a larger value is refused and keeps the old one.
        let (k0, v0) = &stored[0];
        let bigger = rng.bytes(128 << 10, false);
        assert_eq!(g.put(k0, &bigger), Status::QuotaExceeded);
        assert_eq!(&g.get(k0).unwrap(), v0);
        assert_eq!(g.objects_and_bytes(), before);
        for (k, v) in &stored {
            assert_eq!(&g.get(k).unwrap(), v);
        }
        // Raised through the API: puts work again.
        assert!(g.dev.set_quota(quota * 2));
        assert_eq!(g.put(b"more", &[5; 1000]), Status::Ok);
        // Lowered below use: new puts refused, objects kept.
        g.dev.set_quota(1000);
        assert_eq!(g.put(b"even-more", &[5; 10]), Status::QuotaExceeded);
        assert_eq!(g.get(b"more").unwrap(), vec![5; 1000]);
        let s = g.dev.stats().unwrap();
        assert_eq!(s.counters.refused, 3);
        assert_eq!(s.objects, stored.len() as u64 + 1);
    }
}

/// Requests a guest may write that must each be refused with its status,
/// changing nothing (one line each in the test's failure message).
fn hostile_requests() -> Vec<(&'static str, Req, Status)> {
    vec![
        (
            "key outside RAM",
            Req {
                key_addr: HIGH_END,
                ..Req::new(op::PUT, 4, VAL, 4)
            },
            Status::BadAddress,
        ),
        (
            "key in the hole",
            Req {
                key_addr: LOW_END + 8,
                ..Req::new(op::GET, 4, OUT, 4)
            },
            Status::BadAddress,
        ),
        (
            "value straddling RAM end",
            Req::new(op::PUT, 4, HIGH_END - 2, 4),
            Status::BadAddress,
        ),
        (
            "value across the hole",
            Req::new(op::PUT, 4, LOW_END - 2, 4),
            Status::BadAddress,
        ),
        (
            "address + length overflows",
            Req::new(op::PUT, 4, u64::MAX - 1, 4),
            Status::BadAddress,
        ),
        (
            "key address overflows",
            Req {
                key_addr: u64::MAX,
                ..Req::new(op::INVALIDATE, 4, 0, 0)
            },
            Status::BadAddress,
        ),
        (
            "value length u64::MAX",
            Req::new(op::PUT, 4, VAL, u64::MAX),
            Status::BadLength,
        ),
        (
            "key length u64::MAX",
            Req::new(op::PUT, u64::MAX, VAL, 4),
            Status::BadLength,
        ),
        (
            "key too long",
            Req::new(op::PUT, MAX_KEY_LEN + 1, VAL, 4),
            Status::BadLength,
        ),
        ("empty key", Req::new(op::GET, 0, OUT, 4), Status::BadLength),
        (
            "GET buffer outside RAM",
            Req::new(op::GET, 4, HIGH_END - 8, 4096),
            Status::BadAddress,
        ),
        (
            "flags set",
            Req {
                flags: 1,
                ..Req::new(op::PUT, 4, VAL, 4)
            },
            Status::BadRequest,
        ),
        (
            "reserved set",
            Req {
                reserved: [0, 1 << 63],
                ..Req::new(op::FLUSH, 0, 0, 0)
            },
            Status::BadRequest,
        ),
        ("unknown op", Req::new(0, 4, VAL, 4), Status::BadOp),
        ("unknown op 2", Req::new(u32::MAX, 4, VAL, 4), Status::BadOp),
        (
            "misaligned batch",
            Req::new(op::BATCH, 0, BATCH + 8, 1),
            Status::BadRequest,
        ),
        (
            "huge batch",
            Req::new(op::BATCH, 0, BATCH, MAX_BATCH + 1),
            Status::BadLength,
        ),
        (
            "batch count u64::MAX",
            Req::new(op::BATCH, 0, BATCH, u64::MAX),
            Status::BadLength,
        ),
        (
            "batch past RAM",
            Req::new(op::BATCH, 0, HIGH_END - 64, 2),
            Status::BadAddress,
        ),
        (
            "stats buffer too small",
            Req::new(op::STATS, 0, OUT, STATS_SIZE - 1),
            Status::BadLength,
        ),
        (
            "stats outside RAM",
            Req::new(op::STATS, 0, HIGH_END - 8, STATS_SIZE),
            Status::BadAddress,
        ),
    ]
}

#[test]
fn hostile_requests_are_refused_without_effect() {
    let g = Guest::new(64 << 20, Compression::None);
    assert_eq!(g.put(b"keep", b"value"), Status::Ok);
    let before = g.objects_and_bytes();
    let check_intact = |what: &str| {
        assert_eq!(g.objects_and_bytes(), before, "{what}");
        assert_eq!(g.get(b"keep").unwrap(), b"value", "{what}");
    };

    // Blocks that are not (wholly) in RAM: only the port answers.
    for gpa in [
        LOW_END,                // in the hole
        LOW_END - 16,           // straddling the end of the low region
        HIGH_END - 48,          // straddling the end of RAM
        HIGH_END,               // just past RAM
        u32::MAX as u64 & !0xf, // highest encodable block >> 4, far outside
    ] {
        let value = (gpa >> 4) as u32;
        assert_eq!(g.dev.call(&g.mem, value), Status::BadAddress, "{gpa:#x}");
        check_intact("block outside RAM");
    }
    assert_eq!(g.dev.port_write(&g.mem, &[1, 0]), Status::BadRequest);

    for (what, req, want) in hostile_requests() {
        assert_eq!(g.call(req), want, "{what}");
        check_intact(what);
    }
    // A block at the very end of RAM is fine.
    g.write(KEY, b"evil");
    assert_eq!(
        g.call_at(HIGH_END - 64, Req::new(op::GET, 4, OUT, 16)),
        Status::NotFound
    );

    // A batch holding a batch, a flush and a hostile put: each refused on
    // its own, the batch itself handled.
    let entries = [
        Req::new(op::BATCH, 0, BATCH, 1),
        Req::new(op::FLUSH, 0, 0, 0),
        Req::new(op::PUT, 4, HIGH_END - 1, 2),
    ];
    for (i, e) in entries.iter().enumerate() {
        g.write(BATCH + i as u64 * BLOCK_SIZE, &e.bytes());
    }
    assert_eq!(g.call(Req::new(op::BATCH, 0, BATCH, 3)), Status::Ok);
    let statuses: Vec<u32> = (0..3)
        .map(|i| {
            g.mem
                .read_obj(GuestAddress(BATCH + i * BLOCK_SIZE + 4))
                .unwrap()
        })
        .collect();
    assert_eq!(
        statuses,
        [
            Status::BadLength as u32,
            Status::BadOp as u32,
            Status::BadAddress as u32
        ]
    );
    check_intact("batch of hostile entries");
    let s = g.dev.stats().unwrap();
    assert_eq!(s.counters.invalid, 6 + 21 + 3);
}

#[test]
fn batches_put_and_get_many_objects_in_one_call() {
    for c in BOTH {
        let g = Guest::new(64 << 20, c);
        let mut rng = Rng(11);
        let n = 256u64;
        // Keys at KEY + 16*i, values at VAL + 4096*i.
        let values: Vec<Vec<u8>> = (0..n).map(|i| rng.bytes(4096, i % 2 == 0)).collect();
        for i in 0..n {
            g.write(KEY + 16 * i, &format!("k{i:06}").into_bytes());
            g.write(VAL + 4096 * i, &values[host_usize::from_u64(i)]);
            let e = Req {
                key_addr: KEY + 16 * i,
                ..Req::new(op::PUT, 7, VAL + 4096 * i, 4096)
            };
            g.write(BATCH + BLOCK_SIZE * i, &e.bytes());
        }
        assert_eq!(g.call(Req::new(op::BATCH, 0, BATCH, n)), Status::Ok);
        assert_eq!(g.objects_and_bytes().0, n);
        // Read back in one batch into a scratch area; one entry misses.
        for i in 0..n {
            let mut e = Req {
                key_addr: KEY + 16 * i,
                ..Req::new(op::GET, 7, OUT + 4096 * i, 4096)
            };
            if i == 5 {
                e.op = op::INVALIDATE;
            }
            g.write(BATCH + BLOCK_SIZE * i, &e.bytes());
        }
        // Scratch must fit below the end of the low region.
        assert!(OUT + 4096 * n <= LOW_END);
        assert_eq!(g.call(Req::new(op::BATCH, 0, BATCH, n)), Status::Ok);
        for i in 0..n {
            let e = BATCH + BLOCK_SIZE * i;
            let st: u32 = g.mem.read_obj(GuestAddress(e + 4)).unwrap();
            assert_eq!(st, Status::Ok as u32, "entry {i}");
            if i != 5 {
                assert_eq!(g.u64_at(e + 40), 4096);
                assert_eq!(
                    g.read(OUT + 4096 * i, 4096),
                    values[host_usize::from_u64(i)]
                );
            }
        }
        assert_eq!(g.get(b"k000005"), Err(Status::NotFound));
        assert_eq!(g.dev.stats().unwrap().counters.batches, 2);
    }
}

#[test]
fn stats_flush_and_disabled() {
    let g = Guest::new(1 << 20, Compression::None);
    assert_eq!(g.put(b"ab", &[1; 10]), Status::Ok);
    assert_eq!(g.call(Req::new(op::STATS, 0, OUT, STATS_SIZE)), Status::Ok);
    let field = |i: u64| g.u64_at(OUT + 8 * i);
    assert_eq!((field(0), field(1)), (1, 12));
    assert_eq!(field(2), object_charge(2, 10));
    assert_eq!((field(3), field(4)), (1 << 20, 1));
    assert_eq!(g.call(Req::new(op::FLUSH, 0, 0, 0)), Status::Ok);
    assert_eq!(g.objects_and_bytes(), (0, 0, 0));

    let off = Guest {
        dev: TmemDevice::disabled(),
        ..Guest::new(0, Compression::None)
    };
    assert_eq!(off.put(b"ab", &[1]), Status::Disabled);
    assert!(off.dev.stats().is_none());
    assert!(!off.dev.set_quota(5));
}
