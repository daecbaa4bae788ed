//! `spore serve` puts every instance VMM in a cgroup of its own by default
//! (issue 30 item 2, its cgroup part): memory bounded by MemorySize and the VMM's
//! overhead, processes bounded, a CPU share and cap by memory; a clone moved out of
//! its zygote's; an instance past its memory ended alone and reported as
//! `Runtime.OutOfMemory`; the tree removed when the daemon stops.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::thread;

use crate::common::serve::Daemon;
use crate::common::{require_kvm, Scratch};

/// Process `pid`'s cgroup path in the v1 hierarchy of `controller` (this
/// host's hierarchies are v1, each at /sys/fs/cgroup/<controller>).
pub(crate) fn cgroup_of(pid: i32, controller: &str) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    text.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, list, path) = (f.next()?, f.next()?, f.next()?);
        list.split(',')
            .any(|c| c == controller)
            .then(|| path.to_string())
    })
}

/// A file of `pid`'s cgroup of `controller`.
pub(crate) fn cgroup_file(pid: i32, controller: &str, file: &str) -> String {
    let cg = cgroup_of(pid, controller).unwrap_or_default();
    std::fs::read_to_string(format!("/sys/fs/cgroup/{controller}{cg}/{file}"))
        .unwrap_or_default()
        .trim()
        .to_string()
}

fn memory_cgroup(pid: i32) -> Option<String> {
    cgroup_of(pid, "memory")
}

