//! `spore bench tmem`: tmem calls measured three ways, with the seed's
//! figures beside them.
//!
//! - In-process (this module): the VMM side alone, no guest.
//! - In a guest ([`guest`]): 1 MiB put/get latency split into
//!   VMM handling and exit + guest overhead; 4 KiB puts single vs batched.
//! - Against the kvserver unikernel ([`kv`]): `SET` vs
//!   `TMEMPUT` commands/s by value size.
//!
//! In-process, a real `GuestMemoryMmap` and a real `TmemDevice` take calls exactly as the
//! vCPU loop hands them over (the port value of a request block), so this
//! measures everything the VMM does per call (parse, validate, copy, pool)
//! but not the guest's exit round trip, which is what batching saves: the
//! JSON reports how many exits each way needs. Guest-side times come from a
//! guest client (the unikernel's tmem bench).

use std::time::Instant;

use anyhow::{bail, ensure, Context};
use clap::Args;
use serde_json::{json, Value};
use spore_abi::tmem::{op, Status, MAX_BATCH};
use spore_vmm::devices::tmem::{Compression, TmemDevice};
use spore_vmm::devices::virtio::GuestMemoryMmap;
use vm_memory::{Bytes, GuestAddress};

mod guest;
mod kv;

#[derive(Args, Debug)]
pub struct TmemArgs {
    /// Repetitions of each 1 MiB put and get (per VM in the guest part).
    #[arg(long, default_value_t = 200)]
    pub runs: usize,
    /// 4 KiB objects in the single-vs-batched comparison.
    #[arg(long, default_value_t = 4096)]
    pub objects: u64,
    /// Entries per BATCH call.
    #[arg(long, default_value_t = 64)]
    pub batch: u64,
    /// Single-vs-batched rounds per VM.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// VMs booted for each guest measurement (medians are over all of them).
    #[arg(long, default_value_t = 3)]
    pub vm_runs: usize,
    /// Values per size and command in the kvserver part.
    #[arg(long, default_value_t = 1024)]
    pub kv_values: usize,
    /// Runs per size and command in the kvserver part.
    #[arg(long, default_value_t = 3)]
    pub kv_runs: usize,
    /// Commands the kvserver load client sends before reading replies.
    #[arg(long, default_value_t = 16)]
    pub pipeline: usize,
    /// Fewer iterations everywhere (a smoke run: 5 runs, 256 objects, 1 VM,
    /// 64 values per size).
    #[arg(long)]
    pub quick: bool,
    /// Only the in-process VMM-side part (no VM).
    #[arg(long)]
    pub in_process_only: bool,
    /// Directory with the `tmem-bench` and `kvserver` unikernel images
    /// (default: $SPORE_UK_DIR, else crates/spore-uk/target/x86_64-unknown-none/release).
    #[arg(long)]
    pub uk_dir: Option<std::path::PathBuf>,
}

impl TmemArgs {
    fn apply_quick(&mut self) {
        if self.quick {
            self.runs = 5;
            self.objects = 256;
            self.rounds = 1;
            self.vm_runs = 1;
            self.kv_values = 64;
            self.kv_runs = 1;
        }
    }

    fn uk_image(&self, name: &str) -> anyhow::Result<std::path::PathBuf> {
        let dir = self
            .uk_dir
            .clone()
            .or_else(|| std::env::var_os("SPORE_UK_DIR").map(Into::into))
            .unwrap_or_else(|| "crates/spore-uk/target/x86_64-unknown-none/release".into());
        let p = dir.join(name);
        ensure!(
            p.is_file(),
            "unikernel image {} is missing: run `make uk`, or give --uk-dir (or --in-process-only)",
            p.display()
        );
        Ok(p)
    }
}

const BLOCK: u64 = 0x1000;
const KEYS: u64 = 0x10_0000;
const ARRAY: u64 = 0x20_0000;
const VALUES: u64 = 0x100_0000;
const MEM: usize = 64 << 20;
const MIB: u64 = 1 << 20;
const PAGE: u64 = 4096;

struct Guest {
    mem: GuestMemoryMmap,
    dev: TmemDevice,
}

