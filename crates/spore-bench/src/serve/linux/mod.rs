//! `spore bench serve --linux`: SnapFaaS's experiment (seed 003, issue 17)
//! on `spore serve`. Python functions (tests/fixtures/python-bench) at
//! several memory sizes, each started by five strategies, each measured
//! with the host page cache dropped before the invocation (cold) and kept
//! (lukewarm), end to end as the daemon reports it (`X-Spore-Duration-Us`:
//! invoke received → response):
//!
//! - `cold_boot`: the guest kernel boots the runtime image and the function
//!   initialises (`--no-snapshots --no-clones`);
//! - `merged_full`: the seed's baseline (Firecracker Full + Diff merged by
//!   `rebase-snap`): the function's diff merged with the runtime base into
//!   one full snapshot of its own, restored lazily (`--linux-snapshots
//!   merged --restore-mode lazy`);
//! - `layered`: spore's base + diff chain, restored lazily;
//! - `layered_ws`: the chain with the recorded working set read up front
//!   (`--restore-mode working-set`; the first restore records it);
//! - `clone`: a clone of the function's zygote (a VM started from the base,
//!   paused after init);
//! - `warm` (a reference, not a start): an idle instance that served
//!   before, the floor every strategy shares (the function's own run and
//!   the invoke path).
//!
//! Every invocation but `warm`'s is a new instance (`--keep-alive-ms 0`); one that took
//! another start path than its strategy's is reported, not counted. Disk per
//! function: the base is shared by every function of a runtime and size, so
//! an extra layered function costs its diff (and working set), a merged one
//! a whole memory file. Medians go to stdout as JSON; a table to stderr.

use std::collections::{BTreeMap, HashSet};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use clap::Args;
use serde_json::{json, Value};

use super::daemon::Daemon;
use crate::lambda_client::Conn;

#[derive(Args, Debug)]
pub struct LinuxBenchArgs {
    /// Benchmark Linux (python3) functions: SnapFaaS's start strategies,
    /// cold and lukewarm (the unikernel options are then ignored).
    #[arg(long)]
    pub linux: bool,
    /// The guest kernel (default: the newest one in the image cache).
    #[arg(long, value_name = "VMLINUX")]
    pub linux_kernel: Option<PathBuf>,
    /// Where the python3 runtime image is cached (default: $SPORE_CACHE,
    /// else /var/cache/spore).
    #[arg(long, value_name = "DIR")]
    pub image_cache: Option<PathBuf>,
    /// The Python functions, one NAME.py each (default: this source tree's
    /// tests/fixtures/python-bench).
    #[arg(long, value_name = "DIR")]
    pub fixtures: Option<PathBuf>,
    /// Which functions of --fixtures to run.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "lorem,thumbnail,enhance,matrix,compress"
    )]
    pub functions: Vec<String>,
    /// Memory sizes (MiB).
    #[arg(long, value_delimiter = ',', default_value = "128,256,512")]
    pub sizes: Vec<u32>,
    /// Invocations measured per function, size, strategy and temperature.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Start strategies: cold-boot, merged, layered, layered-ws, clone, and
    /// warm (a reference: an idle instance, no start at all).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "cold-boot,merged,layered,layered-ws,clone,warm"
    )]
    pub strategies: Vec<String>,
    /// lukewarm (page cache kept) and/or cold (dropped before each
    /// invocation).
    #[arg(long, value_delimiter = ',', default_value = "lukewarm,cold")]
    pub temperatures: Vec<String>,
    /// How a cold start's page cache is dropped: drop-caches (`echo 1 >
    /// /proc/sys/vm/drop_caches`, root; falls back to fadvise) or fadvise
    /// (POSIX_FADV_DONTNEED on the snapshot, image, kernel and code files).
    #[arg(long, default_value = "drop-caches", value_parser = ["drop-caches", "fadvise"])]
    pub cold_drop: String,
    /// The daemons' state directory (at most 60 bytes; on the disk whose
    /// page cache is dropped: a tmpfs has none to drop). Default: a new
    /// directory under the temporary directory, removed afterwards.
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Keep the state directory (snapshots, bases) afterwards.
    #[arg(long)]
    pub keep_state: bool,
    /// The daemons' --ready-timeout-s (a Linux boot under emulation is slow).
    #[arg(long, default_value_t = 240)]
    pub ready_timeout_s: u64,
    /// The daemons' --working-set-record-ms: the first working-set restore
    /// records until its instance stops, or this long.
    #[arg(long, default_value_t = 60_000)]
    pub working_set_record_ms: u64,
    /// Append the daemons' messages to this file.
    #[arg(long, value_name = "FILE")]
    pub daemon_log: Option<PathBuf>,
}

