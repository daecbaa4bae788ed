//! `spore bench cluster --simulate`: a deterministic discrete-event
//! simulation of function placement on a cluster of `spore serve` nodes,
//! comparing rendezvous hashing per function with random placement. It
//! models; it measures nothing but its own run time. A live multi-node
//! bench is future work.
//!
//! # The model (every assumption)
//!
//! **Cluster.** `--hosts` (100) identical hosts of `--host-memory-gib` (24)
//! each, sharing one catalogue; any host can run any function. CPU, disk,
//! network, the per-host concurrency limit and forwarding costs are not
//! modelled: a host is its memory.
//!
//! **Functions.** `--functions` (10,000), made with `--seed` (1):
//! - *Mean invocation rate*: log-normal over functions, fitted through two
//!   points of the Azure Functions 2019 trace as published (Shahrad et al.,
//!   "Serverless in the Wild", USENIX ATC 2020): 45% of functions are invoked
//!   less than once an hour and 81% less than once a minute on average. The
//!   fit: median 1.67 invocations an hour, σ(ln rate) = ln 60 / (z₀.₈₁ −
//!   z₀.₄₅) = 4.08. The n functions get its quantiles at (i + ½)/n in an
//!   order the seed shuffles (stratified, so that the cluster's load does
//!   not swing with the draws of the few busiest functions). For 10,000
//!   functions that is 10,400 invocations/s in all, the busiest function
//!   3,600/s; 92.7% of the invocations are the busiest 1% of functions',
//!   96.1% the busiest 2%'s, 99.9% the busiest 18.6%'s (the paper: 99.6%).
//! - *Arrivals*: each function's invocations are a Poisson process at its
//!   rate (exponential inter-arrival times; simulated as their
//!   superposition): no diurnal pattern, no bursts, no correlation between
//!   functions.
//! - *Execution time* of each invocation: log-normal with median 0.6 s and
//!   σ(ln s) `--exec-sigma` (1.0), capped at 60 s; drawn per invocation,
//!   independently of the function and its rate: 69% of invocations under
//!   1 s, 99.8% under 10 s, mean 1.0 s. The paper's spread of per-function
//!   averages (~50% under 1 s, ~75% under 10 s) would be σ ≈ 4.2 with that
//!   median; drawn for every invocation regardless of rate (the paper does
//!   not publish how execution time goes with rate), that offers more
//!   running instances than the default cluster's memory holds. An instance
//!   runs one invocation at a time.
//! - *Memory* of an instance: 64 to 256 MiB in 32 MiB steps, uniformly per
//!   function (median 160 MiB ≈ 168 MB; the paper: 50% of applications
//!   allocate at most 170 MB).
//!
//! **Hosts' state.** An instance is kept idle (warm) for `--keep-alive-s`
//! (60, `spore serve`'s default) after its last invocation ends, then ended.
//! A function's *zygote* is made on a host by its first start there that is
//! not warm (a cold boot or a restore) and ended `--zygote-keep-alive-s`
//! (600, spore's `--zygote-keep-alive-ms` default) after the function's last
//! invocation on that host (0 keeps zygotes, as in spore); it holds 1/10 of
//! its function's instance memory (an assumption). A *snapshot* is written on
//! a host by the function's first cold boot there and kept for good (disk is
//! not modelled; snapshots are not shipped between hosts, as in spore
//! today). A start that finds no room ends the host's least recently used
//! idle instance, then its least recently invoked zygote (of another
//! function), until the new instance (and its zygote, if new) fits, as
//! `spore serve --memory-budget` does. Running instances are never ended.
//! The run starts with empty hosts: no snapshot, no zygote.
//!
//! **Starts.** On the chosen host an invocation is *warm* if an idle
//! instance of its function is there (the most recently used is taken);
//! else a *clone* of the function's zygote there; else a *restore* of its
//! snapshot there; else *cold*. Each costs the daemon-side median of `spore
//! bench serve` ([`START_MS`]); the start is added to the instance's busy
//! time. No queueing: an invocation no host can take (no idle instance, no
//! room after evictions) is *rejected* and counted.
//!
//! **Policies** (`--policy`, all three by default), over the same trace:
//! - `rendezvous`: hosts ranked per function by a fixed 64-bit weight (the
//!   SplitMix64 output function of `function << 32 | host`, highest first).
//!   The first of the top `--spread` (2) hosts with an idle instance of the
//!   function; else the first of them with room; else the first host further
//!   down the ranking with an idle instance or room.
//! - `random`: a uniformly random host among those with an idle instance of
//!   the function or room for one.
//! - `two-choices`: two distinct random hosts; the one with more unreserved
//!   memory (not held by instances or zygotes), else the other if only it
//!   can take the start, else as `random`.
//!
//! "Room" for a new instance on a host: its running instances' memory plus
//! the new instance and its zygote fit in the host's memory once idle
//! instances and other zygotes are ended.
//!
//! **Figures**, per policy: invocations; warm, clone, restore, cold and
//! rejected fractions (summing to 1); start latency from the costs (mean,
//! p50, p99 by nearest rank over the started invocations); memory held per
//! host (instances + zygotes), time-averaged over hosts and the run, the
//! busiest host's time average, and the peak on any host; running
//! instances' memory per host; the number of distinct hosts each invoked
//! function had an instance on (over invoked functions, and the busiest 1%);
//! evictions; and the simulation's wall time (the policies run in
//! parallel, one per core).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use anyhow::bail;
use clap::{Args, ValueEnum};
use serde_json::{json, Value};
use sim::Outcome;
use workload::{Workload, EXEC_CAP_S, EXEC_MEDIAN_S};

