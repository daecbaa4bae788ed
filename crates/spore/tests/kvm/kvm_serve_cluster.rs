//! `spore serve --cluster`: two nodes on one etcd share one catalogue. A
//! function deployed through one node is listed and invoked through the
//! other within a second (its code fetched from the first node, checked by
//! hash); a change through either ends the other's stale instances; the
//! nodes' leases show in `spore cluster status` and a killed node drops
//! out; with etcd gone, writes get 503 and a node fences itself (no
//! invocations, its instances ended) until etcd is back.

use std::net::TcpListener;
use std::time::{Duration, Instant};

use crate::common;
use crate::common::etcd::Etcd;
use crate::common::serve::Daemon;
use crate::common::{require_kvm, Scratch};

fn free_addr() -> String {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port");
    format!("127.0.0.1:{port}")
}

fn node(dir: &Scratch, url: &str, id: &str, key: &std::path::Path) -> Daemon {
    let listen = free_addr();
    Daemon::start_on(
        &listen,
        &dir.path(id),
        &[
            "--cluster",
            url,
            "--node-id",
            id,
            "--cluster-key",
            key.to_str().expect("utf-8 path"),
        ],
    )
}

fn until(what: &str, within: Duration, mut check: impl FnMut() -> bool) -> Duration {
    let t = Instant::now();
    while !check() {
        assert!(t.elapsed() < within, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
    t.elapsed()
}

fn stage(d: &Daemon, name: &str) -> (u16, String) {
    let r = d.invoke(name, br#"{"env":"STAGE"}"#);
    let v = r.json()["value"].as_str().unwrap_or_default().to_string();
    (r.status, v)
}

fn status(url: &str) -> serde_json::Value {
    let out = common::spore()
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

#[test]
fn kvm_serve_cluster_shares_one_catalogue_and_fences_without_etcd() {
    require_kvm();
    let dir = Scratch::new("cluster");
    let mut etcd = Etcd::start(&dir.path("etcd"));
    let url = format!("etcd://{}/t{}", etcd.endpoint(), std::process::id());
    let key = dir.path("cluster.key");
    std::fs::write(&key, "a-cluster-key-for-tests-0123\n").unwrap();
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let a = node(&dir, &url, "a", &key);
    let mut b = node(&dir, &url, "b", &key);

    // Created through a, seen and run through b (its code fetched from a).
    let extra = serde_json::json!({ "Environment": { "Variables": { "STAGE": "one" } } });
    let created = a.create("app", "fn-echo", extra);
    assert_eq!(created.status, 201, "{}", created.text());
    let sha_b64 = created.json()["CodeSha256"].as_str().unwrap().to_string();
    let seen = until("b lists the function", Duration::from_secs(1), || {
        b.request("GET", "/2015-03-31/functions", b"", &[])
            .text()
            .contains("\"app\"")
    });
    eprintln!("a's create seen through b after {seen:?}");
    assert_eq!(stage(&b, "app"), (200, "one".into()));
    let code_dirs: Vec<_> = std::fs::read_dir(dir.path("b").join("code"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().join("code.zip").exists())
        .collect();
    assert_eq!(code_dirs.len(), 1, "b holds the code it fetched");
    assert_eq!(stage(&a, "app"), (200, "one".into()));

    // Changed through b: a's instance of the old version ends, its next
    // invocation runs the new one.
    let r = b.request(
        "PUT",
        "/2015-03-31/functions/app/configuration",
        serde_json::json!({ "Environment": { "Variables": { "STAGE": "two" } } })
            .to_string()
            .as_bytes(),
        &[],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    until("a runs b's new version", Duration::from_secs(2), || {
        stage(&a, "app") == (200, "two".into())
    });
    assert_eq!(
        a.request("GET", "/2015-03-31/functions/app", b"", &[])
            .json()["Configuration"]["CodeSha256"],
        sha_b64.as_str()
    );

    // Both nodes hold a lease; a killed node drops out after its TTL.
    let st = status(&url);
    let ids: Vec<_> = st["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["node_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids, ["a", "b"], "{st}");
    assert!(
        st["nodes"][0]["lease_ttl_remaining_s"].as_i64().unwrap() > 0,
        "{st}"
    );
    b.kill9();
    let gone = until("b's lease lapses", Duration::from_secs(10), || {
        status(&url)["nodes"].as_array().map_or(0, Vec::len) == 1
    });
    eprintln!("b out of the cluster {gone:?} after kill -9");

    // Deleted through a: gone for the cluster.
    assert_eq!(
        a.request("DELETE", "/2015-03-31/functions/app", b"", &[])
            .status,
        204
    );
    let created = a.create("other", "fn-echo", serde_json::json!({}));
    assert_eq!(created.status, 201, "{}", created.text());
    assert_eq!(a.invoke("other", b"{}").status, 200);
    assert!(!a.vmm_pids().is_empty());

    // etcd gone: writes fail with a 503 at once, and within the lease's
    // TTL the node fences itself: no invocations, its instances ended.
    etcd.kill();
    let r = a.create("third", "fn-echo", serde_json::json!({}));
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.json()["Type"], "Service", "{}", r.text());
    let fenced = until("a fences itself", Duration::from_secs(8), || {
        a.invoke("other", b"{}").status == 503
    });
    eprintln!("a fenced {fenced:?} after etcd went away");
    until("a's instances end", Duration::from_secs(5), || {
        a.vmm_pids().is_empty()
    });
    let r = a.invoke("other", b"{}");
    assert!(r.text().contains("fenced"), "{}", r.text());

    // etcd back: a registers again and serves.
    etcd.restart();
    let back = until("a serves again", Duration::from_secs(15), || {
        a.invoke("other", b"{}").status == 200
    });
    eprintln!("a served again {back:?} after etcd came back");
    assert_eq!(
        a.request("GET", "/2015-03-31/functions/app", b"", &[])
            .status,
        404
    );
}
