//! `spore bench cluster --failover`: what a node's death costs the
//! invocations of the functions it ran. Three `spore serve --cluster` nodes
//! on this machine; per round a fresh fn-echo function is deployed and
//! warmed through every node (its instances gather on one node, which
//! placement sends them to), then a client invokes it without pause
//! through the two other nodes, in turn, while the warm node is killed
//! with SIGKILL. Reported per round: the time from the kill to the first
//! answer from an invocation run on another node, the invocations that
//! failed, and the longest an invocation answered after the kill took
//! (one in flight at the kill included). The killed node is started again
//! (on its state directory) before the next round.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use serde_json::json;

use crate::cluster_live::{scratch_dir, LiveCluster};
use crate::lambda_client::Conn;
use crate::stats::summary;

/// How long the client keeps invoking after the kill.
const AFTER_KILL: Duration = Duration::from_secs(3);

/// Runs `rounds` kills.
pub(crate) fn run(uk_dir: &Path, rounds: usize) -> anyhow::Result<serde_json::Value> {
    let echo = uk_dir.join("fn-echo");
    if !echo.exists() {
        bail!("no fn-echo in {} (make uk)", uk_dir.display());
    }
    let scratch = scratch_dir("failover")?;
    let result = measure(&scratch, &echo, rounds);
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

/// One client invocation: when it was sent (since `t0`), how long it took,
/// whether it answered 200, the node that ran it.
struct Sample {
    sent: Duration,
    took: Duration,
    ok: bool,
    node: String,
}

fn measure(scratch: &Path, echo: &Path, rounds: usize) -> anyhow::Result<serde_json::Value> {
    let mut cluster = LiveCluster::start(scratch, &["n1", "n2", "n3"])?;
    let (mut recovery, mut failed_total, mut slowest) = (Vec::new(), 0u64, Vec::new());
    let mut per_round = Vec::new();
    for round in 0..rounds {
        let name = format!("fo-{round}");
        cluster.nodes[0].1.deploy(&name, echo, 64)?;
        // Warm through every node.
        for (_, d) in &cluster.nodes {
            let mut c = Conn::open(&d.addr)?;
            for _ in 0..20 {
                let r = c.invoke(&name, b"{}")?;
                if r.status != 200 {
                    bail!("warm-up: {}", crate::lambda_client::error_text(&r));
                }
            }
        }
        // Every node reads what the others hold once a second: then an
        // invocation through any node names the warm one.
        std::thread::sleep(Duration::from_secs(2));
        let holder = Conn::open(&cluster.nodes[0].1.addr)?
            .invoke(&name, b"{}")?
            .node;
        let victim = cluster
            .nodes
            .iter()
            .position(|(id, _)| *id == holder)
            .context("the warm node is none of the three")?;
        let others: Vec<String> = (0..cluster.nodes.len())
            .filter(|&i| i != victim)
            .map(|i| cluster.nodes[i].1.addr.clone())
            .collect();
        let stop = AtomicBool::new(false);
        let t0 = Instant::now();
        let (samples, killed_at, state) = std::thread::scope(|s| {
            let client = s.spawn(|| -> anyhow::Result<Vec<Sample>> {
                let mut conns: Vec<Conn> = others
                    .iter()
                    .map(|a| Conn::open(a))
                    .collect::<Result<_, _>>()?;
                let mut out = Vec::new();
                let mut i = 0;
                while !stop.load(Ordering::Acquire) {
                    let sent = t0.elapsed();
                    let k = i % conns.len();
                    let (ok, node) = match conns[k].invoke(&name, b"{}") {
                        Ok(r) => (r.status == 200, r.node),
                        Err(_) => {
                            conns[k] = Conn::open(&others[k])?;
                            (false, String::new())
                        }
                    };
                    out.push(Sample {
                        sent,
                        took: t0.elapsed() - sent,
                        ok,
                        node,
                    });
                    i += 1;
                }
                Ok(out)
            });
            std::thread::sleep(Duration::from_millis(500));
            let (_, daemon) = cluster.nodes.remove(victim);
            let killed_at = t0.elapsed();
            let state = daemon.kill9();
            std::thread::sleep(AFTER_KILL);
            stop.store(true, Ordering::Release);
            let samples = client
                .join()
                .map_err(|_| anyhow::anyhow!("the client panicked"));
            (samples, killed_at, state)
        });
        let samples = samples??;
        // Answered after the kill (one in flight at the kill included).
        let after: Vec<&Sample> = samples
            .iter()
            .filter(|s| s.sent + s.took >= killed_at)
            .collect();
        let first_ok = after
            .iter()
            .find(|s| s.ok && s.node != holder)
            .map(|s| (s.sent + s.took - killed_at).as_secs_f64() * 1e3)
            .context("no invocation succeeded on another node after the kill")?;
        let failed = after.iter().filter(|s| !s.ok).count() as u64;
        let slow = after
            .iter()
            .filter(|s| s.sent < killed_at + Duration::from_secs(1))
            .map(|s| s.took.as_secs_f64() * 1e3)
            .fold(0.0, f64::max);
        recovery.push(first_ok);
        slowest.push(slow);
        failed_total += failed;
        per_round.push(json!({
            "killed": holder, "first_answer_after_kill_ms": first_ok,
            "failed": failed, "longest_answer_after_kill_ms": slow,
            "invocations": samples.len(),
        }));
        let id = ["n1", "n2", "n3"]
            .into_iter()
            .find(|id| *id == holder)
            .context("node id")?;
        cluster
            .nodes
            .insert(victim, (id, cluster.restart(id, &state)?));
        std::thread::sleep(Duration::from_secs(2));
    }
    Ok(json!({
        "rounds": rounds,
        "first_answer_after_kill_ms": summary(&recovery),
        "longest_answer_after_kill_ms": summary(&slowest),
        "failed": failed_total,
        "per_round": per_round,
    }))
}
