//! Clones end to end on host KVM with the `clonetest` unikernel: copy-on-write
//! isolation between 20 clones and their template, clones of clones,
//! continue mode, the fork cap, a zygote killed under its clones, the host
//! memory of 100 clones, and refused bad input.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::clone::*;
use crate::common::*;

#[test]
fn kvm_clone_twenty_clones_each_keep_their_own_pages_and_the_template_holds_the_original() {
    require_kvm();
    let s = Scratch::new("clone-20");
    let (sock, mut reaper) = start_source(
        &s.0,
        128,
        "clones=20 mib=4 hold_ms=300",
        Some(r#"{"guest_fork": true}"#),
    );
    wait_until(&s.0, 60, "20 clones to check their pages", || {
        oks(&s.0).0.len() >= 20
    });
    let (ok, failed) = oks(&s.0);
    assert!(failed.is_empty(), "{failed:?}");
    assert_eq!(ok, (1..=20).collect::<BTreeSet<u64>>());
    let pids = forked_pids(&read(&s.path("src.log")));
    assert_eq!(pids.len(), 20, "{}", read(&s.path("src.log")));
    reaper.pids.extend(&pids);
    // DONE ends each clone (status 0, no guest shutdown).
    wait_until(&s.0, 20, "the clones to end with DONE", || {
        !pids.iter().any(|&p| alive(p))
    });

    // The zygote is frozen: a resume is refused, and it still serves. A new
    // clone first checks it sees the source's original pattern, after 20
    // clones wrote their own ids over the same pages.
    let (code, body) = http(&sock, "PATCH", "/vm", Some(r#"{"state": "Resumed"}"#));
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("zygote"), "{body}");
    let (code, report) = put_clone(&sock, r#"{"count": 1}"#);
    assert_eq!(code, 200, "{report}");
    reaper.add_from(&report);
    assert_eq!(report["clones"][0]["index"], 21);
    assert_eq!(report["served"], 21);
    wait_until(&s.0, 20, "clone 21", || oks(&s.0).0.contains(&21));
    assert!(oks(&s.0).1.is_empty());
    let status: serde_json::Value =
        serde_json::from_str(&http(&sock, "GET", "/clone", None).1).unwrap();
    assert_eq!(status["zygote"], true);
    assert_eq!(status["served"], 21);
}

#[test]
fn kvm_clone_of_a_clone_in_continue_mode() {
    require_kvm();
    let s = Scratch::new("clone-nest");
    let (_sock, mut reaper) = start_source(
        &s.0,
        128,
        "clones=2 nest=2 levels=2 mib=2 hold_ms=300",
        // Each source exits on its own while its clones still run.
        Some(
            r#"{"mode": "continue", "guest_fork": true, "clones_may_fork": true, "clones_outlive_source": true}"#,
        ),
    );
    let want: BTreeSet<u64> = [1, 2, 101, 102, 201, 202].into();
    wait_until(&s.0, 60, "clones and clones of clones", || {
        oks(&s.0).0 == want
    });
    assert!(oks(&s.0).1.is_empty(), "{:?}", oks(&s.0).1);
    // Each source went on and still holds its own pattern after its
    // clones wrote theirs.
    wait_until(&s.0, 20, "the sources to check their pages", || {
        let all: String = ["src.log", "src-c1.log", "src-c2.log"]
            .iter()
            .map(|f| read(&s.path(f)))
            .collect();
        ["source 0 ok", "source 1 ok", "source 2 ok"]
            .iter()
            .all(|l| all.contains(l))
    });
    for f in ["src.log", "src-c1.log", "src-c2.log"] {
        reaper.pids.extend(forked_pids(&read(&s.path(f))));
    }
    // The continuing source exited 0 on its own.
    let status = reaper.source.as_mut().unwrap().wait().unwrap();
    assert_eq!(status.code(), Some(0));
}

#[test]
fn kvm_clone_fork_cap_refuses_with_a_clear_error() {
    require_kvm();
    let s = Scratch::new("clone-cap");
    let (sock, mut reaper) = start_template_source(
        &s.0,
        r#"{"fork_count": 0, "max_clones": 3, "guest_fork": true}"#,
        None,
    );
    let (code, r) = put_clone(&sock, r#"{"count": 2}"#);
    assert_eq!(code, 200, "{r}");
    reaper.add_from(&r);
    let (code, r) = put_clone(&sock, r#"{"count": 2}"#);
    assert_eq!(code, 400, "{r}");
    let msg = r["fault_message"].as_str().unwrap();
    assert!(msg.contains("only 1 more"), "{msg}");
    let (code, r) = put_clone(&sock, r#"{"count": 1}"#);
    assert_eq!(code, 200, "{r}");
    reaper.add_from(&r);
    // The CLI says it in one line and fails.
    let o = spore()
        .arg("clone")
        .arg(&sock)
        .args(["-n", "1"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = stderr_of(&o);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("max_clones") && err.contains("served 3"),
        "{err}"
    );
    // The three clones run.
    for pid in reaper.pids.clone() {
        assert!(alive(pid), "clone {pid} is gone");
    }
}

#[test]
fn kvm_clone_killing_the_zygote_does_not_disturb_its_clones_that_may_outlive_it() {
    require_kvm();
    let s = Scratch::new("clone-kill");
    let (_sock, mut reaper) = start_source(
        &s.0,
        128,
        "clones=3 mib=8 hold_ms=1500 after=stay",
        Some(r#"{"guest_fork": true, "clones_outlive_source": true}"#),
    );
    wait_until(&s.0, 20, "3 clones", || {
        forked_pids(&read(&s.path("src.log"))).len() == 3
    });
    let pids = forked_pids(&read(&s.path("src.log")));
    reaper.pids.extend(&pids);
    let mut src = reaper.source.take().unwrap();
    src.kill().unwrap();
    src.wait().unwrap();
    // The template's memory lives on in the clones' mappings: they finish
    // checking their pages (written before and read after the kill) and run on.
    wait_until(&s.0, 30, "the clones to check their pages", || {
        oks(&s.0).0.len() == 3
    });
    assert!(oks(&s.0).1.is_empty(), "{:?}", oks(&s.0).1);
    for (i, &pid) in pids.iter().enumerate() {
        assert!(alive(pid), "clone {pid} died with its source");
        let sock = s.path(&format!("src-c{}.sock", i + 1));
        let (code, body) = http(&sock, "GET", "/", None);
        assert_eq!(code, 200);
        assert!(body.contains("Running"), "{body}");
    }
}

#[test]
fn kvm_clone_a_hundred_clones_of_a_512_mib_guest_use_under_1_gib() {
    require_kvm();
    let s = Scratch::new("clone-100");
    let (sock, mut reaper) = start_source(
        &s.0,
        512,
        "clones=100 mib=1 hold_ms=100 after=stay",
        Some(r#"{"mode": "zygote", "guest_fork": true}"#),
    );
    let src = reaper.source_pid();
    wait_until(&s.0, 120, "100 clones", || {
        oks(&s.0).0.len() >= 100 && forked_pids(&read(&s.path("src.log"))).len() == 100
    });
    reaper.pids.extend(forked_pids(&read(&s.path("src.log"))));
    assert_eq!(reaper.pids.len(), 100);
    assert!(oks(&s.0).1.is_empty());
    let status: serde_json::Value =
        serde_json::from_str(&http(&sock, "GET", "/clone", None).1).unwrap();
    assert_eq!(status["served"], 100);
    // All of the source's memory counts once (a baseline measured before
    // the clones would only be smaller), the clones' on top of it.
    let mut all = reaper.pids.clone();
    all.push(src);
    let total_kb = pss_bytes(&all) >> 10;
    let clones_kb = pss_bytes(&reaper.pids) >> 10;
    eprintln!(
        "100 clones of a 512 MiB guest: PSS {} MiB in all, {} MiB for the clones ({} KiB each)",
        total_kb >> 10,
        clones_kb >> 10,
        clones_kb / 100
    );
    assert!(
        clones_kb > 100 * 1024,
        "each clone wrote 1 MiB: {clones_kb} kB"
    );
    assert!(
        total_kb < 1 << 20,
        "{total_kb} kB of PSS for the source and 100 clones"
    );
}

#[test]
fn kvm_clone_bad_input_is_refused_and_the_source_keeps_running() {
    require_kvm();
    let s = Scratch::new("clone-bad");
    // Not started yet.
    let sock = s.path("idle.sock");
    let mut idle = spawn_vmm(&sock);
    let (code, r) = put_clone(&sock, r#"{"count": 1}"#);
    assert_eq!(code, 400);
    assert!(
        r["fault_message"].as_str().unwrap().contains("not started"),
        "{r}"
    );
    let (code, body) = http(&sock, "PUT", "/clone/config", Some(r#"{"max_clones": 0}"#));
    assert_eq!(code, 400, "{body}");
    let (code, body) = http(&sock, "PUT", "/clone", Some(r#"{"count": -1}"#));
    assert_eq!(code, 400, "{body}");
    let (code, body) = http(
        &sock,
        "PUT",
        "/clone",
        Some(r#"{"count": 1, "mode": "sideways"}"#),
    );
    assert_eq!(code, 400, "{body}");
    idle.kill().unwrap();
    idle.wait().unwrap();

    let (sock, mut reaper) = start_template_source(
        &s.0,
        r#"{"fork_count": 0, "mode": "continue", "guest_fork": true}"#,
        None,
    );
    for (body, needle) in [
        (r#"{"count": 0}"#, "at least 1"),
        (r#"{"count": 100000}"#, "more than"),
        (r#"{"count": 2000}"#, "max_clones"),
    ] {
        let (code, r) = put_clone(&sock, body);
        assert_eq!(code, 400, "{body}: {r}");
        let msg = r["fault_message"].as_str().unwrap();
        assert!(msg.contains(needle), "{body}: {msg}");
    }
    // A socket directory that cannot be made.
    let (code, r) = put_clone(&sock, r#"{"count": 1, "socket_dir": "/proc/no/such/dir"}"#);
    assert!(code >= 400, "{r}");
    let (_, info) = http(&sock, "GET", "/", None);
    assert!(info.contains("Running"), "{info}");
    // And it still clones afterwards.
    let (code, r) = put_clone(&sock, r#"{"count": 1}"#);
    assert_eq!(code, 200, "{r}");
    reaper.add_from(&r);
    let (_, info) = http(&sock, "GET", "/", None);
    assert!(info.contains("Running"), "{info}");
}

#[test]
fn kvm_clone_keep_pool_replaces_clones_that_exit_using_standby_processes() {
    require_kvm();
    let s = Scratch::new("clone-keep");
    let (sock, mut reaper) = start_source(
        &s.0,
        64,
        "mode=bench after=done",
        Some(r#"{"fork_count": 0, "standby": 2, "guest_fork": true}"#),
    );
    wait_until(&s.0, 20, "the guest's template", || {
        http(&sock, "GET", "/clone", None)
            .1
            .contains("\"zygote\":true")
    });
    let status: serde_json::Value =
        serde_json::from_str(&http(&sock, "GET", "/clone", None).1).unwrap();
    assert_eq!(status["standby"], 2);
    // Clones end at once (DONE): the pool keeps replacing them.
    let o = spore()
        .arg("clone")
        .arg(&sock)
        .args(["--keep", "2", "--total", "6"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr_of(&o));
    let r: serde_json::Value = serde_json::from_str(&stdout_of(&o)).unwrap();
    assert_eq!(r["clones_started"], 6, "{r}");
    assert_eq!(r["clones_finished"], 6, "{r}");
    assert!(r["clones_per_s"].as_f64().unwrap() > 0.0);
    // A clone from a standby process says so; the pool is refilled.
    let (code, r) = put_clone(&sock, r#"{"count": 1}"#);
    assert_eq!(code, 200, "{r}");
    reaper.add_from(&r);
    assert_eq!(r["clones"][0]["standby"], true, "{r}");
    let status: serde_json::Value =
        serde_json::from_str(&http(&sock, "GET", "/clone", None).1).unwrap();
    assert_eq!(status["standby"], 2);
    assert_eq!(status["served"], 7);
    // Stopping the source ends its unused standby processes too.
    let standby_logs = std::fs::read_dir(&s.0).unwrap().count();
    assert!(standby_logs > 0);
    let mut src = reaper.source.take().unwrap();
    // SAFETY: SIGTERM to the source VMM this test started.
    unsafe { libc::kill(src.id() as i32, libc::SIGTERM) };
    src.wait().unwrap();
    wait_until(&s.0, 10, "the standby processes to end", || {
        std::process::Command::new("pgrep")
            .args(["-f", &s.0.display().to_string()])
            .output()
            .map(|o| o.stdout.is_empty())
            .unwrap_or(true)
    });
}

#[test]
fn kvm_clone_a_read_write_drive_gets_overlays_and_a_deleted_image_is_refused() {
    require_kvm();
    let s = Scratch::new("clone-rw");
    let disk = s.path("data.img");
    sparse_file(&disk, 1 << 20, &[]);
    let drive = format!(
        r#"{{"drive_id": "data", "path_on_host": "{}", "is_root_device": false, "is_read_only": false}}"#,
        disk.display()
    );
    let (sock, _reaper) = start_template_source(
        &s.0,
        r#"{"fork_count": 0, "mode": "continue", "guest_fork": true}"#,
        Some(&drive),
    );
    // The source's image becomes the shared base: the source and the clone
    // each write their own overlay beside the sockets.
    let (code, r) = put_clone(&sock, r#"{"count": 1, "mode": "continue"}"#);
    assert_eq!(code, 200, "{r}");
    let overlays: Vec<_> = std::fs::read_dir(&s.0)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".cow"))
        .collect();
    assert!(
        overlays.len() >= 2,
        "source and clone overlays: {overlays:?}"
    );
    // The base image deleted underneath: the next clone is refused clearly,
    // and the source keeps running.
    std::fs::remove_file(&disk).unwrap();
    let (code, r) = put_clone(&sock, r#"{"count": 1, "mode": "continue"}"#);
    assert_eq!(code, 400, "{r}");
    let msg = r["fault_message"].as_str().unwrap();
    assert!(msg.contains("drive \"data\""), "{msg}");
    let (_, info) = http(&sock, "GET", "/", None);
    assert!(info.contains("Running"), "{info}");
}

#[test]
fn kvm_clone_standby_clones_restored_ahead_see_the_template_and_keep_their_own_pages() {
    require_kvm();
    let s = Scratch::new("clone-standby");
    let (sock, mut reaper) = start_source(
        &s.0,
        128,
        "clones=2 mib=2 hold_ms=200 after=exit",
        Some(r#"{"standby": 2, "guest_fork": true}"#),
    );
    wait_until(&s.0, 30, "the guest's clones", || {
        oks(&s.0).0.len() == 2 && forked_pids(&read(&s.path("src.log"))).len() == 2
    });
    reaper.pids.extend(forked_pids(&read(&s.path("src.log"))));
    // Now the zygote's standby processes hold clones restored ahead: a
    // request only numbers and starts them.
    wait_until(&s.0, 10, "standby processes", || {
        http(&sock, "GET", "/clone", None)
            .1
            .contains("\"standby\":2")
    });
    std::thread::sleep(Duration::from_millis(300));
    let (code, r) = put_clone(&sock, r#"{"count": 2}"#);
    assert_eq!(code, 200, "{r}");
    reaper.add_from(&r);
    for c in r["clones"].as_array().unwrap() {
        assert_eq!(c["standby"], true, "{r}");
    }
    wait_until(&s.0, 30, "clones 3 and 4", || {
        let ok = oks(&s.0).0;
        ok.contains(&3) && ok.contains(&4)
    });
    assert!(oks(&s.0).1.is_empty(), "{:?}", oks(&s.0).1);
}

#[test]
fn kvm_clone_runs_the_sources_own_binary_after_it_was_replaced() {
    require_kvm();
    let s = Scratch::new("clone-upgrade");
    // A copy of spore the test may delete, as an upgrade replaces the file.
    let bin_dir = s.path("bin");
    std::fs::create_dir_all(&bin_dir).unwrap();
    let exe = bin_dir.join("spore");
    std::fs::copy(env!("CARGO_BIN_EXE_spore"), &exe).unwrap();
    let sock = s.path("src.sock");
    let log = std::fs::File::create(s.path("src.log")).unwrap();
    let child = std::process::Command::new(&exe)
        .args(["vmm", "--api-sock"])
        .arg(&sock)
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let mut reaper = Reaper {
        source: Some(child),
        pids: Vec::new(),
        dir: s.0.clone(),
    };
    wait_for_path(&sock, Duration::from_secs(10));
    let boot = format!(
        r#"{{"kernel_image_path": "{}"}}"#,
        uk_image("idle").display()
    );
    assert_eq!(http(&sock, "PUT", "/boot-source", Some(&boot)).0, 204);
    let mc = r#"{"vcpu_count": 1, "mem_size_mib": 64}"#;
    assert_eq!(http(&sock, "PUT", "/machine-config", Some(mc)).0, 204);
    let start = r#"{"action_type": "InstanceStart"}"#;
    assert_eq!(http(&sock, "PUT", "/actions", Some(start)).0, 204);

    std::fs::remove_file(&exe).unwrap();
    let (code, report) = put_clone(&sock, r#"{"count": 1}"#);
    assert_eq!(code, 200, "{report}");
    reaper.add_from(&report);
    let pid = report["clones"][0]["pid"].as_i64().unwrap();
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let argv0 = cmdline.split(|&b| b == 0).next().unwrap();
    assert_eq!(
        std::str::from_utf8(argv0).unwrap(),
        exe.to_str().unwrap(),
        "the clone runs under the source's executable name"
    );
    let target = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
    assert!(
        target.to_string_lossy().contains("(deleted)"),
        "the clone runs the replaced file's contents: {}",
        target.display()
    );
    assert!(alive(i32::try_from(pid).expect("a pid fits i32")));
}

/// A VM restored from a snapshot (its RAM a private mapping of the memory
/// file) is cloned: the file is the template's base, the pages the restored
/// VM wrote since are the layer on top, and the clone's guest counts on.
#[test]
fn kvm_clone_of_a_vm_restored_from_a_snapshot() {
    clone_of_a_restored_vm("clone-restored", "File", "mib=1 rounds=100000 sleep_ms=20");
}

/// The same through userfaultfd: RAM is a memfd whose pages the handler
/// fills as they are touched. The guest's 4 MiB pattern is not touched
/// again until its last round, after the clone: the clone's template must
/// hold the pages nobody touched since the restore too (it verifies them).
#[test]
fn kvm_clone_of_a_vm_restored_through_userfaultfd() {
    clone_of_a_restored_vm("clone-restored-uffd", "Uffd", "mib=4 rounds=40 sleep_ms=20");
}

fn clone_of_a_restored_vm(name: &str, backend: &str, args: &str) {
    require_kvm();
    let s = Scratch::new(name);
    let sock = s.path("api.sock");
    let (vmm, rx) = boot_snaptest(&sock, 64, false, args, &[]);
    read_until(&rx, "count 2");
    let (state, mem) = (s.path("vm.state"), s.path("vm.mem"));
    snapshot_create(&sock, &state, &mem, false, true);
    drop(vmm);

    let rdir = s.path("restored");
    std::fs::create_dir_all(&rdir).unwrap();
    let rsock = rdir.join("api.sock");
    let (_restored, rx2) = spawn_vmm_lines(&rsock);
    let body = format!(
        r#"{{"snapshot_path": "{}", "mem_backend": {{"backend_type": "{backend}", "backend_path": "{}"}}, "resume_vm": true}}"#,
        state.display(),
        mem.display()
    );
    let (code, reply) = http(&rsock, "PUT", "/snapshot/load", Some(&body));
    assert_eq!(code, 204, "{reply}");
    read_until(&rx2, "count");

    let (code, report) = put_clone(&rsock, r#"{"count": 1}"#);
    assert_eq!(code, 200, "PUT /clone on a restored VM: {report}");
    let mut reaper = Reaper {
        source: None,
        pids: Vec::new(),
        dir: rdir.clone(),
    };
    reaper.add_from(&report);
    let log = std::fs::read_dir(&rdir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "log"))
        .unwrap_or_else(|| panic!("no clone log beside {}: {report}", rsock.display()));
    wait_until(&s.0, 30, "the clone's guest to count on", || {
        read(&log).matches("count ").count() >= 2
    });
    if args.contains("rounds=40") {
        wait_until(&s.0, 30, "the clone's guest to verify its memory", || {
            read(&log).contains("verify ")
        });
        assert!(read(&log).contains("verify ok"), "{}", read(&log));
    }
    // (The source stays a template: `PUT /clone`'s default mode, zygote.)
    drop(rx2);
}

#[test]
fn kvm_clone_of_a_vm_with_a_balloon_has_the_balloon_too() {
    // spore serve's Linux functions have a balloon (free page reporting)
    // and are cloned from zygotes: a balloon must not stop a clone.
    require_kvm();
    let s = Scratch::new("clone-balloon");
    let balloon = r#"{"amount_mib": 0, "deflate_on_oom": true, "free_page_reporting": true}"#;
    let (sock, mut reaper) = start_source_calls(
        &s.0,
        64,
        "mode=bench after=stay",
        Some(r#"{"fork_count": 0, "guest_fork": true}"#),
        &[("/balloon", balloon)],
    );
    wait_until(&s.0, 20, "the guest to make its template", || {
        http(&sock, "GET", "/clone", None)
            .1
            .contains("\"template\":\"")
    });
    let (code, report) = put_clone(&sock, r#"{"count": 2}"#);
    assert_eq!(code, 200, "{report}");
    reaper.add_from(&report);
    for c in report["clones"].as_array().unwrap() {
        let clone_sock = Path::new(c["socket"].as_str().unwrap());
        let (code, body) = http(clone_sock, "GET", "/balloon", None);
        assert_eq!(code, 200, "{body}");
        let b: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(b["free_page_reporting"], true, "{b}");
        let (_, info) = http(clone_sock, "GET", "/", None);
        assert!(info.contains("Running"), "{info}");
    }
}

#[test]
fn kvm_clone_each_clone_starts_with_its_own_copy_of_the_mmds_store() {
    require_kvm();
    let s = Scratch::new("clone-mmds");
    let data = r#"{"latest":{"meta-data":{"instance-id":"template"}}}"#;
    let (sock, mut reaper) =
        start_source_calls(&s.0, 64, "clones=0 after=stay", None, &[("/mmds", data)]);
    let (code, report) = put_clone(&sock, r#"{"count": 2}"#);
    assert_eq!(code, 200, "{report}");
    reaper.add_from(&report);
    let socks: Vec<PathBuf> = report["clones"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| PathBuf::from(c["socket"].as_str().unwrap()))
        .collect();
    assert_eq!(socks.len(), 2);
    for c in &socks {
        assert_eq!(http(c, "GET", "/mmds", None), (200, data.to_string()));
    }
    // A clone's change is its own: neither the source nor the other clone sees it.
    let (code, body) = http(
        &socks[0],
        "PATCH",
        "/mmds",
        Some(r#"{"latest":{"meta-data":{"instance-id":"clone-1"}}}"#),
    );
    assert_eq!(code, 204, "{body}");
    assert!(http(&socks[0], "GET", "/mmds", None).1.contains("clone-1"));
    assert_eq!(
        http(&socks[1], "GET", "/mmds", None),
        (200, data.to_string())
    );
    assert_eq!(http(&sock, "GET", "/mmds", None), (200, data.to_string()));
}
