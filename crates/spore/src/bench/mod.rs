//! `spore bench`: benchmarks that print JSON on stdout (and a one-line human
//! summary on stderr).
//!
//! `boot` spawns the VMM as a user would (`spore run`) and times process
//! start to the guest's first signal-port `MARK`; both ends use the host's
//! CLOCK_MONOTONIC, so they compare across processes. While the guest holds
//! after its mark, the bench reads the VMM's RSS from /proc, leaving out the
//! guest-RAM mapping.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

mod clone;
mod net;
mod net_client;
mod reclaim;
mod reclaim_linux;
mod report;
mod serve;
mod serve_linux;
mod snapshot;
pub mod stats;
mod tmem;
mod tmem_guest;
mod tmem_kv;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use serde_json::{json, Value};
use spore_vmm::host::monotonic_ns;

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// VMM start to the guest's first mark, and the VMM's own RSS.
    Boot(BootArgs),
    /// tmem calls: 1 MiB put/get latency (guest and VMM side), single vs batched
    /// 4 KiB puts, kvserver SET vs TMEMPUT commands/s.
    Tmem(crate::bench::tmem::TmemArgs),
    /// Snapshot creation time and size, and restore latency per restore path.
    Snapshot(crate::bench::snapshot::SnapshotBenchArgs),
    /// Clones: latency from the request to the clone's first guest
    /// instruction (p50, p99) per memory size, with and without standby
    /// processes; clones/s with a --keep pool; PSS per clone.
    Clone(crate::bench::clone::CloneBenchArgs),
    /// Reclaim (the virtio-mem seed's two-hog experiment): time to give a
    /// size back and host memory released, virtio-mem and balloon on Linux
    /// (`--linux-kernel`, nested harness) or virtio-mem on the unikernel (`--uk`).
    Reclaim(crate::bench::reclaim::ReclaimArgs),
    /// `spore serve`: invoke latency per start path (warm, clone, cold),
    /// invocations/s with clones against cold boots, idle instances held;
    /// with --linux, SnapFaaS's experiment on Python functions (cold boot,
    /// merged full snapshot, layered base + diff, layered + working set,
    /// clone; cold and lukewarm page cache).
    Serve(crate::bench::serve::ServeBenchArgs),
    /// virtio-net on a tap against the `httpd` unikernel: TCP throughput
    /// both ways, 1-byte ping-pong latency, HTTP keep-alive requests/s
    /// (root: it makes its own tap).
    Net(crate::bench::net::NetBenchArgs),
    /// One HTML page with plots from the bench JSON saved in a directory.
    Report(crate::bench::report::ReportArgs),
}

#[derive(Args, Debug)]
pub struct BootArgs {
    /// The unikernel to boot (the `boot-mark` example app).
    #[arg(long)]
    pub uk: Option<PathBuf>,
    /// A Linux kernel to boot instead; its init must `spore-signal mark 1`
    /// first (the spore guest initramfs does when `spore.bench` is on the cmdline).
    #[arg(long)]
    pub linux_kernel: Option<PathBuf>,
    #[arg(long)]
    pub linux_initrd: Option<PathBuf>,
    #[arg(long, default_value_t = 10)]
    pub runs: usize,
    #[arg(long, default_value = "128M")]
    pub mem: String,
    #[arg(long, default_value_t = 1)]
    pub vcpus: u64,
    /// Boot without seccomp filters, to measure what they cost.
    #[arg(long)]
    pub no_seccomp: bool,
}

pub fn run(cmd: BenchCommand) -> anyhow::Result<u8> {
    match cmd {
        BenchCommand::Boot(a) => boot(a),
        BenchCommand::Tmem(a) => crate::bench::tmem::run(a),
        BenchCommand::Snapshot(a) => crate::bench::snapshot::run(a),
        BenchCommand::Clone(a) => crate::bench::clone::run(a),
        BenchCommand::Reclaim(a) => crate::bench::reclaim::run(a),
        BenchCommand::Serve(a) => crate::bench::serve::run(a),
        BenchCommand::Net(a) => crate::bench::net::run(a),
        BenchCommand::Report(a) => crate::bench::report::run(a),
    }
}

/// Guest-RAM mappings are named after the memfd (see `spore_vmm::memory`).
const GUEST_RAM_MAPPING: &str = "spore-guest-ram";

struct Sample {
    boot_ns: u64,
    rss_kib: Option<u64>,
}

