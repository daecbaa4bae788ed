//! `spore mem SOCK [--set SIZE [--wait [--timeout S]]]`: show or change the
//! target size of a running VM's virtio-mem device.
//!
//! Without `--set` it prints `GET /hotplug/memory`. With `--set` it sends
//! `PATCH /hotplug/memory`; `--wait` then polls until the guest has plugged
//! or unplugged its way to the target (`plugged_size_mib ==
//! requested_size_mib`) and prints the final status with the time it took.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use spore_vmm::config::parse_size;

use crate::api_client::request;

#[derive(Args, Debug)]
pub struct MemArgs {
    /// The VMM's API socket.
    pub socket: PathBuf,
    /// New target size of the hotplug memory, e.g. 1G or 512M (a multiple
    /// of the device's block size; 0 unplugs everything).
    #[arg(long)]
    pub set: Option<String>,
    /// Wait until the guest reaches the target.
    #[arg(long, requires = "set")]
    pub wait: bool,
    /// Give up waiting after this many seconds (exit status 1).
    #[arg(long, default_value_t = 60.0, requires = "wait")]
    pub timeout: f64,
}

fn status(socket: &std::path::Path) -> anyhow::Result<serde_json::Value> {
    let (code, body) = request(socket, "GET", "/hotplug/memory", "")?;
    if code >= 400 {
        bail!("GET /hotplug/memory -> HTTP {code}: {}", body.trim());
    }
    serde_json::from_str(&body).context("GET /hotplug/memory: malformed JSON")
}

fn field(v: &serde_json::Value, name: &str) -> anyhow::Result<u64> {
    v.get(name)
        .and_then(serde_json::Value::as_u64)
        .with_context(|| format!("GET /hotplug/memory: no {name} in {v}"))
}

pub fn run(a: MemArgs) -> anyhow::Result<u8> {
    let Some(set) = a.set else {
        println!("{}", status(&a.socket)?);
        return Ok(0);
    };
    let bytes = parse_size(&set).with_context(|| format!("--set {set:?}"))?;
    if !bytes.is_multiple_of(1 << 20) {
        bail!("--set {set}: the size must be a whole number of MiB");
    }
    let mib = bytes >> 20;
    let start = Instant::now();
    let (code, body) = request(
        &a.socket,
        "PATCH",
        "/hotplug/memory",
        &format!("{{\"requested_size_mib\":{mib}}}"),
    )?;
    if code >= 400 {
        bail!("PATCH /hotplug/memory -> HTTP {code}: {}", body.trim());
    }
    if !a.wait {
        return Ok(0);
    }
    if !(a.timeout.is_finite() && a.timeout >= 0.0) {
        bail!("--timeout must be a non-negative number of seconds");
    }
    let deadline = Duration::from_secs_f64(a.timeout.min(1e6));
    loop {
        let s = status(&a.socket)?;
        if field(&s, "plugged_size_mib")? == field(&s, "requested_size_mib")? {
            let ms = start.elapsed().as_secs_f64() * 1e3;
            println!("{s}");
            eprintln!("spore mem: reached {mib} MiB in {ms:.1} ms");
            return Ok(0);
        }
        if start.elapsed() >= deadline {
            eprintln!("spore mem: timed out after {:.1} s: {s}", a.timeout);
            return Ok(1);
        }
        // 10 ms, as the peer figures were polled: every GET costs the host
        // (and, nested, the guest) CPU time.
        std::thread::sleep(Duration::from_millis(10));
    }
}
