//! Replays every committed fuzz input (`fuzz/regressions/<target>/`: inputs
//! that once crashed spore, and `fuzz/corpus/<target>/`: the seeds) through
//! the same functions the fuzz targets call, on every `cargo test`, without
//! nightly or cargo-fuzz.
#![allow(
    clippy::cast_possible_truncation,
    reason = "test fixtures: byte patterns and addresses the test builds itself"
)]

use std::path::{Path, PathBuf};

use super::TARGETS;

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

/// The files of `dir/<target>/`, sorted; none if the directory is missing.
fn inputs(dir: &str, target: &str) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(fuzz_dir().join(dir).join(target)) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    v.sort();
    v
}

fn replay(dir: &str) -> usize {
    let mut n = 0;
    for (name, run) in TARGETS {
        for path in inputs(dir, name) {
            let data = std::fs::read(&path).unwrap();
            eprintln!("{dir}/{name}: {}", path.display());
            run(&data);
            n += 1;
        }
    }
    n
}

#[test]
fn fuzz_regressions_replay() {
    replay("regressions");
}

#[test]
fn fuzz_corpus_seeds_replay() {
    // Every target has seeds: a target without any would fuzz from nothing.
    for (name, _) in TARGETS {
        assert!(
            !inputs("corpus", name).is_empty(),
            "fuzz/corpus/{name}/ has no seed inputs"
        );
    }
    assert!(replay("corpus") >= TARGETS.len());
}

#[test]
fn fuzz_targets_match_the_fuzz_crate() {
    // Each name in TARGETS is a [[bin]] of fuzz/Cargo.toml, and back.
    let manifest = std::fs::read_to_string(fuzz_dir().join("Cargo.toml")).unwrap();
    let bins: Vec<&str> = manifest
        .lines()
        .filter_map(|l| l.trim().strip_prefix("name = \""))
        .filter_map(|l| l.strip_suffix('"'))
        .filter(|n| *n != "spore-fuzz")
        .collect();
    let names: Vec<&str> = TARGETS.iter().map(|(n, _)| *n).collect();
    assert_eq!(bins, names);
}

/// Builds the seed inputs of every target: valid requests, which the fuzzer
/// then mutates. Written under `fuzz/corpus/` by
/// `cargo test -p spore-vmm --lib write_fuzz_seeds -- --ignored`.
mod seeds {
    use crate::api::server::MAX_BODY_BYTES;
    use crate::snapshot::format::{encode_with, Layer, LayerKind, Manifest, FORMAT_VERSION};
    use crate::snapshot::integrity::SnapshotKey;
    use crate::snapshot::MicrovmState;

    const VERSION_1: u64 = 1 << 32;
    const EVENT_IDX: u64 = 1 << 29;
    const NEXT: u16 = 1;
    const WRITE: u16 = 2;

    /// A memory image with queues laid out as `virtio_queue` expects.
    pub struct Image(pub Vec<u8>);

    impl Image {
        pub fn new(len: usize) -> Self {
            Image(vec![0; len])
        }
        pub fn put(&mut self, at: usize, bytes: &[u8]) {
            if self.0.len() < at + bytes.len() {
                self.0.resize(at + bytes.len(), 0);
            }
            self.0[at..at + bytes.len()].copy_from_slice(bytes);
        }
        /// Descriptor `i` of queue `q`.
        pub fn desc(&mut self, q: usize, i: usize, addr: u64, len: u32, flags: u16, next: u16) {
            let mut d = Vec::new();
            d.extend_from_slice(&addr.to_le_bytes());
            d.extend_from_slice(&len.to_le_bytes());
            d.extend_from_slice(&flags.to_le_bytes());
            d.extend_from_slice(&next.to_le_bytes());
            self.put(q * 0x1000 + i * 16, &d);
        }
        /// Makes `heads` available on queue `q`.
        pub fn avail(&mut self, q: usize, heads: &[u16]) {
            let base = q * 0x1000 + 0x800;
            self.put(base + 2, &(heads.len() as u16).to_le_bytes());
            for (i, h) in heads.iter().enumerate() {
                self.put(base + 4 + 2 * i, &h.to_le_bytes());
            }
            // The used ring's page exists too.
            self.put(q * 0x1000 + 0xc00 + 0x100, &[0]);
        }
        /// The `virtio_queue` input: features, queue size 16, knobs, image.
        pub fn input(&self, features: u64, knobs: u8) -> Vec<u8> {
            let mut v = features.to_le_bytes().to_vec();
            v.push(4);
            v.push(knobs);
            v.extend_from_slice(&self.0);
            v
        }
    }