use crate::host::{loadavg, machine};
use crate::stats::summary;

mod hosts;
mod queue;
mod rng;
mod sim;
#[cfg(test)]
mod tests;
mod workload;

/// Start costs (ms): the daemon-side p50 of `spore bench serve` for the
/// `fn-echo` unikernel on the 2-core AMD EPYC VM (docs/benchmarks.md,
/// `spore bench serve`; docs/bench/serve.json): warm, clone of the zygote,
/// restore with the working set, cold (boot + zygote + first clone).
const WARM_MS: f64 = 0.15;
const CLONE_MS: f64 = 2.69;
const RESTORE_MS: f64 = 5.49;
const COLD_MS: f64 = 14.3;
/// The costs indexed by `hosts::Start`.
const START_MS: [f64; 4] = [WARM_MS, CLONE_MS, RESTORE_MS, COLD_MS];

/// The most (function, host) pairs the simulation keeps state for (24
/// bytes each, in each policy's run).
const MAX_PAIRS: u64 = 1 << 24;

#[derive(Args, Debug)]
pub struct ClusterBenchArgs {
    /// Run the placement simulation.
    #[arg(long, conflicts_with = "forwarding")]
    pub simulate: bool,
    /// Measure what forwarding an invocation to its function's owner costs:
    /// three live nodes on this machine and one etcd.
    #[arg(long)]
    pub forwarding: bool,
    /// The first answer on a node that never ran a function: its snapshot
    /// fetched from the node that made it and restored, against a cold
    /// boot. Two live nodes on this machine and one etcd.
    #[arg(long, conflicts_with_all = ["simulate", "forwarding"])]
    pub shipping: bool,
    /// What a node's death costs: the warm node of a function killed
    /// (SIGKILL) while a client invokes it through the others. Three live
    /// nodes on this machine and one etcd.
    #[arg(long, conflicts_with_all = ["simulate", "forwarding", "shipping"])]
    pub failover: bool,
    /// --forwarding: invocations through each of the two nodes measured
    /// (default 2000); --shipping: functions restored and booted (default 20);
    /// --failover: nodes killed (default 3).
    #[arg(long)]
    pub runs: Option<usize>,
    /// --forwarding, --shipping: directory of the unikernel function images (default:
    /// SPORE_UK_DIR).
    #[arg(long)]
    pub uk_dir: Option<std::path::PathBuf>,
    /// Hosts in the cluster.
    #[arg(long, default_value_t = 100)]
    pub hosts: u32,
    /// Functions in the catalogue.
    #[arg(long, default_value_t = 10_000)]
    pub functions: u32,
    /// Simulated seconds of invocations.
    #[arg(long, default_value_t = 3600.0)]
    pub duration_s: f64,
    /// Seed of the workload and of the random policies.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Run one policy (default: all three, over the same trace).
    #[arg(long, value_enum)]
    pub policy: Option<Policy>,
    /// Memory of each host for instances and zygotes (GiB).
    #[arg(long, default_value_t = 24.0)]
    pub host_memory_gib: f64,
    /// An idle instance is ended after this long unused (s).
    #[arg(long, default_value_t = 60.0)]
    pub keep_alive_s: f64,
    /// A zygote is ended after this long without an invocation of its
    /// function on its host (s; 0 keeps zygotes).
    #[arg(long, default_value_t = 600.0)]
    pub zygote_keep_alive_s: f64,
    /// rendezvous: how many of a function's top-ranked hosts are searched
    /// for an idle instance before a new one is started.
    #[arg(long, default_value_t = 2)]
    pub spread: u32,
    /// σ of the natural logarithm of an invocation's execution time
    /// (median 0.6 s, capped at 60 s).
    #[arg(long, default_value_t = 1.0)]
    pub exec_sigma: f64,
}