fn block(op: u32, key: (u64, u64), value: (u64, u64)) -> [u8; 64] {
    let mut b = [0u8; 64];
    b[0..4].copy_from_slice(&op.to_le_bytes());
    b[16..24].copy_from_slice(&key.0.to_le_bytes());
    b[24..32].copy_from_slice(&key.1.to_le_bytes());
    b[32..40].copy_from_slice(&value.0.to_le_bytes());
    b[40..48].copy_from_slice(&value.1.to_le_bytes());
    b
}

impl Guest {
    fn new(compression: Compression) -> anyhow::Result<Self> {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM)])?;
        Ok(Self {
            mem,
            dev: TmemDevice::new(u64::MAX, compression),
        })
    }

    /// Writes a block at `at` and calls; returns the status and the call's ns.
    fn call(&self, at: u64, b: &[u8; 64]) -> anyhow::Result<(Status, u64)> {
        let value = call_value(at)?;
        self.mem.write_slice(b, GuestAddress(at))?;
        let t = Instant::now();
        let s = self.dev.call(&self.mem, value);
        Ok((s, elapsed_ns(t)))
    }
}

/// The value a guest writes to call the device with the block at `at`
/// (its address in 16-byte units).
fn call_value(at: u64) -> anyhow::Result<u32> {
    u32::try_from(at >> 4).with_context(|| format!("block at {at:#x} is beyond a call's reach"))
}

/// Nanoseconds since `t`, saturating (at 584 years).
fn elapsed_ns(t: Instant) -> u64 {
    u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

fn fill(mem: &GuestMemoryMmap, at: u64, len: u64, seed: u64) -> anyhow::Result<()> {
    // Text-like bytes (random words from a small vocabulary): lz4 finds
    // repeats in them as it would in cached pages of text or JSON.
    const WORDS: [&str; 16] = [
        "tmem ",
        "pool ",
        "guest ",
        "value ",
        "key ",
        "the ",
        "of ",
        "memory ",
        "{\"id\": ",
        "42, ",
        "page ",
        "spore ",
        "lz4 ",
        "batch ",
        "\n",
        "quota ",
    ];
    let len = usize::try_from(len).context("fill length beyond the address space")?;
    let mut x = seed | 1;
    let mut data = Vec::with_capacity(len + 16);
    while data.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        data.extend_from_slice(WORDS[(x & 15) as usize].as_bytes());
    }
    data.truncate(len);
    mem.write_slice(&data, GuestAddress(at))?;
    Ok(())
}

fn one_mib(g: &Guest, runs: usize) -> anyhow::Result<Value> {
    fill(&g.mem, VALUES, MIB, 1)?;
    g.mem.write_slice(b"big", GuestAddress(KEYS))?;
    let (mut puts, mut gets) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let (s, ns) = g.call(BLOCK, &block(op::PUT, (KEYS, 3), (VALUES, MIB)))?;
        ensure!(s == Status::Ok, "1 MiB put: {s:?}");
        puts.push(ns as f64 / 1e3);
        let (s, ns) = g.call(BLOCK, &block(op::GET, (KEYS, 3), (VALUES + 2 * MIB, MIB)))?;
        ensure!(s == Status::Ok, "1 MiB get: {s:?}");
        gets.push(ns as f64 / 1e3);
    }
    let mut a = vec![0u8; usize::try_from(MIB)?];
    let mut b = a.clone();
    g.mem.read_slice(&mut a, GuestAddress(VALUES))?;
    g.mem.read_slice(&mut b, GuestAddress(VALUES + 2 * MIB))?;
    ensure!(a == b, "1 MiB value did not read back identical");
    let st = g.dev.stats().unwrap_or_default();
    Ok(json!({
        "put_us": crate::stats::summary(&puts),
        "get_us": crate::stats::summary(&gets),
        "bytes_used": st.bytes_used,
        "bytes_stored": st.bytes_stored,
    }))
}