    pub fn blk() -> Vec<u8> {
        let mut m = Image::new(0x1000);
        // IN sector 1, OUT sector 2, FLUSH, GET_ID: header, data, status.
        for (n, (kind, sector, data_flags)) in
            [(0u32, 1u64, WRITE), (1, 2, 0), (4, 0, WRITE), (8, 0, WRITE)]
                .into_iter()
                .enumerate()
        {
            let hdr_at = 0x100 + n * 0x100;
            let mut hdr = kind.to_le_bytes().to_vec();
            hdr.extend_from_slice(&0u32.to_le_bytes());
            hdr.extend_from_slice(&sector.to_le_bytes());
            m.put(hdr_at, &hdr);
            let i = (n * 3) as u16;
            let data_len = if kind == 8 { 20 } else { 512 };
            m.desc(0, usize::from(i), hdr_at as u64, 16, NEXT, i + 1);
            if kind == 4 {
                m.desc(0, usize::from(i) + 1, (hdr_at + 0x10) as u64, 1, WRITE, 0);
            } else {
                m.desc(
                    0,
                    usize::from(i) + 1,
                    0x2000 + n as u64 * 0x200,
                    data_len,
                    data_flags | NEXT,
                    i + 2,
                );
                m.desc(0, usize::from(i) + 2, (hdr_at + 0x10) as u64, 1, WRITE, 0);
            }
        }
        m.put(0x2000, &[0xa5; 0x800]);
        m.avail(0, &[0, 3, 6, 9]);
        m.input(VERSION_1 | EVENT_IDX, 0)
    }

    pub fn rng() -> Vec<u8> {
        let mut m = Image::new(0x1000);
        m.desc(0, 0, 0x100, 64, WRITE | NEXT, 1);
        m.desc(0, 1, 0x200, 32, WRITE, 0);
        m.desc(0, 2, 0x300, 16, 0, 0);
        m.avail(0, &[0, 2]);
        m.input(VERSION_1, 0)
    }

    /// rx: two 2 KiB buffers (the 3000-byte frame spans both with
    /// mergeable buffers) and one of 1 KiB; tx: a header and 64 bytes.
    pub fn net() -> Vec<u8> {
        const MRG_RXBUF: u64 = 1 << 15;
        let mut m = Image::new(0x2000);
        m.desc(0, 0, 0x4000, 0x800, WRITE, 0);
        m.desc(0, 1, 0x4800, 0x800, WRITE, 0);
        m.desc(0, 2, 0x5000, 0x400, WRITE, 0);
        m.avail(0, &[0, 1, 2]);
        m.put(0x6000, &[0; 12]);
        m.put(0x6100, &[0x5a; 64]);
        m.desc(1, 0, 0x6000, 12, NEXT, 1);
        m.desc(1, 1, 0x6100, 64, 0, 0);
        m.avail(1, &[0]);
        m.input(VERSION_1 | MRG_RXBUF, 1)
    }

    pub fn balloon() -> Vec<u8> {
        let mut m = Image::new(0x4000);
        // Inflate: 4 PFNs in the second region; deflate: 2 of them.
        let pfns: Vec<u8> = (0x20u32..0x24).flat_map(|p| p.to_le_bytes()).collect();
        m.put(0x100, &pfns);
        m.desc(0, 0, 0x100, 16, 0, 0);
        m.avail(0, &[0]);
        m.put(0x1100, &pfns[..8]);
        m.desc(1, 0, 0x1100, 8, 0, 0);
        m.avail(1, &[0]);
        // Statistics: (tag, value) pairs.
        let mut stats = Vec::new();
        for (tag, val) in [(0u16, 1u64), (4, 4096), (5, 1 << 24), (200, 7)] {
            stats.extend_from_slice(&tag.to_le_bytes());
            stats.extend_from_slice(&val.to_le_bytes());
        }
        m.put(0x2100, &stats);
        m.desc(2, 0, 0x2100, stats.len() as u32, 0, 0);
        m.avail(2, &[0]);
        // Free page reporting: one writable page range.
        m.desc(3, 0, 0x2_0000 + 0x2000, 0x1000, WRITE, 0);
        m.avail(3, &[0]);
        // deflate_on_oom, statistics, reporting; a 1 MiB target.
        m.input(VERSION_1 | EVENT_IDX | 1 | 2 | 1 << 5, 0x17)
    }

