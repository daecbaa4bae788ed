//! Clone limits end to end on host KVM with the `clonetest` unikernel:
//! guest fork is off unless turned on, a fork bomb stops at its tree's
//! budget, a clone forks only when granted, clones end with their source
//! (clones of clones too), and the host-wide clone process limit.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common;
use crate::common::clone::*;
use crate::common::*;

/// Every log of `dir` concatenated.
fn all_logs(dir: &Path) -> String {
    let mut out = String::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.path().extension().is_some_and(|x| x == "log") {
            out += &read(&e.path());
        }
    }
    out
}

fn clone_logs(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.starts_with("src-c") && n.ends_with(".log")
        })
        .count()
}

#[test]
fn kvm_clone_guest_fork_is_refused_by_default_and_the_api_still_clones() {
    require_kvm();
    let s = Scratch::new("limits-off");
    let (sock, mut reaper) = start_source(&s.0, 64, "mode=loop", None);
    wait_until(&s.0, 20, "the refused fork", || {
        read(&s.path("src.log")).contains("id 0: fork refused after 0 forks")
    });
    let log = read(&s.path("src.log"));
    let said: Vec<_> = log
        .lines()
        .filter(|l| l.contains("guest fork refused"))
        .collect();
    assert_eq!(said.len(), 1, "{log}");
    assert!(said[0].contains("guest_fork"), "{log}");
    assert_eq!(clone_logs(&s.0), 0, "no clone was started");
    // The host's choice stays allowed.
    let (code, r) = put_clone(&sock, r#"{"count": 1}"#);
    assert_eq!(code, 200, "{r}");
    reaper.add_from(&r);
    let (code, body) = http(&s.path("src-c1.sock"), "GET", "/", None);
    assert_eq!(code, 200);
    assert!(body.contains("Running"), "{body}");
}

#[test]
fn kvm_clone_a_fork_bomb_stops_at_its_tree_budget() {
    require_kvm();
    let s = Scratch::new("limits-bomb");
    // Continue mode: the source and every clone go on forking.
    let (sock, _reaper) = start_source(
        &s.0,
        64,
        "mode=loop",
        Some(
            r#"{"mode": "continue", "guest_fork": true, "clones_may_fork": true, "max_clones": 8}"#,
        ),
    );
    // Count the tree's VMM processes while it grows.
    let most = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (most, stop, dir) = (most.clone(), stop.clone(), s.0.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                most.fetch_max(common::serve::vmm_pids_under(&dir).len(), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    // Every VM of the tree ends refused: the source and 8 clones.
    wait_until(&s.0, 60, "every VM of the tree to be refused", || {
        all_logs(&s.0).matches("fork refused after").count() == 9
    });
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    let logs = all_logs(&s.0);
    assert_eq!(logs.matches("forked id").count(), 8, "{logs}");
    assert_eq!(clone_logs(&s.0), 8);
    assert_eq!(
        common::serve::vmm_pids_under(&s.0).len(),
        9,
        "the source and its 8 clones run"
    );
    let most = most.load(Ordering::Relaxed);
    assert!(most <= 9, "{most} VMM processes at once (max_clones 8)");
    let status: serde_json::Value =
        serde_json::from_str(&http(&sock, "GET", "/clone", None).1).unwrap();
    assert_eq!(status["budget_left"], 0, "{status}");
    // The host's request is refused too: the budget is the tree's.
    let (code, r) = put_clone(&sock, r#"{"count": 1}"#);
    assert_eq!(code, 400, "{r}");
    assert!(r.to_string().contains("max_clones"), "{r}");
}

#[test]
fn kvm_clone_a_clone_forks_only_when_granted() {
    require_kvm();
    let args = "clones=1 levels=2 nest=1 mib=1 hold_ms=50 after=stay";
    let s = Scratch::new("limits-grant");
    let (_sock, _reaper) = start_source(&s.0, 64, args, Some(r#"{"guest_fork": true}"#));
    wait_until(&s.0, 30, "the clone's refused fork", || {
        read(&s.path("src-c1.log")).contains("id 1: fork failed")
    });
    let log = read(&s.path("src-c1.log"));
    assert!(log.contains("clone 1 ok depth 1"), "{log}");
    assert!(log.contains("guest fork refused"), "{log}");
    assert_eq!(clone_logs(&s.0), 1, "the clone made no clone");

    let s = Scratch::new("limits-granted");
    let (_sock, _reaper) = start_source(
        &s.0,
        64,
        args,
        Some(r#"{"guest_fork": true, "clones_may_fork": true}"#),
    );
    wait_until(&s.0, 30, "the clone's clone", || oks(&s.0).0.contains(&101));
    assert!(oks(&s.0).1.is_empty(), "{:?}", oks(&s.0).1);
}

#[test]
fn kvm_clone_clones_and_their_clones_end_with_their_source() {
    require_kvm();
    let s = Scratch::new("limits-end");
    let (_sock, mut reaper) = start_source(
        &s.0,
        64,
        "clones=1 levels=2 nest=1 mib=1 hold_ms=50 after=stay",
        Some(r#"{"guest_fork": true, "clones_may_fork": true}"#),
    );
    wait_until(&s.0, 30, "a clone and its clone", || {
        oks(&s.0).0.contains(&101)
    });
    let tree = common::serve::vmm_pids_under(&s.0);
    assert_eq!(tree.len(), 3, "source, clone, clone of the clone");
    reaper.pids.extend(&tree);
    let mut src = reaper.source.take().unwrap();
    src.kill().unwrap();
    src.wait().unwrap();
    wait_until(&s.0, 20, "the clones to end with their source", || {
        !tree.iter().any(|&p| alive(p))
    });
    let logs = all_logs(&s.0);
    assert_eq!(
        logs.matches("the source VMM ended; this clone ends with it")
            .count(),
        2,
        "{logs}"
    );
}

#[test]
fn kvm_clone_the_host_limit_refuses_clone_processes_over_it() {
    require_kvm();
    let s = Scratch::new("limits-host");
    let (sock, mut reaper) = start_source(
        &s.0,
        64,
        "mode=loop",
        Some(r#"{"mode": "continue", "host_max_clones": 100000}"#),
    );
    wait_until(&s.0, 20, "the guest", || {
        read(&s.path("src.log")).contains("fork refused")
    });
    let (code, r) = put_clone(&sock, r#"{"count": 1}"#);
    assert_eq!(code, 200, "{r}");
    reaper.add_from(&r);
    // At least that clone runs on this host: a limit of 1 refuses another.
    let (code, body) = http(
        &sock,
        "PUT",
        "/clone/config",
        Some(r#"{"mode": "continue", "host_max_clones": 1}"#),
    );
    assert_eq!(code, 204, "{body}");
    let (code, r) = put_clone(&sock, r#"{"count": 1}"#);
    assert_eq!(code, 400, "{r}");
    let msg = r["fault_message"].as_str().unwrap_or_default();
    assert!(msg.contains("host limit is 1 (host_max_clones)"), "{msg}");
    let (_, info) = http(&sock, "GET", "/", None);
    assert!(info.contains("Running"), "{info}");
    let (code, body) = http(
        &sock,
        "PUT",
        "/clone/config",
        Some(r#"{"host_max_clones": 0}"#),
    );
    assert_eq!(code, 400, "{body}");
}
