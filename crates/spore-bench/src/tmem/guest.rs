//! `spore bench tmem`, guest side: boots the `tmem-bench` unikernel with the
//! VMM's tmem timing on (`spore run --tmem-timing --tmem-stats-file`).
//!
//! The guest times each call with the TSC around its `out` (the whole call as
//! the application sees it); the VMM times its handling of the same calls on
//! the vCPU thread. The difference is what the call costs beyond the VMM's
//! work: the exit and re-entry and the guest's request handling.

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{bail, ensure, Context};
use serde_json::{json, Value};

use crate::stats::{median, summary};

/// One VM's result lines (`name=value` pairs) and its final `GET /tmem`.
struct VmRun {
    lines: Vec<HashMap<String, u64>>,
    tmem: Value,
}

fn run_vm(spore: &Path, image: &Path, cmdline: &str, scratch: &Path) -> anyhow::Result<VmRun> {
    run_vm_with(spore, image, cmdline, scratch, false)
}

/// [`run_vm`], optionally without seccomp filters (`--no-seccomp`).
fn run_vm_with(
    spore: &Path,
    image: &Path,
    cmdline: &str,
    scratch: &Path,
    no_seccomp: bool,
) -> anyhow::Result<VmRun> {
    let stats_file = scratch.join("tmem-stats.json");
    let _ = std::fs::remove_file(&stats_file);
    let out = Command::new(spore)
        .args(["run", "--mem", "128M", "--tmem-timing", "--tmem-stats-file"])
        .arg(&stats_file)
        .args(no_seccomp.then_some("--no-seccomp"))
        .arg("--kernel")
        .arg(image)
        .args(["--cmdline", cmdline])
        .stdin(Stdio::null())
        .output()
        .context("spawning spore run")?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "tmem-bench ({cmdline}) failed ({}): {} {}",
            out.status,
            text.trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    ensure!(
        text.lines().any(|l| l.trim() == "tmem-bench: done"),
        "tmem-bench ({cmdline}) did not finish: {}",
        text.trim()
    );
    let lines = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("tmem-bench: "))
        .map(parse_pairs)
        .filter(|m| !m.is_empty())
        .collect();
    let tmem = serde_json::from_slice(
        &std::fs::read(&stats_file).context("reading the VMM's tmem stats file")?,
    )?;
    Ok(VmRun { lines, tmem })
}

fn parse_pairs(line: &str) -> HashMap<String, u64> {
    line.split_whitespace()
        .filter_map(|p| p.split_once('='))
        .filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
        .collect()
}

fn timing(tmem: &Value, op: &str, field: &str) -> anyhow::Result<u64> {
    tmem["timing"][op][field]
        .as_u64()
        .with_context(|| format!("the VMM reported no timing.{op}.{field}"))
}

/// 1 MiB put and get latency: guest total, VMM handling, the difference.
pub fn latency(
    spore: &Path,
    image: &Path,
    runs: usize,
    vm_runs: usize,
    scratch: &Path,
) -> anyhow::Result<Value> {
    let (mut put, mut get, mut vmm_put, mut vmm_get) = (vec![], vec![], vec![], vec![]);
    let mut vmm_calls = 0;
    for _ in 0..vm_runs {
        let r = run_vm(spore, image, &format!("mode=latency runs={runs}"), scratch)?;
        for l in &r.lines {
            if let (Some(p), Some(g)) = (l.get("put_1m_ns"), l.get("get_1m_ns")) {
                put.push(*p as f64 / 1e3);
                get.push(*g as f64 / 1e3);
            }
        }
        // The guest sends its warm-up calls as BATCH, so the VMM's put and
        // get timing covers exactly the calls the guest timed.
        vmm_put.push(timing(&r.tmem, "put", "median_ns")? as f64 / 1e3);
        vmm_get.push(timing(&r.tmem, "get", "median_ns")? as f64 / 1e3);
        vmm_calls += timing(&r.tmem, "put", "calls")?;
    }
    ensure!(
        put.len() == runs * vm_runs && vmm_calls == put.len() as u64,
        "tmem-bench printed {} results, the VMM timed {vmm_calls} puts, expected {}",
        put.len(),
        runs * vm_runs
    );
    let split = |guest: &[f64], vmm: &[f64]| {
        let (g, v) = (median(guest), median(vmm));
        json!({
            "guest_total_us": summary(guest),
            "vmm_handling_us": v,
            "exit_and_guest_us": g - v,
        })
    };
    Ok(json!({
        "runs": runs,
        "vm_runs": vm_runs,
        "put": split(&put, &vmm_put),
        "get": split(&get, &vmm_get),
        "seed_i5_8250u_us": {
            "note": "seed Table 4.1 (means): 'hypercall' = host backend + hypervisor, 'driver' = guest library",
            "put": { "total": 178, "hypercall": 117, "driver": 61 },
            "get": { "total": 124, "hypercall": 78, "driver": 46 },
        },
    }))
}