fn boot(a: BootArgs) -> anyhow::Result<u8> {
    if a.runs == 0 {
        bail!("--runs must be at least 1");
    }
    let spore = std::env::current_exe().context("locating the spore binary")?;
    let scratch = std::env::temp_dir().join(format!("spore-bench-boot-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let result = (|| -> anyhow::Result<Value> {
        let (kind, base_args) = match (&a.uk, &a.linux_kernel) {
            (Some(uk), None) => (
                "unikernel",
                vec![
                    "--kernel".into(),
                    uk.display().to_string(),
                    "--cmdline".into(),
                    "hold_ms=400".into(),
                ],
            ),
            (None, Some(k)) => {
                let mut v = vec![
                    "--kernel".into(),
                    k.display().to_string(),
                    "--cmdline".into(),
                    // The architecture's default console and reboot settings.
                    format!(
                        "{} quiet spore.bench=1",
                        spore_vmm::builder::DEFAULT_LINUX_CMDLINE
                    ),
                ];
                if let Some(i) = &a.linux_initrd {
                    v.push("--initrd".into());
                    v.push(i.display().to_string());
                }
                ("linux", v)
            }
            _ => bail!("give exactly one of --uk or --linux-kernel"),
        };
        let mut samples = Vec::new();
        for i in 0..a.runs {
            let marks = scratch.join(format!("marks-{i}.json"));
            samples.push(
                boot_once(&spore, &base_args, &a, &marks, kind == "unikernel")
                    .with_context(|| format!("run {i}"))?,
            );
        }
        let boots: Vec<f64> = samples.iter().map(|s| s.boot_ns as f64 / 1e6).collect();
        let rss: Vec<f64> = samples
            .iter()
            .filter_map(|s| s.rss_kib)
            .map(|k| k as f64)
            .collect();
        eprintln!(
            "boot ({kind}, {} runs): VMM start to first mark median {:.3} ms; VMM RSS without guest memory median {} KiB",
            a.runs,
            stats::median(&boots),
            if rss.is_empty() { "n/a".to_string() } else { format!("{:.0}", stats::median(&rss)) },
        );
        Ok(json!({
            "benchmark": "boot",
            "guest": kind,
            "runs": a.runs,
            "mem": a.mem,
            "vcpus": a.vcpus,
            "seccomp": !a.no_seccomp,
            "machine": machine(),
            "start_to_first_mark_ms": stats(&boots),
            "vmm_rss_excluding_guest_kib": if rss.is_empty() { Value::Null } else { stats(&rss) },
        }))
    })();
    let _ = std::fs::remove_dir_all(&scratch);
    println!("{}", serde_json::to_string_pretty(&result?)?);
    Ok(0)
}

fn boot_once(
    spore: &Path,
    base_args: &[String],
    a: &BootArgs,
    marks: &Path,
    measure_rss: bool,
) -> anyhow::Result<Sample> {
    let start = monotonic_ns();
    let mut child = Command::new(spore)
        .arg("run")
        .args(["--mem", &a.mem, "--vcpus", &a.vcpus.to_string()])
        .arg("--marks-file")
        .arg(marks)
        .args(a.no_seccomp.then_some("--no-seccomp"))
        .args(base_args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("spawning spore run")?;
    // The unikernel holds 400 ms after its mark; read RSS in the middle.
    let rss_kib = if measure_rss {
        std::thread::sleep(Duration::from_millis(200));
        vmm_rss_excluding_guest(child.id()).ok()
    } else {
        None
    };
    let status = wait_with_timeout(&mut child, RUN_TIMEOUT)?;
    if !status.success() {
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut err);
        }
        bail!("guest run failed ({status}): {}", err.trim());
    }
    let text = std::fs::read(marks).context("reading the marks file")?;
    let list: Vec<Value> = serde_json::from_slice(&text)?;
    let first = list
        .first()
        .and_then(|m| m["monotonic_ns"].as_u64())
        .context("the guest recorded no mark")?;
    Ok(Sample {
        boot_ns: first.saturating_sub(start),
        rss_kib,
    })
}

/// A boot that has not ended by then is stuck: fail the run rather than hang.
const RUN_TIMEOUT: Duration = Duration::from_secs(120);

/// Waits for the child; kills it and fails after `timeout`.
fn wait_with_timeout(
    child: &mut std::process::Child,
    timeout: Duration,
) -> anyhow::Result<std::process::ExitStatus> {
    let start = std::time::Instant::now();
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "the guest did not finish within {} s (killed)",
                timeout.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Sum of Rss over the process's mappings, without guest RAM.
fn vmm_rss_excluding_guest(pid: u32) -> anyhow::Result<u64> {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps"))?;
    let mut total = 0u64;
    let mut in_guest_ram = false;
    for line in smaps.lines() {
        if let Some(rest) = line.strip_prefix("Rss:") {
            if !in_guest_ram {
                let kib: u64 = rest.trim().trim_end_matches("kB").trim().parse()?;
                total += kib;
            }
        } else if is_mapping_header(line) {
            in_guest_ram = line.contains(GUEST_RAM_MAPPING);
        }
    }
    Ok(total)
}

/// Mapping header lines start with "start-end perms".
fn is_mapping_header(line: &str) -> bool {
    line.split_whitespace().next().is_some_and(|range| {
        range.contains('-') && range.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
    })
}

/// The directory of the unikernel images: `--uk-dir`, else `SPORE_UK_DIR`,
/// else this source tree's spore-uk build directory.
pub(crate) fn uk_dir(flag: &Option<PathBuf>) -> PathBuf {
    flag.clone()
        .or_else(|| std::env::var_os("SPORE_UK_DIR").map(PathBuf::from))
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../spore-uk/target/x86_64-unknown-none/release")
        })
}

/// Summary of a sample set (see [`stats::summary`]).
pub(crate) fn stats(v: &[f64]) -> Value {
    stats::summary(v)
}

pub(crate) fn machine() -> Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let kvm = if Path::new("/sys/module/kvm_pvm").exists() {
        "kvm_pvm"
    } else if Path::new("/sys/module/kvm_amd").exists() {
        "kvm_amd"
    } else if Path::new("/sys/module/kvm_intel").exists() {
        "kvm_intel"
    } else {
        "unknown"
    };
    json!({
        "cpu": cpu,
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "host_kernel": kernel,
        "kvm": kvm,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapping_headers() {
        assert!(is_mapping_header(
            "7f0000000000-7f0008000000 rw-s 00000000 00:01 5 /memfd:spore-guest-ram (deleted)"
        ));
        assert!(!is_mapping_header("Rss:                 123 kB"));
    }
}
