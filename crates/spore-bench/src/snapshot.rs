//! `spore bench snapshot`: snapshot creation and restore latency per
//! restore path, with the `snapbench` unikernel on host KVM.
//!
//! Per guest size: boot snapbench (it fills `--fill-pct` of memory with a
//! pattern and marks 1), pause it, write `--create-runs` full snapshots
//! (time, apparent and on-disk size). Then per restore path and run: start
//! a fresh `spore vmm`, optionally drop the snapshot files from the page
//! cache (`posix_fadvise(DONTNEED)` on the memory, state and working-set
//! files: cold), take the host CLOCK_MONOTONIC, send `PUT /snapshot/load`
//! with `resume_vm`, and read the guest's marks when it exits: mark 2 is
//! its first instructions after the restore (it polls the signal port,
//! which reports the restore once), mark 3 the end of a workload that reads
//! one word of `--touch-pct` of memory's pages, spread pseudo-randomly over
//! the filled memory. The working-set path first runs once to record its
//! set (reported apart), then replays it.

use std::io::{BufRead, BufReader};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use serde_json::{json, Value};
use spore_vmm::config::parse_size;
use spore_vmm::host::monotonic_ns;

use crate::host::{loadavg, machine};
use crate::stats::summary;
use crate::vmm_api::call_below;

#[derive(Args, Debug)]
pub struct SnapshotBenchArgs {
    /// The snapbench unikernel (default: $SPORE_UK_DIR/snapbench).
    #[arg(long)]
    pub uk: Option<PathBuf>,
    /// Guest sizes, comma separated.
    #[arg(long, default_value = "128M,1G,4G", value_delimiter = ',')]
    pub sizes: Vec<String>,
    /// Percent of guest memory the guest fills before the snapshot.
    #[arg(long, default_value_t = 50)]
    pub fill_pct: u64,
    /// Percent of guest memory the workload after the restore touches.
    #[arg(long, default_value_t = 10)]
    pub touch_pct: u64,
    /// Restore runs per path (medians reported).
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Snapshot creations per size.
    #[arg(long, default_value_t = 3)]
    pub create_runs: usize,
    /// Restore paths, comma separated: lazy, eager, working_set, uffd.
    #[arg(
        long,
        default_value = "lazy,eager,working_set,uffd",
        value_delimiter = ','
    )]
    pub modes: Vec<String>,
    /// Keep the snapshot files in the page cache between runs (warm) instead
    /// of dropping them before each restore (cold).
    #[arg(long)]
    pub warm: bool,
    /// The workload also writes each word it reads.
    #[arg(long)]
    pub write: bool,
    /// Where to put the snapshots, in a directory of their own removed at
    /// the end (default /var/tmp: a disk, since cold runs measure reads
    /// from it, not tmpfs).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Run every VMM (boot and restores) without seccomp filters, to
    /// measure what the filters cost.
    #[arg(long)]
    pub no_seccomp: bool,
}

/// The snapshot kinds written per size. A diff snapshot is one more entry
/// here once the VMM writes them (it needs `track_dirty_pages` at boot).
const SNAPSHOT_KINDS: &[&str] = &["Full"];

pub fn run(a: SnapshotBenchArgs) -> anyhow::Result<u8> {
    if a.runs == 0 || a.create_runs == 0 {
        bail!("--runs and --create-runs must be at least 1");
    }
    if a.touch_pct > a.fill_pct || a.fill_pct > 90 {
        bail!("need touch-pct <= fill-pct <= 90");
    }
    let uk = match &a.uk {
        Some(p) => p.clone(),
        None => PathBuf::from(
            std::env::var("SPORE_UK_DIR")
                .context("give --uk PATH to the snapbench unikernel (or set SPORE_UK_DIR)")?,
        )
        .join("snapbench"),
    };
    if !uk.exists() {
        bail!("{} does not exist (build crates/spore-uk)", uk.display());
    }
    let spore = std::env::current_exe().context("locating the spore binary")?;
    let dir = a.dir.clone().unwrap_or_else(|| {
        PathBuf::from(format!(
            "/var/tmp/spore-bench-snapshot-{}",
            std::process::id()
        ))
    });
    std::fs::create_dir_all(&dir)?;
    let load_before = loadavg();
    let result = (|| -> anyhow::Result<Value> {
        let mut sizes = Vec::new();
        for size in &a.sizes {
            let bytes = parse_size(size).with_context(|| format!("size {size}"))?;
            sizes.push(
                bench_size(&spore, &uk, &dir, bytes, &a).with_context(|| format!("size {size}"))?,
            );
        }
        Ok(json!({
            "benchmark": "snapshot",
            "guest": "unikernel (snapbench)",
            "machine": machine(),
            "cache": if a.warm { "warm" } else { "cold (posix_fadvise DONTNEED on the snapshot files before each restore)" },
            "fill_pct": a.fill_pct,
            "touch_pct": a.touch_pct,
            "workload": if a.write { "read+write one word per touched page" } else { "read one word per touched page" },
            "runs": a.runs,
            "seccomp": !a.no_seccomp,
            // Timings on a busy host are inflated: say how busy it was.
            "host_loadavg_1min": {"before": load_before, "after": loadavg()},
            "sizes": sizes,
        }))
    })();
    let _ = std::fs::remove_dir_all(&dir);
    println!("{}", serde_json::to_string_pretty(&result?)?);
    Ok(0)
}

