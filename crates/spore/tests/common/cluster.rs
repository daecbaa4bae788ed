//! `spore serve --cluster` nodes for the cluster tests: a cluster key, a
//! node on a free loopback port, `spore cluster status`, and the node-to-node
//! invocation a forwarding node sends (run where it arrives).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::serve::{Daemon, Response};
use super::Scratch;

/// The cluster key every test node shares.
pub const KEY: &str = "a-cluster-key-for-tests-0123";

/// A cluster on one fresh etcd (in `dir/etcd`): the etcd, its URL (a
/// prefix of this test process) and the cluster key's file.
pub fn one_etcd_cluster(dir: &Scratch) -> (super::etcd::Etcd, String, PathBuf) {
    let etcd = super::etcd::Etcd::start(&dir.path("etcd"));
    let url = format!("etcd://{}/t{}", etcd.endpoint(), std::process::id());
    (etcd, url, cluster_key(dir))
}

/// `spore cluster VERB --cluster URL NODE` (`drain`, `undrain`).
pub fn cluster_cmd(url: &str, verb: &str, node: &str) {
    let out = super::spore()
        .args(["cluster", verb, "--cluster", url, node])
        .output()
        .expect("spore cluster");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Writes the cluster key (mode 0600) into `dir`.
pub fn cluster_key(dir: &Scratch) -> PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let key = dir.path("cluster.key");
    std::fs::write(&key, format!("{KEY}\n")).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    key
}

pub fn free_addr() -> String {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port");
    format!("127.0.0.1:{port}")
}

/// Node `id` of the cluster at `url`, its state in `dir/<id>`, with `extra`
/// flags.
pub fn node_with(dir: &Scratch, url: &str, id: &str, key: &Path, extra: &[&str]) -> Daemon {
    let mut args = vec![
        "--cluster",
        url,
        "--node-id",
        id,
        "--cluster-key",
        key.to_str().expect("utf-8 path"),
    ];
    args.extend_from_slice(extra);
    Daemon::start_on(&free_addr(), &dir.path(id), &args)
}

pub fn node(dir: &Scratch, url: &str, id: &str, key: &Path) -> Daemon {
    node_with(dir, url, id, key, &[])
}

/// Waits (at most `within`) for `check`; how long it took.
pub fn until(what: &str, within: Duration, mut check: impl FnMut() -> bool) -> Duration {
    let t = Instant::now();
    while !check() {
        assert!(t.elapsed() < within, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
    t.elapsed()
}

/// `spore cluster status --cluster URL`'s JSON.
pub fn status(url: &str) -> serde_json::Value {
    let out = super::spore()
        .args(["cluster", "status", "--cluster", url])
        .output()
        .expect("spore cluster status");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("status JSON")
}

/// An invocation of function key `key` ($LATEST) sent to `d` as another
/// node forwards one: it runs on `d`, wherever placement would put it.
pub fn invoke_here(d: &Daemon, key: &str, payload: &[u8]) -> Response {
    super::serve::http(
        &d.addr,
        "POST",
        &format!("/spore-cluster/v1/invoke/{key}?Qualifier=%24LATEST"),
        payload,
        &[
            ("x-spore-cluster-key", KEY),
            ("x-spore-forwarded-by", "test"),
        ],
    )
}
