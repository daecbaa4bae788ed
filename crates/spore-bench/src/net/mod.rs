//! `spore bench net`: virtio-net on a tap, measured against the `httpd`
//! unikernel from the host: TCP throughput both ways, 1-byte ping-pong
//! latency over httpd's echo port, and keep-alive HTTP requests/s.
//!
//! The bench makes its own tap (a name and a 10.78.K.0/24 no host interface
//! uses), boots `httpd` on it through `spore vmm` and the API, runs the
//! clients of [`client`] `--runs` times against the same
//! VM, and removes the VMM and the tap at the end, also when a step fails.
//! It needs root (tap devices) and /dev/net/tun; it never touches another
//! interface.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use client::SINK_POST_BYTES;
use serde_json::{json, Value};

use crate::host::{loadavg, machine, uk_dir};
use crate::stats::{median, summary};
use crate::vmm::BenchVmm;

mod client;

#[derive(Args, Debug)]
pub struct NetBenchArgs {
    /// The `httpd` unikernel (default: `httpd` in `SPORE_UK_DIR`, else in
    /// this source tree's spore-uk build directory).
    #[arg(long)]
    pub uk: Option<PathBuf>,
    /// Length of each throughput window (each direction, each run).
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// Timed 1-byte round trips per run (after a tenth as many untimed).
    #[arg(long, default_value_t = 10_000)]
    pub pings: usize,
    /// Runs of every measurement (in the same VM); figures are medians.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Guest memory in MiB.
    #[arg(long, default_value_t = 128)]
    pub mem: u64,
}

/// httpd's ports in the bench.
const HTTP_PORT: u16 = 80;
const ECHO_PORT: u16 = 7;
/// The window of the HTTP request rate.
const HTTP_WINDOW: Duration = Duration::from_secs(2);

pub fn run(a: NetBenchArgs) -> anyhow::Result<u8> {
    if a.runs == 0 || a.seconds == 0 || a.pings == 0 {
        bail!("--runs, --seconds and --pings must be at least 1");
    }
    let uk = match &a.uk {
        Some(p) => p.clone(),
        None => uk_dir(&None).join("httpd"),
    };
    let uk = std::fs::canonicalize(&uk).unwrap_or(uk);
    if !uk.is_file() {
        bail!(
            "{} is missing: build the unikernel apps (make uk) or give --uk PATH",
            uk.display()
        );
    }
    require_tap_support()?;
    let spore = std::env::current_exe().context("locating the spore binary")?;
    let scratch = std::env::temp_dir().join(format!("spore-bench-net-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let result = (|| {
        let k = free_subnet()?;
        let tap = Tap::new(&format!("spbn{}", std::process::id()), k)?;
        bench(&spore, &uk, &a, &tap, &scratch)
        // The VMM is gone before the tap (dropped in `bench`).
    })();
    let _ = std::fs::remove_dir_all(&scratch);
    let out = result?;
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(0)
}

fn bench(
    spore: &Path,
    uk: &Path,
    a: &NetBenchArgs,
    tap: &Tap,
    scratch: &Path,
) -> anyhow::Result<Value> {
    let guest = tap.guest_ip();
    let vm = BenchVmm::spawn(spore, &scratch.join("net"))?;
    boot_httpd(&vm, uk, a.mem, tap)?;
    let http = SocketAddr::from((guest, HTTP_PORT));
    let echo = SocketAddr::from((guest, ECHO_PORT));
    client::wait_until_up(http, Duration::from_secs(10))?;

    let load_before = loadavg();
    let window = Duration::from_secs(a.seconds);
    let warmup = (a.pings / 10).max(100);
    let (mut tx, mut rx, mut posts, mut pings, mut reqs) = (vec![], vec![], vec![], vec![], vec![]);
    for run in 0..a.runs {
        let ctx = || format!("run {run}");
        tx.push(client::guest_to_host(http, window).with_context(ctx)?);
        let sink = client::host_to_guest(http, window).with_context(ctx)?;
        rx.push(sink.mib_s);
        posts.push(sink.posts);
        pings.push(client::ping_pong(echo, warmup, a.pings).with_context(ctx)?);
        reqs.push(client::http_requests(http, HTTP_WINDOW).with_context(ctx)?);
    }
    let load_after = loadavg();
    drop(vm);

    let ping_runs: Vec<Value> = pings.iter().map(|v| summary(v)).collect();
    let ping_median = |key: &str| {
        median(
            &ping_runs
                .iter()
                .map(|s| s[key].as_f64().unwrap_or(f64::NAN))
                .collect::<Vec<_>>(),
        )
    };
    let (p50, p99, mean) = (ping_median("p50"), ping_median("p99"), ping_median("mean"));
    let (tx_m, rx_m, req_m) = (median(&tx), median(&rx), median(&reqs));
    eprintln!(
        "net ({} runs, tap {}): guest→host {tx_m:.0} MiB/s, host→guest {rx_m:.0} MiB/s, \
         1-byte ping-pong p50 {p50:.1} µs p99 {p99:.1} µs mean {mean:.1} µs, \
         HTTP keep-alive {req_m:.0} requests/s",
        a.runs, tap.name
    );
    Ok(json!({
        "benchmark": "net",
        "guest": "unikernel (httpd: spore-uk virtio-net + smoltcp)",
        "machine": machine(),
        "host_loadavg_1min": { "before": load_before, "after": load_after },
        "host_clock_read_ns": client::clock_read_ns(),
        "parameters": {
            "runs": a.runs,
            "seconds": a.seconds,
            "pings": a.pings,
            "ping_warmup": warmup,
            "http_seconds": HTTP_WINDOW.as_secs(),
            "sink_post_bytes": SINK_POST_BYTES,
            "mem_mib": a.mem,
            "vcpus": 1,
            "tap": tap.name,
            "guest_ip": guest.to_string(),
            "uk": uk.display().to_string(),
        },
        "guest_to_host_mib_per_s": over_runs(&tx),
        "host_to_guest_mib_per_s": over_runs(&rx),
        "host_to_guest_posts_per_run": posts,
        "ping_pong_us": {
            "per_run": ping_runs,
            "median_over_runs": { "p50": p50, "p99": p99, "mean": mean },
        },
        "http_requests_per_s": over_runs(&reqs),
    }))
}

