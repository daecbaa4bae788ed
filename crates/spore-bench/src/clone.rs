//! `spore bench clone`: clone latency, throughput and memory per clone, for
//! several guest memory sizes, with and without standby processes.
//!
//! For each size a source VMM boots the `clonetest` unikernel in bench mode:
//! its guest signals `FORK` with count 0, which turns it into a zygote
//! without clones. The bench then asks for clones one at a time
//! (`PUT /clone`) and measures, on the host's CLOCK_MONOTONIC:
//!
//! - `vmm_start`: request → the clone VMM starting its vCPUs;
//! - `first_instruction`: request → the clone guest's first signal-port
//!   `MARK` (its first instruction after the fork; it includes that one
//!   port-I/O exit, about 37 µs here);
//! - memory per clone: the clone process's PSS once it runs;
//! - clones/s: a pool of `--keep` clones of a source whose clones end at
//!   once (`DONE`), replaced as they exit, over `--total` clones.
//!
//! Runs with `standby` use clone processes started ahead of time
//! (`PUT /clone/config {"standby": N}`): the clone only receives the
//! template, maps it, loads state and starts.

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use serde_json::{json, Value};

use crate::procfs::{cpu_ms, pss_kib, wait_gone};
use crate::stats::summary;
use crate::vmm_api::{call_below, put_clone};

#[derive(Args, Debug)]
pub struct CloneBenchArgs {
    /// Guest memory sizes in MiB.
    #[arg(long, value_delimiter = ',', default_value = "128,1024,4096,8192")]
    pub sizes: Vec<u64>,
    /// Clones timed per size and variant.
    #[arg(long, default_value_t = 20)]
    pub runs: usize,
    /// Standby processes kept ready in the standby variant.
    #[arg(long, default_value_t = 2)]
    pub standby: u32,
    /// Clones kept running in the throughput run.
    #[arg(long, default_value_t = 2)]
    pub keep: u32,
    /// Clones started in the throughput run.
    #[arg(long, default_value_t = 40)]
    pub total: u64,
    /// Directory of the unikernel images (default: `SPORE_UK_DIR`, else the
    /// spore-uk build directory of this source tree).
    #[arg(long)]
    pub uk_dir: Option<PathBuf>,
    /// Also ask one template for this many clones in one request (issue
    /// 16's "1,000 clones of one template"), end to end: request → every
    /// clone running and serving its API, and → the last clone's first
    /// guest instruction; PSS and CPU time per clone. 0: not run.
    #[arg(long, default_value_t = 0)]
    pub count: u32,
    /// Run the source VMMs (and so their clones) without seccomp filters,
    /// to measure what the filters cost.
    #[arg(long)]
    pub no_seccomp: bool,
}

/// `--no-seccomp`, for the source VMMs this run starts.
static NO_SECCOMP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// HyperFork's published figure (Colavita 2020): 9.27 ms to clone a 1 GiB VM,
/// growing linearly with memory.
const HYPERFORK_1GIB_MS: f64 = 9.27;

fn uk_image(a: &CloneBenchArgs) -> anyhow::Result<PathBuf> {
    let dir = crate::host::uk_dir(&a.uk_dir);
    let p = dir.join("clonetest");
    if !p.exists() {
        bail!(
            "{} is missing: build the unikernel apps (make uk)",
            p.display()
        );
    }
    Ok(p)
}

/// A source VMM, stopped on drop.
struct Source {
    child: Child,
    sock: PathBuf,
}

