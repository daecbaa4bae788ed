//! `spore bench sandbox`: the sandbox API's lifecycle, timed from its own
//! client over loopback against a `spore serve --sandbox-listen` it starts
//! with one template: create (a clone of the template's zygote), a command's
//! round trip through the proxy (`commands.run("true")`: envd's
//! `process.Process/Start`, streamed until the process ends), pause and
//! resume, fork ×N; memory per running and per paused sandbox. Beside each
//! fork, the way E2B forks and resumes (a snapshot of the sandbox, then its
//! restore: here a pause and a resume of the same sandbox, in the same run).
//!
//! Sandboxes are Linux guests: on hosts without hardware virtualization
//! this runs in the nested tier (tests/nested/scenarios/sandbox-envd.sh).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use clap::Args;
use serde_json::{json, Value};

use crate::lambda_client::Conn;
use crate::serve::daemon::Daemon;
use crate::stats::summary;
use crate::vmm::BenchVmm;

#[derive(Args, Debug)]
pub struct SandboxBenchArgs {
    /// The sandbox template (`spore serve --sandbox-template`'s TOML).
    #[arg(long)]
    template: PathBuf,
    /// Samples of each measurement.
    #[arg(long, default_value_t = 10)]
    runs: usize,
    /// Fork counts to time (one request each).
    #[arg(long, value_delimiter = ',', default_value = "1,20,100")]
    forks: Vec<u32>,
    /// The daemon's state directory (default: a temporary one, removed).
    #[arg(long)]
    state_dir: Option<PathBuf>,
}

/// A sandbox as the create answer names it.
struct Sbx {
    id: String,
    token: String,
}

/// The sandbox API over one keep-alive connection (no key: the daemon runs
/// without `--auth`).
struct Api {
    conn: Conn,
    addr: String,
}

impl Api {
    fn call(&mut self, method: &str, path: &str, body: &Value) -> anyhow::Result<(u16, Value)> {
        let bytes = if body.is_null() {
            Vec::new()
        } else {
            body.to_string().into_bytes()
        };
        let r = self.conn.request_with(
            method,
            path,
            &[("Content-Type", "application/json")],
            &bytes,
        )?;
        let v = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
        Ok((r.status, v))
    }

    fn expect(
        &mut self,
        method: &str,
        path: &str,
        body: &Value,
        status: u16,
    ) -> anyhow::Result<Value> {
        let (got, v) = self.call(method, path, body)?;
        if got != status {
            bail!("{method} {path}: {got}: {v}");
        }
        Ok(v)
    }

    fn create(&mut self, template: &str) -> anyhow::Result<Sbx> {
        let v = self.expect(
            "POST",
            "/v2/sandboxes",
            &json!({ "templateID": template, "timeout": 3600 }),
            201,
        )?;
        sbx_of(&v)
    }

    fn kill(&mut self, id: &str) -> anyhow::Result<()> {
        self.expect("DELETE", &format!("/sandboxes/{id}"), &Value::Null, 204)
            .map(drop)
    }
}

fn sbx_of(v: &Value) -> anyhow::Result<Sbx> {
    Ok(Sbx {
        id: v["sandboxID"].as_str().context("no sandboxID")?.to_string(),
        token: v["envdAccessToken"]
            .as_str()
            .context("no envdAccessToken")?
            .to_string(),
    })
}