/// Boots `httpd` on the tap (its HTTP and echo ports) and waits for it
/// to listen.
fn boot_httpd(vm: &BenchVmm, uk: &Path, mem_mib: u64, tap: &Tap) -> anyhow::Result<()> {
    let guest = tap.guest_ip();
    vm.api(
        "PUT",
        "/boot-source",
        &json!({
            "kernel_image_path": uk,
            "boot_args": format!(
                "ip={guest}/24 gw={} port={HTTP_PORT} echo={ECHO_PORT} conns=4",
                tap.host_ip()
            ),
        })
        .to_string(),
    )?;
    vm.api(
        "PUT",
        "/machine-config",
        &json!({"vcpu_count": 1, "mem_size_mib": mem_mib}).to_string(),
    )?;
    vm.api(
        "PUT",
        "/network-interfaces/eth0",
        &json!({"iface_id": "eth0", "host_dev_name": tap.name, "guest_mac": tap.guest_mac()})
            .to_string(),
    )?;
    vm.api("PUT", "/actions", r#"{"action_type": "InstanceStart"}"#)?;
    vm.expect("httpd: listening on", Duration::from_secs(30))
        .context("booting httpd")?;
    Ok(())
}

/// The summary of per-run figures, with the figures.
fn over_runs(v: &[f64]) -> Value {
    let mut s = summary(v);
    s["per_run"] = json!(v);
    s
}

/// Root and /dev/net/tun, checked before anything is made.
fn require_tap_support() -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        bail!("spore bench net makes a tap device: run it as root");
    }
    if !Path::new("/dev/net/tun").exists() {
        bail!("spore bench net needs /dev/net/tun (modprobe tun) for its tap device");
    }
    Ok(())
}

/// Runs `ip ARGS`; fails with its stderr.
fn ip(args: &[&str]) -> anyhow::Result<String> {
    let o = Command::new("ip")
        .args(args)
        .output()
        .context("running ip (iproute2)")?;
    if !o.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

/// A K for 10.78.K.0/24 that no host address is in (from the process id,
/// so parallel benches differ).
#[allow(
    clippy::cast_possible_truncation,
    reason = "x % 250 + 1 is in 1..=250, so it fits a u8"
)]
fn free_subnet() -> anyhow::Result<u8> {
    let used = ip(&["-4", "-o", "addr", "show"])?;
    let start = std::process::id() % 250;
    (0..250)
        .map(|i| ((start + i) % 250 + 1) as u8)
        .find(|k| !used.contains(&format!(" 10.78.{k}.")))
        .context("every 10.78.K.0/24 is in use on this host")
}

/// The bench's tap, host address 10.78.K.1/24, deleted on drop.
struct Tap {
    name: String,
    k: u8,
}

impl Tap {
    fn new(name: &str, k: u8) -> anyhow::Result<Tap> {
        ip(&["tuntap", "add", "dev", name, "mode", "tap"])?;
        let tap = Tap {
            name: name.to_string(),
            k,
        };
        ip(&["addr", "add", &format!("{}/24", tap.host_ip()), "dev", name])?;
        ip(&["link", "set", name, "up"])?;
        Ok(tap)
    }

    fn host_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 78, self.k, 1)
    }

    fn guest_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 78, self.k, 2)
    }

    /// Locally administered, unicast, naming the subnet.
    fn guest_mac(&self) -> String {
        format!("06:00:0a:4e:{:02x}:02", self.k)
    }
}

impl Drop for Tap {
    fn drop(&mut self) {
        if let Err(e) = ip(&["link", "del", &self.name]) {
            eprintln!("net: removing tap {}: {e:#}", self.name);
        }
    }
}
