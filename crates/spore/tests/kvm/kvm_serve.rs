//! `spore serve` end to end on real KVM: the real daemon, real VMM
//! processes, unikernel functions (`fn-echo`, `fn-upper`), plain HTTP in the
//! Lambda API's shapes. (boto3 and the AWS CLI: `kvm_serve_clients.rs`.)

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::common;
use crate::common::proc::{private_bytes, shared_bytes};
use crate::common::serve::{guardian_pid, wait_for_snapshot, Daemon};
use crate::common::{require_kvm, Scratch};

fn invocations(d: &Daemon, path: &str) -> f64 {
    ["success", "function_error", "timeout"]
        .iter()
        .map(|o| {
            d.metric(&format!(
                "spore_invocations_total{{function=\"f\",start_path=\"{path}\",outcome=\"{o}\"}}"
            ))
        })
        .sum()
}

/// The function's invocation log once it has `what` (logs are written off
/// the request path); at most 5 s.
fn log_once_it_has(d: &Daemon, function: &str, what: &str) -> String {
    let file = d.state_dir.join("logs").join(format!("{function}.log"));
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let log = std::fs::read_to_string(&file).unwrap_or_default();
        if log.contains(what) {
            return log;
        }
        assert!(Instant::now() < deadline, "no {what:?} in the log: {log}");
        thread::sleep(Duration::from_millis(50));
    }
}

/// The last invocation's part of a function's log.
fn last_invocation(log: &str) -> &str {
    &log[log.rfind("START RequestId").unwrap_or(0)..]
}

