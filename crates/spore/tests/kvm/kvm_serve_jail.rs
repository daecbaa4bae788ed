//! `spore serve` runs every instance's VMM as a user of its own function
//! (issue 30 item 2, its uid and chroot parts): a uid per function from
//! `--uid-range`, no capability, the shared group as its one supplementary
//! group, a root of its own showing only what it needs; clones run as
//! their zygote, in its root. What that user can reach is checked by doing it as
//! that user: its own snapshot yes; another function's snapshot, the
//! catalogue, a listing of the state directory, a signal to the daemon no.

use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::common::serve::{wait_for_snapshot, Daemon};
use crate::common::{require_kvm, Scratch};

/// A line of `/proc/PID/status` after its key, e.g. `Uid`.
fn status_field(pid: i32, key: &str) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .unwrap_or("")
        .trim()
        .to_string()
}

/// The real uid of `pid`.
fn uid_of(pid: i32) -> u32 {
    status_field(pid, "Uid")
        .split_whitespace()
        .next()
        .and_then(|u| u.parse().ok())
        .unwrap_or(0)
}

/// Runs `program args` as `uid` (its gid the same) with `groups`.
fn run_as(uid: u32, groups: &[u32], program: &str, args: &[&str]) -> std::process::Output {
    let groups = groups.to_vec();
    let mut cmd = Command::new(program);
    cmd.args(args);
    // SAFETY: only async-signal-safe id syscalls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setgroups(groups.len(), groups.as_ptr()) != 0
                || libc::setresgid(uid, uid, uid) != 0
                || libc::setresuid(uid, uid, uid) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.output().expect("running a command as the VMM's user")
}

fn can_read(uid: u32, groups: &[u32], path: &Path) -> bool {
    run_as(uid, groups, "head", &["-c", "1", path.to_str().unwrap()])
        .status
        .success()
}

#[test]
fn kvm_serve_each_functions_vmms_run_as_its_own_user() {
    require_kvm();
    let dir = Scratch::new("serve-jail");
    let state = dir.path("state");
    let d = Daemon::start(&state, &["--uid-range", "200000:100"]);
    for f in ["a", "b"] {
        assert_eq!(d.create(f, "fn-echo", serde_json::json!({})).status, 201);
        let r = d.invoke(f, b"{\"x\":1}");
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("x-spore-start-path"), Some("cold"));
    }
    wait_for_snapshot(&state, "a", 1, Duration::from_secs(20));
    wait_for_snapshot(&state, "b", 1, Duration::from_secs(20));
    // Zygotes and clones of both functions: none is root, none has a
    // capability, each function's are one uid, the two functions' differ.
    let pids = d.vmm_pids();
    assert!(pids.len() >= 4, "zygote and clone of each: {pids:?}");
    let snap_owner = |f: &str| {
        use std::os::unix::fs::MetadataExt as _;
        std::fs::metadata(state.join(format!("snapshots/{f}-v1")))
            .unwrap()
            .uid()
    };
    let (ua, ub) = (snap_owner("a"), snap_owner("b"));
    assert!((200_001..200_100).contains(&ua), "a's uid {ua}");
    assert!((200_001..200_100).contains(&ub), "b's uid {ub}");
    assert_ne!(ua, ub, "two functions share a uid");
    for pid in &pids {
        let uid = uid_of(*pid);
        assert!(uid == ua || uid == ub, "VMM {pid} runs as {uid}");
        assert_eq!(
            status_field(*pid, "CapEff"),
            "0000000000000000",
            "VMM {pid}"
        );
        assert_eq!(status_field(*pid, "Groups"), "200000", "VMM {pid}");
        assert_eq!(status_field(*pid, "Seccomp"), "2", "VMM {pid}");
    }
    assert!(pids.iter().any(|p| uid_of(*p) == ua));
    assert!(pids.iter().any(|p| uid_of(*p) == ub));
    // Each in a root of its own: the host's files are not there, nor the
    // daemon's; its snapshots and its run directory are, at their paths.
    let in_state = state.strip_prefix("/").unwrap();
    for pid in &pids {
        let root = std::path::PathBuf::from(format!("/proc/{pid}/root"));
        for hidden in ["etc", "root", "home", "var"] {
            assert!(!root.join(hidden).exists(), "VMM {pid} sees /{hidden}");
        }
        assert!(!root.join(in_state).join("catalog.db").exists());
        assert!(!root.join(in_state).join("logs").exists());
        assert!(root.join(in_state).join("snapshots").is_dir());
        assert!(root.join(in_state).join("run").is_dir());
    }

    // What a's user reaches: its own snapshot, nothing of b's or the daemon's.
    let shared = [200_000];
    assert!(can_read(
        ua,
        &shared,
        &state.join("snapshots/a-v1/vm.state")
    ));
    assert!(!can_read(
        ua,
        &shared,
        &state.join("snapshots/b-v1/vm.state")
    ));
    assert!(!can_read(ua, &shared, &state.join("catalog.db")));
    assert!(!can_read(ua, &shared, &state.join("logs/a.log")));
    let listing = run_as(ua, &shared, "ls", &[state.to_str().unwrap()]);
    assert!(
        !listing.status.success(),
        "a's user lists the state directory"
    );
    let signal = run_as(ua, &shared, "kill", &["-0", &d.child.id().to_string()]);
    assert!(!signal.status.success(), "a's user may signal the daemon");

    // The uids are kept across a restart (the snapshots are their files):
    // a restore of each function runs as its uid again.
    drop(d);
    let d = Daemon::start(&state, &["--uid-range", "200000:100"]);
    for f in ["a", "b"] {
        let r = d.invoke(f, b"{\"x\":2}");
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("x-spore-start-path"), Some("restore"), "{f}");
    }
}

