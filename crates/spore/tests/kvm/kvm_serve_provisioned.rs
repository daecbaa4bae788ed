//! `spore serve` provisioned concurrency (HyperFork's throughput mode as a
//! pool setting): N fresh clones kept ready, each serving one invocation and
//! replaced, on real KVM with unikernel functions.

use std::collections::BTreeSet;
use std::thread;
use std::time::{Duration, Instant};

use crate::common::serve::Daemon;
use crate::common::{require_kvm, Scratch};

const PATH: &str = "/2019-09-30/functions/f/provisioned-concurrency?Qualifier=%24LATEST";

fn provisioned(d: &Daemon) -> f64 {
    d.metric("spore_instances{function=\"f\",state=\"provisioned\"}")
}

fn wait_for(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn kvm_serve_provisioned_clones_serve_once_and_are_replaced() {
    require_kvm();
    let dir = Scratch::new("serve-prov");
    let state = dir.path("state");
    let d = Daemon::start(&state, &[]);
    assert_eq!(d.create("f", "fn-echo", serde_json::json!({})).status, 201);

    // Bad input first: nothing is configured by any of these.
    let r = d.request("GET", PATH, b"", &[]);
    assert_eq!(r.status, 404);
    assert_eq!(
        r.error_type(),
        Some("ProvisionedConcurrencyConfigNotFoundException")
    );
    let bad = [
        (
            "/2019-09-30/functions/f/provisioned-concurrency",
            "{\"ProvisionedConcurrentExecutions\":2}",
            400,
        ),
        (PATH, "{\"ProvisionedConcurrentExecutions\":0}", 400),
        (PATH, "{\"ProvisionedConcurrentExecutions\":100000}", 400),
        (PATH, "{\"Provisioned\":", 400),
        (
            "/2019-09-30/functions/f/provisioned-concurrency?Qualifier=7",
            "{\"ProvisionedConcurrentExecutions\":2}",
            404,
        ),
        (
            "/2019-09-30/functions/nope/provisioned-concurrency?Qualifier=%24LATEST",
            "{\"ProvisionedConcurrentExecutions\":2}",
            404,
        ),
    ];
    for (path, body, status) in bad {
        let r = d.request("PUT", path, body.as_bytes(), &[]);
        assert_eq!(r.status, status, "{path} {body}: {}", r.text());
    }
    assert_eq!(d.request("GET", PATH, b"", &[]).status, 404);

    let r = d.request(
        "PUT",
        PATH,
        br#"{"ProvisionedConcurrentExecutions":3}"#,
        &[],
    );
    assert_eq!(r.status, 202, "{}", r.text());
    assert_eq!(r.json()["RequestedProvisionedConcurrentExecutions"], 3);
    wait_for("3 provisioned instances", Duration::from_secs(20), || {
        provisioned(&d) == 3.0
    });
    let r = d.request("GET", PATH, b"", &[]).json();
    assert_eq!(r["Status"], "READY", "{r}");
    assert_eq!(r["AvailableProvisionedConcurrentExecutions"], 3);

    // Every invocation gets a fresh instance (a VMM never seen before), and
    // the pool is refilled behind it.
    let mut pids_seen = BTreeSet::new();
    for i in 0..6 {
        let before: BTreeSet<i32> = d.vmm_pids().into_iter().collect();
        let r = d.invoke("f", format!("{{\"i\":{i}}}").as_bytes());
        assert_eq!(r.json()["echo"]["i"], i);
        assert_eq!(r.header("x-spore-start-path"), Some("provisioned"));
        wait_for("the pool refilled", Duration::from_secs(20), || {
            provisioned(&d) == 3.0
        });
        let after: BTreeSet<i32> = d.vmm_pids().into_iter().collect();
        let gone: Vec<_> = before.difference(&after).copied().collect();
        assert_eq!(gone.len(), 1, "one instance served and ended: {gone:?}");
        assert!(pids_seen.insert(gone[0]), "an instance served twice");
    }
    let list = d
        .request(
            "GET",
            "/2019-09-30/functions/f/provisioned-concurrency?List=ALL",
            b"",
            &[],
        )
        .json();
    assert_eq!(
        list["ProvisionedConcurrencyConfigs"]
            .as_array()
            .map(Vec::len),
        Some(1)
    );

    // Fewer, then none: the extra fresh instances are ended.
    let r = d.request(
        "PUT",
        PATH,
        br#"{"ProvisionedConcurrentExecutions":1}"#,
        &[],
    );
    assert_eq!(r.status, 202);
    wait_for("1 provisioned instance", Duration::from_secs(10), || {
        provisioned(&d) == 1.0
    });
    assert_eq!(d.request("DELETE", PATH, b"", &[]).status, 204);
    wait_for("no provisioned instance", Duration::from_secs(10), || {
        provisioned(&d) == 0.0
    });
    assert_eq!(d.request("DELETE", PATH, b"", &[]).status, 404);
    // Without provisioned concurrency, invocations take the usual paths.
    let r = d.invoke("f", b"{}");
    assert_ne!(r.header("x-spore-start-path"), Some("provisioned"));
}