    fn vsock_header(op: u16, len: u32) -> Vec<u8> {
        let mut h = Vec::new();
        h.extend_from_slice(&3u64.to_le_bytes()); // src_cid: the guest
        h.extend_from_slice(&2u64.to_le_bytes()); // dst_cid: the host
        h.extend_from_slice(&1234u32.to_le_bytes());
        h.extend_from_slice(&5000u32.to_le_bytes());
        h.extend_from_slice(&len.to_le_bytes());
        h.extend_from_slice(&1u16.to_le_bytes()); // stream
        h.extend_from_slice(&op.to_le_bytes());
        h.extend_from_slice(&0u32.to_le_bytes());
        h.extend_from_slice(&65536u32.to_le_bytes());
        h.extend_from_slice(&0u32.to_le_bytes());
        h
    }

    pub fn vsock() -> Vec<u8> {
        let mut m = Image::new(0x3000);
        // rx: two writable buffers; tx (queue 1): REQUEST, then RW with data.
        m.desc(0, 0, 0x100, 0x200, WRITE, 0);
        m.desc(0, 1, 0x300, 0x200, WRITE, 0);
        m.avail(0, &[0, 1]);
        m.put(0x1100, &vsock_header(1, 0));
        m.desc(1, 0, 0x1100, 44, 0, 0);
        m.put(0x1200, &vsock_header(5, 5));
        m.put(0x1300, b"hello");
        m.desc(1, 1, 0x1200, 44, NEXT, 2);
        m.desc(1, 2, 0x1300, 5, 0, 0);
        m.avail(1, &[0, 1]);
        m.avail(2, &[]);
        m.input(VERSION_1 | EVENT_IDX, 0)
    }

    pub fn vsock_packet() -> Vec<u8> {
        let mut m = Image::new(0x1000);
        m.put(0x100, &vsock_header(1, 0));
        m.desc(0, 0, 0x100, 44, 0, 0);
        m.put(0x200, &vsock_header(5, 3));
        m.put(0x300, b"abc");
        m.desc(0, 1, 0x200, 44, NEXT, 2);
        m.desc(0, 2, 0x300, 3, 0, 0);
        m.avail(0, &[0, 1]);
        let mut v = vec![4];
        v.extend_from_slice(&m.0);
        v
    }

    pub fn mem() -> Vec<u8> {
        let mut m = Image::new(0x1000);
        // STATE of the region, PLUG its first block, UNPLUG it, UNPLUG_ALL.
        let base = 4u64 << 30;
        for (n, (kind, addr, nb)) in [(3u16, base, 8u16), (0, base, 1), (1, base, 1), (2, 0, 0)]
            .into_iter()
            .enumerate()
        {
            let at = 0x100 + n * 0x40;
            let mut r = kind.to_le_bytes().to_vec();
            r.extend_from_slice(&[0; 6]);
            r.extend_from_slice(&addr.to_le_bytes());
            r.extend_from_slice(&nb.to_le_bytes());
            r.extend_from_slice(&[0; 6]);
            m.put(at, &r);
            let i = (2 * n) as u16;
            m.desc(0, usize::from(i), at as u64, 24, NEXT, i + 1);
            m.desc(0, usize::from(i) + 1, (at + 0x20) as u64, 10, WRITE, 0);
        }
        m.avail(0, &[0, 2, 4, 6]);
        // A 4 MiB target.
        m.input(VERSION_1 | 1, 2)
    }