/// What every VMM of function `f` (MemorySize 128) must show on any start
/// path: a uid of the range and no capability, seccomp with no new
/// privileges, a root without the host's files, and a cgroup leaf of its
/// own under `f`'s group with `f`'s limits. Returns its memory cgroup.
fn assert_jailed(pid: i32, range: std::ops::Range<u32>, what: &str) -> String {
    use super::kvm_serve_cgroups::{cgroup_file, cgroup_of};
    let uid = uid_of(pid);
    assert!(range.contains(&uid), "{what}: VMM {pid} runs as {uid}");
    assert_eq!(
        status_field(pid, "CapEff"),
        "0000000000000000",
        "{what}: {pid}"
    );
    assert_eq!(status_field(pid, "Seccomp"), "2", "{what}: {pid}");
    assert_eq!(status_field(pid, "NoNewPrivs"), "1", "{what}: {pid}");
    let root = std::path::PathBuf::from(format!("/proc/{pid}/root"));
    assert!(!root.join("etc").exists(), "{what}: VMM {pid} sees /etc");
    let leaf = cgroup_of(pid, "memory").unwrap_or_default();
    assert!(leaf.contains("/f/"), "{what}: VMM {pid} is in {leaf}");
    assert_eq!(
        cgroup_file(pid, "memory", "memory.limit_in_bytes"),
        ((128u64 + 64) << 20).to_string(),
        "{what}: {pid}"
    );
    assert_eq!(cgroup_file(pid, "pids", "pids.max"), "512", "{what}: {pid}");
    leaf
}