/// A start strategy: which daemon, which start path its invocations take.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Strategy {
    ColdBoot,
    Layered,
    LayeredWs,
    Merged,
    Clone,
    Warm,
}

impl Strategy {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "cold-boot" | "cold_boot" => Strategy::ColdBoot,
            "layered" => Strategy::Layered,
            "layered-ws" | "layered_ws" => Strategy::LayeredWs,
            "merged" | "merged-full" | "merged_full" => Strategy::Merged,
            "clone" => Strategy::Clone,
            "warm" => Strategy::Warm,
            _ => return None,
        })
    }

    /// Its name in the JSON.
    fn key(self) -> &'static str {
        match self {
            Strategy::ColdBoot => "cold_boot",
            Strategy::Layered => "layered",
            Strategy::LayeredWs => "layered_ws",
            Strategy::Merged => "merged_full",
            Strategy::Clone => "clone",
            Strategy::Warm => "warm",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Strategy::ColdBoot => "kernel boot + runtime and function init, no snapshot",
            Strategy::Layered => "runtime base + function diff, restored lazily",
            Strategy::LayeredWs => {
                "runtime base + function diff, recorded working set read up front"
            }
            Strategy::Merged => {
                "one full snapshot per function (base and diff merged, Firecracker rebase-snap style), restored lazily"
            }
            Strategy::Clone => "clone of the function's zygote (started from the base)",
            Strategy::Warm => "reference: an idle instance that served before (no start)",
        }
    }

    /// The daemon flags beyond the common ones.
    fn flags(self) -> &'static [&'static str] {
        match self {
            Strategy::ColdBoot => &["--keep-alive-ms", "0", "--no-snapshots", "--no-clones"],
            Strategy::Layered => &[
                "--keep-alive-ms",
                "0",
                "--no-clones",
                "--restore-mode",
                "lazy",
            ],
            Strategy::LayeredWs => &[
                "--keep-alive-ms",
                "0",
                "--no-clones",
                "--restore-mode",
                "working-set",
            ],
            Strategy::Merged => &[
                "--keep-alive-ms",
                "0",
                "--no-clones",
                "--restore-mode",
                "lazy",
                "--linux-snapshots",
                "merged",
            ],
            Strategy::Clone => &["--keep-alive-ms", "0", "--restore-mode", "lazy"],
            Strategy::Warm => &["--keep-alive-ms", "3600000", "--restore-mode", "lazy"],
        }
    }

    /// The start path (`X-Spore-Start-Path`) its invocations must take.
    fn path(self) -> &'static str {
        match self {
            Strategy::ColdBoot => "cold",
            Strategy::Layered | Strategy::LayeredWs | Strategy::Merged => "restore",
            Strategy::Clone => "clone",
            Strategy::Warm => "warm",
        }
    }

    /// The deployed function's name: merged snapshots are another
    /// function's (its own full snapshot); the others share the layered one.
    fn function_name(self, function: &str, mib: u32) -> String {
        match self {
            Strategy::Merged => format!("{function}-{mib}-merged"),
            _ => format!("{function}-{mib}"),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Temperature {
    Lukewarm,
    Cold,
}

impl Temperature {
    fn parse(s: &str) -> Option<Self> {
        match s {
            "lukewarm" => Some(Temperature::Lukewarm),
            "cold" => Some(Temperature::Cold),
            _ => None,
        }
    }

    fn key(self) -> &'static str {
        match self {
            Temperature::Lukewarm => "lukewarm",
            Temperature::Cold => "cold",
        }
    }
}

/// One measured invocation.
struct Sample {
    temperature: Temperature,
    server_ms: f64,
    client_ms: f64,
    path: String,
}

/// The measurements of one function, size and strategy.
struct Cell {
    function: String,
    mib: u32,
    strategy: Strategy,
    samples: Vec<Sample>,
    error: Option<String>,
}

fn parse_list<T>(what: &str, v: &[String], f: fn(&str) -> Option<T>) -> anyhow::Result<Vec<T>> {
    v.iter()
        .map(|s| f(s.trim()).with_context(|| format!("--{what}: unknown value {s:?}")))
        .collect()
}

pub fn run(a: LinuxBenchArgs) -> anyhow::Result<u8> {
    let mut strategies = parse_list("strategies", &a.strategies, Strategy::parse)?;
    strategies.sort();
    strategies.dedup();
    let temps = parse_list("temperatures", &a.temperatures, Temperature::parse)?;
    if strategies.is_empty() || temps.is_empty() || a.sizes.is_empty() || a.rounds == 0 {
        bail!("nothing to measure: give strategies, temperatures, sizes and rounds >= 1");
    }
    let fixtures = a.fixtures.clone().unwrap_or_else(|| {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/python-bench")
    });
    let mut zips = BTreeMap::new();
    for f in &a.functions {
        if f.is_empty() || !f.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            bail!("--functions: {f:?} is not a Python module name");
        }
        let src = fixtures.join(format!("{f}.py"));
        let code = std::fs::read(&src)
            .with_context(|| format!("reading the function {}", src.display()))?;
        zips.insert(f.clone(), zip_of(&format!("{f}.py"), &code)?);
    }
    let cache = spore_serve::images::cache_dir(a.image_cache.clone());
    let image = spore_serve::images::newest(&cache, "python3")?;
    let kernel = match &a.linux_kernel {
        Some(k) if !k.is_file() => bail!("--linux-kernel: no file at {}", k.display()),
        Some(k) => k.clone(),
        None => spore_serve::images::newest_kernel(&cache).with_context(|| {
            format!(
                "no guest kernel in {}: give --linux-kernel",
                cache.display()
            )
        })?,
    };
    let state = a
        .state_dir
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join(format!("spore-bsl-{}", std::process::id())));
    std::fs::create_dir_all(&state)
        .with_context(|| format!("creating the state directory {}", state.display()))?;
    let state = state.canonicalize()?;
    let dropper = Dropper {
        how: a.cold_drop.clone(),
        files: vec![state.clone(), image.clone(), kernel.clone()],
        notes: std::cell::RefCell::new(Vec::new()),
    };
    let common: Vec<String> = vec![
        "--image-cache".into(),
        cache.display().to_string(),
        "--linux-kernel".into(),
        kernel.display().to_string(),
        "--ready-timeout-s".into(),
        a.ready_timeout_s.to_string(),
        "--working-set-record-ms".into(),
        a.working_set_record_ms.to_string(),
        "--max-concurrency".into(),
        "4".into(),
    ];
    let started = Instant::now();
    let mut cells = Vec::new();
    let mut deployed = HashSet::new();
    for &strategy in &strategies {
        eprintln!(
            "bench serve --linux: {} ({})",
            strategy.key(),
            strategy.describe()
        );
        let mut args: Vec<&str> = common.iter().map(String::as_str).collect();
        args.extend(strategy.flags());
        let daemon = match Daemon::start_keeping(&state, &args, a.daemon_log.as_deref()) {
            Ok(d) => d,
            Err(e) => {
                for &mib in &a.sizes {
                    for f in &a.functions {
                        cells.push(Cell {
                            function: f.clone(),
                            mib,
                            strategy,
                            samples: Vec::new(),
                            error: Some(format!("{e:#}")),
                        });
                    }
                }
                continue;
            }
        };
        for &mib in &a.sizes {
            for (f, zip) in &zips {
                let name = strategy.function_name(f, mib);
                let mut cell = Cell {
                    function: f.clone(),
                    mib,
                    strategy,
                    samples: Vec::new(),
                    error: None,
                };
                let t = Instant::now();
                let measured = (|| -> anyhow::Result<()> {
                    if !deployed.contains(&name) {
                        daemon
                            .deploy_zip(&name, "python3", &format!("{f}.handler"), zip, mib, 120)
                            .with_context(|| format!("deploying {name}"))?;
                        deployed.insert(name.clone());
                    }
                    let mut conn = Conn::open(&daemon.addr)?;
                    prepare(&mut conn, &state, &name, strategy)?;
                    for round in 0..a.rounds {
                        for &temp in &temps {
                            if temp == Temperature::Cold {
                                dropper.drop_cache();
                            }
                            let (r, client_ms) = invoke(&mut conn, &name, round)?;
                            eprintln!(
                                "bench serve --linux: {name} {} {}: {} start, {:.1} ms (client {:.1} ms)",
                                strategy.key(),
                                temp.key(),
                                r.path,
                                r.server_us / 1e3,
                                client_ms
                            );
                            cell.samples.push(Sample {
                                temperature: temp,
                                server_ms: r.server_us / 1e3,
                                client_ms,
                                path: r.path,
                            });
                        }
                    }
                    Ok(())
                })();
                if let Err(e) = measured {
                    eprintln!(
                        "bench serve --linux: {name} {}: FAILED: {e:#}",
                        strategy.key()
                    );
                    cell.error = Some(format!("{e:#}"));
                }
                eprintln!(
                    "bench serve --linux: {name} {} done in {:.0} s",
                    strategy.key(),
                    t.elapsed().as_secs_f64()
                );
                cells.push(cell);
            }
        }
        drop_daemon(daemon);
    }
    let disk = disk_report(&state, &a.sizes, &a.functions, &strategies);
    let report = report(
        &a,
        &strategies,
        &temps,
        &cells,
        disk,
        &dropper,
        &image,
        &kernel,
    );
    eprint!("{}", table(&report));
    eprintln!(
        "bench serve --linux: {:.0} s in all",
        started.elapsed().as_secs_f64()
    );
    if !a.keep_state {
        let _ = std::fs::remove_dir_all(&state);
    }
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(0)
}

