//! `spore bench serve`: end-to-end invoke latency of `spore serve` per start
//! path (warm, clone, restore with a working set, restore lazy, cold), as the daemon measures it (request received →
//! response ready, `X-Spore-Duration-Us`) and as a client sees it (one
//! persistent HTTP connection); invocations per second at several
//! concurrencies with clones against cold boots; and how many idle instances
//! of a 64 MiB function the host holds, with their memory (PSS) measured from
//! the VMM processes.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use clap::Args;
use daemon::Daemon;
use serde_json::{json, Value};

use crate::lambda_client::Conn;
use crate::procfs::{pss_kib, rss_kib};

pub(crate) mod daemon;
mod linux;

#[derive(Args, Debug)]
pub struct ServeBenchArgs {
    /// Directory of the unikernel function images (default: SPORE_UK_DIR).
    #[arg(long)]
    pub uk_dir: Option<PathBuf>,
    /// Invocations measured per start path (cold: functions deployed).
    #[arg(long, default_value_t = 200)]
    pub runs: usize,
    #[arg(long, default_value_t = 20)]
    pub cold_runs: usize,
    /// Concurrencies of the throughput part.
    #[arg(long, value_delimiter = ',', default_value = "1,2,8,32")]
    pub concurrency: Vec<usize>,
    /// Seconds per throughput measurement.
    #[arg(long, default_value_t = 3.0)]
    pub seconds: f64,
    /// Idle instances of a 64 MiB function to hold (0 skips that part).
    #[arg(long, default_value_t = 1000)]
    pub idle_instances: usize,
    /// Linux functions instead (python3, SnapFaaS's experiment): start
    /// strategies compared cold and lukewarm; see `--linux-*` options.
    #[command(flatten)]
    pub linux: Box<linux::LinuxBenchArgs>,
    /// Also measure the clone path of a networked function (fn-echo with
    /// `SporeNetwork`: a tap and a network namespace per instance), the
    /// daemon's `--net-pool` (needs root, `ip` and `nft`).
    #[arg(long, value_name = "CIDR")]
    pub net_pool: Option<String>,
    /// A flag for every `spore serve` the bench starts (repeatable), e.g.
    /// `--daemon-arg=--no-cgroups` to measure what instance cgroups cost.
    #[arg(long = "daemon-arg", allow_hyphen_values = true, value_name = "ARG")]
    pub daemon_args: Vec<String>,
}

fn stats_ms(v: &[f64]) -> Value {
    let p = |q| crate::stats::percentile(v, q) / 1e3;
    json!({"p50": p(0.5), "p99": p(0.99), "min": p(0.0), "max": p(1.0), "n": v.len()})
}

/// Latency samples (server µs, client µs) of invocations that took `want`.
fn measure(
    conn: &mut Conn,
    name: &str,
    runs: usize,
    want: &str,
) -> anyhow::Result<(Vec<f64>, Vec<f64>)> {
    let (mut server, mut client) = (Vec::new(), Vec::new());
    for i in 0..runs {
        let t = Instant::now();
        let r = conn.invoke(name, format!("{{\"i\":{i}}}").as_bytes())?;
        let us = t.elapsed().as_secs_f64() * 1e6;
        if r.path == want {
            server.push(r.server_us);
            client.push(us);
        }
    }
    Ok((server, client))
}

fn path_figures(server: &[f64], client: &[f64]) -> Value {
    json!({"server_ms": stats_ms(server), "client_ms": stats_ms(client)})
}

pub fn run(a: ServeBenchArgs) -> anyhow::Result<u8> {
    daemon::set_extra_args(a.daemon_args.clone());
    if a.linux.linux {
        return linux::run(*a.linux);
    }
    let dir = crate::host::uk_dir(&a.uk_dir);
    let (echo, touch) = (dir.join("fn-echo"), dir.join("fn-touch32"));
    for p in [&echo, &touch] {
        if !p.exists() {
            bail!(
                "{} is missing: build the unikernel apps (make uk)",
                p.display()
            );
        }
    }
    let scratch = std::env::temp_dir().join(format!("spore-bench-serve-{}", std::process::id()));
    let mut report = json!({"bench": "serve", "host_cpus": std::thread::available_parallelism().map_or(0, |n| n.get()), "daemon_args": a.daemon_args});

    for (fname, image) in [("echo", &echo), ("touch32", &touch)] {
        report[fname] = start_paths(&a, &scratch, fname, image)?;
    }
    if let Some(pool) = &a.net_pool {
        report["echo_net"] = net_clones(&a, &scratch.join("net"), &echo, pool)?;
    }
    eprintln!("bench serve: throughput, clones against cold boots");
    report["throughput"] = Value::Array(throughput(&a, &scratch, &echo)?);
    if a.idle_instances > 0 {
        let keep = a.linux.keep_state;
        report["density"] = density(a.idle_instances, &scratch.join("density"), &echo, keep)?;
    }
    if a.linux.keep_state {
        eprintln!(
            "bench serve: state and daemon log kept in {}",
            scratch.display()
        );
    } else {
        let _ = std::fs::remove_dir_all(&scratch);
    }
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(0)
}