/// A placement policy.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// Rendezvous (highest-random-weight) hashing per function.
    Rendezvous,
    /// A uniformly random host.
    Random,
    /// The freer of two random hosts.
    TwoChoices,
}

impl Policy {
    const ALL: [Policy; 3] = [Policy::Rendezvous, Policy::Random, Policy::TwoChoices];

    fn name(self) -> &'static str {
        match self {
            Policy::Rendezvous => "rendezvous",
            Policy::Random => "random",
            Policy::TwoChoices => "two-choices",
        }
    }
}

/// The simulation's parameters, validated, in its units (ns, KiB).
#[derive(Clone, Debug)]
struct Config {
    hosts: u32,
    functions: u32,
    duration_ns: u64,
    seed: u64,
    host_memory_kib: u64,
    keep_alive_ns: u64,
    zygote_keep_alive_ns: u64,
    spread: u32,
    exec_sigma: f64,
}

/// Seconds as simulated ns (negative and NaN as 0; at most 10^9 s).
fn secs_to_ns(s: f64) -> u64 {
    round_u64(s * 1e9)
}

/// `x` rounded, clamped to 0..=10^18 (NaN as 0).
fn round_u64(x: f64) -> u64 {
    let x = if x.is_nan() { 0.0 } else { x.clamp(0.0, 1e18) };
    #[allow(
        clippy::cast_possible_truncation,
        reason = "clamped to 0..=1e18, below u64::MAX"
    )]
    let v = (x + 0.5) as u64;
    v
}

impl Config {
    fn of(a: &ClusterBenchArgs) -> anyhow::Result<Config> {
        if a.hosts == 0 || a.functions == 0 {
            bail!("--hosts and --functions must be at least 1");
        }
        if u64::from(a.hosts) * u64::from(a.functions) > MAX_PAIRS {
            bail!("--hosts × --functions must be at most {MAX_PAIRS} (the simulation keeps state per pair)");
        }
        if a.spread == 0 || a.spread > a.hosts {
            bail!("--spread must be from 1 to --hosts");
        }
        for (name, v) in [
            ("--duration-s", a.duration_s),
            ("--keep-alive-s", a.keep_alive_s),
            ("--zygote-keep-alive-s", a.zygote_keep_alive_s),
            ("--exec-sigma", a.exec_sigma),
        ] {
            if !(0.0..=1e6).contains(&v) {
                bail!("{name} must be from 0 to 1e6");
            }
        }
        if a.duration_s <= 0.0 {
            bail!("--duration-s must be more than 0");
        }
        // 256 MiB and its zygote.
        let largest_start_kib = 256 * 1024 * 11 / 10;
        let cap_kib = round_u64(a.host_memory_gib * 1024.0 * 1024.0);
        if !a.host_memory_gib.is_finite() || cap_kib < largest_start_kib {
            bail!("--host-memory-gib must hold the largest instance and its zygote (0.28 GiB)");
        }
        Ok(Config {
            hosts: a.hosts,
            functions: a.functions,
            duration_ns: secs_to_ns(a.duration_s),
            seed: a.seed,
            host_memory_kib: cap_kib,
            keep_alive_ns: secs_to_ns(a.keep_alive_s),
            zygote_keep_alive_ns: if a.zygote_keep_alive_s == 0.0 {
                hosts::NEVER
            } else {
                secs_to_ns(a.zygote_keep_alive_s)
            },
            spread: a.spread,
            exec_sigma: a.exec_sigma,
        })
    }
}