/// Ends a daemon (and with it every instance and zygote it holds).
fn drop_daemon(d: Daemon) {
    drop(d);
}

/// A zip holding one file.
fn zip_of(name: &str, code: &[u8]) -> anyhow::Result<Vec<u8>> {
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    zip.start_file(name, zip::write::SimpleFileOptions::default())?;
    zip.write_all(code)?;
    Ok(zip.finish()?.into_inner())
}

/// One invocation; a function error fails it. Returns the reply and the
/// client's own time (ms).
fn invoke(
    conn: &mut Conn,
    name: &str,
    i: usize,
) -> anyhow::Result<(crate::lambda_client::Reply, f64)> {
    let t = Instant::now();
    let r = conn.invoke(name, format!("{{\"i\":{i}}}").as_bytes())?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    if r.function_error {
        bail!(
            "{name} answered a function error: {}",
            String::from_utf8_lossy(&r.body)
        );
    }
    Ok((r, ms))
}

/// Invocations not measured until the next one takes the strategy's start
/// path: the function's snapshot written (and merged, for `merged`), its
/// working set recorded (`layered_ws`), its zygote made (`clone`); the last
/// one also fills the page cache for the first lukewarm sample.
fn prepare(conn: &mut Conn, state: &Path, name: &str, s: Strategy) -> anyhow::Result<()> {
    const TRIES: usize = 8;
    let mut seen = Vec::new();
    for _ in 0..TRIES {
        let (r, ms) = invoke(conn, name, 0)?;
        eprintln!(
            "bench serve --linux: {name} {}: preparing: {} start, {ms:.0} ms",
            s.key(),
            r.path
        );
        seen.push(r.path.clone());
        let dir = snapshot_dir(state, name);
        match s {
            Strategy::ColdBoot => return Ok(()),
            Strategy::Merged if r.path != "cold" => {
                let merged = dir
                    .as_ref()
                    .is_some_and(|d| d.join("merged.json").is_file());
                if !merged {
                    bail!("{name}'s snapshot was not merged into a full one (see the daemon log)");
                }
                return Ok(());
            }
            Strategy::Layered if r.path == "restore" => {
                if dir.as_ref().is_none_or(|d| !d.join("layer.json").is_file()) {
                    bail!("{name}'s snapshot is not a diff on a base (see the daemon log)");
                }
                return Ok(());
            }
            Strategy::LayeredWs if r.path == "restore" => {
                // Written by that instance's VMM when it stopped.
                let ws = dir
                    .map(|d| d.join("vm.state.ws"))
                    .context("no snapshot directory")?;
                let deadline = Instant::now() + Duration::from_secs(120);
                while !ws.is_file() && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(200));
                }
                if !ws.is_file() {
                    bail!("no working set was recorded at {}", ws.display());
                }
                // One restore that reads it: the page cache as lukewarm
                // samples find it.
                let (r, _) = invoke(conn, name, 0)?;
                if r.path != "restore" {
                    bail!(
                        "a restore was expected after the working set, got a {} start",
                        r.path
                    );
                }
                return Ok(());
            }
            Strategy::Clone if r.path == "clone" => return Ok(()),
            Strategy::Warm if r.path == "warm" => return Ok(()),
            // The zygote is remade by a boot in the background.
            Strategy::Clone => std::thread::sleep(Duration::from_secs(2)),
            _ => {}
        }
    }
    bail!(
        "{name} did not reach a {} start in {TRIES} invocations (took: {})",
        s.path(),
        seen.join(", ")
    )
}

