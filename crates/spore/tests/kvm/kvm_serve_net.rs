//! `spore serve` with networked functions (`SporeNetwork`), end to end on
//! real KVM: the `fn-fetch` unikernel function fetches a page from an HTTP
//! server on the host, through its instance's tap, network namespace, veth
//! and NAT, on the cold path, the clone path and (after the daemon was
//! killed) the restore path. Everything the daemon made on the host is gone
//! after the function is deleted, after a killed daemon's successor starts,
//! and after the daemon stops; a function without network gets none.
//!
//! Needs root (namespaces, taps, nftables) like the other host-KVM tests.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::common::net::require_tap;
use crate::common::serve::{wait_for_snapshot, Daemon};
use crate::common::{require_kvm, Scratch};

/// The test's pool: not the default, so that a daemon someone runs on the
/// same host keeps its own.
const POOL: &str = "10.213.0.0/24";

/// A tiny HTTP/1.1 server on 0.0.0.0: every request gets `body`. Returns
/// its port and a count of the requests it answered.
fn host_server(body: String) -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("0.0.0.0:0").expect("binding the host's HTTP server");
    let port = listener.local_addr().unwrap().port();
    let served = Arc::new(AtomicUsize::new(0));
    let count = served.clone();
    thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut s) = conn else { continue };
            let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && head.len() < 8192 {
                match s.read(&mut byte) {
                    Ok(1) => head.push(byte[0]),
                    _ => break,
                }
            }
            if !head.starts_with(b"GET /hello ") {
                let _ = s.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n");
                continue;
            }
            let reply = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            // Counted before the reply goes out: the function's answer can
            // reach the test before this thread runs again.
            count.fetch_add(1, Ordering::SeqCst);
            let _ = s.write_all(reply.as_bytes());
        }
    });
    (port, served)
}

/// An address of this host the guests can reach through their veth: the
/// first global IPv4 address that is not on one of the daemon's veths, or
/// else the host's end of the pool's first /30 (which the zygote's, or the
/// restored instance's, namespace holds while the guest fetches).
fn host_address() -> String {
    let out = Command::new("ip")
        .args(["-4", "-o", "addr", "show", "scope", "global"])
        .output()
        .expect("run ip");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            let dev = words.nth(1)?;
            let addr = words.nth(1)?.split('/').next()?;
            (!dev.starts_with("sp") && !addr.starts_with("10.213.")).then(|| addr.to_string())
        })
        .next()
        .unwrap_or_else(|| "10.213.0.1".to_string())
}

/// The daemon's network namespaces of function `f` (`sp<hash>.<f>.<instance>`).
fn namespaces_of(f: &str) -> Vec<String> {
    let marker = format!(".{f}.");
    namespaces_where(|n| n.starts_with("sp") && n.contains(&marker))
}

/// The named network namespaces (`/run/netns`) whose name passes `keep`.
fn namespaces_where(keep: impl Fn(&str) -> bool) -> Vec<String> {
    std::fs::read_dir("/run/netns")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| keep(n))
        .collect()
}

/// The daemon's (`prefix`) spare namespaces, made ahead for its next
/// networked instances.
fn spares_of(prefix: &str) -> Vec<String> {
    let marker = format!("{prefix}..spare");
    namespaces_where(|n| n.starts_with(&marker))
}

/// Host links whose name starts with `prefix`.
fn links_with(prefix: &str) -> Vec<String> {
    std::fs::read_dir("/sys/class/net")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with(prefix))
        .collect()
}

fn nft_tables() -> String {
    let out = Command::new("nft")
        .args(["list", "tables"])
        .output()
        .expect("run nft (nftables)");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Waits (bounded) until `done` holds; returns whether it did.
fn eventually(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while !done() {
        if Instant::now() > deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(50));
    }
    true
}

/// Invokes `f` to fetch `url`; checks the body and returns the start path.
fn fetch(d: &Daemon, f: &str, url: &str, body: &str) -> String {
    let payload = serde_json::json!({ "url": url }).to_string();
    let r = d.invoke(f, payload.as_bytes());
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.header("x-amz-function-error"),
        None,
        "fn-fetch failed: {}",
        r.text()
    );
    let v = r.json();
    assert_eq!(v["status"], "HTTP/1.1 200 OK", "{v}");
    assert_eq!(v["body"], body, "{v}");
    assert_eq!(v["truncated"], false, "{v}");
    r.header("x-spore-start-path").unwrap_or("?").to_string()
}

/// Jailed (the default) and unjailed, a networked function's instances are
/// clones of its zygote, each in a namespace of its own: unjailed, a clone
/// enters it; jailed (its uid may not), it is given its tap's
/// `/dev/net/tun` opened there. One after the other: the two daemons would
/// share the address pool.
#[test]
fn kvm_serve_net_function_fetches_from_the_host_on_every_start_path() {
    net_function_on_every_start_path(true);
    net_function_on_every_start_path(false);
}