impl Drop for Source {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_source(
    dir: &Path,
    uk: &Path,
    mib: u64,
    after: &str,
    clone_config: &Value,
) -> anyhow::Result<Source> {
    std::fs::create_dir_all(dir)?;
    let sock = dir.join("src.sock");
    let log = std::fs::File::create(dir.join("src.log"))?;
    let child = std::process::Command::new(std::env::current_exe()?)
        .args(["vmm", "--api-sock"])
        .arg(&sock)
        .args(
            NO_SECCOMP
                .load(std::sync::atomic::Ordering::Relaxed)
                .then_some("--no-seccomp"),
        )
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("starting the source VMM")?;
    let src = Source { child, sock };
    let t = Instant::now();
    while !src.sock.exists() {
        if t.elapsed() > Duration::from_secs(10) {
            bail!("the source VMM did not serve its API");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    call_below(
        &src.sock,
        400,
        "PUT",
        "/clone/config",
        &clone_config.to_string(),
    )?;
    let boot = json!({
        "kernel_image_path": uk.display().to_string(),
        "boot_args": format!("mode=bench after={after}"),
    });
    call_below(&src.sock, 400, "PUT", "/boot-source", &boot.to_string())?;
    let mc = json!({"vcpu_count": 1, "mem_size_mib": mib});
    call_below(&src.sock, 400, "PUT", "/machine-config", &mc.to_string())?;
    call_below(
        &src.sock,
        400,
        "PUT",
        "/actions",
        r#"{"action_type": "InstanceStart"}"#,
    )?;
    let t = Instant::now();
    loop {
        let status: Value =
            serde_json::from_str(&call_below(&src.sock, 400, "GET", "/clone", "")?)?;
        if status["zygote"] == true {
            break;
        }
        if t.elapsed() > Duration::from_secs(60) {
            bail!("the source guest did not become a zygote: {status}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(src)
}

fn first_mark(path: &Path) -> Option<u64> {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(5) {
        if let Ok(text) = std::fs::read_to_string(path) {
            let v: Value = serde_json::from_str(&text).ok()?;
            return v.as_array()?.first()?["monotonic_ns"].as_u64();
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    None
}

/// Latency and memory of `runs` clones, one at a time.
fn latency(dir: &Path, uk: &Path, mib: u64, runs: usize, standby: u32) -> anyhow::Result<Value> {
    let config = json!({"fork_count": 0, "guest_fork": true, "marks": true, "max_clones": 100000, "standby": standby});
    let src = start_source(dir, uk, mib, "stay", &config)?;
    let (mut vmm_ms, mut guest_ms, mut reply_ms, mut pss) = (vec![], vec![], vec![], vec![]);
    for _ in 0..runs {
        // Let standby processes finish starting, as a pool would be.
        if standby > 0 {
            std::thread::sleep(Duration::from_millis(30));
        }
        let t = Instant::now();
        let r = put_clone(&src.sock, 1)?;
        reply_ms.push(t.elapsed().as_secs_f64() * 1e3);
        let c = r.clones.first().context("no clone in the report")?;
        vmm_ms.push(c.start_ns.saturating_sub(r.request_ns) as f64 / 1e6);
        std::thread::sleep(Duration::from_millis(20));
        if let Some(k) = pss_kib(c.pid as i32) {
            pss.push(k as f64);
        }
        // SAFETY: SIGTERM to the clone VMM just started (a clean stop that
        // writes its marks).
        unsafe { libc::kill(c.pid as i32, libc::SIGTERM) };
        if !wait_gone(c.pid, Duration::from_secs(10)) {
            bail!("clone {} did not stop", c.pid);
        }
        let marks = dir.join(format!("{}.marks.json", c.name));
        if let Some(m) = first_mark(&marks) {
            guest_ms.push(m.saturating_sub(r.request_ns) as f64 / 1e6);
        }
        let _ = std::fs::remove_file(&marks);
        let _ = std::fs::remove_file(dir.join(format!("{}.log", c.name)));
    }
    drop(src);
    Ok(json!({
        "vmm_start_ms": summary(&vmm_ms),
        "first_instruction_ms": summary(&guest_ms),
        "request_to_reply_ms": summary(&reply_ms),
        "clone_pss_kib": summary(&pss),
    }))
}

/// Raises this process's open-file limit to its hard limit: the source
/// VMM (our child) holds a socket and a log per clone of a request.
fn raise_nofile() {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: reads and writes this process's own limit.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 && r.rlim_cur < r.rlim_max {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}

/// `--count N`: one `PUT /clone` for N clones of one template.
fn batch(dir: &Path, uk: &Path, mib: u64, count: u32) -> anyhow::Result<Value> {
    raise_nofile();
    let config = json!({"fork_count": 0, "guest_fork": true, "marks": true, "max_clones": 100000, "standby": 0});
    let src = start_source(dir, uk, mib, "stay", &config)?;
    let t = Instant::now();
    let r = put_clone(&src.sock, count)?;
    let reply_ms = t.elapsed().as_secs_f64() * 1e3;
    let last_start_ms = r
        .clones
        .iter()
        .map(|c| c.start_ns.saturating_sub(r.request_ns))
        .max()
        .unwrap_or(0) as f64
        / 1e6;
    let (mut pss, mut cpu) = (Vec::new(), Vec::new());
    for c in &r.clones {
        pss.extend(pss_kib(c.pid as i32).map(|k| k as f64));
        cpu.extend(cpu_ms(c.pid));
    }
    for c in &r.clones {
        // SAFETY: SIGTERM to a clone VMM this request started (a clean
        // stop that writes its marks).
        unsafe { libc::kill(c.pid as i32, libc::SIGTERM) };
    }
    let mut firsts = Vec::new();
    for c in &r.clones {
        if !wait_gone(c.pid, Duration::from_secs(30)) {
            bail!("clone {} did not stop", c.pid);
        }
        let marks = dir.join(format!("{}.marks.json", c.name));
        if let Some(m) = first_mark(&marks) {
            firsts.push(m.saturating_sub(r.request_ns) as f64 / 1e6);
        }
    }
    drop(src);
    let last_first_ms = firsts.iter().copied().fold(0.0, f64::max);
    Ok(json!({
        "count": count,
        "clones_reported": r.clones.len(),
        "first_marks": firsts.len(),
        "request_to_reply_ms": reply_ms,
        "last_vcpu_start_ms": last_start_ms,
        "last_first_instruction_ms": last_first_ms,
        "clones_per_s": if last_first_ms > 0.0 { count as f64 * 1e3 / last_first_ms } else { 0.0 },
        "first_instruction_ms": summary(&firsts),
        "clone_pss_kib": summary(&pss),
        "clone_pss_total_mib": pss.iter().sum::<f64>() / 1024.0,
        "clone_cpu_ms": summary(&cpu),
    }))
}

/// Clones per second with a pool of `keep` clones that end at once.
fn throughput(
    dir: &Path,
    uk: &Path,
    mib: u64,
    keep: u32,
    total: u64,
    standby: u32,
) -> anyhow::Result<Value> {
    let config =
        json!({"fork_count": 0, "guest_fork": true, "max_clones": 100000, "standby": standby});
    let src = start_source(dir, uk, mib, "done", &config)?;
    let out = std::process::Command::new(std::env::current_exe()?)
        .arg("clone")
        .arg(&src.sock)
        .args(["--keep", &keep.to_string(), "--total", &total.to_string()])
        .stderr(Stdio::null())
        .output()?;
    if !out.status.success() {
        bail!("spore clone --keep failed");
    }
    drop(src);
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// The machine the numbers come from.
fn host_info() -> Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    json!({"cpu": cpu, "cpus": cpus, "kernel": kernel.trim()})
}

pub fn run(a: CloneBenchArgs) -> anyhow::Result<u8> {
    NO_SECCOMP.store(a.no_seccomp, std::sync::atomic::Ordering::Relaxed);
    if a.runs == 0 {
        bail!("--runs must be at least 1");
    }
    let uk = uk_image(&a)?;
    let scratch = std::env::temp_dir().join(format!("spore-bench-clone-{}", std::process::id()));
    let result = (|| -> anyhow::Result<Value> {
        let mut sizes = Vec::new();
        for &mib in &a.sizes {
            sizes.push(bench_size(&a, &scratch, &uk, mib)?);
        }
        Ok(json!({
            "bench": "clone",
            "runs": a.runs,
            "seccomp": !a.no_seccomp,
            "host": host_info(),
            "hyperfork": "9.27 ms at 1 GiB (thesis, m5.metal), linear in memory; the estimate per size scales it",
            "sizes": sizes,
        }))
    })();
    let _ = std::fs::remove_dir_all(&scratch);
    println!("{}", serde_json::to_string_pretty(&result?)?);
    Ok(0)
}

/// One guest size: latency fresh and with standby processes, throughput
/// with and without standby, and with `--count` one request for many clones.
fn bench_size(a: &CloneBenchArgs, scratch: &Path, uk: &Path, mib: u64) -> anyhow::Result<Value> {
    let fresh = latency(&scratch.join(format!("{mib}-fresh")), uk, mib, a.runs, 0)?;
    let standby = latency(
        &scratch.join(format!("{mib}-standby")),
        uk,
        mib,
        a.runs,
        a.standby,
    )?;
    let tput = throughput(
        &scratch.join(format!("{mib}-keep")),
        uk,
        mib,
        a.keep,
        a.total,
        0,
    )?;
    let tput_standby = throughput(
        &scratch.join(format!("{mib}-keep-standby")),
        uk,
        mib,
        a.keep,
        a.total,
        a.standby,
    )?;
    eprintln!(
        "{mib} MiB: clone p50 {:.2} ms (standby {:.2} ms) to the first guest instruction, \
         {:.0} clones/s (standby {:.0}), {:.0} KiB PSS per clone",
        fresh["first_instruction_ms"]["p50"]
            .as_f64()
            .unwrap_or(f64::NAN),
        standby["first_instruction_ms"]["p50"]
            .as_f64()
            .unwrap_or(f64::NAN),
        tput["clones_per_s"].as_f64().unwrap_or(f64::NAN),
        tput_standby["clones_per_s"].as_f64().unwrap_or(f64::NAN),
        fresh["clone_pss_kib"]["p50"].as_f64().unwrap_or(f64::NAN),
    );
    let many = if a.count > 0 {
        let b = batch(&scratch.join(format!("{mib}-count")), uk, mib, a.count)?;
        eprintln!(
            "{mib} MiB: {} clones in one request: all serving in {:.0} ms, the last \
             first instruction at {:.0} ms, {:.0} KiB PSS and {:.1} ms CPU per clone (p50)",
            a.count,
            b["request_to_reply_ms"].as_f64().unwrap_or(f64::NAN),
            b["last_first_instruction_ms"].as_f64().unwrap_or(f64::NAN),
            b["clone_pss_kib"]["p50"].as_f64().unwrap_or(f64::NAN),
            b["clone_cpu_ms"]["p50"].as_f64().unwrap_or(f64::NAN),
        );
        b
    } else {
        Value::Null
    };
    Ok(json!({
        "mem_mib": mib,
        "batch": many,
        "fresh_process": fresh,
        "standby_process": standby,
        "throughput": tput,
        "throughput_standby": tput_standby,
        "hyperfork_ms_estimate": HYPERFORK_1GIB_MS * mib as f64 / 1024.0,
    }))
}