/// Seccomp's cost on tmem calls: 1 MiB put and get latency (guest total and
/// VMM handling) with the filters on and off, VMs alternating between the
/// two so that drift on the machine hits both alike.
pub fn seccomp_cost(
    spore: &Path,
    image: &Path,
    runs: usize,
    vm_runs: usize,
    scratch: &Path,
) -> anyhow::Result<Value> {
    // [on, off] x [guest put, guest get, vmm put, vmm get]
    let mut s: [[Vec<f64>; 4]; 2] = Default::default();
    for _ in 0..vm_runs {
        for (i, no_seccomp) in [false, true].into_iter().enumerate() {
            let r = run_vm_with(
                spore,
                image,
                &format!("mode=latency runs={runs}"),
                scratch,
                no_seccomp,
            )?;
            for l in &r.lines {
                if let (Some(p), Some(g)) = (l.get("put_1m_ns"), l.get("get_1m_ns")) {
                    s[i][0].push(*p as f64 / 1e3);
                    s[i][1].push(*g as f64 / 1e3);
                }
            }
            s[i][2].push(timing(&r.tmem, "put", "median_ns")? as f64 / 1e3);
            s[i][3].push(timing(&r.tmem, "get", "median_ns")? as f64 / 1e3);
        }
    }
    ensure!(
        s[0][0].len() == runs * vm_runs && s[1][0].len() == runs * vm_runs,
        "tmem-bench printed {} and {} results, expected {} each",
        s[0][0].len(),
        s[1][0].len(),
        runs * vm_runs
    );
    let side = |v: &[Vec<f64>; 4]| {
        json!({
            "put_guest_total_us": summary(&v[0]),
            "get_guest_total_us": summary(&v[1]),
            "put_vmm_handling_us": median(&v[2]),
            "get_vmm_handling_us": median(&v[3]),
        })
    };
    let pct = |on: &[f64], off: &[f64]| (median(on) / median(off) - 1.0) * 100.0;
    Ok(json!({
        "runs": runs,
        "vm_runs": vm_runs,
        "on": side(&s[0]),
        "off": side(&s[1]),
        "put_cost_pct": pct(&s[0][0], &s[1][0]),
        "get_cost_pct": pct(&s[0][1], &s[1][1]),
    }))
}

/// 4 KiB puts one call each vs `batch` per BATCH call: objects/s and exits.
pub fn batching(
    spore: &Path,
    image: &Path,
    objects: u64,
    batch: u64,
    rounds: usize,
    vm_runs: usize,
    scratch: &Path,
) -> anyhow::Result<Value> {
    let (mut single, mut batched) = (vec![], vec![]);
    let (mut single_calls, mut batched_calls) = (0u64, 0u64);
    let (mut vmm_put, mut vmm_batch) = (vec![], vec![]);
    let cmdline = format!("mode=batch runs={rounds} objects={objects} batch={batch}");
    for _ in 0..vm_runs {
        let r = run_vm(spore, image, &cmdline, scratch)?;
        let mut seen = 0usize;
        for l in &r.lines {
            let (Some(s), Some(b), Some(sc), Some(bc)) = (
                l.get("single_ns"),
                l.get("batched_ns"),
                l.get("single_calls"),
                l.get("batched_calls"),
            ) else {
                continue;
            };
            ensure!(*s > 0 && *b > 0, "tmem-bench reported a zero time");
            single.push(objects as f64 * 1e9 / *s as f64);
            batched.push(objects as f64 * 1e9 / *b as f64);
            (single_calls, batched_calls) = (*sc, *bc);
            seen += 1;
        }
        ensure!(
            seen == rounds,
            "tmem-bench printed {seen} rounds, expected {rounds}"
        );
        // The VMM's own count of calls (exits) must match the guest's.
        let (puts, batches) = (
            timing(&r.tmem, "put", "calls")?,
            timing(&r.tmem, "batch", "calls")?,
        );
        ensure!(
            puts == single_calls * rounds as u64 && batches == batched_calls * rounds as u64,
            "the VMM counted {puts} put and {batches} batch calls, the guest made {} and {}",
            single_calls * rounds as u64,
            batched_calls * rounds as u64
        );
        vmm_put.push(timing(&r.tmem, "put", "median_ns")? as f64 / 1e3);
        vmm_batch.push(timing(&r.tmem, "batch", "median_ns")? as f64 / 1e3);
    }
    let speedup = median(&batched) / median(&single);
    Ok(json!({
        "objects": objects,
        "batch": batch,
        "rounds": rounds * vm_runs,
        "single": {
            "objects_per_s": summary(&single),
            "exits": single_calls,
            "vmm_handling_us_per_call": median(&vmm_put),
        },
        "batched": {
            "objects_per_s": summary(&batched),
            "exits": batched_calls,
            "vmm_handling_us_per_call": median(&vmm_batch),
        },
        "exits_saved": single_calls.saturating_sub(batched_calls),
        "speedup": speedup,
        "target_speedup": 5.0,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_parse() {
        let m = parse_pairs("round=2 single_ns=10 x=y batched_calls=64");
        assert_eq!(m.get("round"), Some(&2));
        assert_eq!(m.get("batched_calls"), Some(&64));
        assert!(!m.contains_key("x"));
        assert!(parse_pairs("done").is_empty());
    }
}