/// Every start path's VMM — cold boot, zygote and clone, provisioned,
/// restore — runs jailed in a cgroup of its own (issue 30's scenario).
#[test]
fn kvm_serve_every_start_path_runs_jailed_in_a_cgroup_of_its_own() {
    require_kvm();
    let dir = Scratch::new("serve-jp");
    let state = dir.path("state");
    let range = 210_001..210_100;
    let d = std::sync::Arc::new(Daemon::start(&state, &["--uid-range", "210000:100"]));
    let check_all = |d: &Daemon, what: &str| {
        let pids = d.vmm_pids();
        assert!(!pids.is_empty(), "{what}: no VMM");
        // One leaf per instance: a zygote's shares its own only with the
        // processes it starts ahead (through its clone factory: its
        // grandchildren), each moved into a leaf of its own when it becomes
        // an instance.
        let mut by_leaf: std::collections::BTreeMap<String, Vec<i32>> = Default::default();
        for pid in &pids {
            by_leaf
                .entry(assert_jailed(*pid, range.clone(), what))
                .or_default()
                .push(*pid);
        }
        for (leaf, group) in &by_leaf {
            let parents: Vec<i32> = group
                .iter()
                .filter(|p| {
                    let parent = |pid: i32| status_field(pid, "PPid").parse().unwrap_or(0);
                    let (up, up2) = (parent(**p), parent(parent(**p)));
                    !group.contains(&up) && !group.contains(&up2)
                })
                .copied()
                .collect();
            assert_eq!(parents.len(), 1, "{what}: VMMs {group:?} share {leaf}");
        }
    };
    let r = d.create("f", "fn-echo", serde_json::json!({"MemorySize": 128}));
    assert_eq!(r.status, 201, "{}", r.text());
    let r = d.invoke("f", b"{}");
    assert_eq!(r.header("x-spore-start-path"), Some("cold"), "{}", r.text());
    check_all(&d, "cold");
    wait_for_snapshot(&state, "f", 1, Duration::from_secs(20));
    // Two at once: the warm instance and a clone of the zygote.
    let paths: Vec<String> = (0..2)
        .map(|_| {
            let d = d.clone();
            std::thread::spawn(move || {
                let r = d.invoke("f", br#"{"sleep_ms":300}"#);
                r.header("x-spore-start-path").unwrap_or("").to_string()
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    assert!(paths.iter().any(|p| p == "clone"), "{paths:?}");
    check_all(&d, "clone");
    let r = d.request("POST", "/2015-03-31/functions/f/versions", b"{}", &[]);
    assert_eq!(r.status, 201, "{}", r.text());
    let r = d.request(
        "PUT",
        "/2019-09-30/functions/f/provisioned-concurrency?Qualifier=1",
        br#"{"ProvisionedConcurrentExecutions":2}"#,
        &[],
    );
    assert_eq!(r.status, 202, "{}", r.text());
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while d.metric("spore_instances{function=\"f\",state=\"provisioned\"}") < 2.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no provisioned instances"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let r = d.invoke("f:1", b"{}");
    assert_eq!(
        r.header("x-spore-start-path"),
        Some("provisioned"),
        "{}",
        r.text()
    );
    check_all(&d, "provisioned");
    // A new daemon without clones: a restore.
    drop(std::sync::Arc::into_inner(d));
    let d = Daemon::start(&state, &["--uid-range", "210000:100", "--no-clones"]);
    let r = d.invoke("f", b"{}");
    assert_eq!(
        r.header("x-spore-start-path"),
        Some("restore"),
        "{}",
        r.text()
    );
    check_all(&d, "restore");
}

#[test]
fn kvm_serve_no_jail_runs_vmms_as_the_daemons_user_and_says_so() {
    require_kvm();
    let dir = Scratch::new("serve-nojail");
    let d = Daemon::start(&dir.path("state"), &["--no-jail"]);
    assert_eq!(d.create("f", "fn-echo", serde_json::json!({})).status, 201);
    assert_eq!(d.invoke("f", b"{}").status, 200);
    let pids = d.vmm_pids();
    assert!(!pids.is_empty());
    for pid in pids {
        assert_eq!(uid_of(pid), 0, "VMM {pid}");
    }
}

#[test]
fn serve_refuses_to_jail_without_root_and_an_unreachable_state_dir() {
    let dir = Scratch::new("jail-no");
    // Not root: a clear error, not VMMs that fail later.
    let state = dir.path("n");
    std::fs::create_dir_all(&state).unwrap();
    std::os::unix::fs::chown(&state, Some(65534), Some(65534)).unwrap();
    let out = run_as(
        65534,
        &[],
        env!("CARGO_BIN_EXE_spore"),
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--state-dir",
            state.to_str().unwrap(),
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("needs root") && err.contains("--no-jail"),
        "{err}"
    );
    // A state directory under one only root may enter.
    let closed = dir.path("closed");
    std::fs::create_dir_all(&closed).unwrap();
    std::fs::set_permissions(&closed, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let out = crate::common::spore()
        .args(["serve", "--listen", "127.0.0.1:0", "--state-dir"])
        .arg(closed.join("state"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("chmod o+x"), "{err}");
}
