//! `spore serve --cluster`: two nodes on one etcd share one catalogue. A
//! function deployed through one node is listed and invoked through the
//! other within a second (its code fetched from the first node, checked by
//! hash); a change through either ends the other's stale instances; the
//! nodes' leases show in `spore cluster status` and a killed node drops
//! out; with etcd down for all, writes get 503 and every node serves on.
//! (A node cut off from etcd while the others renew: kvm_serve_cluster_hosts.)

use std::time::{Duration, Instant};

use crate::common;
use crate::common::cluster::{
    cluster_cmd, cluster_key, free_addr, invoke_here, node, one_etcd_cluster, status, until,
};
use crate::common::etcd::Etcd;
use crate::common::serve::Daemon;
use crate::common::{require_kvm, Scratch};

fn stage(d: &Daemon, name: &str) -> (u16, String) {
    let r = d.invoke(name, br#"{"env":"STAGE"}"#);
    let v = r.json()["value"].as_str().unwrap_or_default().to_string();
    (r.status, v)
}

#[test]
fn kvm_serve_cluster_shares_one_catalogue_and_serves_on_without_etcd() {
    require_kvm();
    let dir = Scratch::new("cluster");
    let mut etcd = Etcd::start(&dir.path("etcd"));
    let url = format!("etcd://{}/t{}", etcd.endpoint(), std::process::id());
    let key = cluster_key(&dir);
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
    b.set_stage("app", "two");
    until("a runs b's new version", Duration::from_secs(2), || {
        stage(&a, "app") == (200, "two".into())
    });
    assert_eq!(
        a.request("GET", "/2015-03-31/functions/app", b"", &[])
            .json()["Configuration"]["CodeSha256"],
        sha_b64.as_str()
    );

    // Both nodes hold a lease.
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

    // (A node cut off from etcd while the others renew fences itself:
    // kvm_serve_cluster_hosts cuts a host's link.) A write through one node
    // is run by the other's next invocation.
    b.set_stage("app", "three");
    until("a runs three", Duration::from_secs(2), || {
        stage(&a, "app") == (200, "three".into())
    });

    // etcd down for everyone: no node can change anything, so both keep
    // serving (no fence) while writes get 503.
    etcd.kill();
    std::thread::sleep(Duration::from_secs(6));
    assert_eq!(stage(&a, "app"), (200, "three".into()));
    assert_eq!(stage(&b, "app"), (200, "three".into()));
    let r = b.create("fourth", "fn-echo", serde_json::json!({}));
    assert_eq!(r.status, 503, "{}", r.text());
    etcd.restart();
    until("writes are taken again", Duration::from_secs(15), || {
        b.create("fourth", "fn-echo", serde_json::json!({})).status == 201
    });
    until("a sees b's write", Duration::from_secs(5), || {
        a.request("GET", "/2015-03-31/functions/fourth", b"", &[])
            .status
            == 200
    });

    // A killed node drops out after its lease's TTL.
    b.kill9();
    let gone = until("b's lease lapses", Duration::from_secs(10), || {
        status(&url)["nodes"].as_array().map_or(0, Vec::len) == 1
    });
    eprintln!("b out of the cluster {gone:?} after kill -9");
    assert_eq!(
        a.request("DELETE", "/2015-03-31/functions/app", b"", &[])
            .status,
        204
    );
    assert_eq!(stage(&a, "fourth").0, 200);
}

/// The node ids that own `function` (its first two by rendezvous weight),
/// as every node computes them.
fn owners(function: &str, ids: &[&str]) -> Vec<String> {
    let records: Vec<spore_serve::cluster::NodeRecord> = ids
        .iter()
        .map(|id| spore_serve::cluster::NodeRecord {
            node_id: (*id).to_string(),
            advertise: String::new(),
            capacity: spore_serve::cluster::Capacity {
                cpus: 1,
                memory_budget_bytes: 0,
                memory_total_bytes: 0,
            },
            started_unix_ms: 0,
            lease_id: 0,
            draining: false,
        })
        .collect();
    spore_serve::cluster::ranked(function, &records)
        .iter()
        .take(spore_serve::cluster::DEFAULT_REPLICAS)
        .map(|n| n.node_id.clone())
        .collect()
}

/// The nodes that ran `n` invocations of `function` sent through `nodes`
/// in turn.
fn ran_on(nodes: &[Daemon], function: &str, n: usize) -> std::collections::BTreeSet<String> {
    (0..n)
        .map(|i| {
            let r = nodes[i % nodes.len()].invoke(function, b"{}");
            assert_eq!(r.status, 200, "{}", r.text());
            r.header("x-spore-node").unwrap_or_default().to_string()
        })
        .collect()
}

#[test]
fn kvm_serve_cluster_runs_a_function_on_its_two_owners() {
    require_kvm();
    let dir = Scratch::new("cluster3");
    let (etcd, url, key) = one_etcd_cluster(&dir);
    let ids = ["a", "b", "c"];
    let mut nodes: Vec<Daemon> = ids.iter().map(|id| node(&dir, &url, id, &key)).collect();
    // Each node reads the membership every few seconds.
    until(
        "every node knows the three",
        Duration::from_secs(10),
        || status(&url)["nodes"].as_array().map_or(0, Vec::len) == 3,
    );
    std::thread::sleep(Duration::from_secs(4));
    let created = nodes[0].create("app", "fn-echo", serde_json::json!({}));
    assert_eq!(created.status, 201, "{}", created.text());
    let owner_ids = owners("app", &ids);
    let outsider = ids
        .iter()
        .position(|id| !owner_ids.iter().any(|o| o == id))
        .unwrap();
    eprintln!("owners of app: {owner_ids:?}; outsider {}", ids[outsider]);

    // 300 invocations through all three: every answer right, and the
    // function's instances only on its owners.
    for i in 0..300 {
        let d = &nodes[i % 3];
        let payload = format!(r#"{{"n":{i}}}"#);
        let r = d.invoke("app", payload.as_bytes());
        assert_eq!(r.status, 200, "through {}: {}", ids[i % 3], r.text());
        assert!(r.text().contains(&format!(r#""n":{i}"#)), "{}", r.text());
    }
    assert!(
        nodes[outsider].vmm_pids().is_empty(),
        "the outsider ran no instance"
    );
    let holding = nodes.iter().filter(|d| !d.vmm_pids().is_empty()).count();
    assert!((1..=2).contains(&holding), "{holding} nodes hold instances");
    // Once every node has read what the others hold (a second or two),
    // invocations through any node run where the warm instances are.
    std::thread::sleep(Duration::from_secs(3));
    let warm_on = ran_on(&nodes, "app", 30);
    assert_eq!(warm_on.len(), 1, "all ran on the warm node: {warm_on:?}");

    // A rolling restart: the first owner drained, restarted, undrained,
    // while a client invokes through the two others: nothing fails.
    let first = ids.iter().position(|id| *id == owner_ids[0]).unwrap();
    cluster_cmd(&url, "drain", ids[first]);
    until("the drain shows", Duration::from_secs(5), || {
        status(&url)["nodes"][first]["draining"] == true
    });
    std::thread::sleep(Duration::from_secs(2));
    let others: Vec<String> = (0..3)
        .filter(|&i| i != first)
        .map(|i| nodes[i].addr.clone())
        .collect();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (served, failed) = std::thread::scope(|s| {
        let client = s.spawn(|| {
            let (mut served, mut failed) = (0, 0);
            let t = Instant::now();
            // Bounded, so that a failing test never waits on it.
            while !stop.load(std::sync::atomic::Ordering::Acquire)
                && t.elapsed() < Duration::from_secs(60)
            {
                let addr = &others[served % 2];
                let r = common::serve::http(
                    addr,
                    "POST",
                    "/2015-03-31/functions/app/invocations",
                    b"{}",
                    &[],
                );
                if r.status == 200 {
                    served += 1
                } else {
                    failed += 1
                }
            }
            (served, failed)
        });
        let dir_of = dir.path(ids[first]);
        // The old process first: the state directory is one daemon's.
        drop(nodes.remove(first));
        let restarted = Daemon::start_on(
            &free_addr(),
            &dir_of,
            &[
                "--cluster",
                &url,
                "--node-id",
                ids[first],
                "--cluster-key",
                key.to_str().unwrap(),
            ],
        );
        nodes.insert(first, restarted);
        std::thread::sleep(Duration::from_secs(2));
        stop.store(true, std::sync::atomic::Ordering::Release);
        client.join().unwrap()
    });
    eprintln!(
        "rolling restart of {}: {served} served, {failed} failed",
        ids[first]
    );
    assert_eq!(failed, 0);
    assert!(served > 0);
    cluster_cmd(&url, "undrain", ids[first]);

    // kill -9 of the node holding the warm instances: invocations through
    // the others succeed again (where they arrive, or the other owner) and
    // none is answered wrongly.
    std::thread::sleep(Duration::from_secs(3));
    let holder_id = ran_on(&nodes, "app", 9)
        .into_iter()
        .next()
        .unwrap_or_default();
    let holder = ids.iter().position(|id| *id == holder_id).unwrap();
    nodes[holder].kill9();
    let t = Instant::now();
    let mut failed = 0;
    let survivors: Vec<usize> = (0..3).filter(|&i| i != holder).collect();
    let mut ok_in_a_row = 0;
    while ok_in_a_row < 20 {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "not recovered in 30 s"
        );
        let d = &nodes[survivors[ok_in_a_row % 2]];
        let r = d.invoke("app", br#"{"after":1}"#);
        if r.status == 200 {
            assert!(r.text().contains(r#""after":1"#), "{}", r.text());
            ok_in_a_row += 1;
        } else {
            failed += 1;
            ok_in_a_row = 0;
        }
    }
    eprintln!(
        "after kill -9 of {holder_id}, which held the warm instances: served again in {:?}, {failed} failed meanwhile",
        t.elapsed()
    );
    drop(nodes);
    drop(etcd);
}

#[test]
fn kvm_serve_cluster_writes_through_an_etcd_leader_kill_and_serves_without_quorum() {
    require_kvm();
    let dir = Scratch::new("cluster-etcd3");
    let mut members = Etcd::start_cluster(&dir.path("etcd"), 3);
    let endpoints: Vec<String> = members.iter().map(Etcd::endpoint).collect();
    let url = format!("etcd://{}/t{}", endpoints.join(","), std::process::id());
    let key = cluster_key(&dir);
    let a = node(&dir, &url, "a", &key);
    let b = node(&dir, &url, "b", &key);
    let r = a.create("app", "fn-echo", serde_json::json!({}));
    assert_eq!(r.status, 201, "{}", r.text());
    until("b has it", Duration::from_secs(1), || {
        b.request("GET", "/2015-03-31/functions/app", b"", &[])
            .status
            == 200
    });
    assert_eq!(a.invoke("app", b"{}").status, 200);
    assert_eq!(b.invoke("app", b"{}").status, 200);

    // The leader killed: the two others elect one, writes go on (a few
    // may fail with 503 during the election).
    let leader = members.iter().position(Etcd::is_leader).expect("a leader");
    members[leader].kill();
    let t = Instant::now();
    let mut refused = 0;
    loop {
        let r = b.create("after-leader", "fn-echo", serde_json::json!({}));
        // 409: an attempt answered 503 (its confirmation lost in the
        // election) was applied after all.
        if r.status == 201 || (r.status == 409 && refused > 0) {
            break;
        }
        assert_eq!(r.status, 503, "{}", r.text());
        refused += 1;
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "no write within 15 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!(
        "writes taken again {:?} after the leader's kill ({refused} refused)",
        t.elapsed()
    );
    until("a has it", Duration::from_secs(2), || {
        a.request("GET", "/2015-03-31/functions/after-leader", b"", &[])
            .status
            == 200
    });

    // Both nodes renewing again (a node whose lease stream went to the
    // killed leader reconnects within a few seconds): otherwise the one that
    // lagged would rightly fence itself below, having seen the other renew
    // while it could not.
    until("both nodes renew again", Duration::from_secs(10), || {
        [&a, &b].iter().all(|d| {
            let ago = d.metric("spore_cluster_lease_renewed_ms_ago");
            ago > 0.0 && ago < 1500.0
        })
    });
    // Two of three gone: no quorum. Writes get 503 ServiceException; warm
    // invocations go on through both nodes, past the fence's delay.
    let second = (0..3).find(|&i| i != leader).unwrap();
    members[second].kill();
    let r = a.create("no-quorum", "fn-echo", serde_json::json!({}));
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.header("x-amzn-errortype"), Some("ServiceException"));
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(8) {
        for d in [&a, &b] {
            let r = d.invoke("app", br#"{"k":1}"#);
            assert_eq!(r.status, 200, "{}", r.text());
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[test]
fn kvm_serve_cluster_runs_a_dead_nodes_accepted_events_elsewhere() {
    require_kvm();
    let dir = Scratch::new("cluster-events");
    let (etcd, url, key) = one_etcd_cluster(&dir);
    let mut a = node(&dir, &url, "a", &key);
    let b = node(&dir, &url, "b", &key);
    assert_eq!(a.create("ev", "fn-echo", serde_json::json!({})).status, 201);
    // Reserved concurrency 0: every attempt is throttled, so a's accepted
    // events are still queued when it is killed.
    let r = a.request(
        "PUT",
        "/2017-10-31/functions/ev/concurrency",
        br#"{"ReservedConcurrentExecutions":0}"#,
        &[],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    const EVENTS: usize = 20;
    for i in 0..EVENTS {
        let r = a.request(
            "POST",
            "/2015-03-31/functions/ev/invocations",
            format!(r#"{{"i":{i}}}"#).as_bytes(),
            &[("X-Amz-Invocation-Type", "Event")],
        );
        assert_eq!(r.status, 202, "{}", r.text());
    }
    assert_eq!(a.metric("spore_events_succeeded_total"), 0.0);
    a.kill9();
    let r = b.request("DELETE", "/2017-10-31/functions/ev/concurrency", b"", &[]);
    assert_eq!(r.status, 204, "{}", r.text());
    let ran = until("b ran a's events", Duration::from_secs(40), || {
        b.metric("spore_events_succeeded_total") >= EVENTS as f64
    });
    eprintln!("a's {EVENTS} events ran on b {ran:?} after a's kill -9");
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        b.metric("spore_events_succeeded_total"),
        EVENTS as f64,
        "each ran once"
    );
    drop(etcd);
}

/// A node that never ran a function restores the snapshot another node
/// made instead of booting it (fetched, sparse, in its own jail); a
/// snapshot made on another CPU is not restored there: it boots cold.
/// `spore cluster status` shows what each node holds. A node being drained
/// has its snapshots copied to the functions' other owners.
#[test]
fn kvm_serve_cluster_restores_a_snapshot_made_on_another_node() {
    require_kvm();
    let dir = Scratch::new("cluster-ship");
    let (etcd, url, key) = one_etcd_cluster(&dir);
    let a = node(&dir, &url, "a", &key);
    let b = node(&dir, &url, "b", &key);
    until("both nodes are members", Duration::from_secs(10), || {
        status(&url)["nodes"].as_array().map_or(0, Vec::len) == 2
    });
    // b drained: a runs what is sent to either (nodes read the membership
    // every second).
    cluster_cmd(&url, "drain", "b");
    std::thread::sleep(Duration::from_secs(2));
    // b's invocations are sent as a forwarding node sends them: they run
    // on b, wherever placement would put them.
    let first_answer = |d: &Daemon, name: &str| {
        let t = Instant::now();
        let here = std::ptr::eq(d, &b);
        let r = if here {
            invoke_here(d, name, br#"{"first":1}"#)
        } else {
            d.invoke(name, br#"{"first":1}"#)
        };
        let took = t.elapsed();
        assert_eq!(r.status, 200, "{}", r.text());
        assert!(r.text().contains(r#""first":1"#), "{}", r.text());
        let me = if here { "b" } else { "a" };
        assert_eq!(r.header("x-spore-node"), Some(me), "not forwarded");
        (
            r.header("x-spore-start-path").unwrap_or("").to_string(),
            took,
        )
    };
    for name in ["ship", "elsewhere", "moved"] {
        let created = a.create(name, "fn-echo", serde_json::json!({}));
        assert_eq!(created.status, 201, "{}", created.text());
        let (path, _) = first_answer(&a, name);
        assert_eq!(path, "cold");
        common::serve::wait_for_snapshot(&a.state_dir, name, 1, Duration::from_secs(20));
    }
    // One snapshot says it was made on another CPU model.
    let origin = a.state_dir.join("snapshots/elsewhere-v1/origin.json");
    let mut record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&origin).unwrap()).unwrap();
    record["cpu"] = "vendor_id=SomeOtherVendor cpu family=99".into();
    std::fs::write(&origin, serde_json::to_vec(&record).unwrap()).unwrap();
    cluster_cmd(&url, "undrain", "b");
    std::thread::sleep(Duration::from_secs(2));

    let cold = {
        let created = b.create("cold-here", "fn-echo", serde_json::json!({}));
        assert_eq!(created.status, 201, "{}", created.text());
        first_answer(&b, "cold-here")
    };
    assert_eq!(cold.0, "cold");
    let a_holds = status(&url)["nodes"]
        .as_array()
        .and_then(|n| n.iter().find(|n| n["node_id"] == "a"))
        .map(|n| n["holds"].clone())
        .unwrap_or_default();
    assert_eq!(
        a_holds["functions"]["ship:1"], 3,
        "a holds ship warm: {a_holds}"
    );
    let (path, restored) = first_answer(&b, "ship");
    assert_eq!(path, "restore", "b restored a's snapshot");
    let fetched_metric = |f: &str| {
        b.metric(&format!(
            "spore_snapshots_fetched_total{{node=\"b\",function=\"{f}\"}}"
        ))
    };
    assert_eq!(fetched_metric("ship"), 1.0);
    // Every series of a node carries its id.
    assert_eq!(
        a.metric("spore_snapshots_written_total{node=\"a\",function=\"ship\"}"),
        1.0
    );
    let fetched = b.state_dir.join("snapshots/ship-v1");
    let made = a.state_dir.join("snapshots/ship-v1");
    assert_eq!(
        std::fs::read(fetched.join("vm.mem")).unwrap(),
        std::fs::read(made.join("vm.mem")).unwrap()
    );
    let disk = |p: &std::path::Path| {
        use std::os::unix::fs::MetadataExt as _;
        std::fs::metadata(p).unwrap().blocks() * 512
    };
    assert!(
        disk(&fetched.join("vm.mem")) <= disk(&made.join("vm.mem")) + (1 << 20),
        "the fetched memory file stays sparse"
    );
    eprintln!(
        "first answer on a node that never ran the function: fetch + restore {restored:?}, cold boot {:?}",
        cold.1
    );
    for i in 0..20 {
        let r = invoke_here(&b, "ship", format!(r#"{{"n":{i}}}"#).as_bytes());
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let (path, _) = first_answer(&b, "elsewhere");
    assert_eq!(path, "cold", "not restored on another CPU");
    assert_eq!(fetched_metric("elsewhere"), 0.0);

    // a drained: b, the other owner of everything, keeps a copy of a's
    // snapshot of the function it never ran, without an invocation.
    assert_eq!(fetched_metric("moved"), 0.0);
    cluster_cmd(&url, "drain", "a");
    let took = until("b copies moved's snapshot", Duration::from_secs(15), || {
        fetched_metric("moved") == 1.0
    });
    assert!(b.state_dir.join("snapshots/moved-v1/vm.state").is_file());
    eprintln!("a drained: its snapshot copied to b within {took:?}");
    drop((a, b));
    drop(etcd);
}
