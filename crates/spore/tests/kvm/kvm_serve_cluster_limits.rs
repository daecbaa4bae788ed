//! Concurrency limits of a `spore serve --cluster` bound the whole cluster:
//! a function's reserved concurrency and an account's concurrency (the keys
//! file's `concurrency`), with invocations running on two nodes at once
//! (sent to each as a forwarding node sends them, so that placement does
//! not gather them on one). An account's function's snapshot is shipped
//! like the default account's.

use std::process::Command;
use std::time::Duration;

use crate::common;
use crate::common::cluster::{invoke_here, node, node_with, one_etcd_cluster, until};
use crate::common::fc::repo_root;
use crate::common::{require_kvm, Scratch};

/// Six slow invocations of the function keys in `keys`, three through
/// each of `a` and `b` at once: their statuses and error types.
fn six_slow(
    a: &common::serve::Daemon,
    b: &common::serve::Daemon,
    keys: [&str; 2],
) -> Vec<(u16, String)> {
    std::thread::scope(|s| {
        let calls: Vec<_> = (0..6)
            .map(|i| {
                let (d, key) = if i % 2 == 0 {
                    (a, keys[0])
                } else {
                    (b, keys[1])
                };
                s.spawn(move || {
                    let r = invoke_here(d, key, br#"{"sleep_ms":1500}"#);
                    (r.status, r.error_type().unwrap_or_default().to_string())
                })
            })
            .collect();
        calls.into_iter().map(|c| c.join().unwrap()).collect()
    })
}

#[test]
fn kvm_serve_cluster_bounds_reserved_concurrency_across_nodes() {
    require_kvm();
    let dir = Scratch::new("cluster-slots");
    let (etcd, url, key) = one_etcd_cluster(&dir);
    let a = node(&dir, &url, "a", &key);
    let b = node(&dir, &url, "b", &key);
    assert_eq!(a.create("r", "fn-echo", serde_json::json!({})).status, 201);
    let r = a.request(
        "PUT",
        "/2017-10-31/functions/r/concurrency",
        br#"{"ReservedConcurrentExecutions":2}"#,
        &[],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    until("b has the limit", Duration::from_secs(2), || {
        b.request("GET", "/2019-09-30/functions/r/concurrency", b"", &[])
            .text()
            .contains("2")
    });
    // An instance on each node: each holds one slot while it lives.
    assert_eq!(invoke_here(&a, "r", b"{}").status, 200);
    assert_eq!(invoke_here(&b, "r", b"{}").status, 200);
    // Three slow invocations on each node at once: two run in the whole
    // cluster, the rest are throttled (429).
    let got = six_slow(&a, &b, ["r", "r"]);
    let ran = got.iter().filter(|(s, _)| *s == 200).count();
    let throttled = got.iter().filter(|(s, _)| *s == 429).count();
    assert_eq!((ran, throttled), (2, 4), "{got:?}");
    // Afterwards the slots serve again.
    for d in [&a, &b, &a, &b] {
        assert_eq!(invoke_here(d, "r", b"{}").status, 200);
    }
    drop((a, b));
    drop(etcd);
}

#[test]
fn kvm_serve_cluster_bounds_account_concurrency_across_nodes() {
    require_kvm();
    let venv = crate::kvm_serve_clients::client_venv();
    let dir = Scratch::new("cluster-accounts");
    // The jailed VMMs pass through the scratch directory.
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o711)).unwrap();
    }
    let (etcd, url, key) = one_etcd_cluster(&dir);
    let keys = dir.path("keys.toml");
    std::fs::write(
        &keys,
        "[[keys]]\naccess_key_id = \"AKIDTENANT\"\nsecret_access_key = \"tenant-secret\"\n\
         account_id = \"111111111111\"\nconcurrency = 2\n",
    )
    .unwrap();
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&keys, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let auth = ["--auth", keys.to_str().unwrap()];
    let a = node_with(&dir, &url, "a", &key, &auth);
    let b = node_with(&dir, &url, "b", &key, &auth);
    // boto3 signs as a real client: the daemons take nothing unsigned.
    let out = Command::new(venv.join("bin/python"))
        .arg(repo_root().join("tests/serve/cluster_accounts.py"))
        .args(["--endpoint", &format!("http://{}", a.addr)])
        .arg("--echo-elf")
        .arg(common::uk_image("fn-echo"))
        .args(["--key-id", "AKIDTENANT", "--secret", "tenant-secret"])
        .args(["--account", "111111111111", "t1", "t2"])
        .output()
        .expect("running cluster_accounts.py");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let (t1, t2) = ("111111111111:t1", "111111111111:t2");
    until("b has both functions", Duration::from_secs(2), || {
        invoke_here(&b, t2, b"{}").status == 200
    });
    assert_eq!(invoke_here(&a, t1, b"{}").status, 200);
    // Two functions of one account, three slow invocations of each at
    // once on its own node: the account's two run, four get 429.
    let got = six_slow(&a, &b, [t1, t2]);
    let ran = got.iter().filter(|(s, _)| *s == 200).count();
    let throttled: Vec<_> = got.iter().filter(|(s, _)| *s == 429).collect();
    assert_eq!((ran, throttled.len()), (2, 4), "{got:?}");
    assert!(
        throttled
            .iter()
            .all(|(_, kind)| kind == "TooManyRequestsException"),
        "{got:?}"
    );
    // The slots go back as invocations end: both nodes serve again.
    for (d, k) in [(&a, t1), (&b, t2), (&a, t1), (&b, t2)] {
        assert_eq!(invoke_here(d, k, b"{}").status, 200);
    }
    // An account's function's snapshot travels too: b, which never ran t1,
    // restores the one a made.
    common::serve::wait_for_snapshot(&a.state_dir, t1, 1, Duration::from_secs(20));
    let r = invoke_here(&b, t1, br#"{"on":"b"}"#);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-spore-start-path"), Some("restore"));
    drop((a, b));
    drop(etcd);
}
