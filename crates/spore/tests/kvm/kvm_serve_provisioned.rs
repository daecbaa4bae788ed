//! `spore serve` provisioned concurrency (HyperFork's throughput mode as a
//! pool setting): N fresh clones of a published version kept ready, each
//! serving one invocation and replaced, on real KVM with unikernel
//! functions; set on a version or an alias (which it follows), never on
//! `$LATEST`, as Lambda.

use std::collections::BTreeSet;
use std::thread;
use std::time::{Duration, Instant};

use crate::common::serve::Daemon;
use crate::common::{require_kvm, Scratch};

const PATH: &str = "/2019-09-30/functions/f/provisioned-concurrency?Qualifier=1";

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
    let r = d.request("POST", "/2015-03-31/functions/f/versions", b"{}", &[]);
    assert_eq!(r.status, 201, "{}", r.text());

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
            "/2019-09-30/functions/nope/provisioned-concurrency?Qualifier=1",
            "{\"ProvisionedConcurrentExecutions\":2}",
            404,
        ),
        // Lambda refuses `$LATEST`: it is not a published version.
        (
            "/2019-09-30/functions/f/provisioned-concurrency?Qualifier=%24LATEST",
            "{\"ProvisionedConcurrentExecutions\":2}",
            400,
        ),
        (
            "/2019-09-30/functions/f/provisioned-concurrency?Qualifier=no-alias",
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
        let r = d.invoke("f:1", format!("{{\"i\":{i}}}").as_bytes());
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
    let r = d.invoke("f:1", b"{}");
    assert_ne!(r.header("x-spore-start-path"), Some("provisioned"));
    // `$LATEST` was never provisioned.
    let r = d.invoke("f", b"{}");
    assert_ne!(r.header("x-spore-start-path"), Some("provisioned"));
}

/// Provisioned concurrency set on an alias is kept on the version the alias
/// points to, moves when the alias moves, and ends with the alias.
#[test]
fn kvm_serve_provisioned_concurrency_follows_its_alias() {
    require_kvm();
    let dir = Scratch::new("serve-prov-al");
    let d = Daemon::start(&dir.path("state"), &[]);
    assert_eq!(d.create("f", "fn-echo", serde_json::json!({})).status, 201);
    let publish = |d: &Daemon| {
        let r = d.request("POST", "/2015-03-31/functions/f/versions", b"{}", &[]);
        assert_eq!(r.status, 201, "{}", r.text());
    };
    publish(&d);
    // A change, so that version 2 is a new one.
    let r = d.request(
        "PUT",
        "/2015-03-31/functions/f/configuration",
        br#"{"Description":"second"}"#,
        &[],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    publish(&d);
    let r = d.request(
        "POST",
        "/2015-03-31/functions/f/aliases",
        br#"{"Name":"live","FunctionVersion":"1"}"#,
        &[],
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let alias_path = "/2019-09-30/functions/f/provisioned-concurrency?Qualifier=live";
    let r = d.request(
        "PUT",
        alias_path,
        br#"{"ProvisionedConcurrentExecutions":2}"#,
        &[],
    );
    assert_eq!(r.status, 202, "{}", r.text());
    wait_for("2 provisioned instances", Duration::from_secs(20), || {
        provisioned(&d) == 2.0
    });
    let path_of = |d: &Daemon, q: &str| {
        d.invoke(&format!("f:{q}"), b"{}")
            .header("x-spore-start-path")
            .map(str::to_string)
    };
    assert_eq!(path_of(&d, "live").as_deref(), Some("provisioned"));
    assert_eq!(path_of(&d, "1").as_deref(), Some("provisioned"));
    // The alias moves to version 2: so does its provisioned concurrency.
    let r = d.request(
        "PUT",
        "/2015-03-31/functions/f/aliases/live",
        br#"{"FunctionVersion":"2"}"#,
        &[],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    wait_for("version 2 provisioned", Duration::from_secs(20), || {
        d.request("GET", alias_path, b"", &[]).json()["Status"] == "READY"
    });
    wait_for(
        "2 provisioned instances, all of version 2",
        Duration::from_secs(20),
        || provisioned(&d) == 2.0,
    );
    assert_eq!(path_of(&d, "2").as_deref(), Some("provisioned"));
    assert_ne!(path_of(&d, "1").as_deref(), Some("provisioned"));
    // An alias may not point provisioned concurrency at `$LATEST`.
    let r = d.request(
        "POST",
        "/2015-03-31/functions/f/aliases",
        br#"{"Name":"head","FunctionVersion":"$LATEST"}"#,
        &[],
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let r = d.request(
        "PUT",
        "/2019-09-30/functions/f/provisioned-concurrency?Qualifier=head",
        br#"{"ProvisionedConcurrentExecutions":1}"#,
        &[],
    );
    assert_eq!(r.status, 400, "{}", r.text());
    // Deleting the alias deletes its configuration.
    let r = d.request("DELETE", "/2015-03-31/functions/f/aliases/live", b"", &[]);
    assert_eq!(r.status, 204, "{}", r.text());
    wait_for("no provisioned instance", Duration::from_secs(10), || {
        provisioned(&d) == 0.0
    });
    assert_eq!(d.request("GET", alias_path, b"", &[]).status, 404);
}
