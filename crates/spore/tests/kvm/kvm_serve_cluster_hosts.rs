//! A spore serve cluster as three hosts on one machine: three network
//! namespaces (h1–h3) on a bridge, each running one etcd member and one
//! spore serve node (jailed instances, host KVM). boto3 creates a function
//! through h1, lists it through h2 and h3, and invokes it 1,000 times
//! through all three (every answer checked; the invocations run on at most
//! two nodes). Then h3's link goes down for longer than the lease's TTL: h3
//! fences itself (seen from inside h3), the others go on and change the
//! function; when the link comes back, h3 serves the changed version,
//! nothing stale.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::common;
use crate::common::etcd::Etcd;
use crate::common::fc::repo_root;
use crate::common::net::{ip, Netns};
use crate::common::serve::Daemon;
use crate::common::{require_kvm, Scratch};

/// The bridge and the hosts' veth pairs, removed on drop (the namespaces
/// go with their `Netns`).
struct Hosts {
    bridge: String,
    veths: Vec<String>,
    netns: Vec<Netns>,
    addrs: Vec<String>,
}

impl Hosts {
    fn new(n: usize) -> Hosts {
        let pid = std::process::id() % 100_000;
        let bridge = format!("spc{pid}");
        let _ = Command::new("ip").args(["link", "del", &bridge]).output();
        ip(None, &["link", "add", &bridge, "type", "bridge"]);
        ip(None, &["addr", "add", "10.231.0.254/24", "dev", &bridge]);
        ip(None, &["link", "set", &bridge, "up"]);
        let mut hosts = Hosts {
            bridge,
            veths: Vec::new(),
            netns: Vec::new(),
            addrs: Vec::new(),
        };
        for i in 1..=n {
            let ns = Netns::new(&format!("spn31-{}-h{i}", std::process::id()));
            let outside = format!("spc{pid}v{i}");
            let _ = Command::new("ip").args(["link", "del", &outside]).output();
            ip(
                None,
                &[
                    "link", "add", &outside, "type", "veth", "peer", "name", "eth0", "netns", &ns.0,
                ],
            );
            ip(None, &["link", "set", &outside, "master", &hosts.bridge]);
            ip(None, &["link", "set", &outside, "up"]);
            let addr = format!("10.231.0.{i}");
            ip(
                Some(&ns.0),
                &["addr", "add", &format!("{addr}/24"), "dev", "eth0"],
            );
            ip(Some(&ns.0), &["link", "set", "eth0", "up"]);
            hosts.veths.push(outside);
            hosts.netns.push(ns);
            hosts.addrs.push(addr);
        }
        hosts
    }

    /// Host `i`'s link to the bridge down (a partition) or up again.
    fn link(&self, i: usize, up: bool) {
        ip(
            None,
            &[
                "link",
                "set",
                &self.veths[i],
                if up { "up" } else { "down" },
            ],
        );
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for v in &self.veths {
            let _ = Command::new("ip").args(["link", "del", v]).output();
        }
        let _ = Command::new("ip")
            .args(["link", "del", &self.bridge])
            .output();
    }
}

/// An Invoke from inside host `ns` to its own node (the only way to reach
/// a partitioned host): the status and body.
fn invoke_inside(ns: &str, addr: &str, function: &str, payload: &str) -> (u16, String) {
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            ns,
            "curl",
            "-sS",
            "--max-time",
            "10",
            "-w",
            "\n%{http_code}",
        ])
        .args(["-X", "POST", "--data", payload])
        .arg(format!(
            "http://{addr}/2015-03-31/functions/{function}/invocations"
        ))
        .output()
        .expect("curl in the namespace");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