/// `commands.run("true")` as the SDK sends it: a Connect server stream
/// (`application/connect+json`, one enveloped message), read until the
/// stream's end; `Err` unless the process ended with exit code 0.
fn run_true(addr: &str, s: &Sbx) -> anyhow::Result<()> {
    let msg = json!({ "process": { "cmd": "/bin/true", "args": [] } }).to_string();
    let mut body = vec![0u8];
    body.extend_from_slice(&u32::try_from(msg.len())?.to_be_bytes());
    body.extend_from_slice(msg.as_bytes());
    let head = format!(
        "POST /process.Process/Start HTTP/1.1\r\nHost: {addr}\r\nE2b-Sandbox-Id: {}\r\nE2b-Sandbox-Port: 49983\r\nX-Access-Token: {}\r\nContent-Type: application/connect+json\r\nConnect-Protocol-Version: 1\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        s.id,
        s.token,
        body.len()
    );
    let mut stream = TcpStream::connect(addr)?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(Duration::from_secs(120)))?;
    stream.write_all(head.as_bytes())?;
    stream.write_all(&body)?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer)?;
    let text = String::from_utf8_lossy(&answer);
    // The stream's `end` event; its exit code is left out when 0 (proto3
    // JSON omits defaults); an error ends the stream with `"error"`.
    let ended = text.contains("\"end\"") && !text.contains("\"error\"");
    let zero = text.contains("exit status 0") || !text.contains("\"exitCode\"");
    if !(text.starts_with("HTTP/1.1 200") && ended && zero) {
        bail!(
            "commands.run(\"true\"): {}",
            text.chars().take(300).collect::<String>()
        );
    }
    Ok(())
}

/// PSS (KiB) of every process whose command line names `state` (the
/// daemon's VMMs: zygotes, clones, restored sandboxes).
fn vmm_pss_kib(state: &Path) -> u64 {
    let marker = state.display().to_string();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&marker))
        })
        .filter(|&pid| {
            // The daemon itself is not a VMM.
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.split(|&b| b == 0).nth(1) == Some(b"vmm"))
        })
        .filter_map(crate::procfs::pss_kib)
        .sum()
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}

/// The template's name: its file's `name = "..."` line (the daemon checks
/// the whole file when it starts).
fn template_name(path: &Path) -> anyhow::Result<String> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .filter_map(|l| l.split_once('='))
        .find(|(k, _)| k.trim() == "name")
        .map(|(_, v)| v.trim().trim_matches('"').to_string())
        .with_context(|| format!("{} names no template name", path.display()))
}

