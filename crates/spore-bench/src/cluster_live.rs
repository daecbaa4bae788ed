//! Live `spore serve --cluster` nodes for the cluster benches: one etcd
//! (Debian's `etcd-server`) and nodes on this machine's loopback sharing a
//! fresh cluster key. The CPU cap is off (`--no-cpu-cap`): a 64 MiB
//! function's cap would throttle a tight loop and measure the cap.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use spore_serve::catalog::ClusterConfig;

use crate::serve::daemon::Daemon;

fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A bench's scratch directory (`spore-bench-<what>-<pid>` in the temp
/// directory), new and passable by jailed VMMs.
pub(crate) fn scratch_dir(what: &str) -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    let scratch = std::env::temp_dir().join(format!("spore-bench-{what}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch)?;
    std::fs::set_permissions(&scratch, std::fs::Permissions::from_mode(0o711))?;
    Ok(scratch)
}

/// etcd for the bench, killed on drop.
pub(crate) struct Etcd(Child);

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

/// Writes a fresh random cluster key (mode 0600) to `path`; returns it.
fn write_key(path: &Path) -> anyhow::Result<String> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(path)?;
    let mut secret = [0u8; 16];
    std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom")?, &mut secret)?;
    let hex: String = secret.iter().map(|b| format!("{b:02x}")).collect();
    writeln!(f, "{hex}")?;
    Ok(hex)
}

/// The nodes and their etcd (ended in that order on drop).
pub(crate) struct LiveCluster {
    pub(crate) nodes: Vec<(&'static str, Daemon)>,
    /// What `spore cluster` commands need to reach it.
    pub(crate) config: ClusterConfig,
    /// The cluster key (what a node sends another).
    pub(crate) key: String,
    key_file: PathBuf,
    url: String,
    _etcd: Etcd,
}

impl LiveCluster {
    /// etcd and one node per id (state in `scratch/<id>`), each told the
    /// others by the time this returns (nodes read the membership once a
    /// second).
    pub(crate) fn start(scratch: &Path, ids: &[&'static str]) -> anyhow::Result<LiveCluster> {
        let (etcd, etcd_addr) = start_etcd(&scratch.join("etcd"))?;
        let key = scratch.join("cluster.key");
        let secret = write_key(&key)?;
        let url = format!("etcd://{etcd_addr}/bench");
        let key_arg = key.to_str().context("a UTF-8 scratch path")?;
        let mut nodes = Vec::new();
        for id in ids {
            nodes.push((*id, start_node(&url, key_arg, id, &scratch.join(id))?));
        }
        std::thread::sleep(Duration::from_secs(3));
        Ok(LiveCluster {
            nodes,
            config: ClusterConfig::parse(&url, "bench")?,
            key: secret,
            key_file: key,
            url,
            _etcd: etcd,
        })
    }

    /// Node `id` started again on its state directory `state` (after a
    /// kill: it waits out its predecessor's lease first).
    pub(crate) fn restart(&self, id: &str, state: &Path) -> anyhow::Result<Daemon> {
        let key = self.key_file.to_str().context("a UTF-8 scratch path")?;
        start_node(&self.url, key, id, state)
    }
}

fn start_node(url: &str, key: &str, id: &str, state: &Path) -> anyhow::Result<Daemon> {
    let listen = format!("127.0.0.1:{}", free_port()?);
    let extra = [
        "--cluster",
        url,
        "--node-id",
        id,
        "--cluster-key",
        key,
        "--no-cpu-cap",
    ];
    Daemon::start_on(&listen, state, &extra)
}
