//! `spore bench boot`: spawns the VMM as a user would (`spore run`) and
//! times process start to the guest's first signal-port `MARK`; both ends
//! use the host's CLOCK_MONOTONIC, so they compare across processes. While
//! the guest holds after its mark, the bench reads the VMM's RSS from
//! /proc, leaving out the guest-RAM mapping.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use serde_json::{json, Value};
use spore_vmm::host::monotonic_ns;

use crate::host::machine;
use crate::procfs::rss_excluding_guest_kib;
use crate::stats::{median, summary};

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

struct Sample {
    boot_ns: u64,
    rss_kib: Option<u64>,
}

pub fn run(a: BootArgs) -> anyhow::Result<u8> {
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
            median(&boots),
            if rss.is_empty() { "n/a".to_string() } else { format!("{:.0}", median(&rss)) },
        );
        Ok(json!({
            "benchmark": "boot",
            "guest": kind,
            "runs": a.runs,
            "mem": a.mem,
            "vcpus": a.vcpus,
            "seccomp": !a.no_seccomp,
            "machine": machine(),
            "start_to_first_mark_ms": summary(&boots),
            "vmm_rss_excluding_guest_kib": if rss.is_empty() { Value::Null } else { summary(&rss) },
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
        rss_excluding_guest_kib(child.id()).ok()
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