/// `<state>/snapshots/<name>-v<N>` (the newest N).
fn snapshot_dir(state: &Path, name: &str) -> Option<PathBuf> {
    let prefix = format!("{name}-v");
    std::fs::read_dir(state.join("snapshots"))
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let n: u64 = e
                .file_name()
                .to_str()?
                .strip_prefix(&prefix)?
                .parse()
                .ok()?;
            Some((n, e.path()))
        })
        .max()
        .map(|(_, p)| p)
}

/// Drops the page cache before a cold start.
struct Dropper {
    how: String,
    /// Files and directories (walked) whose cached pages a fadvise drop
    /// evicts.
    files: Vec<PathBuf>,
    /// What went differently than asked (reported in the JSON).
    notes: std::cell::RefCell<Vec<String>>,
}

impl Dropper {
    fn drop_cache(&self) {
        // SAFETY: sync(2) takes no arguments; dirty pages cannot be dropped.
        unsafe { libc::sync() };
        if self.how == "drop-caches" {
            match std::fs::write("/proc/sys/vm/drop_caches", b"1") {
                Ok(()) => return,
                Err(e) => {
                    let note = format!(
                        "echo 1 > /proc/sys/vm/drop_caches failed ({e}); dropped with fadvise instead"
                    );
                    let mut notes = self.notes.borrow_mut();
                    if !notes.contains(&note) {
                        eprintln!("bench serve --linux: {note}");
                        notes.push(note);
                    }
                }
            }
        }
        for p in &self.files {
            fadvise_tree(p);
        }
    }
}