#[test]
fn kvm_serve_cluster_on_three_hosts_with_boto3_and_a_partition() {
    require_kvm();
    let venv = crate::kvm_serve_clients::client_venv();
    let dir = Scratch::new("cluster-hosts");
    // The jailed VMMs pass through the scratch directory.
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o711)).unwrap();
    }
    let hosts = Hosts::new(3);
    let pairs: Vec<(&str, &str)> = hosts
        .netns
        .iter()
        .zip(&hosts.addrs)
        .map(|(n, a)| (n.0.as_str(), a.as_str()))
        .collect();
    let members = Etcd::start_cluster_in(&dir.path("etcd"), &pairs);
    let endpoints: Vec<String> = members.iter().map(Etcd::endpoint).collect();
    let url = format!("etcd://{}", endpoints.join(","));
    let key = dir.path("cluster.key");
    std::fs::write(&key, "a-cluster-key-for-tests-0123\n").unwrap();
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let nodes: Vec<Daemon> = (0..3)
        .map(|i| {
            let id = format!("h{}", i + 1);
            Daemon::start_in(
                Some(&hosts.netns[i].0),
                &format!("{}:9000", hosts.addrs[i]),
                &dir.path(&id),
                &[
                    "--cluster",
                    &url,
                    "--node-id",
                    &id,
                    "--cluster-key",
                    key.to_str().unwrap(),
                ],
            )
        })
        .collect();
    // Every node reads the membership each second.
    std::thread::sleep(Duration::from_secs(3));

    let out = Command::new(venv.join("bin/python"))
        .arg(repo_root().join("tests/serve/cluster_scenario.py"))
        .arg("--endpoints")
        .arg(
            nodes
                .iter()
                .map(|d| format!("http://{}", d.addr))
                .collect::<Vec<_>>()
                .join(","),
        )
        .arg("--echo-elf")
        .arg(common::uk_image("fn-echo"))
        .args(["--invokes", "1000", "--name", "app"])
        .output()
        .expect("running the boto3 cluster scenario");
    assert!(
        out.status.success(),
        "boto3 cluster scenario failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).expect("its JSON");
    eprintln!("boto3 through three hosts: {summary}");
    let ran_on = summary["ran_on"].as_object().expect("ran_on");
    assert!(
        (1..=2).contains(&ran_on.len()),
        "a function's invocations run on at most two nodes: {summary}"
    );
    assert_eq!(
        ran_on
            .values()
            .filter_map(serde_json::Value::as_u64)
            .sum::<u64>(),
        1000
    );

    // h3 cut off for longer than the TTL: it fences itself; h1 and h2 keep
    // their quorum and change the function meanwhile.
    let (ns3, addr3) = (&hosts.netns[2].0, format!("{}:9000", hosts.addrs[2]));
    assert_eq!(invoke_inside(ns3, &addr3, "app", "{}").0, 200);
    hosts.link(2, false);
    let t = Instant::now();
    loop {
        let (status, body) = invoke_inside(ns3, &addr3, "app", "{}");
        if status == 503 {
            assert!(body.contains("fenced"), "{body}");
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "h3 never fenced: {status} {body}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    eprintln!("h3 fenced {:?} after its link went down", t.elapsed());
    let body = serde_json::json!({ "Environment": { "Variables": { "STAGE": "two" } } });
    // h1's etcd connection may have gone to h3's member, now cut off: that
    // write gets 503 ServiceException (as a client would, try again; the
    // next goes to a member that answers).
    let t = Instant::now();
    let r = loop {
        let r = nodes[0].request(
            "PUT",
            "/2015-03-31/functions/app/configuration",
            body.to_string().as_bytes(),
            &[],
        );
        if r.status != 503 || t.elapsed() > Duration::from_secs(10) {
            break r;
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    assert_eq!(r.status, 200, "{}", r.text());
    std::thread::sleep(Duration::from_secs(2));

    // The link back: h3 serves again, the version changed while it was away.
    hosts.link(2, true);
    let t = Instant::now();
    loop {
        let (status, body) = invoke_inside(ns3, &addr3, "app", r#"{"env":"STAGE"}"#);
        if status == 200 {
            assert!(body.contains("two"), "h3 served a stale version: {body}");
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "h3 never came back: {status} {body}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    eprintln!("h3 served again {:?} after its link came back", t.elapsed());
    drop(nodes);
    drop(members);
}