/// One function's latency per start path: warm, clone, cold, and restores
/// with a working set and lazy.
fn start_paths(
    a: &ServeBenchArgs,
    scratch: &Path,
    fname: &str,
    image: &Path,
) -> anyhow::Result<Value> {
    let state = |n: &str| scratch.join(format!("{fname}-{n}"));
    eprintln!("bench serve: {fname}: warm and cold");
    let (warm, cold) = warm_and_cold(a, &state("a"), fname, image)?;

    eprintln!("bench serve: {fname}: clone (keep-alive 0: every invocation a clone)");
    let d = Daemon::start(&state("b"), &["--keep-alive-ms", "0"])?;
    d.deploy(fname, image, 64)?;
    let mut conn = Conn::open(&d.addr)?;
    conn.invoke(fname, b"{}")?;
    let (clone_s, clone_c) = measure(&mut conn, fname, a.runs, "clone")?;
    let (spaced_s, spaced_c) = measure_spaced(&mut conn, fname, a.runs.min(100), "clone")?;
    drop(d);
    let mut figures = json!({
        "warm": warm,
        "clone": path_figures(&clone_s, &clone_c),
        "clone_spaced": path_figures(&spaced_s, &spaced_c),
        "cold": cold,
    });
    for (label, mode) in [
        ("restore_working_set", "working-set"),
        ("restore_lazy", "lazy"),
    ] {
        eprintln!(
            "bench serve: {fname}: {label} (no zygote, keep-alive 0: every invocation a restore)"
        );
        figures[label] = restores(a.runs.min(100), &state(mode), fname, image, mode)?;
    }
    Ok(figures)
}

/// Pause between the invocations of `clone_spaced`: traffic that pauses,
/// as most functions see (what the kernel does lazily, such as the RCU
/// grace period a cgroup move may wait for, is then on each start), and
/// longer than making a network takes, so that the one made ahead is
/// ready for each.
const SPACING: Duration = Duration::from_millis(100);

/// Like [`measure`], each invocation [`SPACING`] after the previous one.
fn measure_spaced(
    conn: &mut Conn,
    name: &str,
    runs: usize,
    want: &str,
) -> anyhow::Result<(Vec<f64>, Vec<f64>)> {
    let (mut server, mut client) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        std::thread::sleep(SPACING);
        let (s, c) = measure(conn, name, 1, want)?;
        server.extend(s);
        client.extend(c);
    }
    Ok((server, client))
}

/// The clone path of a networked function: every invocation a clone in a
/// network namespace of its own (its tap made there; under the jail, opened
/// by the daemon and passed to the clone), back to back (`clone`: faster
/// than networks are made ahead) and [`SPACING`] apart (`clone_spaced`).
fn net_clones(a: &ServeBenchArgs, state: &Path, image: &Path, pool: &str) -> anyhow::Result<Value> {
    eprintln!("bench serve: echo with a network: clone (keep-alive 0)");
    let d = Daemon::start(state, &["--keep-alive-ms", "0", "--net-pool", pool])?;
    let network = json!({"SporeNetwork": {"Enabled": true}});
    d.deploy_configured("echo-net", image, 64, network)?;
    let mut conn = Conn::open(&d.addr)?;
    conn.invoke("echo-net", b"{}")?;
    let (server, client) = measure(&mut conn, "echo-net", a.runs, "clone")?;
    let (spaced_s, spaced_c) = measure_spaced(&mut conn, "echo-net", a.runs.min(100), "clone")?;
    if server.is_empty() || spaced_s.is_empty() {
        bail!("no invocation of the networked function took the clone path");
    }
    Ok(json!({
        "clone": path_figures(&server, &client),
        "clone_spaced": path_figures(&spaced_s, &spaced_c),
        "spacing_ms": SPACING.as_millis(),
    }))
}