/// Runs one of the live-cluster benches (`bench(uk_dir, runs)`) and prints
/// its report with the machine, the load and the wall time.
fn live(
    name: &str,
    a: &ClusterBenchArgs,
    default_runs: usize,
    bench: fn(&std::path::Path, usize) -> anyhow::Result<serde_json::Value>,
) -> anyhow::Result<u8> {
    let t0 = Instant::now();
    let mut report = bench(
        &crate::host::uk_dir(&a.uk_dir),
        a.runs.unwrap_or(default_runs),
    )?;
    report["benchmark"] = json!(name);
    report["machine"] = machine();
    report["loadavg_1m"] = json!(loadavg());
    report["wall_s"] = json!(t0.elapsed().as_secs_f64());
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(0)
}

pub fn run(a: ClusterBenchArgs) -> anyhow::Result<u8> {
    if a.forwarding {
        return live(
            "cluster-forwarding",
            &a,
            2000,
            crate::cluster_forwarding::run,
        );
    }
    if a.failover {
        return live("cluster-failover", &a, 3, crate::cluster_failover::run);
    }
    if a.shipping {
        return live("cluster-shipping", &a, 20, crate::cluster_shipping::run);
    }
    if !a.simulate {
        bail!(
            "say which: `spore bench cluster --simulate` (the placement model) or \
             `--forwarding` (what forwarding costs, on live nodes), `--shipping` (a \
             snapshot from another node against a cold boot) or `--failover` (a node killed)"
        );
    }
    let cfg = Config::of(&a)?;
    let policies = a.policy.map_or(Policy::ALL.to_vec(), |p| vec![p]);
    let t0 = Instant::now();
    let (workload, outcomes) = simulate_all(&cfg, &policies);
    let report = json!({
        "benchmark": "cluster",
        "simulated": true,
        "model": model_json(&a, &cfg),
        "workload": workload.shape(),
        "machine": machine(),
        "loadavg_1m": loadavg(),
        "policies": outcomes.iter().map(|o| policy_json(o, &cfg)).collect::<Vec<_>>(),
        "wall_s": t0.elapsed().as_secs_f64(),
    });
    eprint!("{}", table(&report));
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(0)
}

/// The workload of `cfg`, and each policy's run over it (in order). The
/// runs share nothing: they go in parallel, one a core.
fn simulate_all(cfg: &Config, policies: &[Policy]) -> (Workload, Vec<Outcome>) {
    let workload = Workload::generate(cfg.functions, cfg.seed, cfg.exec_sigma);
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(policies.len());
    let next = AtomicUsize::new(0);
    let mut outcomes: Vec<(usize, Outcome)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(&p) = policies.get(i) else {
                            return done;
                        };
                        done.push((i, sim::simulate(cfg, &workload, p)));
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    });
    outcomes.sort_by_key(|o| o.0);
    (workload, outcomes.into_iter().map(|o| o.1).collect())
}

fn model_json(a: &ClusterBenchArgs, cfg: &Config) -> Value {
    json!({
        "hosts": cfg.hosts,
        "functions": cfg.functions,
        "duration_s": a.duration_s,
        "seed": cfg.seed,
        "host_memory_gib": a.host_memory_gib,
        "keep_alive_s": a.keep_alive_s,
        "zygote_keep_alive_s": a.zygote_keep_alive_s,
        "zygote_memory_fraction": 1.0 / workload::ZYGOTE_DIVISOR as f64,
        "spread": cfg.spread,
        "exec_time_s": {"distribution": "log-normal", "median": EXEC_MEDIAN_S, "sigma_ln": cfg.exec_sigma, "cap": EXEC_CAP_S},
        "instance_memory_mib": "uniform over 64, 96, ..., 256 per function",
        "arrivals": "Poisson per function",
        "start_cost_ms": {"warm": WARM_MS, "clone": CLONE_MS, "restore": RESTORE_MS, "cold": COLD_MS},
        "rendezvous_hash": "splitmix64 output function of (function << 32 | host)",
    })
}

/// The `p` quantile (nearest rank) of the start costs, `counts` starts of
/// each kind.
fn start_percentile(counts: &[u64; 4], p: f64) -> f64 {
    let n: u64 = counts.iter().sum();
    if n == 0 {
        return f64::NAN;
    }
    #[allow(
        clippy::cast_possible_truncation,
        reason = "(n - 1) * p for p in 0..=1, rounded, is in 0..n"
    )]
    let rank = ((n - 1) as f64 * p).round() as u64;
    let mut seen = 0;
    for (i, &c) in counts.iter().enumerate() {
        seen += c;
        if rank < seen {
            return START_MS[i];
        }
    }
    START_MS[3]
}