/// POSIX_FADV_DONTNEED on every regular file at or under `p`.
fn fadvise_tree(p: &Path) {
    let Ok(meta) = std::fs::symlink_metadata(p) else {
        return;
    };
    if meta.is_dir() {
        for e in std::fs::read_dir(p).into_iter().flatten().flatten() {
            fadvise_tree(&e.path());
        }
    } else if meta.is_file() {
        if let Ok(f) = std::fs::File::open(p) {
            use std::os::fd::AsRawFd;
            // SAFETY: advice on a file descriptor we own, whole file.
            unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        }
    }
}

/// Bytes the files at or under `p` take on disk.
fn disk_bytes(p: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::symlink_metadata(p) else {
        return 0;
    };
    if meta.is_dir() {
        std::fs::read_dir(p)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| disk_bytes(&e.path()))
            .sum()
    } else {
        meta.blocks() * 512
    }
}

/// Disk per runtime base and per function snapshot, per memory size.
fn disk_report(
    state: &Path,
    sizes: &[u32],
    functions: &[String],
    strategies: &[Strategy],
) -> Value {
    let layered = strategies
        .iter()
        .any(|s| matches!(s, Strategy::Layered | Strategy::LayeredWs | Strategy::Clone));
    let merged = strategies.contains(&Strategy::Merged);
    let mut out = Vec::new();
    for &mib in sizes {
        let base_dir = state.join(format!("bases/python3-{mib}"));
        let base = base_dir
            .is_dir()
            .then(|| disk_bytes(&base_dir.join("vm.mem")) + disk_bytes(&base_dir.join("vm.state")));
        let mut per_fn = serde_json::Map::new();
        let (mut sum_layered, mut sum_merged, mut n) = (0u64, 0u64, 0u64);
        for f in functions {
            let mut entry = serde_json::Map::new();
            if layered {
                if let Some(d) = snapshot_dir(state, &Strategy::Layered.function_name(f, mib)) {
                    let ws = disk_bytes(&d.join("vm.state.ws"));
                    let diff = disk_bytes(&d) - ws;
                    entry.insert("layered_diff".into(), diff.into());
                    entry.insert("working_set".into(), ws.into());
                    sum_layered += diff + ws;
                    n += 1;
                }
            }
            if merged {
                if let Some(d) = snapshot_dir(state, &Strategy::Merged.function_name(f, mib)) {
                    let full = disk_bytes(&d);
                    entry.insert("merged_full".into(), full.into());
                    sum_merged += full;
                }
            }
            per_fn.insert(f.clone(), Value::Object(entry));
        }
        out.push(json!({
            "memory_mib": mib,
            "base_bytes": base,
            "functions": per_fn,
            // What N functions of this runtime and size take: the base once
            // plus each diff (and working set), against a full snapshot each.
            "layered_total_bytes": base.map(|b| b + sum_layered),
            "merged_total_bytes": merged.then_some(sum_merged),
            "layered_functions": n,
        }));
    }
    Value::Array(out)
}