    pub fn mmio() -> Vec<u8> {
        // rng (device 1): the driver's handshake with rings at 0x8000.
        let mut v = vec![1, 0];
        let mut w = |off: u16, val: u32| {
            v.push(1 | 2 << 1);
            v.extend_from_slice(&off.to_le_bytes());
            v.extend_from_slice(&val.to_le_bytes());
        };
        w(0x70, 1);
        w(0x70, 3);
        w(0x24, 1);
        w(0x20, 1);
        w(0x70, 0xb);
        w(0x30, 0);
        w(0x38, 16);
        w(0x80, 0x8000);
        w(0x90, 0x8800);
        w(0xa0, 0x8c00);
        w(0x44, 1);
        w(0x70, 0xf);
        w(0x50, 0);
        w(0x64, 1);
        // A read of the config generation and the interrupt status.
        v.push(2 << 1);
        v.extend_from_slice(&0xfcu16.to_le_bytes());
        v.extend_from_slice(&[0; 4]);
        let mut m = Image::new(0x9000);
        m.put(0, &v);
        m.put(0x8000, &{
            let mut d = 0x9000u64.to_le_bytes().to_vec();
            d.extend_from_slice(&64u32.to_le_bytes());
            d.extend_from_slice(&[2, 0, 0, 0]);
            d
        });
        m.put(0x8802, &1u16.to_le_bytes());
        m.put(0x9100, &[0]);
        m.0
    }

    pub fn tmem() -> Vec<u8> {
        // Blocks at 0x100.. (16-byte aligned): PUT, GET, STATS, INVALIDATE,
        // FLUSH; key at 0x800, value at 0x900, GET's buffer at 0xa00.
        let mut m = Image::new(0x1000);
        m.put(0x800, b"key-1");
        m.put(0x900, &[0x5a; 200]);
        let block = |op: u32, ka: u64, kl: u64, va: u64, vl: u64| {
            let mut b = op.to_le_bytes().to_vec();
            b.extend_from_slice(&[0xff; 4]);
            for x in [0u64, ka, kl, va, vl, 0, 0] {
                b.extend_from_slice(&x.to_le_bytes());
            }
            b
        };
        let blocks = [
            block(1, 0x800, 5, 0x900, 200),
            block(2, 0x800, 5, 0xa00, 256),
            block(5, 0, 0, 0xc00, 256),
            block(3, 0x800, 5, 0, 0),
            block(4, 0, 0, 0, 0),
        ];
        let mut calls = Vec::new();
        for (i, b) in blocks.iter().enumerate() {
            let at = 0x100 + i * 0x40;
            m.put(at, b);
            calls.extend_from_slice(&((at as u32) >> 4).to_le_bytes());
        }
        // Byte 0 picks lz4; the call words follow it.
        let mut v = vec![1];
        v.extend_from_slice(&calls);
        m.put(0, &v);
        m.0
    }

    pub fn snapshot_state(key: Option<&SnapshotKey>) -> Vec<u8> {
        let (manifest, bytes) = snapshot_parts();
        encode_with(&manifest, &bytes, key).unwrap()
    }

    /// The same state in the target's other form: manifest length, JSON, state.
    pub fn snapshot_structured() -> Vec<u8> {
        let (manifest, bytes) = snapshot_parts();
        let json = serde_json::to_vec(&manifest).unwrap();
        let mut v = (json.len() as u32).to_le_bytes().to_vec();
        v.extend_from_slice(&json);
        v.extend_from_slice(&bytes);
        v
    }

    fn snapshot_parts() -> (Manifest, Vec<u8>) {
        use crate::arch::GuestKind;
        use crate::config::{MachineConfig, VmConfig};
        let config = VmConfig {
            machine: MachineConfig {
                vcpu_count: 1,
                mem_size_mib: 16,
                ..Default::default()
            },
            ..Default::default()
        };
        let (vcpus, vm) = crate::arch::empty_state(1);
        let state = MicrovmState {
            config_json: serde_json::to_string(&config).unwrap(),
            kind: GuestKind::Unikernel,
            mem_size: 16 << 20,
            vm,
            vcpus,
            devices: Default::default(),
            generation: 0,
            signal_results: vec![0],
        };
        let bytes = bincode::serialize(&state).unwrap();
        let manifest = Manifest {
            format_version: FORMAT_VERSION,
            arch: crate::arch::NAME.into(),
            spore_version: "fuzz-seed".into(),
            created_unix_ms: 0,
            guest: "unikernel".into(),
            vcpu_count: 1,
            mem_size_bytes: 16 << 20,
            devices: crate::snapshot::describe::devices(&config, &state),
            layer: Layer {
                id: "0123456789abcdef".into(),
                kind: LayerKind::Full,
                parent: None,
                mem_file_size: 16 << 20,
                mem_data_bytes: 0,
                mem_sha256: None,
                zero_runs: None,
            },
            state_bytes: bytes.len() as u64,
            hotplug: None,
        };
        (manifest, bytes)
    }