fn policy_json(o: &Outcome, cfg: &Config) -> Value {
    const GIB_KIB: f64 = 1024.0 * 1024.0;
    let n = o.invocations.max(1) as f64;
    let started: u64 = o.starts.iter().sum();
    let mean_ms = o
        .starts
        .iter()
        .zip(START_MS)
        .map(|(&c, ms)| c as f64 * ms)
        .sum::<f64>()
        / started.max(1) as f64;
    let secs = cfg.duration_ns as f64 / 1e9;
    let hosts = o.memory.len().max(1) as f64;
    let held: f64 = o.memory.iter().map(|m| m.0).sum();
    let busy: f64 = o.memory.iter().map(|m| m.1).sum();
    let busiest = o.memory.iter().map(|m| m.0).fold(0.0, f64::max);
    let peak = o.memory.iter().map(|m| m.2).max().unwrap_or(0);
    // Invoked functions, busiest first.
    let mut invoked: Vec<(u64, u32)> = o
        .invocations_per_function
        .iter()
        .zip(&o.hosts_per_function)
        .filter(|(&i, _)| i > 0)
        .map(|(&i, &h)| (i, h))
        .collect();
    invoked.sort_by_key(|&(i, _)| std::cmp::Reverse(i));
    let spread: Vec<f64> = invoked.iter().map(|&(_, h)| f64::from(h)).collect();
    let top = o
        .invocations_per_function
        .len()
        .div_ceil(100)
        .min(spread.len());
    let top_mean = spread[..top].iter().sum::<f64>() / top.max(1) as f64;
    json!({
        "policy": o.policy.name(),
        "invocations": o.invocations,
        "starts": {"warm": o.starts[0], "clone": o.starts[1], "restore": o.starts[2], "cold": o.starts[3], "rejected": o.rejected},
        "rates": {
            "warm": o.starts[0] as f64 / n,
            "clone": o.starts[1] as f64 / n,
            "restore": o.starts[2] as f64 / n,
            "cold": o.starts[3] as f64 / n,
            "rejected": o.rejected as f64 / n,
        },
        "start_ms": {
            "mean": mean_ms,
            "p50": start_percentile(&o.starts, 0.5),
            "p99": start_percentile(&o.starts, 0.99),
        },
        "mem_per_host_gib": {
            "mean": held / secs / hosts / GIB_KIB,
            "busiest_host_mean": busiest / secs / GIB_KIB,
            "peak": peak as f64 / GIB_KIB,
            "running_mean": busy / secs / hosts / GIB_KIB,
        },
        "hosts_per_function": summary(&spread),
        "hosts_per_function_top_1pct_mean": top_mean,
        "evicted": {"idle_instances": o.evicted_instances, "zygotes": o.evicted_zygotes},
        "wall_s": o.wall_s,
    })
}

/// The human summary (stderr): one row per policy.
fn table(report: &Value) -> String {
    let mut s = format!(
        "{:<12} {:>11} {:>6} {:>6} {:>7} {:>6} {:>6} {:>9} {:>9} {:>9} {:>9} {:>8} {:>6}\n",
        "policy",
        "invocations",
        "warm",
        "clone",
        "restore",
        "cold",
        "rej.",
        "p50 ms",
        "p99 ms",
        "mem GiB",
        "peak GiB",
        "hosts/fn",
        "wall s"
    );
    for p in report["policies"].as_array().into_iter().flatten() {
        let f = |v: &Value| v.as_f64().unwrap_or(f64::NAN);
        let pct = |k: &str| 100.0 * f(&p["rates"][k]);
        s += &format!(
            "{:<12} {:>11} {:>5.1}% {:>5.1}% {:>6.1}% {:>5.1}% {:>5.2}% {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>8.2} {:>6.1}\n",
            p["policy"].as_str().unwrap_or(""),
            p["invocations"],
            pct("warm"),
            pct("clone"),
            pct("restore"),
            pct("cold"),
            pct("rejected"),
            f(&p["start_ms"]["p50"]),
            f(&p["start_ms"]["p99"]),
            f(&p["mem_per_host_gib"]["mean"]),
            f(&p["mem_per_host_gib"]["peak"]),
            f(&p["hosts_per_function"]["mean"]),
            f(&p["wall_s"]),
        );
    }
    s
}