fn median_of(cell: &Cell, temp: Temperature) -> (Vec<f64>, Vec<f64>, Vec<String>) {
    let (mut server, mut client, mut other) = (Vec::new(), Vec::new(), Vec::new());
    for s in cell.samples.iter().filter(|s| s.temperature == temp) {
        if s.path == cell.strategy.path() {
            server.push(s.server_ms);
            client.push(s.client_ms);
        } else {
            other.push(format!("{} ({:.1} ms)", s.path, s.server_ms));
        }
    }
    (server, client, other)
}

/// The seed's figures and the targets of issue 17, to compare against.
fn targets() -> Value {
    json!({
        "source": "seed 003 (SnapFaaS on ARM, NTUA 2024): up to 1.7x (cold) and 2.5x (lukewarm) faster end to end than Firecracker Full+Diff snapshots merged with rebase-snap; issue 17: clone >= 10x faster than the merged full snapshot",
        "layered_ws_over_merged_cold": 1.7,
        "layered_ws_over_merged_lukewarm": 2.5,
        "clone_over_merged": 10.0,
    })
}

#[allow(clippy::too_many_arguments)]
fn report(
    a: &LinuxBenchArgs,
    strategies: &[Strategy],
    temps: &[Temperature],
    cells: &[Cell],
    disk: Value,
    drop: &Dropper,
    image: &Path,
    kernel: &Path,
) -> Value {
    let mut results = Vec::new();
    // (function, mib, temp) -> strategy -> median server ms
    let mut medians: BTreeMap<(String, u32, &'static str), BTreeMap<&'static str, f64>> =
        BTreeMap::new();
    for c in cells {
        for &t in temps {
            let (server, client, other) = median_of(c, t);
            let m = crate::stats::median(&server);
            if !m.is_nan() {
                medians
                    .entry((c.function.clone(), c.mib, t.key()))
                    .or_default()
                    .insert(c.strategy.key(), m);
            }
            results.push(json!({
                "function": c.function,
                "memory_mib": c.mib,
                "strategy": c.strategy.key(),
                "temperature": t.key(),
                "start_path": c.strategy.path(),
                "median_ms": if m.is_nan() { Value::Null } else { json!(m) },
                "server_ms": crate::stats::summary(&server),
                "client_ms": crate::stats::summary(&client),
                "samples_ms": server,
                "other_start_paths": other,
                "error": c.error,
            }));
        }
    }
    let mut speedups = Vec::new();
    let ratio = |m: &BTreeMap<&str, f64>, num: &str, den: &str| {
        m.get(num)
            .zip(m.get(den))
            .filter(|(_, d)| **d > 0.0)
            .map(|(n, d)| n / d)
    };
    let mut met: BTreeMap<&str, Vec<bool>> = BTreeMap::new();
    for ((f, mib, t), m) in &medians {
        let ws = ratio(m, "merged_full", "layered_ws");
        let clone = ratio(m, "merged_full", "clone");
        let want_ws = if *t == "cold" { 1.7 } else { 2.5 };
        if let Some(x) = ws {
            met.entry(if *t == "cold" {
                "layered_ws_over_merged_cold"
            } else {
                "layered_ws_over_merged_lukewarm"
            })
            .or_default()
            .push(x >= want_ws);
        }
        if let Some(x) = clone {
            met.entry("clone_over_merged").or_default().push(x >= 10.0);
        }
        speedups.push(json!({
            "function": f, "memory_mib": mib, "temperature": t,
            "merged_over_layered_ws": ws,
            "merged_over_layered": ratio(m, "merged_full", "layered"),
            "merged_over_clone": clone,
            "cold_boot_over_merged": ratio(m, "cold_boot", "merged_full"),
            "cold_boot_over_layered_ws": ratio(m, "cold_boot", "layered_ws"),
        }));
    }
    let mut t = targets();
    for (k, v) in met {
        t[format!("{k}_met")] = json!(format!(
            "{} of {}",
            v.iter().filter(|x| **x).count(),
            v.len()
        ));
    }
    json!({
        "bench": "serve-linux",
        "machine": crate::host::machine(),
        "config": {
            "functions": a.functions, "memory_mib": a.sizes, "rounds": a.rounds,
            "strategies": strategies.iter().map(|s| json!({"name": s.key(), "what": s.describe(), "start_path": s.path()})).collect::<Vec<_>>(),
            "temperatures": temps.iter().map(|t| t.key()).collect::<Vec<_>>(),
            "cold_drop": a.cold_drop,
            "cold_drop_notes": *drop.notes.borrow(),
            "image": image.display().to_string(),
            "kernel": kernel.display().to_string(),
            "measure": "X-Spore-Duration-Us of spore serve (invoke received to response ready), medians in ms; every invocation a new instance (--keep-alive-ms 0)",
        },
        "results": results,
        "speedups": speedups,
        "targets": t,
        "disk": disk,
    })
}

/// The human table: median ms per function, size and temperature, one
/// column per strategy, then the speedups over the merged full snapshot.
fn table(report: &Value) -> String {
    let cols = [
        "cold_boot",
        "merged_full",
        "layered",
        "layered_ws",
        "clone",
        "warm",
    ];
    let mut rows: BTreeMap<(String, u64, String), BTreeMap<String, String>> = BTreeMap::new();
    for r in report["results"].as_array().into_iter().flatten() {
        let key = (
            r["function"].as_str().unwrap_or("").to_string(),
            r["memory_mib"].as_u64().unwrap_or(0),
            r["temperature"].as_str().unwrap_or("").to_string(),
        );
        let cell = match (r["median_ms"].as_f64(), r["error"].as_str()) {
            (Some(m), _) => format!("{m:.0}"),
            (None, Some(_)) => "failed".to_string(),
            (None, None) => "n/a".to_string(),
        };
        rows.entry(key)
            .or_default()
            .insert(r["strategy"].as_str().unwrap_or("").to_string(), cell);
    }
    let mut s = String::from(
        "\nmedian end-to-end ms (X-Spore-Duration-Us)\nfunction   MiB  temp      cold_boot  merged_full  layered  layered_ws  clone   warm  ws:merged  clone:merged\n",
    );
    for ((f, mib, t), m) in &rows {
        let get = |c: &str| m.get(c).cloned().unwrap_or_else(|| "-".into());
        let sp = report["speedups"].as_array().and_then(|v| {
            v.iter().find(|x| {
                x["function"] == json!(f)
                    && x["memory_mib"] == json!(mib)
                    && x["temperature"] == json!(t)
            })
        });
        let x = |k: &str| {
            sp.and_then(|v| v[k].as_f64())
                .map_or("-".to_string(), |v| format!("{v:.2}x"))
        };
        s.push_str(&format!(
            "{f:<10} {mib:>4}  {t:<8} {:>10} {:>12} {:>8} {:>11} {:>6} {:>6} {:>10} {:>13}\n",
            get(cols[0]),
            get(cols[1]),
            get(cols[2]),
            get(cols[3]),
            get(cols[4]),
            get(cols[5]),
            x("merged_over_layered_ws"),
            x("merged_over_clone"),
        ));
    }
    for d in report["disk"].as_array().into_iter().flatten() {
        s.push_str(&format!(
            "disk {} MiB: base {} bytes (shared); per function:",
            d["memory_mib"], d["base_bytes"]
        ));
        for (f, e) in d["functions"].as_object().into_iter().flatten() {
            s.push_str(&format!(
                " {f} diff {} + ws {} / merged {};",
                e["layered_diff"], e["working_set"], e["merged_full"]
            ));
        }
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strategies_parse_and_map_to_daemons() {
        assert_eq!(Strategy::parse("layered-ws"), Some(Strategy::LayeredWs));
        assert_eq!(Strategy::parse("merged"), Some(Strategy::Merged));
        assert_eq!(Strategy::parse("hot"), None);
        assert!(Strategy::Merged.flags().contains(&"merged"));
        assert!(Strategy::ColdBoot.flags().contains(&"--no-snapshots"));
        assert!(!Strategy::Clone.flags().contains(&"--no-clones"));
        assert_eq!(Strategy::parse("warm"), Some(Strategy::Warm));
        assert!(Strategy::Warm.flags().contains(&"3600000"));
        assert_eq!(
            Strategy::Merged.function_name("lorem", 256),
            "lorem-256-merged"
        );
        assert_eq!(Strategy::LayeredWs.function_name("lorem", 256), "lorem-256");
        let mut v = vec![
            Strategy::Clone,
            Strategy::ColdBoot,
            Strategy::LayeredWs,
            Strategy::Layered,
        ];
        v.sort();
        // Layered writes the diff that the working-set and clone daemons use.
        assert_eq!(
            v,
            [
                Strategy::ColdBoot,
                Strategy::Layered,
                Strategy::LayeredWs,
                Strategy::Clone
            ]
        );
    }

    #[test]
    fn the_newest_snapshot_directory_of_a_function() {
        let state = std::env::temp_dir().join(format!("spore-bsl-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&state);
        assert_eq!(snapshot_dir(&state, "lorem-256"), None);
        for d in [
            "lorem-256-v1",
            "lorem-256-v3",
            "lorem-256-merged-v9",
            ".tmp-lorem-256-v4-0",
        ] {
            std::fs::create_dir_all(state.join("snapshots").join(d)).unwrap();
        }
        assert_eq!(
            snapshot_dir(&state, "lorem-256"),
            Some(state.join("snapshots/lorem-256-v3"))
        );
        std::fs::write(state.join("snapshots/lorem-256-v3/vm.mem"), vec![1u8; 8192]).unwrap();
        assert!(disk_bytes(&state.join("snapshots")) >= 8192);
        let _ = std::fs::remove_dir_all(&state);
    }

    fn cell(strategy: Strategy, ms: &[(Temperature, f64, &str)]) -> Cell {
        Cell {
            function: "lorem".into(),
            mib: 256,
            strategy,
            samples: ms
                .iter()
                .map(|(t, v, p)| Sample {
                    temperature: *t,
                    server_ms: *v,
                    client_ms: *v + 1.0,
                    path: p.to_string(),
                })
                .collect(),
            error: None,
        }
    }

    #[test]
    fn medians_count_only_the_strategys_start_path_and_speedups_follow() {
        use Temperature::*;
        let cells = vec![
            cell(
                Strategy::Merged,
                &[
                    (Cold, 900.0, "restore"),
                    (Cold, 1000.0, "restore"),
                    (Cold, 1100.0, "restore"),
                    (Lukewarm, 500.0, "restore"),
                ],
            ),
            cell(
                Strategy::LayeredWs,
                &[
                    (Cold, 400.0, "restore"),
                    (Cold, 9000.0, "cold"),
                    (Lukewarm, 250.0, "restore"),
                ],
            ),
            cell(
                Strategy::Clone,
                &[(Cold, 50.0, "clone"), (Lukewarm, 40.0, "clone")],
            ),
        ];
        let (server, _, other) = median_of(&cells[1], Cold);
        assert_eq!(server, [400.0]);
        assert_eq!(other.len(), 1, "the cold boot is reported, not counted");
        let a = LinuxBenchArgs {
            linux: true,
            linux_kernel: None,
            image_cache: None,
            fixtures: None,
            functions: vec!["lorem".into()],
            sizes: vec![256],
            rounds: 3,
            strategies: vec![],
            temperatures: vec![],
            cold_drop: "fadvise".into(),
            state_dir: None,
            keep_state: false,
            ready_timeout_s: 1,
            working_set_record_ms: 1,
            daemon_log: None,
        };
        let dropper = Dropper {
            how: "fadvise".into(),
            files: vec![],
            notes: Default::default(),
        };
        let r = report(
            &a,
            &[Strategy::LayeredWs, Strategy::Merged, Strategy::Clone],
            &[Lukewarm, Cold],
            &cells,
            json!([]),
            &dropper,
            Path::new("/i"),
            Path::new("/k"),
        );
        let sp = r["speedups"].as_array().unwrap();
        let cold = sp.iter().find(|s| s["temperature"] == "cold").unwrap();
        assert_eq!(cold["merged_over_layered_ws"], json!(2.5));
        assert_eq!(cold["merged_over_clone"], json!(20.0));
        let warm = sp.iter().find(|s| s["temperature"] == "lukewarm").unwrap();
        assert_eq!(warm["merged_over_layered_ws"], json!(2.0));
        assert_eq!(r["targets"]["layered_ws_over_merged_cold_met"], "1 of 1");
        assert_eq!(
            r["targets"]["layered_ws_over_merged_lukewarm_met"],
            "0 of 1"
        );
        assert_eq!(r["targets"]["clone_over_merged_met"], "2 of 2");
        let text = table(&r);
        assert!(text.contains("lorem"), "{text}");
        assert!(text.contains("2.50x"), "{text}");
    }
}