    pub const CONFIG: &str = r#"{
  "boot-source": {"kernel_image_path": "/k", "initrd_path": null, "boot_args": "exit=0"},
  "drives": [{"drive_id": "root", "path_on_host": "/d", "is_root_device": true,
              "is_read_only": true}],
  "machine-config": {"vcpu_count": 2, "mem_size_mib": 128, "smt": false},
  "balloon": {"amount_mib": 16, "deflate_on_oom": true, "stats_polling_interval_s": 1},
  "vsock": {"guest_cid": 3, "uds_path": "/tmp/v.sock"},
  "entropy": {"rate_limiter": null}, "memory-hotplug": null, "network-interfaces": []
}"#;

    fn http(method: &str, path: &str, body: &str) -> String {
        format!(
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        )
    }

    pub const REQUESTS: &[(&str, &str, &str)] = &[
        ("GET", "/", ""),
        (
            "PUT",
            "/machine-config",
            r#"{"vcpu_count": 1, "mem_size_mib": 64}"#,
        ),
        ("PATCH", "/machine-config", r#"{"mem_size_mib": 32}"#),
        (
            "PUT",
            "/boot-source",
            r#"{"kernel_image_path": "/k", "boot_args": "a=b"}"#,
        ),
        (
            "PUT",
            "/drives/root",
            r#"{"drive_id": "root", "path_on_host": "/d", "is_root_device": true, "is_read_only": false}"#,
        ),
        (
            "PUT",
            "/vsock",
            r#"{"guest_cid": 3, "uds_path": "/tmp/v.sock"}"#,
        ),
        (
            "PUT",
            "/balloon",
            r#"{"amount_mib": 8, "deflate_on_oom": false, "stats_polling_interval_s": 1}"#,
        ),
        ("PATCH", "/balloon", r#"{"amount_mib": 4}"#),
        (
            "PUT",
            "/hotplug/memory",
            r#"{"total_size_mib": 1024, "block_size_mib": 2, "slot_size_mib": 128}"#,
        ),
        ("PUT", "/tmem", r#"{"quota_bytes": 16777216}"#),
        ("PUT", "/clone/config", r#"{"mode": "zygote"}"#),
        (
            "PUT",
            "/snapshot/create",
            r#"{"snapshot_path": "s", "mem_file_path": "m"}"#,
        ),
        ("PATCH", "/vm", r#"{"state": "Paused"}"#),
        ("PUT", "/actions", r#"{"action_type": "SendCtrlAltDel"}"#),
        ("GET", "/vm/config", ""),
        ("GET", "/version", ""),
        ("GET", "/balloon/statistics", ""),
    ];

    /// One connection: every request of [`REQUESTS`], pipelined.
    pub fn api_http() -> Vec<Vec<u8>> {
        let all: String = REQUESTS.iter().map(|(m, p, b)| http(m, p, b)).collect();
        let mut v = vec![all.into_bytes()];
        v.extend(REQUESTS.iter().map(|(m, p, b)| http(m, p, b).into_bytes()));
        // A body over the limit, announced.
        v.push(
            format!(
                "PUT /machine-config HTTP/1.1\r\nContent-Length: {}\r\n\r\n{{}}",
                MAX_BODY_BYTES + 1
            )
            .into_bytes(),
        );
        v
    }

    /// Working-set files of a 64 MiB VM, one per version.
    pub fn working_set() -> Vec<Vec<u8>> {
        use crate::snapshot::restore::working_set::tests::{v1_file, v2_file, v3_file};
        let mem = 64 << 20;
        let fill = |p: u64| p as u8;
        vec![
            v3_file(mem, "fuzz", &[(300, 2), (10, 3), (17000 - 1000, 1)], fill),
            v2_file(mem, "fuzz", &[(10, 3), (300, 2)], fill),
            v1_file(mem, "fuzz", &[300, 10, 11 | (1 << 63)]),
        ]
    }

    pub fn api_request() -> Vec<Vec<u8>> {
        REQUESTS
            .iter()
            .map(|(m, p, b)| format!("{m} {p}\n{b}").into_bytes())
            .collect()
    }
}

#[test]
#[ignore = "writes fuzz/corpus/: run by hand when the seeds change"]
fn write_fuzz_seeds() {
    use crate::snapshot::integrity::SnapshotKey;
    let key = SnapshotKey::new(super::FUZZ_KEY).unwrap();
    let sets: Vec<(&str, Vec<Vec<u8>>)> = vec![
        ("virtio_blk", vec![seeds::blk()]),
        ("virtio_rng", vec![seeds::rng()]),
        ("virtio_balloon", vec![seeds::balloon()]),
        ("virtio_vsock", vec![seeds::vsock()]),
        ("virtio_mem", vec![seeds::mem()]),
        ("virtio_net", vec![seeds::net()]),
        ("virtio_mmio", vec![seeds::mmio()]),
        ("vsock_packet", vec![seeds::vsock_packet()]),
        ("tmem", vec![seeds::tmem()]),
        (
            "snapshot_state",
            vec![
                seeds::snapshot_state(None),
                seeds::snapshot_state(Some(&key)),
                seeds::snapshot_structured(),
            ],
        ),
        ("working_set", seeds::working_set()),
        ("config_file", vec![seeds::CONFIG.as_bytes().to_vec()]),
        ("api_http", seeds::api_http()),
        ("api_request", seeds::api_request()),
    ];
    for (target, inputs) in sets {
        let dir = fuzz_dir().join("corpus").join(target);
        std::fs::create_dir_all(&dir).unwrap();
        for (i, data) in inputs.iter().enumerate() {
            std::fs::write(dir.join(format!("seed-{i:02}")), data).unwrap();
        }
    }
}

/// The working-set seeds load, one per file version.
#[test]
fn working_set_seeds_load() {
    use crate::snapshot::restore::working_set::load;
    let dir = std::env::temp_dir().join(format!("spore-ws-seeds-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (i, seed) in seeds::working_set().iter().enumerate() {
        let path = dir.join(format!("seed-{i}"));
        std::fs::write(&path, seed).unwrap();
        let ws = load(&path, "fuzz", 64 << 20).unwrap();
        assert_eq!(ws.version, 3 - i as u32);
        super::working_set(seed);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The seeds reach what they are meant to: a valid request is accepted.
#[test]
fn fuzz_seeds_are_valid_inputs() {
    use super::{virtio_queue_used, DeviceKind};
    // Every chain of a device seed comes back on its used ring (the
    // balloon keeps its statistics buffer until the next poll).
    for (kind, seed, used) in [
        (DeviceKind::Blk, seeds::blk(), vec![4]),
        (DeviceKind::Rng, seeds::rng(), vec![2]),
        (DeviceKind::Mem, seeds::mem(), vec![4]),
        // The 60-byte frame in one buffer, the 3000-byte one in two; the
        // tx frame is sent.
        (DeviceKind::Net, seeds::net(), vec![3, 1]),
        // Both tx packets are answered with an RST (no host listener).
        (DeviceKind::Vsock, seeds::vsock(), vec![2, 2, 0]),
        (DeviceKind::Balloon, seeds::balloon(), vec![1, 1, 0, 1]),
    ] {
        assert_eq!(virtio_queue_used(kind, &seed), Some(used), "{kind:?}");
    }
    use crate::snapshot::format::decode_with;
    let state = seeds::snapshot_state(None);
    let (manifest, bytes) = decode_with("seed", &state, None).unwrap();
    crate::snapshot::decode_state("seed", &manifest, bytes).unwrap();
    let config: crate::config::VmConfig = serde_json::from_str(seeds::CONFIG).unwrap();
    config.validate().unwrap();
    for (m, p, b) in seeds::REQUESTS {
        let method = hyper::Method::from_bytes(m.as_bytes()).unwrap();
        crate::api::request::parse_request(&method, p, b.as_bytes())
            .unwrap_or_else(|e| panic!("{m} {p}: {e}"));
    }
}
