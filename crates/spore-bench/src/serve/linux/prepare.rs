//! Invocations of a measured function: one timed invocation, and the
//! unmeasured ones that bring a function to its strategy's start path.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};

use super::disk::snapshot_dir;
use super::strategy::Strategy;
use crate::lambda_client::{Conn, Reply};

/// One invocation; a function error fails it. Returns the reply and the
/// client's own time (ms).
pub(super) fn invoke(conn: &mut Conn, name: &str, i: usize) -> anyhow::Result<(Reply, f64)> {
    let t = Instant::now();
    let r = conn.invoke(name, format!("{{\"i\":{i}}}").as_bytes())?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    if r.function_error {
        bail!(
            "{name} answered a function error: {}",
            String::from_utf8_lossy(&r.body)
        );
    }
    Ok((r, ms))
}

/// Invocations not measured until the next one takes the strategy's start
/// path: the function's snapshot written (and merged, for `merged`), its
/// working set recorded (`layered_ws`), its zygote made (`clone`); the last
/// one also fills the page cache for the first lukewarm sample.
pub(super) fn prepare(
    conn: &mut Conn,
    state: &Path,
    name: &str,
    s: Strategy,
) -> anyhow::Result<()> {
    const TRIES: usize = 8;
    let mut seen = Vec::new();
    for _ in 0..TRIES {
        let (r, ms) = invoke(conn, name, 0)?;
        eprintln!(
            "bench serve --linux: {name} {}: preparing: {} start, {ms:.0} ms",
            s.key(),
            r.path
        );
        seen.push(r.path.clone());
        let dir = snapshot_dir(state, name);
        match s {
            Strategy::ColdBoot => return Ok(()),
            Strategy::Merged if r.path != "cold" => {
                let merged = dir
                    .as_ref()
                    .is_some_and(|d| d.join("merged.json").is_file());
                if !merged {
                    bail!("{name}'s snapshot was not merged into a full one (see the daemon log)");
                }
                return Ok(());
            }
            Strategy::Layered if r.path == "restore" => {
                if dir.as_ref().is_none_or(|d| !d.join("layer.json").is_file()) {
                    bail!("{name}'s snapshot is not a diff on a base (see the daemon log)");
                }
                return Ok(());
            }
            Strategy::LayeredWs if r.path == "restore" => {
                // Written by that instance's VMM when it stopped.
                let ws = dir
                    .map(|d| d.join("vm.state.ws"))
                    .context("no snapshot directory")?;
                let deadline = Instant::now() + Duration::from_secs(120);
                while !ws.is_file() && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(200));
                }
                if !ws.is_file() {
                    bail!("no working set was recorded at {}", ws.display());
                }
                // One restore that reads it: the page cache as lukewarm
                // samples find it.
                let (r, _) = invoke(conn, name, 0)?;
                if r.path != "restore" {
                    bail!(
                        "a restore was expected after the working set, got a {} start",
                        r.path
                    );
                }
                return Ok(());
            }
            Strategy::Clone if r.path == "clone" => return Ok(()),
            Strategy::Warm if r.path == "warm" => return Ok(()),
            // The zygote is remade by a boot in the background.
            Strategy::Clone => std::thread::sleep(Duration::from_secs(2)),
            _ => {}
        }
    }
    bail!(
        "{name} did not reach a {} start in {TRIES} invocations (took: {})",
        s.path(),
        seen.join(", ")
    )
}