/// Cold starts (a function deployed for each) and warm invocations of one
/// daemon: `(warm, cold)` figures.
fn warm_and_cold(
    a: &ServeBenchArgs,
    state: &Path,
    fname: &str,
    image: &Path,
) -> anyhow::Result<(Value, Value)> {
    let d = Daemon::start(state, &["--max-concurrency", "64"])?;
    let mut conn = Conn::open(&d.addr)?;
    let (mut cold_s, mut cold_c) = (Vec::new(), Vec::new());
    for i in 0..a.cold_runs {
        let name = format!("{fname}-cold-{i}");
        d.deploy(&name, image, 64)?;
        let (s, c) = measure(&mut conn, &name, 1, "cold")?;
        cold_s.extend(s);
        cold_c.extend(c);
    }
    d.deploy(fname, image, 64)?;
    conn.invoke(fname, b"{}")?;
    let (warm_s, warm_c) = measure(&mut conn, fname, a.runs, "warm")?;
    Ok((
        path_figures(&warm_s, &warm_c),
        path_figures(&cold_s, &cold_c),
    ))
}

/// `runs` restores of the function's snapshot in `mode` (no zygote,
/// keep-alive 0: every invocation a restore).
fn restores(
    runs: usize,
    state: &Path,
    fname: &str,
    image: &Path,
    mode: &str,
) -> anyhow::Result<Value> {
    let d = Daemon::start(
        state,
        &[
            "--keep-alive-ms",
            "0",
            "--no-clones",
            "--restore-mode",
            mode,
        ],
    )?;
    d.deploy(fname, image, 64)?;
    let mut conn = Conn::open(&d.addr)?;
    // The boot writes the snapshot; the first restore records the
    // working set, written when that instance stops.
    conn.invoke(fname, b"{}")?;
    conn.invoke(fname, b"{}")?;
    if mode == "working-set" {
        let ws = state.join(format!("snapshots/{fname}-v1/vm.state.ws"));
        let deadline = Instant::now() + Duration::from_secs(10);
        while !ws.is_file() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if !ws.is_file() {
            bail!("no working set was recorded at {}", ws.display());
        }
    }
    let (s, c) = measure(&mut conn, fname, runs, "restore")?;
    Ok(path_figures(&s, &c))
}

/// Invocations/s of `echo` per concurrency, with clones and with cold boots.
fn throughput(a: &ServeBenchArgs, scratch: &Path, echo: &Path) -> anyhow::Result<Vec<Value>> {
    let mut tput = Vec::new();
    for (mode, extra) in [
        ("clone", vec!["--keep-alive-ms", "0"]),
        (
            "cold",
            vec!["--keep-alive-ms", "0", "--no-clones", "--no-snapshots"],
        ),
    ] {
        let mut args = extra.clone();
        args.extend(["--max-concurrency", "64"]);
        let d = Daemon::start(&scratch.join(format!("tput-{mode}")), &args)?;
        d.deploy("echo", echo, 64)?;
        Conn::open(&d.addr)?.invoke("echo", b"{}")?;
        for &c in &a.concurrency {
            let (n, errors) = invocations_in(&d.addr, c, a.seconds);
            tput.push(
                json!({"start": mode, "concurrency": c, "invocations_per_s": n as f64 / a.seconds,
                "errors": errors}),
            );
            eprintln!(
                "bench serve: {mode} concurrency {c}: {:.0} invocations/s",
                n as f64 / a.seconds
            );
        }
    }
    Ok(tput)
}