#[test]
fn kvm_serve_lifecycle_and_distinct_invocations() {
    require_kvm();
    let dir = Scratch::new("serve-life");
    let d = Daemon::start(&dir.path("state"), &[]);
    let r = d.create(
        "f",
        "fn-echo",
        serde_json::json!({"Environment": {"Variables": {"GREETING": "hi there"}}}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(r.json()["FunctionName"], "f");
    assert_eq!(r.json()["Runtime"], "spore-uk");

    for i in 0..100 {
        let payload = format!("{{\"n\":{i},\"tag\":\"p{i}\"}}");
        let r = d.invoke("f", payload.as_bytes());
        assert_eq!(r.status, 200, "invoke {i}: {}", r.text());
        let v = r.json();
        assert_eq!(v["echo"]["n"], i, "invoke {i}: {}", r.text());
        assert_eq!(v["echo"]["tag"], format!("p{i}"));
        assert!(r.header("x-amz-function-error").is_none());
    }
    // One cold start, then warm reuse of the same instance.
    assert_eq!(invocations(&d, "cold"), 1.0);
    assert_eq!(invocations(&d, "warm"), 99.0);

    let env = d.invoke("f", br#"{"env":"GREETING"}"#).json();
    assert_eq!(env["value"], "hi there");
    let tail = d.request(
        "POST",
        "/2015-03-31/functions/f/invocations",
        br#"{"x":1}"#,
        &[("X-Amz-Log-Type", "Tail")],
    );
    use base64::Engine;
    let log = base64::engine::general_purpose::STANDARD
        .decode(tail.header("x-amz-log-result").expect("log tail"))
        .unwrap();
    let log = String::from_utf8_lossy(&log);
    assert!(
        log.contains("START RequestId") && log.contains("fn-echo: request"),
        "{log}"
    );

    let list = d.request("GET", "/2015-03-31/functions/", b"", &[]).json();
    assert_eq!(list["Functions"].as_array().map(|a| a.len()), Some(1));
    let got = d.request("GET", "/2015-03-31/functions/f", b"", &[]).json();
    assert_eq!(got["Configuration"]["Handler"], "fn-echo");
    // Code.Location downloads the zip from the daemon, no host path shown.
    let location = got["Code"]["Location"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let path = location
        .strip_prefix(&format!("http://{}", d.addr))
        .unwrap_or_else(|| panic!("Code.Location {location}"));
    let zip = d.request("GET", path, b"", &[]);
    assert_eq!(zip.status, 200, "{}", zip.text());
    assert!(zip.body.starts_with(b"PK\x03\x04"), "not a zip");
    assert_eq!(zip.header("content-type"), Some("application/zip"));

    // New code: the next invocation runs it, never an instance or the zygote
    // of the old code.
    let r = d.update_code("f", "fn-echo", "fn-upper");
    assert_eq!(r.status, 200, "{}", r.text());
    for _ in 0..3 {
        let r = d.invoke("f", b"{\"hello\":1}");
        assert_eq!(r.text(), "{\"HELLO\":1}");
    }
    // A configuration change is a new version too.
    let r = d.request(
        "PUT",
        "/2015-03-31/functions/f/configuration",
        br#"{"Timeout": 5, "MemorySize": 96}"#,
        &[],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["MemorySize"], 96);
    assert_eq!(d.invoke("f", b"\"abc\"").text(), "\"ABC\"");

    let r = d.request("DELETE", "/2015-03-31/functions/f", b"", &[]);
    assert_eq!(r.status, 204);
    let r = d.invoke("f", b"{}");
    assert_eq!(r.status, 404);
    assert_eq!(r.error_type(), Some("ResourceNotFoundException"));
    // Deleting retired every instance of the function.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !d.vmm_pids().is_empty() && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(50));
    }
    assert!(
        d.vmm_pids().is_empty(),
        "VMMs left after delete: {:?}",
        d.vmm_pids()
    );
}

#[test]
fn kvm_serve_concurrent_cold_invokes_boot_once_then_clone() {
    require_kvm();
    let dir = Scratch::new("serve-cold20");
    let d = Arc::new(Daemon::start(&dir.path("state"), &[]));
    assert_eq!(d.create("f", "fn-echo", serde_json::json!({})).status, 201);
    let handles: Vec<_> = (0..20)
        .map(|i| {
            let d = d.clone();
            thread::spawn(move || {
                // Long enough that no invocation finds another one's instance idle,
                // even when threads start late on a loaded host.
                let r = d.invoke("f", format!("{{\"i\":{i},\"sleep_ms\":2000}}").as_bytes());
                (i, r.status, r.text())
            })
        })
        .collect();
    for h in handles {
        let (i, status, text) = h.join().unwrap();
        assert_eq!(status, 200, "{text}");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["echo"]["i"], i);
        // Each ran on an instance of its own (the others were busy).
        assert_eq!(v["invocations"], 1, "{text}");
    }
    assert_eq!(invocations(&d, "cold"), 1.0, "one boot");
    assert_eq!(invocations(&d, "clone"), 19.0, "then clones of the zygote");
    assert_eq!(
        d.metric("spore_instances{function=\"f\",state=\"zygote\"}"),
        1.0
    );
}

#[test]
fn kvm_serve_reserved_concurrency_throttles() {
    require_kvm();
    let dir = Scratch::new("serve-429");
    let d = Arc::new(Daemon::start(
        &dir.path("state"),
        &["--queue-wait-ms", "100"],
    ));
    assert_eq!(
        d.create("f", "fn-echo", serde_json::json!({"Timeout": 10}))
            .status,
        201
    );
    let r = d.request(
        "PUT",
        "/2017-10-31/functions/f/concurrency",
        br#"{"ReservedConcurrentExecutions": 2}"#,
        &[],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["ReservedConcurrentExecutions"], 2);
    let handles: Vec<_> = (0..10)
        .map(|i| {
            let d = d.clone();
            thread::spawn(move || {
                let r = d.invoke("f", format!("{{\"i\":{i},\"sleep_ms\":3000}}").as_bytes());
                (i, r.status, r.error_type().map(String::from), r.text())
            })
        })
        .collect();
    let (mut ok, mut throttled) = (0, 0);
    for h in handles {
        let (i, status, kind, text) = h.join().unwrap();
        match status {
            200 => {
                let v: serde_json::Value = serde_json::from_str(&text).unwrap();
                assert_eq!(v["echo"]["i"], i, "{text}");
                ok += 1;
            }
            429 => {
                assert_eq!(kind.as_deref(), Some("TooManyRequestsException"), "{text}");
                throttled += 1;
            }
            s => panic!("unexpected {s}: {text}"),
        }
    }
    assert_eq!(ok, 2, "exactly the reserved 2 ran");
    assert_eq!(throttled, 8);
    assert_eq!(d.metric("spore_throttles_total{function=\"f\"}"), 8.0);
    // Without the limit, all run again.
    assert_eq!(
        d.request("DELETE", "/2017-10-31/functions/f/concurrency", b"", &[])
            .status,
        204
    );
    assert_eq!(d.invoke("f", b"{}").status, 200);
}

#[test]
fn kvm_serve_timeout_and_crash_fail_only_their_invocation() {
    require_kvm();
    let dir = Scratch::new("serve-fail");
    let d = Daemon::start(&dir.path("state"), &[]);
    assert_eq!(
        d.create("f", "fn-echo", serde_json::json!({"Timeout": 1}))
            .status,
        201
    );
    assert_eq!(d.invoke("f", b"{}").status, 200);
    let before = d.vmm_pids();

    let r = d.invoke(
        "f",
        br#"{"log":"written before the timeout 3f9a","sleep_ms":600000}"#,
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-amz-function-error"), Some("Unhandled"));
    assert!(
        r.text().contains("Task timed out after 1.00 seconds"),
        "{}",
        r.text()
    );
    // What the function logged before it timed out is kept.
    let log = log_once_it_has(&d, "f", "Outcome: timeout");
    assert!(
        last_invocation(&log).contains("\nwritten before the timeout 3f9a\n"),
        "{log}"
    );
    // The instance that timed out is gone (its VMM killed), not reused.
    thread::sleep(Duration::from_millis(200));
    let after = d.vmm_pids();
    let gone: Vec<_> = before.iter().filter(|p| !after.contains(p)).collect();
    assert_eq!(
        gone.len(),
        1,
        "one VMM ended: before {before:?} after {after:?}"
    );
    let r = d.invoke("f", br#"{"ok":1}"#);
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["echo"]["ok"], 1);

    let r = d.invoke("f", br#"{"panic":"boom"}"#);
    assert_eq!(r.header("x-amz-function-error"), Some("Unhandled"));
    assert_eq!(r.json()["errorType"], "Runtime.Panic");
    assert_eq!(r.json()["errorMessage"], "boom");
    let r = d.invoke("f", br#"{"exit":7}"#);
    assert_eq!(r.header("x-amz-function-error"), Some("Unhandled"));
    assert_eq!(r.json()["errorType"], "Runtime.ExitError", "{}", r.text());
    // The guest ended its VM: its own exit status is named.
    assert!(
        r.json()["errorMessage"]
            .as_str()
            .is_some_and(|m| m.ends_with("Runtime exited with error: exit status 7")),
        "{}",
        r.text()
    );
    let r = d.invoke("f", br#"{"fail":"handled"}"#);
    assert_eq!(r.json()["errorType"], "HandledError");
    // ... and the next invocation works.
    let r = d.invoke("f", br#"{"ok":2}"#);
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["echo"]["ok"], 2);
}

/// kill -9 of the instance's VMM mid-invocation is the host's fault, not
/// the function's: 500 ServiceException (no `X-Amz-Function-Error`), the
/// log's outcome `service_error`, counted so; the next invocation runs.
/// What the function logged (`flog!`) before the kill is in that
/// invocation's log: the SDK streams it while the handler blocks.
#[test]
fn kvm_serve_a_killed_vmm_is_a_service_error_not_the_functions() {
    require_kvm();
    let dir = Scratch::new("serve-vmmkill");
    let d = Arc::new(Daemon::start(&dir.path("state"), &[]));
    assert_eq!(d.create("f", "fn-echo", serde_json::json!({})).status, 201);
    assert_eq!(d.invoke("f", br#"{"ok":1}"#).status, 200);
    let slow = {
        let d = d.clone();
        thread::spawn(move || {
            d.invoke(
                "f",
                br#"{"log":"written before the kill 7c1e","sleep_ms":5000}"#,
            )
        })
    };
    thread::sleep(Duration::from_millis(1500));
    let pids = d.vmm_pids();
    assert!(!pids.is_empty(), "the instance's VMM runs");
    for pid in pids {
        // SAFETY: a VMM of this test's daemon.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    let r = slow.join().expect("the invoking thread");
    assert_eq!(r.status, 500, "{}", r.text());
    assert_eq!(r.error_type(), Some("ServiceException"), "{}", r.text());
    assert_eq!(r.header("x-amz-function-error"), None);
    assert!(r.text().contains("host fault"), "{}", r.text());
    assert_eq!(
        d.metric("spore_invocations_total{function=\"f\",start_path=\"warm\",outcome=\"service_error\"}")
            + d.metric("spore_invocations_total{function=\"f\",start_path=\"clone\",outcome=\"service_error\"}"),
        1.0
    );
    let log = log_once_it_has(&d, "f", "Outcome: service_error");
    assert!(!log.contains("Outcome: function_error"), "{log}");
    // The function's own line (not a console line), in the failed
    // invocation's part of the log.
    assert!(
        last_invocation(&log).contains("\nwritten before the kill 7c1e\n"),
        "the function's log line is lost: {log}"
    );
    let r = d.invoke("f", br#"{"ok":2}"#);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["echo"]["ok"], 2);
}

#[test]
fn kvm_serve_keep_alive_gives_memory_back() {
    require_kvm();
    let dir = Scratch::new("serve-keepalive");
    let d = Arc::new(Daemon::start(
        &dir.path("state"),
        &["--keep-alive-ms", "3000"],
    ));
    assert_eq!(d.create("f", "fn-echo", serde_json::json!({})).status, 201);
    // Four instances at once, each touching memory with its answer.
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let d = d.clone();
            thread::spawn(move || d.invoke("f", br#"{"sleep_ms":200}"#).status)
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap(), 200);
    }
    let all = d.vmm_pids();
    assert!(
        all.len() >= 5,
        "the zygote and four instances (and standby clones): {all:?}"
    );
    #[allow(
        clippy::cast_possible_truncation,
        reason = "the metric is a whole byte count (a float only in the text format), far below u64::MAX"
    )]
    let idle_pss = d.metric("spore_memory_bytes{held_by=\"instances\"}") as u64;
    assert!(idle_pss > 0, "idle instances hold memory");
    let before: Vec<(i32, u64, u64)> = all
        .iter()
        .map(|&p| (p, private_bytes(&[p]), shared_bytes(&[p])))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(15);
    while d.metric("spore_instances{function=\"f\",state=\"idle\"}") > 0.0
        && Instant::now() < deadline
    {
        thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        d.metric("spore_instances{function=\"f\",state=\"idle\"}"),
        0.0
    );
    assert_eq!(d.metric("spore_memory_bytes{held_by=\"instances\"}"), 0.0);
    thread::sleep(Duration::from_millis(300));
    let left = d.vmm_pids();
    // What the ended instances held of their own (private pages: shared
    // template pages stay with the zygote), measured from /proc before,
    // against what the VMM processes hold now.
    let ended: Vec<&(i32, u64, u64)> = before.iter().filter(|(p, ..)| !left.contains(p)).collect();
    let ended_held: u64 = ended.iter().map(|(_, private, _)| private).sum();
    let ended_shared: u64 = ended.iter().map(|(.., shared)| shared).sum();
    let survivors_before: u64 = before
        .iter()
        .filter(|(p, ..)| left.contains(p))
        .map(|(_, private, _)| private)
        .sum();
    let survivors_after = private_bytes(&left);
    eprintln!(
        "idle instances: PSS {idle_pss} B, private {ended_held} B, shared {ended_shared} B; \
         the VMMs left: private {survivors_before} -> {survivors_after} B"
    );
    assert!(ended_held > 0);
    // The ended instances' private pages are gone with them. What the VMMs
    // left may gain is only what they shared with the ended ones (a page
    // mapped by one process is counted private to it), never more: more
    // would be memory moved to a process that lives on.
    let survivors_grew = survivors_after.saturating_sub(survivors_before);
    assert!(
        survivors_grew <= ended_shared,
        "the VMMs left grew by {survivors_grew} B, more than the {ended_shared} B they shared with the ended instances"
    );
    assert_eq!(
        d.vmm_pids().len(),
        all.len() - 4,
        "only the four idle instances ended"
    );
}

#[test]
fn kvm_serve_survives_kill_9() {
    require_kvm();
    let dir = Scratch::new("serve-kill9");
    let state = dir.path("state");
    let mut d = Daemon::start(&state, &[]);
    assert_eq!(d.create("f", "fn-echo", serde_json::json!({})).status, 201);
    assert_eq!(d.create("g", "fn-upper", serde_json::json!({})).status, 201);
    let addr = d.addr.clone();
    let handles: Vec<_> = (0..20)
        .map(|i| {
            let addr = addr.clone();
            thread::spawn(move || {
                // Some of these are cut off by the kill: only no hang matters.
                let _ = std::panic::catch_unwind(|| {
                    common::serve::http(
                        &addr,
                        "POST",
                        "/2015-03-31/functions/f/invocations",
                        format!("{{\"i\":{i},\"sleep_ms\":500}}").as_bytes(),
                        &[],
                    )
                });
            })
        })
        .collect();
    thread::sleep(Duration::from_millis(300));
    wait_for_snapshot(&state, "f", 1, Duration::from_secs(10));
    // The files are in place before the catalog records them; a kill in
    // between leaves a snapshot the next daemon rightly removes.
    let deadline = Instant::now() + Duration::from_secs(10);
    while d.metric("spore_snapshots_written_total{function=\"f\"}") < 1.0 {
        assert!(Instant::now() < deadline, "f's snapshot was never recorded");
        thread::sleep(Duration::from_millis(20));
    }
    // Without its guardian (killed first), a killed daemon leaves its VMMs
    // to the next daemon's recovery.
    let guardian = guardian_pid(&state).expect("the daemon's guardian runs");
    // SAFETY: the guardian of this test's daemon.
    unsafe { libc::kill(guardian, libc::SIGKILL) };
    d.kill9();
    for h in handles {
        let _ = h.join();
    }
    assert!(
        !d.vmm_pids().is_empty(),
        "the killed daemon left VMMs behind (what recovery must end)"
    );

    let d2 = Daemon::start(&state, &[]);
    assert!(
        d2.vmm_pids().is_empty(),
        "the old daemon's VMMs are ended: {:?}",
        d2.vmm_pids()
    );
    assert!(
        !state.join("run").exists() || state.join("run").read_dir().unwrap().next().is_none(),
        "the old daemon's run directories are removed"
    );
    // A second daemon on the same state directory is refused.
    let second = common::spore()
        .args(["serve", "--listen", "127.0.0.1:0", "--state-dir"])
        .arg(&state)
        .output()
        .unwrap();
    assert!(!second.status.success());
    assert!(
        common::stderr_of(&second).contains("another spore serve"),
        "{}",
        common::stderr_of(&second)
    );
    let list = d2.request("GET", "/2015-03-31/functions", b"", &[]).json();
    let names: Vec<_> = list["Functions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["FunctionName"].clone())
        .collect();
    assert_eq!(names, vec!["f", "g"]);
    // f's snapshot (written by its first cold boot) survived the kill: its
    // first start restores it; g was never invoked, so it boots.
    let r = d2.invoke("f", br#"{"after":1}"#);
    assert_eq!(r.json()["echo"]["after"], 1);
    assert_eq!(r.header("x-spore-start-path"), Some("restore"));
    let r = d2.invoke("g", b"\"after\"");
    assert_eq!(r.text(), "\"AFTER\"");
    assert_eq!(r.header("x-spore-start-path"), Some("cold"));
}

#[test]
fn kvm_serve_restore_path_working_set_and_zygote_demotion() {
    require_kvm();
    let dir = Scratch::new("serve-restore");
    let state = dir.path("state");
    // A budget no zygote fits in: zygotes are demoted to their snapshots.
    let d = Daemon::start(&state, &["--memory-budget", "1M", "--keep-alive-ms", "0"]);
    assert_eq!(d.create("f", "fn-echo", serde_json::json!({})).status, 201);
    let r = d.invoke("f", br#"{"n":0}"#);
    assert_eq!(r.json()["echo"]["n"], 0);
    assert_eq!(r.header("x-spore-start-path"), Some("cold"));
    // The cold boot's zygote wrote the version's snapshot, private to the daemon.
    wait_for_snapshot(&state, "f", 1, Duration::from_secs(10));
    let snap = state.join("snapshots/f-v1");
    assert!(snap.join("vm.state").is_file() && snap.join("vm.mem").is_file());
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&snap).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "snapshot directory mode {mode:o}");

    let zygotes = |d: &Daemon| d.metric("spore_instances{function=\"f\",state=\"zygote\"}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while zygotes(&d) > 0.0 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(zygotes(&d), 0.0, "the zygote was demoted under the budget");
    let pids_before = d.vmm_pids().len();

    // Demoted: every start restores the snapshot (no zygote is made again).
    // The first restore records the working set; the VMM writes it beside
    // the snapshot when the recording ends (1 s after the guest started, or
    // when the instance is stopped before).
    for i in 1..=2 {
        let r = d.invoke("f", format!("{{\"n\":{i}}}").as_bytes());
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["echo"]["n"], i);
        assert_eq!(r.header("x-spore-start-path"), Some("restore"));
    }
    let ws = snap.join("vm.state.ws");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ws.is_file() && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(100));
    }
    assert!(ws.is_file(), "the first restore recorded a working set");
    let r = d.invoke("f", br#"{"n":3}"#);
    assert_eq!(r.json()["echo"]["n"], 3);
    assert_eq!(r.header("x-spore-start-path"), Some("restore"));
    assert_eq!(invocations(&d, "restore"), 3.0);
    // keep-alive 0: restored instances end after their invocation.
    let deadline = Instant::now() + Duration::from_secs(5);
    while d.vmm_pids().len() > pids_before && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(50));
    }
    assert!(d.vmm_pids().len() <= pids_before, "{:?}", d.vmm_pids());

    // New code is a new version: the old snapshot is deleted and never
    // restored; the next start boots the new code and snapshots it.
    let r = d.update_code("f", "fn-echo", "fn-upper");
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(!snap.exists(), "the old version's snapshot is deleted");
    let r = d.invoke("f", b"\"abc\"");
    assert_eq!(r.text(), "\"ABC\"");
    assert_eq!(r.header("x-spore-start-path"), Some("cold"));
    wait_for_snapshot(&state, "f", 2, Duration::from_secs(10));
    let r = d.request("DELETE", "/2015-03-31/functions/f", b"", &[]);
    assert_eq!(r.status, 204);
    assert!(
        !state.join("snapshots/f-v2").exists(),
        "deleted with its function"
    );
}

#[test]
fn kvm_serve_restore_remakes_the_zygote() {
    require_kvm();
    let dir = Scratch::new("serve-remake");
    let state = dir.path("state");
    let mut d = Daemon::start(&state, &["--keep-alive-ms", "0"]);
    assert_eq!(d.create("f", "fn-echo", serde_json::json!({})).status, 201);
    assert_eq!(
        d.invoke("f", b"{}").header("x-spore-start-path"),
        Some("cold")
    );
    assert_eq!(
        d.invoke("f", b"{}").header("x-spore-start-path"),
        Some("clone")
    );
    d.kill9();
    let d = Daemon::start(&state, &["--keep-alive-ms", "0"]);
    // No zygote after the restart: the snapshot serves at once, and a boot
    // in the background makes the zygote for the starts after it.
    let r = d.invoke("f", br#"{"k":1}"#);
    assert_eq!(r.json()["echo"]["k"], 1);
    assert_eq!(r.header("x-spore-start-path"), Some("restore"));
    let zygotes = || d.metric("spore_instances{function=\"f\",state=\"zygote\"}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while zygotes() < 1.0 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(zygotes(), 1.0);
    let r = d.invoke("f", br#"{"k":2}"#);
    assert_eq!(r.json()["echo"]["k"], 2);
    assert_eq!(r.header("x-spore-start-path"), Some("clone"));
}

#[test]
fn kvm_serve_bad_input_is_lambda_shaped_and_changes_nothing() {
    require_kvm();
    let dir = Scratch::new("serve-bad");
    let d = Daemon::start(&dir.path("state"), &[]);
    assert_eq!(d.create("f", "fn-echo", serde_json::json!({})).status, 201);
    let before = d.request("GET", "/2015-03-31/functions", b"", &[]).text();
    let echo = std::fs::read(common::uk_image("fn-echo")).unwrap();
    let fn_of = |zip: String| serde_json::json!({"ZipFile": zip});

    let cases: Vec<(&str, common::serve::Response, u16, &str)> = vec![
        (
            "not a zip",
            d.create("a", "fn-echo", serde_json::json!({"Code": {"ZipFile": "bm90IGEgemlw"}})),
            400,
            "InvalidParameterValueException",
        ),
        (
            "zip without the handler",
            d.create("b", "fn-echo", serde_json::json!({"Code": fn_of(common::serve::zip_b64(&[("other", &echo)]))})),
            400,
            "InvalidParameterValueException",
        ),
        (
            "handler not an ELF",
            d.create("c", "fn-echo", serde_json::json!({"Code": fn_of(common::serve::zip_b64(&[("fn-echo", b"#!/bin/sh\n")]))})),
            400,
            "InvalidParameterValueException",
        ),
        (
            "unknown runtime",
            d.create("d", "fn-echo", serde_json::json!({"Runtime": "python9.9"})),
            400,
            "InvalidParameterValueException",
        ),
        ("memory too small", d.create("e", "fn-echo", serde_json::json!({"MemorySize": 32})), 400, "InvalidParameterValueException"),
        ("memory too large", d.create("e", "fn-echo", serde_json::json!({"MemorySize": 20000})), 400, "InvalidParameterValueException"),
        ("name with ../ in the body", d.create("../x", "fn-echo", serde_json::json!({})), 400, "InvalidParameterValueException"),
        (
            "name with ../ in the path",
            d.invoke("..%2F..%2Fetc", b"{}"),
            400,
            "InvalidParameterValueException",
        ),
        (
            "malformed JSON",
            d.request("POST", "/2015-03-31/functions", b"{\"FunctionName\": ", &[]),
            400,
            "InvalidRequestContentException",
        ),
        (
            "payload over 6 MB",
            d.invoke("f", &vec![b'x'; 6 * 1024 * 1024 + 1]),
            413,
            "RequestTooLargeException",
        ),
        ("existing name", d.create("f", "fn-echo", serde_json::json!({})), 409, "ResourceConflictException"),
        ("unknown function", d.invoke("nope", b"{}"), 404, "ResourceNotFoundException"),
        ("payload not JSON", d.invoke("f", b"{not json"), 400, "InvalidRequestContentException"),
        (
            "another account's ARN",
            d.invoke("arn:aws:lambda:us-east-1:123456789012:function:f", b"{}"),
            404,
            "ResourceNotFoundException",
        ),
        (
            "bad invocation type",
            d.request("POST", "/2015-03-31/functions/f/invocations", b"{}", &[("X-Amz-Invocation-Type", "Sometimes")]),
            400,
            "InvalidParameterValueException",
        ),
    ];
    for (what, r, status, kind) in cases {
        assert_eq!(r.status, status, "{what}: {}", r.text());
        assert_eq!(r.error_type(), Some(kind), "{what}: {}", r.text());
        assert!(
            r.json()["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{what}"
        );
    }
    assert_eq!(
        d.request("GET", "/2015-03-31/functions", b"", &[]).text(),
        before,
        "nothing changed"
    );
    assert_eq!(d.invoke("f", b"{\"still\":1}").json()["echo"]["still"], 1);
    // DryRun and Event.
    let r = d.request(
        "POST",
        "/2015-03-31/functions/f/invocations",
        b"{}",
        &[("X-Amz-Invocation-Type", "DryRun")],
    );
    assert_eq!(r.status, 204);
    let r = d.request(
        "POST",
        "/2015-03-31/functions/f/invocations",
        b"{}",
        &[("X-Amz-Invocation-Type", "Event")],
    );
    assert_eq!(r.status, 202);
}

#[test]
fn kvm_serve_fn_cli() {
    require_kvm();
    let dir = Scratch::new("serve-fncli");
    let state = dir.path("state");
    let d = Daemon::start(&state, &[]);
    let run = |args: &[&str]| {
        common::spore()
            .args(["fn", "--endpoint", &d.addr])
            .args(args)
            .output()
            .unwrap()
    };
    let image = common::uk_image("fn-echo");
    let out = run(&[
        "deploy",
        "cli",
        "--image",
        image.to_str().unwrap(),
        "--memory",
        "64",
        "--env",
        "K=v w",
    ]);
    assert!(out.status.success(), "{}", common::stderr_of(&out));
    let out = run(&["invoke", "cli", r#"{"env":"K"}"#]);
    assert!(out.status.success(), "{}", common::stderr_of(&out));
    assert_eq!(
        common::stdout_of(&out).trim(),
        r#"{"env":"K","value":"v w"}"#
    );
    let out = run(&["invoke", "cli", r#"{"fail":"x"}"#]);
    assert_eq!(out.status.code(), Some(1), "a function error exits 1");
    let out = run(&["ls"]);
    assert!(
        common::stdout_of(&out)
            .lines()
            .any(|l| l.starts_with("cli ")),
        "{}",
        common::stdout_of(&out)
    );
    let out = common::spore()
        .args(["fn", "logs", "cli", "--state-dir", state.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        common::stdout_of(&out).contains("Outcome: function_error"),
        "{}",
        common::stdout_of(&out)
    );
    assert!(run(&["rm", "cli"]).status.success());
    let out = run(&["invoke", "cli"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        common::stderr_of(&out).contains("ResourceNotFoundException"),
        "{}",
        common::stderr_of(&out)
    );
}

#[test]
fn kvm_serve_memory_budget_ends_lru_idle_instances() {
    require_kvm();
    let dir = Scratch::new("serve-budget");
    let state = dir.path("state");
    let idle = |d: &Daemon| d.metric("spore_instances{function=\"t\",state=\"idle\"}");
    let all = |d: &Daemon| d.metric("spore_memory_bytes{held_by=\"all\"}");
    let templates = |d: &Daemon| d.metric("spore_memory_bytes{held_by=\"templates\"}");
    // Deploys fn-echo as "t", invokes it five times at once (five clones,
    // each holding 8 MiB of its own), and lets the reaper look.
    let five_at_once = |d: &Arc<Daemon>| {
        assert_eq!(
            d.create("t", "fn-echo", serde_json::json!({"MemorySize": 128}))
                .status,
            201
        );
        let handles: Vec<_> = (0..5)
            .map(|_| {
                let d = d.clone();
                thread::spawn(move || d.invoke("t", br#"{"sleep_ms":300,"hold_mib":8}"#).status)
            })
            .collect();
        for h in handles {
            assert_eq!(h.join().unwrap(), 200);
        }
        thread::sleep(Duration::from_millis(1500));
    };
    // The budget bounds every process the daemon's instances need, measured:
    // the zygote, its clone factory, the clones it starts ahead (which map
    // the template too), and the idle instances, each of which holds 8 MiB
    // of its own (fn-echo's hold_mib). What that takes is measured first,
    // without a budget: five idle clones and the zygote's tree alone (PSS
    // of shared file pages moves with what else runs, by a MB or two: the
    // 8 MiB per clone keeps the budget's margin above that).
    let (tree, per_clone) = {
        let d = Arc::new(Daemon::start(&state, &["--keep-alive-ms", "4000"]));
        five_at_once(&d);
        let (a, five) = (all(&d), idle(&d));
        // Then the idle clones' keep-alive ends them: the zygote's tree alone.
        let deadline = Instant::now() + Duration::from_secs(20);
        while idle(&d) > 0.0 && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(200));
        }
        thread::sleep(Duration::from_millis(1500));
        let t = all(&d);
        eprintln!(
            "without a budget: all {a} B with {five} idle clones, {t} B the zygote's tree alone"
        );
        assert!(
            five == 5.0 && a > t && t > 0.0,
            "all {a} B, tree {t} B, {five} idle"
        );
        (t, (a - t) / 5.0)
    };
    // A budget that holds the zygote and two or three of its five clones.
    let budget = tree + 2.5 * per_clone;
    // The same again on a fresh state directory (the same start paths: a
    // cold start, then clones), with that budget.
    let d = Arc::new(Daemon::start(
        &dir.path("state2"),
        &[
            "--memory-budget",
            &format!("{budget:.0}"),
            "--keep-alive-ms",
            "600000",
        ],
    ));
    five_at_once(&d);
    // The reaper looks every 250 ms (measuring at most once a second);
    // ending one clone raises the PSS of the others (fewer share the
    // template), so it may take a few rounds, and longer on a loaded host.
    // A census read while a clone is being ended can come out low (the
    // others' shares not yet grown), so under the budget only counts when
    // three censuses in a row (each at most a second old) agree.
    let started = Instant::now();
    let deadline = started + Duration::from_secs(30);
    let mut under = 0;
    while under < 3 && Instant::now() < deadline {
        let a = all(&d);
        under = if a > 0.0 && a <= budget { under + 1 } else { 0 };
        thread::sleep(Duration::from_millis(1100));
    }
    eprintln!(
        "budget {budget} B after {:?}: idle instances {} holding {} B; all processes {} B, templates {} B",
        started.elapsed(),
        idle(&d),
        d.metric("spore_memory_bytes{held_by=\"instances\"}"),
        all(&d),
        templates(&d)
    );
    assert!(all(&d) <= budget, "over the budget: {} B", all(&d));
    assert!(
        idle(&d) >= 1.0 && idle(&d) < 5.0,
        "some, not all, idle instances ended: {}",
        idle(&d)
    );
    // What is left still serves, warm.
    let r = d.request("POST", "/2015-03-31/functions/t/invocations", b"{}", &[]);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-spore-start-path"), Some("warm"));
}

/// A function not invoked for its zygote keep-alive holds no memory: its
/// instances and its zygote end (with the factory and the clones it
/// started ahead); the next invocation restores its snapshot.
#[test]
fn kvm_serve_an_unused_function_scales_to_zero() {
    require_kvm();
    let dir = Scratch::new("serve-zero");
    let state = dir.path("state");
    let d = Daemon::start(
        &state,
        &["--keep-alive-ms", "300", "--zygote-keep-alive-ms", "1500"],
    );
    assert_eq!(d.create("f", "fn-echo", serde_json::json!({})).status, 201);
    let r = d.invoke("f", br#"{"n":1}"#);
    assert_eq!(r.header("x-spore-start-path"), Some("cold"));
    wait_for_snapshot(&state, "f", 1, Duration::from_secs(10));
    let r = d.invoke("f", br#"{"n":2}"#);
    assert_eq!(r.status, 200);
    let deadline = Instant::now() + Duration::from_secs(15);
    while !d.vmm_pids().is_empty() && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(d.vmm_pids(), Vec::<i32>::new(), "nothing of f runs");
    assert_eq!(d.metric("spore_memory_bytes{held_by=\"all\"}"), 0.0);
    let r = d.invoke("f", br#"{"n":3}"#);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["echo"]["n"], 3);
    assert_eq!(r.header("x-spore-start-path"), Some("restore"));
}

/// A Linux runtime whose image is not in the cache: CreateFunction is
/// refused with a clear 400 that says how to build it, and nothing is kept.
#[test]
fn kvm_serve_refuses_a_linux_runtime_whose_image_is_not_built() {
    require_kvm();
    let dir = Scratch::new("serve-no-image");
    let empty_cache = dir.path("cache");
    std::fs::create_dir_all(&empty_cache).unwrap();
    let d = Daemon::start(
        &dir.path("state"),
        &["--image-cache", empty_cache.to_str().unwrap()],
    );
    let body = serde_json::json!({
        "FunctionName": "py",
        "Runtime": "python3",
        "Handler": "app.handler",
        "Role": "arn:aws:iam::000000000000:role/test",
        "Code": { "ZipFile": common::serve::zip_b64(&[("app.py", b"def handler(e, c):\n    return e\n")]) },
        "MemorySize": 256,
    });
    let r = d.request(
        "POST",
        "/2015-03-31/functions",
        body.to_string().as_bytes(),
        &[],
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(
        r.text()
            .contains("runtime image python3 is not built; run spore image build python3"),
        "{}",
        r.text()
    );
    let list = d.request("GET", "/2015-03-31/functions", b"", &[]).json();
    assert_eq!(
        list["Functions"].as_array().map(Vec::len),
        Some(0),
        "{list}"
    );
}
