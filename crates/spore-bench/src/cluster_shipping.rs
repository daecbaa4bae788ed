//! `spore bench cluster --shipping`: the first answer of a function on a
//! node that never ran it, when another node already made its snapshot
//! (fetched from that node and restored) against when none did (booted
//! cold). Two `spore serve --cluster` nodes, a and b, on this machine.
//! First, b drained (so that a runs everything), `--runs` fn-echo
//! functions deployed and first run on a (cold; snapshots written). Then,
//! b undrained, per round one of them first invoked on b (fetch +
//! restore) and another function deployed and first invoked on b with no
//! snapshot anywhere (cold boot, after asking a). b's invocations are sent
//! as a forwarding node sends them (the node-to-node endpoint with the
//! cluster key), so that they run on b, not where placement would put
//! them. Times are the client's, request sent to answer read, on a fresh
//! connection.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::bail;
use serde_json::json;

use crate::cluster_live::{scratch_dir, LiveCluster};
use crate::lambda_client::Conn;
use crate::serve::daemon::Daemon;
use crate::stats::summary;

/// One first invocation: client ms, the daemon's ms, its start path.
/// With a cluster key: sent as a forwarding node sends it (run on `d`).
fn first_invoke(
    d: &Daemon,
    name: &str,
    run_here_with_key: Option<&str>,
) -> anyhow::Result<(f64, f64, String)> {
    let mut c = Conn::open(&d.addr)?;
    let t = Instant::now();
    let r = match run_here_with_key {
        None => c.invoke(name, b"{}")?,
        Some(key) => c.request_with(
            "POST",
            &format!("/spore-cluster/v1/invoke/{name}?Qualifier=%24LATEST"),
            &[
                ("x-spore-cluster-key", key),
                ("x-spore-forwarded-by", "bench"),
            ],
            b"{}",
        )?,
    };
    let ms = t.elapsed().as_secs_f64() * 1e3;
    if r.status != 200 {
        bail!("invoke {name}: {}", crate::lambda_client::error_text(&r));
    }
    Ok((ms, r.server_us / 1e3, r.path))
}

fn wait_for_snapshot(state: &Path, name: &str) -> anyhow::Result<()> {
    let file = state.join(format!("snapshots/{name}-v1/vm.state"));
    let t = Instant::now();
    while !file.is_file() {
        if t.elapsed() > Duration::from_secs(30) {
            bail!("no snapshot of {name} within 30 s at {}", file.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Runs `rounds` rounds (one function restored, one booted, per round).
pub(crate) fn run(uk_dir: &Path, rounds: usize) -> anyhow::Result<serde_json::Value> {
    let echo = uk_dir.join("fn-echo");
    if !echo.exists() {
        bail!("no fn-echo in {} (make uk)", uk_dir.display());
    }
    let scratch = scratch_dir("ship")?;
    let result = measure(&scratch, &echo, rounds);
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

fn measure(scratch: &Path, echo: &Path, rounds: usize) -> anyhow::Result<serde_json::Value> {
    let cluster = LiveCluster::start(scratch, &["a", "b"])?;
    let (a, b) = (&cluster.nodes[0].1, &cluster.nodes[1].1);
    let drain = |node: &str, draining: bool| -> anyhow::Result<()> {
        spore_serve::cluster::set_draining_blocking(&cluster.config, node, draining)?;
        Ok(())
    };
    drain("b", true)?;
    // Every node reads the membership once a second.
    std::thread::sleep(Duration::from_secs(2));
    for i in 0..rounds {
        let shipped = format!("ship-{i}");
        a.deploy(&shipped, echo, 64)?;
        let (_, _, path) = first_invoke(a, &shipped, None)?;
        if path != "cold" {
            bail!("{shipped}'s first start on a was {path:?}, not cold");
        }
        wait_for_snapshot(&a.state, &shipped)?;
    }
    drain("b", false)?;
    std::thread::sleep(Duration::from_secs(2));
    let here = Some(cluster.key.as_str());
    let (mut restored, mut restored_server) = (Vec::new(), Vec::new());
    let (mut cold, mut cold_server) = (Vec::new(), Vec::new());
    let mut not_restored = 0;
    for i in 0..rounds {
        let shipped = format!("ship-{i}");
        let (ms, server_ms, path) = first_invoke(b, &shipped, here)?;
        if path == "restore" {
            restored.push(ms);
            restored_server.push(server_ms);
        } else {
            not_restored += 1;
        }
        let booted = format!("cold-{i}");
        b.deploy(&booted, echo, 64)?;
        let (ms, server_ms, path) = first_invoke(b, &booted, here)?;
        if path != "cold" {
            bail!("{booted}'s first start on b was {path:?}, not cold");
        }
        cold.push(ms);
        cold_server.push(server_ms);
    }
    if restored.is_empty() {
        bail!("no function was restored on b from a's snapshot");
    }
    Ok(json!({
        "rounds": rounds,
        "function": "fn-echo, 64 MiB",
        "fetch_and_restore_ms": summary(&restored),
        "fetch_and_restore_server_ms": summary(&restored_server),
        "cold_boot_ms": summary(&cold),
        "cold_boot_server_ms": summary(&cold_server),
        "not_restored": not_restored,
    }))
}