#[test]
fn kvm_serve_instances_get_their_own_cgroups() {
    require_kvm();
    let dir = Scratch::new("serve-cg");
    let state = dir.path("state");
    let me = memory_cgroup(std::process::id() as i32).expect("this process's memory cgroup");
    let d = std::sync::Arc::new(Daemon::start(&state, &[]));
    assert_eq!(
        d.create("f", "fn-echo", serde_json::json!({"MemorySize": 128}))
            .status,
        201
    );
    // Two at once: the zygote and a clone of it, at least.
    let handles: Vec<_> = (0..2)
        .map(|_| {
            let d = d.clone();
            thread::spawn(move || d.invoke("f", br#"{"sleep_ms":300}"#).status)
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap(), 200);
    }
    let pids = d.vmm_pids();
    assert!(pids.len() >= 2, "{pids:?}");
    let mut leaves = BTreeSet::new();
    for pid in &pids {
        let cg = memory_cgroup(*pid).unwrap_or_default();
        // Under the daemon's own cgroup (the test's), in the function's group.
        assert!(
            cg.starts_with(&format!("{}/sp", me.trim_end_matches('/'))) && cg.contains("/f/"),
            "VMM {pid} is in {cg}"
        );
        leaves.insert(cg);
        assert_eq!(
            cgroup_file(*pid, "memory", "memory.limit_in_bytes"),
            ((128u64 + 64) << 20).to_string(),
            "{pid}"
        );
        assert_eq!(cgroup_file(*pid, "pids", "pids.max"), "512", "{pid}");
        assert_eq!(
            cgroup_file(*pid, "cpu", "cpu.shares"),
            (1024 * 128 / 1769).to_string(),
            "{pid}"
        );
    }
    assert!(
        leaves.len() >= 2,
        "a clone has a cgroup of its own: {leaves:?}"
    );
    // The instances that served are capped at their memory's share of a CPU
    // (10,000 µs × 128 / 1,769 a 10 ms period, raised to the kernel's
    // least, 1 ms); the zygote, which clones on every invoker's path, is not.
    let quotas: Vec<String> = pids
        .iter()
        .map(|pid| cgroup_file(*pid, "cpu", "cpu.cfs_quota_us"))
        .collect();
    assert!(
        quotas.iter().all(|q| q == "1000" || q == "-1"),
        "{quotas:?}"
    );
    assert!(quotas.iter().any(|q| q == "1000"), "{quotas:?}");
    for pid in &pids {
        assert_eq!(cgroup_file(*pid, "cpu", "cpu.cfs_period_us"), "10000");
    }
    // The daemon stopped: its tree is gone.
    let tree: PathBuf = PathBuf::from(format!(
        "/sys/fs/cgroup/memory{}",
        leaves
            .iter()
            .next()
            .and_then(|l| l.rsplitn(3, '/').nth(2).map(str::to_string))
            .unwrap_or_default()
    ));
    assert!(tree.exists(), "{}", tree.display());
    drop(std::sync::Arc::into_inner(d));
    assert!(!tree.exists(), "{} left behind", tree.display());
}

/// The processes in each cgroup of the memory hierarchy under `base` (a
/// path as /proc/PID/cgroup gives it), by cgroup.
fn processes_under(base: &str) -> std::collections::BTreeMap<String, Vec<i32>> {
    let mut by_leaf = std::collections::BTreeMap::<String, Vec<i32>>::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        if let Some(cg) = memory_cgroup(pid).filter(|cg| cg.starts_with(base)) {
            by_leaf.entry(cg).or_default().push(pid);
        }
    }
    by_leaf
}

/// The clone processes a zygote starts ahead (its standby pool) are each
/// moved into a cgroup of their own once a clone report lists them, off the
/// clone path, so that a clone request that hands one out finds it there
/// (moving a process when no move came for a while costs milliseconds):
/// clones 150 ms apart each run in a leaf of their own, and the zygote's
/// leaf holds only the zygote, its clone factory and at most the one
/// standby process started after the last clone (no report listed it yet).
#[test]
fn kvm_serve_standby_clones_get_their_cgroups_ahead() {
    require_kvm();
    let dir = Scratch::new("serve-cga");
    let me = memory_cgroup(std::process::id() as i32).expect("this process's memory cgroup");
    let d = std::sync::Arc::new(Daemon::start(&dir.path("state"), &["--keep-alive-ms", "0"]));
    let r = d.create("f", "fn-echo", serde_json::json!({"MemorySize": 128}));
    assert_eq!(r.status, 201);
    let base = format!("{}/sp", me.trim_end_matches('/'));
    // No leaf holds more than the zygote, its factory and one standby
    // process; while a clone serves, it is in a leaf of its own.
    let check = |when: &str| {
        let by_leaf = processes_under(&base);
        let crowded: Vec<_> = by_leaf.iter().filter(|(_, p)| p.len() > 3).collect();
        assert!(
            crowded.is_empty(),
            "{when}: standby processes left in their zygote's cgroup: {crowded:?} (all: {by_leaf:?})"
        );
        by_leaf
    };
    // The cold start first (it makes the zygote): its boot, slow on a
    // loaded host, is not what is checked; the invocations below are clones.
    assert_eq!(d.invoke("f", b"{}").status, 200);
    thread::sleep(std::time::Duration::from_millis(150));
    for i in 0..4 {
        let h = {
            let d = d.clone();
            thread::spawn(move || d.invoke("f", br#"{"sleep_ms":200}"#).status)
        };
        thread::sleep(std::time::Duration::from_millis(100));
        let by_leaf = check(&format!("invocation {i}"));
        assert!(by_leaf.len() >= 2, "invocation {i}: {by_leaf:?}");
        assert_eq!(h.join().unwrap(), 200);
        thread::sleep(std::time::Duration::from_millis(150));
    }
    // The standby process the last report listed, in a leaf of its own.
    let by_leaf = check("after the clones");
    let singles = by_leaf.values().filter(|p| p.len() == 1).count();
    assert!(
        singles >= 1,
        "a standby process in its own leaf: {by_leaf:?}"
    );
}

/// An instance whose VMM goes past its cgroup's memory is ended by the
/// kernel, alone; the invoker gets `Runtime.OutOfMemory`; the function's
/// next invocation, and another function's, run. A guest alone cannot pass
/// MemorySize plus the overhead (its memory is MemorySize): the test lowers
/// one instance's limit under what its guest then touches, as a VMM that
/// grew past its overhead would find it.
#[test]
fn kvm_serve_an_instance_past_its_memory_is_ended_alone() {
    require_kvm();
    let dir = Scratch::new("serve-oom");
    let d = Daemon::start(&dir.path("state"), &["--no-clones"]);
    // 1,769 MB: a whole CPU once capped, so that touching 100 MiB (page
    // faults under this host's KVM are slow) is not throttled past the
    // function's timeout.
    for name in ["big", "other"] {
        let r = d.create(name, "fn-echo", serde_json::json!({"MemorySize": 1769}));
        assert_eq!(r.status, 201, "{}", r.text());
    }
    let r = d.invoke("other", br#"{"sleep_ms":10}"#);
    assert_eq!(r.status, 200, "{}", r.text());
    let other_pids = d.vmm_pids();
    let r = d.invoke("big", br#"{"hold_mib":8}"#);
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.header("x-amz-function-error").is_none(), "{}", r.text());
    // The idle instance of "big": 64 MiB from now on (it holds ~15).
    let big: Vec<i32> = d
        .vmm_pids()
        .into_iter()
        .filter(|p| memory_cgroup(*p).is_some_and(|c| c.contains("/big/")))
        .collect();
    assert_eq!(big.len(), 1, "{big:?}");
    let leaf = memory_cgroup(big[0]).unwrap_or_default();
    std::fs::write(
        format!("/sys/fs/cgroup/memory{leaf}/memory.limit_in_bytes"),
        (64u64 << 20).to_string(),
    )
    .expect("lowering the instance's memory limit");
    let r = d.invoke("big", br#"{"hold_mib":100}"#);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-amz-function-error"), Some("Unhandled"));
    assert_eq!(r.json()["errorType"], "Runtime.OutOfMemory", "{}", r.text());
    assert!(
        r.json()["errorMessage"]
            .as_str()
            .is_some_and(|m| m.contains("signal: killed") && m.contains("limit of 64 MiB")),
        "{}",
        r.text()
    );
    // The other function's instance was not touched, and both still serve
    // ("big" from a new instance).
    let now = d.vmm_pids();
    assert!(
        other_pids.iter().all(|p| now.contains(p)),
        "{other_pids:?} -> {now:?}"
    );
    assert!(!now.contains(&big[0]), "the instance past its memory ended");
    assert_eq!(d.invoke("other", b"{}").status, 200);
    let r = d.invoke("big", br#"{"hold_mib":100}"#);
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.header("x-amz-function-error").is_none(), "{}", r.text());
}

/// `--no-cpu-cap` keeps each instance's cgroup and CPU weight but no cap;
/// `--no-cgroups` leaves instance VMMs in the daemon's own cgroup.
#[test]
fn kvm_serve_cgroups_without_a_cpu_cap_or_at_all() {
    require_kvm();
    let dir = Scratch::new("serve-cgo");
    let me = memory_cgroup(std::process::id() as i32).expect("this process's memory cgroup");
    let d = Daemon::start(&dir.path("u"), &["--no-cpu-cap"]);
    let r = d.create("f", "fn-echo", serde_json::json!({"MemorySize": 128}));
    assert_eq!(r.status, 201);
    assert_eq!(d.invoke("f", b"{}").status, 200);
    let pids = d.vmm_pids();
    assert!(!pids.is_empty());
    for pid in &pids {
        assert_ne!(memory_cgroup(*pid).as_deref(), Some(me.as_str()), "{pid}");
        assert_eq!(cgroup_file(*pid, "cpu", "cpu.cfs_quota_us"), "-1", "{pid}");
        assert_eq!(cgroup_file(*pid, "cpu", "cpu.shares"), "74", "{pid}");
    }
    drop(d);
    let d = Daemon::start(&dir.path("s"), &["--no-cgroups"]);
    assert_eq!(d.create("f", "fn-echo", serde_json::json!({})).status, 201);
    assert_eq!(d.invoke("f", b"{}").status, 200);
    let pids = d.vmm_pids();
    assert!(!pids.is_empty());
    for pid in &pids {
        assert_eq!(memory_cgroup(*pid).as_deref(), Some(me.as_str()), "{pid}");
    }
}