/// `n` 4 KiB puts, one call each or `batch` per call; returns ns per object.
fn small_puts(g: &Guest, n: u64, batch: u64) -> anyhow::Result<f64> {
    ensure!(
        n * PAGE <= (MEM as u64 - VALUES),
        "--objects too large for the bench memory"
    );
    ensure!(
        n * 16 <= ARRAY - KEYS,
        "--objects too large for the key area"
    );
    fill(&g.mem, VALUES, n * PAGE, 2)?;
    for i in 0..n {
        g.mem.write_slice(
            &format!("k{i:014}").into_bytes(),
            GuestAddress(KEYS + 16 * i),
        )?;
    }
    let entry = |i: u64| block(op::PUT, (KEYS + 16 * i, 15), (VALUES + PAGE * i, PAGE));
    // One clock pair around the whole loop: reading the clock can cost
    // microseconds on some hosts (kvm_pvm traps it), which would swamp a
    // 4 KiB call. The loop includes writing the blocks, as a guest would.
    let block_value = call_value(BLOCK)?;
    let start = Instant::now();
    if batch <= 1 {
        for i in 0..n {
            g.mem.write_slice(&entry(i), GuestAddress(BLOCK))?;
            let s = g.dev.call(&g.mem, block_value);
            ensure!(s == Status::Ok, "4 KiB put: {s:?}");
        }
    } else {
        let mut i = 0;
        while i < n {
            let count = batch.min(n - i);
            for j in 0..count {
                g.mem
                    .write_slice(&entry(i + j), GuestAddress(ARRAY + 64 * j))?;
            }
            let b = block(op::BATCH, (0, 0), (ARRAY, count));
            g.mem.write_slice(&b, GuestAddress(BLOCK))?;
            let s = g.dev.call(&g.mem, block_value);
            ensure!(s == Status::Ok, "batch: {s:?}");
            for j in 0..count {
                let st: u32 = g.mem.read_obj(GuestAddress(ARRAY + 64 * j + 4))?;
                ensure!(st == Status::Ok as u32, "batch entry {j}: status {st}");
            }
            i += count;
        }
    }
    let total_ns = elapsed_ns(start);
    Ok(total_ns as f64 / n as f64)
}