fn net_function_on_every_start_path(jailed: bool) {
    require_kvm();
    require_tap();
    let dir = Scratch::new("serve-net");
    let state = dir.path("state");
    let mut args = vec!["--keep-alive-ms", "0", "--net-pool", POOL];
    // Jailed, with networks made ahead (the default); unjailed, with none
    // (`--net-spares 0`): every namespace made on its start's path.
    let spares = jailed;
    if !jailed {
        args.extend(["--no-jail", "--net-spares", "0"]);
    }
    let args = &args[..];
    let warm_path = "clone";
    let pid = std::process::id();
    let f = format!("fetch{pid}");
    let plain = format!("plain{pid}");
    let body = format!("hello from the host to {f}\n");
    let (port, served) = host_server(body.clone());
    let url = format!("http://{}:{port}/hello", host_address());

    let mut d = Daemon::start(&state, args);
    let r = d.create(
        &f,
        "fn-fetch",
        serde_json::json!({ "SporeNetwork": { "Enabled": true }, "Timeout": 30 }),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(r.json()["SporeNetwork"]["Enabled"], true);
    let g = d.request("GET", &format!("/2015-03-31/functions/{f}"), b"", &[]);
    assert_eq!(g.json()["Configuration"]["SporeNetwork"]["Enabled"], true);

    // Cold: the booted VM becomes the zygote, its first clone fetches.
    assert_eq!(fetch(&d, &f, &url, &body), "cold");
    let made = namespaces_of(&f);
    assert!(!made.is_empty(), "no network namespace for {f}");
    let prefix = made[0].split('.').next().unwrap().to_string();
    assert!(
        !links_with(&format!("{prefix}v")).is_empty(),
        "no host veth of {prefix}"
    );
    assert!(nft_tables().contains(&format!("spore_{}", &prefix[2..])));
    // Clone: a new namespace for clone 2, the same guest address.
    assert_eq!(fetch(&d, &f, &url, &body), warm_path);
    // Namespaces are made ahead, off the start path: two spares wait, each
    // with its host veth, and the next clone takes one (renamed its own).
    let want = if spares { 2 } else { 0 };
    assert!(
        eventually(Duration::from_secs(10), || spares_of(&prefix).len() == want),
        "spares: {:?}",
        spares_of(&prefix)
    );
    let before = spares_of(&prefix);
    assert_eq!(fetch(&d, &f, &url, &body), warm_path);
    if spares {
        assert!(
            spares_of(&prefix).len() < 2 || spares_of(&prefix) != before,
            "the clone took no spare: {before:?}"
        );
    } else {
        assert!(spares_of(&prefix).is_empty());
    }
    assert_eq!(served.load(Ordering::SeqCst), 3);
    // Nothing listens there: an error result, not a hung instance.
    let closed = TcpListener::bind("0.0.0.0:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let bad = serde_json::json!({ "url": format!("http://{}:{closed}/", host_address()) });
    let r = d.invoke(&f, bad.to_string().as_bytes());
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-amz-function-error"), Some("Unhandled"));
    assert_eq!(r.json()["errorType"], "FetchError", "{}", r.text());

    // Frames that reach the zygote's tap after its snapshot was written
    // (ARP requests from its namespace's kernel, for a guest that never
    // answers: the zygote is a paused template) must not land in the
    // memory its later clones map from.
    wait_for_snapshot(&state, &f, 1, Duration::from_secs(15));
    let zygote_ns = namespaces_of(&f)
        .into_iter()
        .find(|n| !n.rsplit('.').next().unwrap_or("c").contains('c'))
        .expect("the zygote's namespace");
    let _ = Command::new("ip")
        .args(["netns", "exec", &zygote_ns, "curl", "-s", "--max-time", "1"])
        .arg("http://172.16.0.2:9/")
        .output();
    assert_eq!(fetch(&d, &f, &url, &body), warm_path);
    assert_eq!(fetch(&d, &f, &url, &body), warm_path);
    assert_eq!(served.load(Ordering::SeqCst), 5);

    // A function without network gets no namespace.
    assert_eq!(
        d.create(&plain, "fn-echo", serde_json::json!({})).status,
        201
    );
    let r = d.invoke(&plain, b"{\"a\":1}");
    assert_eq!(r.json()["echo"]["a"], 1);
    assert_eq!(
        d.request("GET", &format!("/2015-03-31/functions/{plain}"), b"", &[])
            .json()["Configuration"]["SporeNetwork"]["Enabled"],
        false
    );
    assert!(namespaces_of(&plain).is_empty());

    // A killed daemon leaves its namespaces; the next one removes them at
    // start, and restores the snapshot in a fresh namespace.
    d.kill9();
    assert!(
        !namespaces_of(&f).is_empty(),
        "a killed daemon cannot clean up"
    );
    let d = Daemon::start(&state, args);
    assert!(
        namespaces_of(&f).is_empty(),
        "leftovers after restart: {:?}",
        namespaces_of(&f)
    );
    assert!(links_with(&format!("{prefix}v")).is_empty());
    assert_eq!(fetch(&d, &f, &url, &body), "restore");
    assert_eq!(served.load(Ordering::SeqCst), 6);

    // Deleting the function removes its namespaces and veths (the host
    // veths left are the daemon's spares').
    let r = d.request("DELETE", &format!("/2015-03-31/functions/{f}"), b"", &[]);
    assert_eq!(r.status, 204);
    assert!(
        eventually(Duration::from_secs(10), || namespaces_of(&f).is_empty()
            && links_with(&format!("{prefix}v")).len()
                == spares_of(&prefix).len()
            && spares_of(&prefix).len() <= 2),
        "after delete: {:?} {:?}",
        namespaces_of(&f),
        links_with(&format!("{prefix}v"))
    );

    // Networked again, then the daemon stops: nothing of it is left.
    let again = format!("again{pid}");
    let r = d.create(
        &again,
        "fn-fetch",
        serde_json::json!({ "SporeNetwork": { "Enabled": true }, "Timeout": 30 }),
    );
    assert_eq!(r.status, 201);
    assert_eq!(fetch(&d, &again, &url, &body), "cold");
    assert!(!namespaces_of(&again).is_empty());
    drop(d); // SIGTERM: the daemon ends its instances.
    assert!(
        namespaces_of(&again).is_empty() && spares_of(&prefix).is_empty(),
        "after stop: {:?} {:?}",
        namespaces_of(&again),
        spares_of(&prefix)
    );
    assert!(links_with(&format!("{prefix}v")).is_empty());
    assert!(!nft_tables().contains(&format!("spore_{}", &prefix[2..])));
}
