//! `spore bench cluster --forwarding`: what forwarding an invocation to a
//! function's owner costs. Three `spore serve --cluster` nodes on this
//! machine (loopback) and one etcd (Debian's `etcd-server`); fn-echo
//! deployed; after a warm-up through every node, sequential invocations
//! over one kept-alive connection, through an owner (run there) and through
//! the node that is no owner (forwarded), alternating in rounds so that
//! both see the same machine. The CPU cap is off (`--no-cpu-cap`): a 64 MiB
//! function's cap would throttle a tight loop and measure the cap.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use serde_json::json;

use crate::lambda_client::Conn;
use crate::serve::daemon::Daemon;
use crate::stats::summary;

/// Invocations per round through each node; rounds alternate the two.
const ROUND: usize = 100;

fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// etcd for the bench, killed on drop.
struct Etcd(Child);

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_etcd(data: &Path) -> anyhow::Result<(Etcd, String)> {
    let binary = Path::new("/usr/bin/etcd");
    if !binary.exists() {
        bail!("no etcd at /usr/bin/etcd: install Debian's etcd-server (make deps does)");
    }
    let (client, peer) = (free_port()?, free_port()?);
    let child = Command::new(binary)
        .args(["--name", "bench", "--data-dir"])
        .arg(data)
        .arg(format!("--listen-client-urls=http://127.0.0.1:{client}"))
        .arg(format!("--advertise-client-urls=http://127.0.0.1:{client}"))
        .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer}"))
        .arg(format!(
            "--initial-advertise-peer-urls=http://127.0.0.1:{peer}"
        ))
        .arg(format!("--initial-cluster=bench=http://127.0.0.1:{peer}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting etcd")?;
    let etcd = Etcd(child);
    let addr = format!("127.0.0.1:{client}");
    let t = Instant::now();
    while std::net::TcpStream::connect(&addr).is_err() {
        if t.elapsed() > Duration::from_secs(20) {
            bail!("etcd did not listen on {addr} within 20 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok((etcd, addr))
}

/// Runs the bench; `runs` invocations through each of the two nodes.
pub(crate) fn run(uk_dir: &Path, runs: usize) -> anyhow::Result<serde_json::Value> {
    let echo = uk_dir.join("fn-echo");
    if !echo.exists() {
        bail!("no fn-echo in {} (make uk)", uk_dir.display());
    }
    let scratch = std::env::temp_dir().join(format!("spore-bench-fwd-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch)?;
    // Jailed VMMs pass through it.
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&scratch, std::fs::Permissions::from_mode(0o711))?;
    }
    let result = measure(&scratch, &echo, runs);
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

fn measure(scratch: &Path, echo: &Path, runs: usize) -> anyhow::Result<serde_json::Value> {
    let (_etcd, etcd_addr) = start_etcd(&scratch.join("etcd"))?;
    let key = scratch.join("cluster.key");
    {
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(0o600)
            .open(&key)?;
        let mut secret = [0u8; 16];
        std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom")?, &mut secret)?;
        let hex: String = secret.iter().map(|b| format!("{b:02x}")).collect();
        writeln!(f, "{hex}")?;
    }
    let url = format!("etcd://{etcd_addr}/bench");
    let key_arg = key.to_str().context("a UTF-8 scratch path")?;
    let mut nodes = Vec::new();
    for id in ["n1", "n2", "n3"] {
        let listen = format!("127.0.0.1:{}", free_port()?);
        let extra = [
            "--cluster",
            &url,
            "--node-id",
            id,
            "--cluster-key",
            key_arg,
            "--no-cpu-cap",
        ];
        nodes.push((id, Daemon::start_on(&listen, &scratch.join(id), &extra)?));
    }
    nodes[0].1.deploy("fwd", echo, 64)?;
    // Every node reads the membership once a second.
    std::thread::sleep(Duration::from_secs(3));
    let mut conns = Vec::new();
    let mut ran_on = Vec::new();
    for (_, d) in &nodes {
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