pub fn run(mut a: TmemArgs) -> anyhow::Result<u8> {
    a.apply_quick();
    if a.runs == 0 || a.objects == 0 || a.rounds == 0 || a.vm_runs == 0 {
        bail!("--runs, --objects, --rounds and --vm-runs must be at least 1");
    }
    if a.kv_values == 0 || a.kv_runs == 0 || a.pipeline == 0 {
        bail!("--kv-values, --kv-runs and --pipeline must be at least 1");
    }
    if a.batch == 0 || a.batch > MAX_BATCH || a.batch * 64 > VALUES - ARRAY {
        bail!("--batch must be between 1 and {}", (VALUES - ARRAY) / 64);
    }
    let (in_process, mut summary) = in_process(&a)?;
    let mut out = json!({
        "benchmark": "tmem",
        "machine": crate::host::machine(),
        "quick": a.quick,
        "vmm_in_process": in_process,
    });
    if !a.in_process_only {
        let spore = std::env::current_exe().context("locating the spore binary")?;
        let (bench_uk, kv_uk) = (a.uk_image("tmem-bench")?, a.uk_image("kvserver")?);
        let scratch = std::env::temp_dir().join(format!("spore-bench-tmem-{}", std::process::id()));
        std::fs::create_dir_all(&scratch)?;
        let guest = (|| -> anyhow::Result<(Value, Value, Value, Value, Value)> {
            let lat = guest::latency(&spore, &bench_uk, a.runs, a.vm_runs, &scratch)
                .context("guest 1 MiB latency")?;
            let sec = guest::seccomp_cost(&spore, &bench_uk, a.runs, a.vm_runs, &scratch)
                .context("seccomp on/off")?;
            let bat = guest::batching(
                &spore, &bench_uk, a.objects, a.batch, a.rounds, a.vm_runs, &scratch,
            )
            .context("guest batching")?;
            let kv = kv::run(&spore, &kv_uk, a.kv_values, a.kv_runs, a.pipeline, &scratch)
                .context("kvserver SET vs TMEMPUT")?;
            let vsock = kv::seccomp_round_trips(
                &spore,
                &kv_uk,
                if a.quick { 200 } else { 1000 },
                a.vm_runs,
                &scratch,
            )
            .context("vsock round trips, seccomp on/off")?;
            Ok((lat, bat, kv, sec, vsock))
        })();
        let _ = std::fs::remove_dir_all(&scratch);
        let (lat, bat, kv, sec, vsock) = guest?;
        let f = |v: &Value| v.as_f64().unwrap_or(f64::NAN);
        summary = format!(
            "guest 1 MiB put {:.0} µs ({:.0} VMM + {:.0} exit/guest), get {:.0} µs ({:.0} + {:.0}) [seed: 178, 124]; \
             4 KiB puts {:.0}/s single vs {:.0}/s batched ({:.1}x, {} vs {} exits); \
             kvserver SET/TMEMPUT cmds/s {}; \
             seccomp on/off 1 MiB put {:.0}/{:.0} µs ({:+.1}%), get {:.0}/{:.0} µs ({:+.1}%), \
             vsock round trip {:.0}/{:.0} µs; {summary}",
            f(&lat["put"]["guest_total_us"]["median"]),
            f(&lat["put"]["vmm_handling_us"]),
            f(&lat["put"]["exit_and_guest_us"]),
            f(&lat["get"]["guest_total_us"]["median"]),
            f(&lat["get"]["vmm_handling_us"]),
            f(&lat["get"]["exit_and_guest_us"]),
            f(&bat["single"]["objects_per_s"]["median"]),
            f(&bat["batched"]["objects_per_s"]["median"]),
            f(&bat["speedup"]),
            bat["single"]["exits"],
            bat["batched"]["exits"],
            kv["sizes"]
                .as_array()
                .map(|rows| rows
                    .iter()
                    .map(|r| format!(
                        "{} B {:.0}/{:.0}",
                        r["value_bytes"],
                        f(&r["set_cmds_per_s"]["median"]),
                        f(&r["tmemput_cmds_per_s"]["median"])
                    ))
                    .collect::<Vec<_>>()
                    .join(", "))
                .unwrap_or_default(),
            f(&sec["on"]["put_guest_total_us"]["median"]),
            f(&sec["off"]["put_guest_total_us"]["median"]),
            f(&sec["put_cost_pct"]),
            f(&sec["on"]["get_guest_total_us"]["median"]),
            f(&sec["off"]["get_guest_total_us"]["median"]),
            f(&sec["get_cost_pct"]),
            f(&vsock["seccomp_on_us"]["median"]),
            f(&vsock["seccomp_off_us"]["median"]),
        );
        out["guest"] = json!({ "one_mib": lat, "batching_4k": bat, "seccomp_1m": sec });
        out["vsock_seccomp"] = vsock;
        out["kvserver"] = kv;
    }
    eprintln!("tmem: {summary}");
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(0)
}

/// The in-process part: its JSON and its share of the summary line.
fn in_process(a: &TmemArgs) -> anyhow::Result<(Value, String)> {
    let mut per_compression = serde_json::Map::new();
    let mut summary = Vec::new();
    for (name, c) in [("none", Compression::None), ("lz4", Compression::Lz4)] {
        let big = one_mib(&Guest::new(c)?, a.runs)?;
        let single = small_puts(&Guest::new(c)?, a.objects, 1)?;
        let batched = small_puts(&Guest::new(c)?, a.objects, a.batch)?;
        summary.push(format!(
            "{name}: 1 MiB put {:.0} µs, get {:.0} µs, 4 KiB put {:.2} µs single, {:.2} µs batched",
            big["put_us"]["median"].as_f64().unwrap_or(f64::NAN),
            big["get_us"]["median"].as_f64().unwrap_or(f64::NAN),
            single / 1e3,
            batched / 1e3,
        ));
        per_compression.insert(
            name.into(),
            json!({
                "one_mib": big,
                "put_4k_us_per_object": { "single": single / 1e3, "batched": batched / 1e3 },
            }),
        );
    }
    Ok((
        json!({
            "side": "vmm (in-process: device call only, no guest exit)",
            "runs": a.runs,
            "objects_4k": a.objects,
            "batch": a.batch,
            "exits_4k": { "single": a.objects, "batched": a.objects.div_ceil(a.batch) },
            "compression": per_compression,
        }),
        format!("VMM in-process {}", summary.join("; ")),
    ))
}