/// `(succeeded, failed)` invocations of `echo` by `concurrency` clients,
/// each on its own connection, invoking back to back for `seconds`.
fn invocations_in(addr: &str, concurrency: usize, seconds: f64) -> (u64, u64) {
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + Duration::from_secs_f64(seconds);
    let threads: Vec<_> = (0..concurrency)
        .map(|_| {
            let (addr, done, errors) = (addr.to_string(), done.clone(), errors.clone());
            std::thread::spawn(move || {
                let Ok(mut conn) = Conn::open(&addr) else {
                    return;
                };
                while Instant::now() < until {
                    match conn.invoke("echo", b"{}") {
                        Ok(_) => done.fetch_add(1, Ordering::Relaxed),
                        Err(_) => errors.fetch_add(1, Ordering::Relaxed),
                    };
                }
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
    (done.load(Ordering::Relaxed), errors.load(Ordering::Relaxed))
}

/// `n` idle instances of a 64 MiB function held at once, and the memory
/// (PSS, RSS) of their VMM processes.
fn density(n: usize, state: &Path, echo: &Path, keep_state: bool) -> anyhow::Result<Value> {
    eprintln!("bench serve: holding {n} idle instances of a 64 MiB function");
    let max = n.to_string();
    let args = [
        "--max-concurrency",
        &max,
        "--queue-wait-ms",
        "600000",
        "--keep-alive-ms",
        "3600000",
    ];
    // --keep-state (the Linux part's flag): the daemon's log is kept too.
    let log = state.with_extension("log");
    let d = if keep_state {
        Daemon::start_keeping(state, &args, Some(&log))?
    } else {
        Daemon::start(state, &args)?
    };
    d.deploy("echo", echo, 64)?;
    let t = Instant::now();
    // n invocations at once, each held 3 s, so each needs an instance of its own.
    let threads: Vec<_> = (0..n)
        .map(|_| {
            let addr = d.addr.clone();
            // A burst of 1000 connects can overflow the listen backlog:
            // a refused connection is tried again.
            std::thread::spawn(move || {
                let mut conn = Conn::open(&addr);
                for _ in 0..20 {
                    if conn.is_ok() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                    conn = Conn::open(&addr);
                }
                let r = conn?.invoke("echo", br#"{"sleep_ms":3000}"#)?;
                if r.function_error {
                    anyhow::bail!("a function error: {}", String::from_utf8_lossy(&r.body));
                }
                Ok(())
            })
        })
        .collect();
    // Each failure counted by its reason (the first line of its error), so
    // that a failed client is explained, not only counted.
    let mut failures: std::collections::BTreeMap<String, usize> = Default::default();
    let mut ok = 0;
    for t in threads {
        match t.join() {
            Ok(Ok(())) => ok += 1,
            Ok(Err(e)) => *failures.entry(reason(&format!("{e:#}"))).or_default() += 1,
            Err(_) => {
                *failures
                    .entry("the client thread panicked".into())
                    .or_default() += 1
            }
        }
    }
    for (why, count) in &failures {
        eprintln!("bench serve: {count} invocations failed: {why}");
    }
    let secs = t.elapsed().as_secs_f64();
    let pids = vmm_pids_under(&d.state);
    let pss: u64 = pids.iter().filter_map(|p| pss_kib(*p)).sum();
    let rss: u64 = pids.iter().filter_map(|p| rss_kib(*p)).sum();
    eprintln!("bench serve: {} VMM processes hold {:.0} MiB PSS ({:.0} MiB RSS) for {} MiB of guest memory", pids.len(), pss as f64 / 1024.0, rss as f64 / 1024.0, pids.len() * 64);
    Ok(json!({
        "function_mib": 64, "invocations_ok": ok, "failures": failures, "vmm_processes": pids.len(),
        "pss_total_mib": pss as f64 / 1024.0, "pss_per_instance_kib": pss as f64 / pids.len().max(1) as f64,
        "rss_total_mib": rss as f64 / 1024.0, "guest_memory_promised_mib": pids.len() * 64,
        "seconds_to_serve_all": secs,
    }))
}

/// The first line of an error message without its request id, at most 300
/// bytes: a reason to count failures by.
fn reason(e: &str) -> String {
    let first = e.lines().next().unwrap_or("");
    let line = match first.find("RequestId: ") {
        Some(at) => {
            let rest = &first[at + "RequestId: ".len()..];
            let id_end = rest.find(' ').unwrap_or(rest.len());
            format!("{}RequestId: …{}", &first[..at], &rest[id_end..])
        }
        None => first.to_string(),
    };
    let mut end = line.len().min(300);
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    line[..end].to_string()
}

fn vmm_pids_under(state: &Path) -> Vec<i32> {
    let marker = state.display().to_string();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|raw| {
                    // A clone factory runs no VM (its clones share its command line).
                    let comm = std::fs::read(format!("/proc/{pid}/comm")).unwrap_or_default();
                    let c = String::from_utf8_lossy(&raw).replace('\0', " ");
                    c.contains(" vmm ")
                        && c.contains(&marker)
                        && !spore_vmm::clone::factory::is_factory(&raw, &comm)
                })
                .unwrap_or(false)
        })
        .collect()
}
