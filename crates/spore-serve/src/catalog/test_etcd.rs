//! Tests' etcd: one real etcd server (Debian's `etcd-server`, installed by
//! `make`'s dependency step) per test process, on free loopback ports, and
//! the catalogue backends every catalogue test runs against: a single
//! daemon's SQLite and a cluster member's copy (a fresh prefix each, so
//! tests in one process never see each other's logs).

use std::net::TcpListener;
use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::{Catalog, ClusterConfig};

/// `host:port` of this process's etcd, started on first use.
pub fn endpoint() -> &'static str {
    static ENDPOINT: OnceLock<String> = OnceLock::new();
    ENDPOINT.get_or_init(start)
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// Starts etcd from a thread that lives as long as the test process, with
/// a parent-death signal: etcd ends with the tests, however they end.
fn start() -> String {
    let binary = ["/usr/bin/etcd", "/usr/local/bin/etcd"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .expect("etcd not found: `make deps` installs Debian's etcd-server");
    remove_leftovers();
    let (client, peer) = (free_port(), free_port());
    let data = std::env::temp_dir().join(format!("spore-test-etcd-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut cmd = Command::new(binary);
        cmd.args(["--name", "t", "--data-dir"])
            .arg(&data)
            .arg(format!("--listen-client-urls=http://127.0.0.1:{client}"))
            .arg(format!("--advertise-client-urls=http://127.0.0.1:{client}"))
            .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer}"))
            .arg(format!(
                "--initial-advertise-peer-urls=http://127.0.0.1:{peer}"
            ))
            .arg(format!("--initial-cluster=t=http://127.0.0.1:{peer}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: prctl in the child before exec touches no shared state.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut child = cmd.spawn().expect("starting etcd");
        tx.send(child.id()).expect("the test waits for etcd");
        // The parent-death signal follows this thread: it lasts as long
        // as etcd does.
        let _ = child.wait();
    });
    rx.recv().expect("etcd started");
    let addr = format!("127.0.0.1:{client}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(&addr).is_err() {
        assert!(
            Instant::now() < deadline,
            "etcd did not listen on {addr} within 20 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    addr
}

/// Data directories of earlier test processes' etcd that are gone.
fn remove_leftovers() {
    let Ok(dir) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(pid) = name.strip_prefix("spore-test-etcd-") {
            let alive = pid
                .parse::<u32>()
                .is_ok_and(|p| std::path::Path::new(&format!("/proc/{p}")).exists());
            if !alive {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
}

/// A cluster of its own on this process's etcd (a fresh prefix).
pub fn fresh_cluster(node_id: &str) -> ClusterConfig {
    let mut tag = [0u8; 8];
    getrandom::fill(&mut tag).expect("random");
    let url = format!("etcd://{}/t{:016x}", endpoint(), u64::from_le_bytes(tag));
    ClusterConfig::parse(&url, node_id).expect("a test cluster URL")
}

/// Both backends, empty: a single daemon's catalogue and a cluster
/// member's copy.
pub fn backends() -> Vec<(&'static str, Catalog)> {
    vec![
        ("sqlite", Catalog::in_memory().expect("in-memory catalogue")),
        (
            "etcd",
            Catalog::in_memory_member(&fresh_cluster("n1")).expect("a cluster member"),
        ),
    ]
}
