//! `spore bench cluster --forwarding`: what forwarding an invocation to a
//! function's owner costs. Three `spore serve --cluster` nodes on this
//! machine (loopback) and one etcd (Debian's `etcd-server`); fn-echo
//! deployed; after a warm-up through every node, sequential invocations
//! over one kept-alive connection, through an owner (run there) and through
//! the node that is no owner (forwarded), alternating in rounds so that
//! both see the same machine.

use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Context as _};
use serde_json::json;

use crate::cluster_live::{scratch_dir, LiveCluster};
use crate::lambda_client::Conn;
use crate::stats::summary;

/// Invocations per round through each node; rounds alternate the two.
const ROUND: usize = 100;

/// Runs the bench; `runs` invocations through each of the two nodes.
pub(crate) fn run(uk_dir: &Path, runs: usize) -> anyhow::Result<serde_json::Value> {
    let echo = uk_dir.join("fn-echo");
    if !echo.exists() {
        bail!("no fn-echo in {} (make uk)", uk_dir.display());
    }
    let scratch = scratch_dir("fwd")?;
    let result = measure(&scratch, &echo, runs);
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

fn measure(scratch: &Path, echo: &Path, runs: usize) -> anyhow::Result<serde_json::Value> {
    let cluster = LiveCluster::start(scratch, &["n1", "n2", "n3"])?;
    let nodes = &cluster.nodes;
    nodes[0].1.deploy("fwd", echo, 64)?;
    let mut conns = Vec::new();
    let mut ran_on = Vec::new();
    for (_, d) in nodes {
        let mut c = Conn::open(&d.addr)?;
        let mut last = String::new();
        for _ in 0..50 {
            let r = c.invoke("fwd", b"{}")?;
            if r.status != 200 {
                bail!("warm-up invoke: {}", crate::lambda_client::error_text(&r));
            }
            last = r.node;
        }
        ran_on.push(last);
        conns.push(c);
    }
    let owner = (0..3)
        .find(|&i| ran_on[i] == nodes[i].0)
        .context("no node ran it itself")?;
    let outsider = (0..3)
        .find(|&i| ran_on[i] != nodes[i].0)
        .context("every node owns it")?;
    let (mut direct, mut forwarded) = (Vec::new(), Vec::new());
    while direct.len() < runs {
        for (i, out) in [(owner, &mut direct), (outsider, &mut forwarded)] {
            for _ in 0..ROUND.min(runs - out.len()) {
                let t = Instant::now();
                let r = conns[i].invoke("fwd", b"{}")?;
                let ms = t.elapsed().as_secs_f64() * 1e3;
                if r.status != 200 {
                    bail!("invoke: {}", crate::lambda_client::error_text(&r));
                }
                out.push(ms);
            }
        }
    }
    let p = |v: &[f64], q| crate::stats::percentile(v, q);
    Ok(json!({
        "owner": nodes[owner].0,
        "outsider": nodes[outsider].0,
        "outsider_ran_on": ran_on[outsider],
        "runs": runs,
        "direct_ms": summary(&direct),
        "forwarded_ms": summary(&forwarded),
        "forwarding_adds_ms": {
            "p50": p(&forwarded, 0.5) - p(&direct, 0.5),
            "p99": p(&forwarded, 0.99) - p(&direct, 0.99),
        },
    }))
}
