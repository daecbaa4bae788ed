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
use std::time::Instant;

use anyhow::{bail, Context as _};
use clap::Args;
use disk::disk_report;
use page_cache::Dropper;
use prepare::{invoke, prepare};
use report::{report, table};
use strategy::{Strategy, Temperature};

use super::daemon::Daemon;
use crate::lambda_client::Conn;

mod disk;
mod page_cache;
mod prepare;
mod report;
mod strategy;

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

impl Cell {
    fn new(function: &str, mib: u32, strategy: Strategy) -> Self {
        Cell {
            function: function.to_string(),
            mib,
            strategy,
            samples: Vec::new(),
            error: None,
        }
    }
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
    let zips = function_zips(&a)?;
    let cache = spore_serve::images::cache_dir(a.image_cache.clone());
    let image = spore_serve::images::newest(&cache, "python3")?;
    let kernel = guest_kernel(&a, &cache)?;
    let state = state_dir(&a)?;
    let dropper = Dropper::new(
        a.cold_drop.clone(),
        vec![state.clone(), image.clone(), kernel.clone()],
    );
    let common = daemon_flags(&a, &cache, &kernel);
    let started = Instant::now();
    let mut bench = Bench {
        a: &a,
        zips: &zips,
        temps: &temps,
        state: &state,
        dropper: &dropper,
        common: common.iter().map(String::as_str).collect(),
        deployed: HashSet::new(),
        cells: Vec::new(),
    };
    for &strategy in &strategies {
        bench.strategy(strategy);
    }
    let cells = bench.cells;
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

/// Each `--functions` module of `--fixtures`, zipped: name → zip.
fn function_zips(a: &LinuxBenchArgs) -> anyhow::Result<BTreeMap<String, Vec<u8>>> {
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
    Ok(zips)
}

/// `--linux-kernel`, else the newest kernel in the image cache.
fn guest_kernel(a: &LinuxBenchArgs, cache: &Path) -> anyhow::Result<PathBuf> {
    Ok(match &a.linux_kernel {
        Some(k) if !k.is_file() => bail!("--linux-kernel: no file at {}", k.display()),
        Some(k) => k.clone(),
        None => spore_serve::images::newest_kernel(cache).with_context(|| {
            format!(
                "no guest kernel in {}: give --linux-kernel",
                cache.display()
            )
        })?,
    })
}

/// The daemons' state directory (`--state-dir`, else a new one under the
/// temporary directory), made and canonical.
fn state_dir(a: &LinuxBenchArgs) -> anyhow::Result<PathBuf> {
    let state = a
        .state_dir
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join(format!("spore-bsl-{}", std::process::id())));
    std::fs::create_dir_all(&state)
        .with_context(|| format!("creating the state directory {}", state.display()))?;
    Ok(state.canonicalize()?)
}

/// The flags every strategy's daemon gets.
fn daemon_flags(a: &LinuxBenchArgs, cache: &Path, kernel: &Path) -> Vec<String> {
    vec![
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
    ]
}

/// One run of the experiment: what it measures with, and the cells so far.
struct Bench<'a> {
    a: &'a LinuxBenchArgs,
    zips: &'a BTreeMap<String, Vec<u8>>,
    temps: &'a [Temperature],
    state: &'a Path,
    dropper: &'a Dropper,
    /// [`daemon_flags`].
    common: Vec<&'a str>,
    /// Functions deployed in the state directory (by an earlier daemon).
    deployed: HashSet<String>,
    cells: Vec<Cell>,
}

impl Bench<'_> {
    /// Every function and size under one strategy's daemon; a daemon that
    /// does not start fails each of its cells.
    fn strategy(&mut self, strategy: Strategy) {
        eprintln!(
            "bench serve --linux: {} ({})",
            strategy.key(),
            strategy.describe()
        );
        let mut args = self.common.clone();
        args.extend(strategy.flags());
        let daemon = match Daemon::start_keeping(self.state, &args, self.a.daemon_log.as_deref()) {
            Ok(d) => d,
            Err(e) => {
                for &mib in &self.a.sizes {
                    for f in &self.a.functions {
                        let mut cell = Cell::new(f, mib, strategy);
                        cell.error = Some(format!("{e:#}"));
                        self.cells.push(cell);
                    }
                }
                return;
            }
        };
        for &mib in &self.a.sizes {
            for (f, zip) in self.zips {
                let name = strategy.function_name(f, mib);
                let mut cell = Cell::new(f, mib, strategy);
                let t = Instant::now();
                if let Err(e) = self.measure(&daemon, &name, zip, &mut cell) {
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
                self.cells.push(cell);
            }
        }
        drop_daemon(daemon);
    }

    /// One cell: deploys the function `name` (once per state directory),
    /// brings it to the strategy's start path, then `--rounds` invocations
    /// at each temperature.
    fn measure(
        &mut self,
        daemon: &Daemon,
        name: &str,
        zip: &[u8],
        cell: &mut Cell,
    ) -> anyhow::Result<()> {
        let (f, mib, strategy) = (&cell.function, cell.mib, cell.strategy);
        if !self.deployed.contains(name) {
            daemon
                .deploy_zip(name, "python3", &format!("{f}.handler"), zip, mib, 120)
                .with_context(|| format!("deploying {name}"))?;
            self.deployed.insert(name.to_string());
        }
        let mut conn = Conn::open(&daemon.addr)?;
        prepare(&mut conn, self.state, name, strategy)?;
        for round in 0..self.a.rounds {
            for &temp in self.temps {
                if temp == Temperature::Cold {
                    self.dropper.drop_cache();
                }
                let (r, client_ms) = invoke(&mut conn, name, round)?;
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
    }
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