struct Vmm {
    child: Child,
    sock: PathBuf,
    lines: mpsc::Receiver<String>,
}

impl Vmm {
    fn spawn(spore: &Path, sock: &Path, marks: &Path, no_seccomp: bool) -> anyhow::Result<Self> {
        let _ = std::fs::remove_file(sock);
        let mut child = Command::new(spore)
            .args(["vmm", "--api-sock"])
            .arg(sock)
            .args(no_seccomp.then_some("--no-seccomp"))
            .arg("--marks-file")
            .arg(marks)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("spawning spore vmm")?;
        let out = child.stdout.take().context("no stdout")?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let t = Instant::now();
        while !sock.exists() {
            if t.elapsed() > Duration::from_secs(10) {
                let _ = child.kill();
                bail!("the VMM did not create {}", sock.display());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(Self {
            child,
            sock: sock.to_path_buf(),
            lines,
        })
    }

    fn call(&self, method: &str, path: &str, body: &str) -> anyhow::Result<String> {
        call_below(&self.sock, 300, method, path, body)
    }

    fn wait_line(&self, prefix: &str, timeout: Duration) -> anyhow::Result<()> {
        let t = Instant::now();
        loop {
            let left = timeout.saturating_sub(t.elapsed());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.starts_with(prefix) => return Ok(()),
                Ok(l) if l.contains("FAILED") => bail!("guest: {l}"),
                Ok(_) => {}
                Err(_) => bail!("the guest did not print {prefix:?} in {timeout:?}"),
            }
        }
    }

    /// Waits for the VMM to exit (the guest exits after its workload).
    fn wait(mut self, timeout: Duration) -> anyhow::Result<()> {
        let t = Instant::now();
        loop {
            if let Some(s) = self.child.try_wait()? {
                if !s.success() {
                    bail!("the VMM exited with {s}");
                }
                return Ok(());
            }
            if t.elapsed() > timeout {
                let _ = self.child.kill();
                let _ = self.child.wait();
                bail!("the restored guest did not finish in {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn stop(mut self) {
        // SAFETY: SIGTERM to our own child process.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

fn bench_size(
    spore: &Path,
    uk: &Path,
    dir: &Path,
    bytes: u64,
    a: &SnapshotBenchArgs,
) -> anyhow::Result<Value> {
    let mib = bytes >> 20;
    let fill_mib = (mib * a.fill_pct / 100).max(1);
    let touch_pages = bytes / 4096 * a.touch_pct / 100;
    let creation = create(spore, uk, dir, mib, fill_mib, touch_pages, a)?;
    eprintln!(
        "bench snapshot {mib} MiB: created ({fill_mib} MiB filled), restoring ({touch_pages} pages touched)"
    );
    let mut restores = serde_json::Map::new();
    for mode in &a.modes {
        restores.insert(mode.clone(), restore_mode(spore, dir, mode, a)?);
    }
    let median_of = |m: &str| {
        restores
            .get(m)
            .and_then(|v| v["to_workload_end_ms"]["median"].as_f64())
    };
    let speedup = match (median_of("lazy"), median_of("working_set")) {
        (Some(l), Some(w)) if w > 0.0 => json!(l / w),
        _ => Value::Null,
    };
    Ok(json!({
        "mem_bytes": bytes,
        "filled_bytes": fill_mib << 20,
        "touched_pages": touch_pages,
        "create": creation,
        "restore": restores,
        "working_set_speedup_over_lazy": speedup,
    }))
}

/// Boots snapbench with `mib` of memory, lets it fill `fill_mib`, pauses
/// it and writes `--create-runs` snapshots of each kind into `dir`: their
/// creation time and sizes per kind.
fn create(
    spore: &Path,
    uk: &Path,
    dir: &Path,
    mib: u64,
    fill_mib: u64,
    touch_pages: u64,
    a: &SnapshotBenchArgs,
) -> anyhow::Result<serde_json::Map<String, Value>> {
    let (state, mem) = (dir.join("vm.state"), dir.join("vm.mem"));
    let vmm = Vmm::spawn(
        spore,
        &dir.join("api.sock"),
        &dir.join("marks.json"),
        a.no_seccomp,
    )?;
    vmm.call(
        "PUT",
        "/boot-source",
        &json!({
            "kernel_image_path": uk,
            "boot_args": format!("mib={fill_mib} touch_pages={touch_pages} write={}", u8::from(a.write)),
        })
        .to_string(),
    )?;
    vmm.call(
        "PUT",
        "/machine-config",
        &json!({"vcpu_count": 1, "mem_size_mib": mib}).to_string(),
    )?;
    vmm.call("PUT", "/actions", r#"{"action_type":"InstanceStart"}"#)?;
    vmm.wait_line("ready", Duration::from_secs(300))?;
    vmm.call("PATCH", "/vm", r#"{"state":"Paused"}"#)?;
    let mut creation = serde_json::Map::new();
    for kind in SNAPSHOT_KINDS {
        let mut ms = Vec::new();
        for _ in 0..a.create_runs {
            let t = Instant::now();
            vmm.call(
                "PUT",
                "/snapshot/create",
                &json!({"snapshot_type": kind, "snapshot_path": state, "mem_file_path": mem})
                    .to_string(),
            )?;
            ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let md = std::fs::metadata(&mem)?;
        creation.insert(
            kind.to_lowercase(),
            json!({
                "ms": summary(&ms),
                "mem_file_bytes": md.len(),
                "mem_file_on_disk_bytes": md.blocks() * 512,
                "state_file_bytes": std::fs::metadata(&state)?.len(),
            }),
        );
    }
    vmm.stop();
    Ok(creation)
}

/// `--runs` restores of the snapshot in `dir` by one restore path (the
/// working-set path after one run that records its set).
fn restore_mode(
    spore: &Path,
    dir: &Path,
    mode: &str,
    a: &SnapshotBenchArgs,
) -> anyhow::Result<Value> {
    let ws = dir.join("vm.state.ws");
    let _ = std::fs::remove_file(&ws);
    let mut record = None;
    if mode == "working_set" {
        record = Some(restore_once(spore, dir, mode, a)?);
        if !ws.exists() {
            bail!("the recording run wrote no working set");
        }
    }
    let mut samples = Vec::new();
    for i in 0..a.runs {
        samples.push(restore_once(spore, dir, mode, a).with_context(|| format!("{mode} run {i}"))?);
    }
    let col = |f: fn(&Sample) -> f64| summary(&samples.iter().map(f).collect::<Vec<_>>());
    let mut v = json!({
        "load_request_ms": col(|s| s.load_ms),
        "to_first_instruction_ms": col(|s| s.first_ms),
        "to_workload_end_ms": col(|s| s.done_ms),
        "workload_ms": col(|s| s.done_ms - s.first_ms),
    });
    if let Some(r) = record {
        v["recording_run"] = json!({
            "to_first_instruction_ms": r.first_ms,
            "to_workload_end_ms": r.done_ms,
            "working_set_bytes": std::fs::metadata(&ws)?.len(),
        });
    }
    eprintln!(
        "  {mode}: first instruction {:.3} ms, workload end {:.3} ms (medians)",
        v["to_first_instruction_ms"]["median"]
            .as_f64()
            .unwrap_or(f64::NAN),
        v["to_workload_end_ms"]["median"]
            .as_f64()
            .unwrap_or(f64::NAN)
    );
    Ok(v)
}

struct Sample {
    load_ms: f64,
    first_ms: f64,
    done_ms: f64,
}

/// Drops a file's clean pages from the page cache.
fn drop_cache(path: &Path) {
    if let Ok(f) = std::fs::File::open(path) {
        // SAFETY: fadvise on an fd we own.
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    }
}

fn restore_once(
    spore: &Path,
    dir: &Path,
    mode: &str,
    a: &SnapshotBenchArgs,
) -> anyhow::Result<Sample> {
    let warm = a.warm;
    let (state, mem) = (dir.join("vm.state"), dir.join("vm.mem"));
    let marks = dir.join("marks.json");
    let _ = std::fs::remove_file(&marks);
    let vmm = Vmm::spawn(spore, &dir.join("restore.sock"), &marks, a.no_seccomp)?;
    if !warm {
        for f in [&mem, &state, &dir.join("vm.state.ws")] {
            drop_cache(f);
        }
    }
    let (backend, restore_mode) = match mode {
        "uffd" => ("Uffd", "lazy"),
        m => ("File", m),
    };
    let body = json!({
        "snapshot_path": state,
        "mem_backend": {"backend_type": backend, "backend_path": mem},
        "restore_mode": restore_mode,
        "resume_vm": true,
    })
    .to_string();
    let t0 = monotonic_ns();
    vmm.call("PUT", "/snapshot/load", &body)?;
    let load_ns = monotonic_ns() - t0;
    vmm.wait(Duration::from_secs(300))?;
    let list: Vec<Value> =
        serde_json::from_slice(&std::fs::read(&marks).context("reading marks")?)?;
    let at = |n: u64| {
        list.iter()
            .find(|m| m["mark"].as_u64() == Some(n))
            .and_then(|m| m["monotonic_ns"].as_u64())
            .with_context(|| format!("the guest recorded no mark {n}"))
    };
    let (m2, m3) = (at(2)?, at(3)?);
    Ok(Sample {
        load_ms: load_ns as f64 / 1e6,
        first_ms: m2.saturating_sub(t0) as f64 / 1e6,
        done_ms: m3.saturating_sub(t0) as f64 / 1e6,
    })
}