pub fn run(a: SandboxBenchArgs) -> anyhow::Result<u8> {
    let name = template_name(&a.template)?;
    let temp = tempdir()?;
    let state = a.state_dir.clone().unwrap_or_else(|| temp.join("state"));
    let template = a.template.canonicalize()?;
    let daemon = Daemon::start(
        &state,
        &[
            "--sandbox-listen",
            "127.0.0.1:0",
            "--sandbox-template",
            template
                .to_str()
                .context("a template path that is not UTF-8")?,
        ],
    )?;
    let addr = daemon
        .sandbox_addr
        .clone()
        .context("the daemon announced no sandbox_listen")?;
    let mut api = Api {
        conn: Conn::open(&addr)?,
        addr: addr.clone(),
    };
    let runs = a.runs.max(1);

    // The first create waits for the zygote's boot.
    let t = Instant::now();
    let first = api.create(&name)?;
    let first_create_ms = ms(t);
    let zygote_pss = {
        api.kill(&first.id)?;
        vmm_pss_kib(&state)
    };

    let mut create = Vec::new();
    let mut sandboxes = Vec::new();
    for _ in 0..runs {
        let t = Instant::now();
        sandboxes.push(api.create(&name)?);
        create.push(ms(t));
    }
    let running_pss = vmm_pss_kib(&state);
    let per_running_kib = running_pss.saturating_sub(zygote_pss) as f64 / runs as f64;

    let s = sandboxes.remove(0);
    for other in sandboxes.drain(..) {
        api.kill(&other.id)?;
    }
    let mut round_trip = Vec::new();
    for _ in 0..runs {
        let t = Instant::now();
        if let Err(e) = run_true(&api.addr, &s) {
            // What the sandbox's VMM said, for the error.
            let log = sandbox_log(&state.join("sbx").join(&s.id));
            bail!("{e:#}; the sandbox's VMM log ends: {log}");
        }
        round_trip.push(ms(t));
    }

    let p = time_pauses(&mut api, &state, &s, runs)?;
    let (pause, resume) = (&p.all_ms, &p.resume_ms);
    let restore = time_restores(&state, runs)?;

    let (forks, fork_errors) = time_forks(&mut api, &s, &a.forks, runs)?;
    api.kill(&s.id)?;
    drop(daemon);
    if a.state_dir.is_none() {
        let _ = std::fs::remove_dir_all(&temp);
    }

    let p50 = |v: &[f64]| crate::stats::median(v);
    let fork1 = forks
        .get("x1")
        .and_then(|v| v["p50"].as_f64())
        .unwrap_or(f64::NAN);
    let snapshot_restore = p50(pause) + p50(resume);
    let report = json!({
        "bench": "sandbox",
        "template": name,
        "runs": runs,
        "host_cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "first_create_ms": first_create_ms,
        "create_clone_ms": summary(&create),
        "e2b_way_create_as_restore_of_the_template_ms": summary(&restore),
        "command_round_trip_ms": summary(&round_trip),
        "pause_ms": summary(pause),
        "pause_diff_ms": summary(&p.diff_ms),
        "pause_full_ms": summary(&p.full_ms),
        "resume_ms": summary(resume),
        "fork_ms": forks,
        "fork_errors": fork_errors,
        "e2b_way_fork_as_snapshot_restore_ms": snapshot_restore,
        "fork_x1_speedup_over_snapshot_restore": snapshot_restore / fork1,
        "pause_diff_kib_on_disk": summary(&p.diff_kib),
        "pause_full_kib_on_disk": summary(&p.full_kib),
        "template_base_kib_on_disk": base_kib(&state),
        "host_pss_kib_per_running_sandbox": per_running_kib,
        "host_pss_kib_freed_by_a_pause": summary(&p.freed_pss_kib),
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    if !report["fork_errors"].as_array().is_none_or(Vec::is_empty) {
        eprintln!("sandbox: forks failed: {}", report["fork_errors"]);
    }
    eprintln!(
        "sandbox: create {:.0} ms (restore of the base {:.0} ms), command {:.1} ms, pause {:.0} ms, resume {:.0} ms, fork x1 {:.0} ms (snapshot+restore {:.0} ms), {:.0} KiB per running sandbox (p50)",
        p50(&create),
        p50(&restore),
        p50(&round_trip),
        p50(pause),
        p50(resume),
        fork1,
        snapshot_restore,
        per_running_kib
    );
    Ok(0)
}

/// Fork requests of each count (`runs` of a single fork, two of more):
/// their times, and the errors of forks that did not start (a request
/// whose forks did not all start is not timed).
fn time_forks(
    api: &mut Api,
    s: &Sbx,
    counts: &[u32],
    runs: usize,
) -> anyhow::Result<(serde_json::Map<String, Value>, Vec<Value>)> {
    let mut forks = serde_json::Map::new();
    let mut fork_errors = Vec::new();
    for &count in counts {
        let mut times = Vec::new();
        for _ in 0..runs.min(if count > 1 { 2 } else { runs }) {
            let t = Instant::now();
            let v = api.expect(
                "POST",
                &format!("/sandboxes/{}/fork", s.id),
                &json!({ "count": count, "timeout": 3600 }),
                201,
            )?;
            let took = ms(t);
            let list = v.as_array().context("fork answered no list")?;
            let mut all = true;
            for r in list {
                match sbx_of(&r["sandbox"]) {
                    Ok(f) => api.kill(&f.id)?,
                    Err(_) => {
                        all = false;
                        fork_errors.push(r["error"].clone());
                    }
                }
            }
            if all {
                times.push(took);
            }
        }
        forks.insert(format!("x{count}"), summary(&times));
    }
    Ok((forks, fork_errors))
}

/// The last lines of the VMM logs in a sandbox's directory.
fn sandbox_log(dir: &Path) -> String {
    let mut out = String::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_name().to_string_lossy().ends_with(".log") {
            let text = std::fs::read_to_string(e.path()).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(12).collect();
            out.push_str(&tail.into_iter().rev().collect::<Vec<_>>().join(" | "));
        }
    }
    out
}

/// Pauses and resumes of one sandbox: times, what each wrote, what each
/// gave back.
#[derive(Default)]
struct Pauses {
    all_ms: Vec<f64>,
    /// Diffs (on the template base or the sandbox's last pause) and full
    /// snapshots (every 5th pause in a row, the way E2B pauses every time).
    diff_ms: Vec<f64>,
    full_ms: Vec<f64>,
    diff_kib: Vec<f64>,
    full_kib: Vec<f64>,
    resume_ms: Vec<f64>,
    freed_pss_kib: Vec<f64>,
}

fn time_pauses(api: &mut Api, state: &Path, s: &Sbx, runs: usize) -> anyhow::Result<Pauses> {
    let mut p = Pauses::default();
    let dir = state.join("sbx").join(&s.id);
    for _ in 0..runs {
        let before = vmm_pss_kib(state);
        let t = Instant::now();
        api.expect(
            "POST",
            &format!("/sandboxes/{}/pause", s.id),
            &Value::Null,
            204,
        )?;
        let took = ms(t);
        p.all_ms.push(took);
        p.freed_pss_kib
            .push(before.saturating_sub(vmm_pss_kib(state)) as f64);
        // The record says which pause this was (a full one starts the
        // chain again: no base, one layer).
        let rec: Value = serde_json::from_slice(&std::fs::read(dir.join("sandbox.json"))?)?;
        let generation = rec["pause_generation"].as_u64().unwrap_or(0);
        let kib = disk_kib(&dir.join(format!("pause-{generation}.mem")));
        let full = rec["base"].is_null() && rec["layers"].as_array().is_some_and(|l| l.len() == 1);
        if full {
            p.full_ms.push(took);
            p.full_kib.push(kib);
        } else {
            p.diff_ms.push(took);
            p.diff_kib.push(kib);
        }
        let t = Instant::now();
        api.expect(
            "POST",
            &format!("/v2/sandboxes/{}/connect", s.id),
            &json!({ "timeout": 3600 }),
            201,
        )?;
        p.resume_ms.push(ms(t));
        run_true(&api.addr, s)?;
    }
    Ok(p)
}

/// Creates the way E2B does, for comparison: the template base (the
/// snapshot of the zygote the daemon wrote) restored in a new VMM, its
/// disk as a clone's and a fresh identity, timed from the VMM's start to
/// envd's answer over vsock.
fn time_restores(state: &Path, runs: usize) -> anyhow::Result<Vec<f64>> {
    let base = newest_base(state).context("no template base was written")?;
    let spore = std::env::current_exe().context("locating the spore binary")?;
    let mut times = Vec::new();
    for i in 1..=runs {
        let dir = state.join("bench-restore");
        let t = Instant::now();
        let vmm = BenchVmm::spawn(&spore, &dir)?;
        let load = json!({
            "snapshot_path": base,
            "mem_file_path": base.with_extension("mem"),
            "resume_vm": true,
            "vsock_override": { "uds_path": vmm.vsock_uds() },
            "clone_disks": { "dir": dir, "name": "restored" },
            "clone_generation": i,
        });
        vmm.api("PUT", "/snapshot/load", &load.to_string())?;
        vmm.block_on(spore_serve::sandboxes::envd::wait_healthy(
            vmm.vsock_uds(),
            Duration::from_secs(120),
        ))?;
        times.push(ms(t));
        drop(vmm);
    }
    Ok(times)
}

/// The template base written last: the daemon keeps them in
/// `<state>/sbx-bases/<template>.<account>/*.state`.
fn newest_base(state: &Path) -> Option<PathBuf> {
    std::fs::read_dir(state.join("sbx-bases"))
        .ok()?
        .flatten()
        .flat_map(|dir| {
            std::fs::read_dir(dir.path())
                .into_iter()
                .flatten()
                .flatten()
        })
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "state"))
        .max_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
}

/// KiB on disk of the newest template base's memory file.
fn base_kib(state: &Path) -> f64 {
    newest_base(state).map_or(0.0, |b| disk_kib(&b.with_extension("mem")))
}

/// KiB a file holds on disk (sparse files: their data only).
fn disk_kib(path: &Path) -> f64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).map_or(0.0, |m| (m.blocks() * 512) as f64 / 1024.0)
}

/// A private temporary directory (short: the daemon's socket paths must fit).
fn tempdir() -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("spore-bsbx-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
