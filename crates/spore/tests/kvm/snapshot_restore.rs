//! Restore paths end to end on host KVM with the `snaptest` unikernel: the
//! same snapshot restored lazily, eagerly, through a recorded working set
//! (a recording run, then a replay run), through the built-in userfaultfd
//! handler and through an external handler process; each restored guest
//! goes on counting and finds every page of its pattern intact. Plus bad
//! load bodies and bad working-set files.

use std::process::{Output, Stdio};
use std::time::Duration;

use crate::common::*;

/// Snapshots a snaptest guest mid-count and stops it; returns the last
/// count it printed.
fn make_snapshot(dir: &Scratch, name: &str, cmdline: &str) -> u64 {
    let sock = dir.path(&format!("{name}.sock"));
    let (mut vmm, rx) = boot_snaptest(&sock, 128, false, cmdline, &[]);
    let mut seen = read_until(&rx, "count 4");
    snapshot_create(
        &sock,
        &dir.path(&format!("{name}.state")),
        &dir.path(&format!("{name}.mem")),
        false,
        true,
    );
    vmm.wait().unwrap();
    while let Ok(l) = rx.recv_timeout(Duration::from_millis(200)) {
        seen.push(l);
    }
    *counts(&seen).iter().max().unwrap()
}

fn restore(dir: &Scratch, name: &str, extra: &[&str]) -> Output {
    spore()
        .env("SPORE_LOG", "info")
        .args(["snapshot", "restore", "--state"])
        .arg(dir.path(&format!("{name}.state")))
        .arg("--mem")
        .arg(dir.path(&format!("{name}.mem")))
        .args(extra)
        .output()
        .unwrap()
}

/// The restored guest continued from `last` to the end, and its whole
/// pattern (`pages` pages) verified.
fn assert_continued(o: &Output, last: u64, pages: u64, what: &str) {
    let out = stdout_of(o);
    assert_eq!(o.status.code(), Some(0), "{what}: {out}\n{}", stderr_of(o));
    let lines: Vec<String> = out.lines().map(str::to_string).collect();
    assert!(
        !lines.iter().any(|l| l.starts_with("filled")),
        "{what}: the guest restarted: {out}"
    );
    let c = counts(&lines);
    assert_eq!(c.first().copied(), Some(last + 1), "{what}: {out}");
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("verify ok") && l.ends_with(&format!("pages={pages}"))),
        "{what}: {out}"
    );
}

/// "page-fault handler served N faults" from a restore's log.
/// `spore snapshot restore` of snapshot `name` with `args`, its API on
/// `sock` (waited for) and its guest's output as lines.
fn restore_serving(
    s: &Scratch,
    name: &str,
    args: &[&str],
    sock: &std::path::Path,
) -> (std::process::Child, std::sync::mpsc::Receiver<String>) {
    let mut child = spore()
        .args(["snapshot", "restore"])
        .args(args)
        .arg("--state")
        .arg(s.path(&format!("{name}.state")))
        .arg("--mem")
        .arg(s.path(&format!("{name}.mem")))
        .arg("--api-sock")
        .arg(sock)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let rx = lines_of(&mut child);
    wait_for_path(sock, Duration::from_secs(10));
    (child, rx)
}

/// Drops a file's clean pages from the page cache.
fn drop_from_page_cache(path: &std::path::Path) {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path).unwrap();
    // SAFETY: advice on an fd we own.
    let r = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(r, 0);
}

fn faults_served(o: &Output) -> Option<u64> {
    stderr_of(o).lines().find_map(|l| {
        l.split("handler served ")
            .nth(1)?
            .split(' ')
            .next()?
            .parse()
            .ok()
    })
}

#[test]
fn kvm_every_restore_path_continues_with_memory_intact() {
    require_kvm();
    let s = Scratch::new("restore-paths");
    let last = make_snapshot(&s, "vm", "mib=24 rounds=24 sleep_ms=30");
    let pages = 24 * 256;
    for mode in ["lazy", "eager", "uffd"] {
        let o = restore(&s, "vm", &["--mode", mode]);
        assert_continued(&o, last, pages, mode);
    }
    // Every page of the pattern was read through the handler, in runs of
    // up to 256 pages (1 MiB) per fault.
    let served_uffd = faults_served(&restore(&s, "vm", &["--mode", "uffd"])).unwrap();
    assert!(served_uffd >= pages / 256, "{served_uffd} faults");
    assert!(
        served_uffd < pages / 16,
        "{served_uffd} faults for {pages} pages"
    );

    // Working set: the first run records it, the second loads it.
    let ws = s.path("vm.state.ws");
    assert!(!ws.exists());
    let o = restore(&s, "vm", &["--mode", "working-set"]);
    assert_continued(&o, last, pages, "working-set recording");
    assert!(stderr_of(&o).contains("recording"), "{}", stderr_of(&o));
    // Recording serves one page per fault: every page of the pattern.
    let served_all = faults_served(&o).unwrap();
    assert!(served_all >= pages, "{served_all} faults");
    let recorded = std::fs::read(&ws).unwrap();
    assert_eq!(&recorded[..8], b"SPOREWS1");
    // Version 3: page runs in first-touch order (16 bytes each) covering
    // at least the pattern's pages, their total in the header, a CRC per
    // 256 pages, then each listed page's data.
    assert_eq!(recorded[8], 3);
    let runs = usize::try_from(u64::from_le_bytes(recorded[24..32].try_into().unwrap()))
        .expect("a run count fits usize");
    let listed: u64 = (0..runs)
        .map(|i| u64::from_le_bytes(recorded[72 + i * 16 + 8..][..8].try_into().unwrap()))
        .sum();
    assert!(listed >= pages, "{listed} pages in the set");
    let total = u32::from_le_bytes(recorded[68..72].try_into().unwrap());
    assert_eq!(u64::from(total), listed);
    let list_end = (72 + runs as u64 * 16 + listed.div_ceil(256) * 4).div_ceil(4096) * 4096;
    assert_eq!(recorded.len() as u64, list_end + listed * 4096);
    let o = restore(&s, "vm", &["--mode", "working-set"]);
    assert_continued(&o, last, pages, "working-set replay");
    assert!(stderr_of(&o).contains("\"loaded\""), "{}", stderr_of(&o));
    // The replay maps the memory file: no page goes through a handler.
    assert_eq!(faults_served(&o).unwrap_or(0), 0, "{}", stderr_of(&o));
    // Loading it does not rewrite it.
    assert_eq!(std::fs::read(&ws).unwrap(), recorded);
    // The memory file out of the page cache: the set loads beside the
    // running guest into handler-served memory, memory intact.
    drop_from_page_cache(&s.path("vm.mem"));
    let o = restore(&s, "vm", &["--mode", "working-set"]);
    assert_continued(&o, last, pages, "working-set load beside the guest");
    assert!(stderr_of(&o).contains("\"loading\""), "{}", stderr_of(&o));

    // An external handler process, Firecracker's protocol.
    let hsock = s.path("handler.sock");
    let handler = spore()
        .args(["snapshot", "uffd-handler", "--sock"])
        .arg(&hsock)
        .arg("--mem")
        .arg(s.path("vm.mem"))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_path(&hsock, Duration::from_secs(10));
    let o = restore(&s, "vm", &["--uffd-handler", hsock.to_str().unwrap()]);
    assert_continued(&o, last, pages, "external uffd handler");
    let h = handler.wait_with_output().unwrap();
    assert!(h.status.success(), "{}", stderr_of(&h));
    let served: u64 = stderr_of(&h)
        .split("served ")
        .nth(1)
        .and_then(|t| t.split(' ').next()?.parse().ok())
        .unwrap();
    assert!(
        served >= pages / 256,
        "the external handler served {served}"
    );
}

#[test]
fn kvm_a_vm_restored_through_uffd_snapshots_every_page() {
    require_kvm();
    let s = Scratch::new("restore-uffd-resnap");
    make_snapshot(&s, "a", "mib=16 rounds=40 sleep_ms=30");
    // Restore through the handler, let it run a little, snapshot it again:
    // pages it never touched are still only in the first snapshot's file.
    let sock = s.path("b.sock");
    let (mut child, rx) = restore_serving(&s, "a", &["--mode", "uffd"], &sock);
    read_until(&rx, "count 10");
    snapshot_create(&sock, &s.path("b.state"), &s.path("b.mem"), false, true);
    child.wait().unwrap();
    let mut tail = vec!["count 10".to_string()];
    while let Ok(l) = rx.recv_timeout(Duration::from_millis(200)) {
        tail.push(l);
    }
    let last = *counts(&tail).iter().max().unwrap();
    let o = restore(&s, "b", &["--mode", "lazy"]);
    assert_continued(&o, last, 16 * 256, "lazy restore of the re-snapshot");
}

#[test]
fn kvm_a_vm_served_by_an_external_handler_is_not_cloned() {
    require_kvm();
    let s = Scratch::new("restore-external-clone");
    make_snapshot(&s, "a", "mib=1 rounds=100000 sleep_ms=20");
    let hsock = s.path("handler.sock");
    let mut handler = spore()
        .args(["snapshot", "uffd-handler", "--sock"])
        .arg(&hsock)
        .arg("--mem")
        .arg(s.path("a.mem"))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for_path(&hsock, Duration::from_secs(10));
    let sock = s.path("b.sock");
    let hsock_arg = hsock.to_str().unwrap();
    let (mut child, rx) = restore_serving(&s, "a", &["--uffd-handler", hsock_arg], &sock);
    read_until(&rx, "count");
    // Its template would miss every page the handler holds: refused.
    let (code, reply) = http(&sock, "PUT", "/clone", Some(r#"{"count": 1}"#));
    assert_eq!(code, 400, "{reply}");
    assert!(reply.contains("external userfaultfd handler"), "{reply}");
    let _ = child.kill();
    let _ = child.wait();
    let _ = handler.kill();
    let _ = handler.wait();
}

#[test]
fn kvm_bad_working_set_files_are_ignored_and_recorded_again() {
    require_kvm();
    let s = Scratch::new("restore-bad-ws");
    let last_a = make_snapshot(&s, "a", "mib=8 rounds=12 sleep_ms=20");
    let last_b = make_snapshot(&s, "b", "mib=8 rounds=12 sleep_ms=20");
    let pages = 8 * 256;
    let (ws_a, ws_b) = (s.path("a.state.ws"), s.path("b.state.ws"));
    // Garbage, then a truncated copy of a good one.
    std::fs::write(&ws_a, b"not a working set").unwrap();
    let o = restore(&s, "a", &["--mode", "working-set"]);
    assert_continued(&o, last_a, pages, "garbage working set");
    assert!(
        stderr_of(&o).contains("ignoring the working set"),
        "{}",
        stderr_of(&o)
    );
    let good = std::fs::read(&ws_a).unwrap();
    assert_eq!(&good[..8], b"SPOREWS1", "not recorded again");
    std::fs::write(&ws_a, &good[..good.len() - 100]).unwrap();
    let o = restore(&s, "a", &["--mode", "working-set"]);
    assert_continued(&o, last_a, pages, "truncated working set");
    assert!(stderr_of(&o).contains("truncated"), "{}", stderr_of(&o));
    // A's working set beside snapshot B: another snapshot id.
    std::fs::copy(&ws_a, &ws_b).unwrap();
    let o = restore(&s, "b", &["--mode", "working-set"]);
    assert_continued(&o, last_b, pages, "another snapshot's working set");
    assert!(
        stderr_of(&o).contains("recorded for snapshot"),
        "{}",
        stderr_of(&o)
    );
    let o = restore(&s, "b", &["--mode", "working-set"]);
    assert_continued(&o, last_b, pages, "re-recorded working set");
    assert!(stderr_of(&o).contains("\"loaded\""), "{}", stderr_of(&o));
}

#[test]
fn kvm_bad_load_bodies_are_refused() {
    require_kvm();
    let s = Scratch::new("restore-bad-body");
    make_snapshot(&s, "vm", "mib=1 rounds=1000 sleep_ms=20");
    let (state, mem) = (s.path("vm.state"), s.path("vm.mem"));
    let sock = s.path("api.sock");
    let mut vmm = spawn_vmm(&sock);
    wait_for_path(&sock, Duration::from_secs(10));
    let load = |backend: &str, extra: &str| {
        let body = format!(
            r#"{{"snapshot_path": "{}", "mem_backend": {backend}{extra}}}"#,
            state.display()
        );
        http(&sock, "PUT", "/snapshot/load", Some(&body))
    };
    let file = format!(
        r#"{{"backend_type": "File", "backend_path": "{}"}}"#,
        mem.display()
    );
    let (code, reply) = load(&file, r#", "restore_mode": "turbo""#);
    assert_eq!(code, 400, "{reply}");
    assert!(reply.contains("unknown variant"), "{reply}");
    let (code, reply) = load(
        &format!(
            r#"{{"backend_type": "Tape", "backend_path": "{}"}}"#,
            mem.display()
        ),
        "",
    );
    assert_eq!(code, 400, "{reply}");
    assert!(reply.contains("unknown variant"), "{reply}");
    let missing = s.path("no-handler.sock");
    let (code, reply) = load(
        &format!(
            r#"{{"backend_type": "Uffd", "backend_path": "{}"}}"#,
            missing.display()
        ),
        "",
    );
    assert_eq!(code, 400, "{reply}");
    assert!(
        reply.contains("no-handler.sock") && reply.contains("socket"),
        "{reply}"
    );
    // A socket nobody accepts on any more.
    let stale = s.path("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    let (code, reply) = load(
        &format!(
            r#"{{"backend_type": "Uffd", "backend_path": "{}"}}"#,
            stale.display()
        ),
        "",
    );
    assert_eq!(code, 400, "{reply}");
    assert!(
        reply.contains("cannot reach the page-fault handler"),
        "{reply}"
    );
    let (code, reply) = load(
        &format!(
            r#"{{"backend_type": "Uffd", "backend_path": "{}"}}"#,
            mem.display()
        ),
        r#", "restore_mode": "eager""#,
    );
    assert_eq!(code, 400, "{reply}");
    assert!(reply.contains("needs the File backend"), "{reply}");
    // After all that the VMM still loads the snapshot.
    let (code, reply) = load(&file, r#", "restore_mode": "eager", "resume_vm": true"#);
    assert_eq!(code, 204, "{reply}");
    vmm.kill().unwrap();
    vmm.wait().unwrap();
}

#[test]
fn kvm_working_set_recording_ends_on_its_timer_and_waits_for_the_resume() {
    require_kvm();
    let s = Scratch::new("restore-ws-api");
    let last = make_snapshot(&s, "vm", "mib=8 rounds=60 sleep_ms=20");
    let (state, mem, ws) = (s.path("vm.state"), s.path("vm.mem"), s.path("vm.state.ws"));
    let sock = s.path("api.sock");
    let (mut vmm, rx) = spawn_vmm_lines(&sock);
    let body = format!(
        r#"{{"snapshot_path": "{}", "mem_backend": {{"backend_type": "File", "backend_path": "{}"}},
            "restore_mode": "working_set", "working_set_record_ms": 300}}"#,
        state.display(),
        mem.display()
    );
    let (code, reply) = http(&sock, "PUT", "/snapshot/load", Some(&body));
    assert_eq!(code, 204, "{reply}");
    // Loaded paused: the timer has not started.
    std::thread::sleep(Duration::from_millis(600));
    assert!(!ws.exists(), "recorded before the guest ran");
    assert_eq!(
        http(&sock, "PATCH", "/vm", Some(r#"{"state": "Resumed"}"#)).0,
        204
    );
    let first = read_until(&rx, "count");
    assert_eq!(counts(&first).first().copied(), Some(last + 1), "{first:?}");
    // The set is written while the guest still runs (it counts for ~1 s).
    let t = std::time::Instant::now();
    while !ws.exists() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "no working set written"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(vmm.try_wait().unwrap().is_none(), "written only at exit");
    let rest = read_until(&rx, "verify");
    assert!(rest.last().unwrap().starts_with("verify ok"), "{rest:?}");
    assert_eq!(vmm.wait().unwrap().code(), Some(0));
    assert_eq!(&std::fs::read(&ws).unwrap()[..8], b"SPOREWS1");
    // The next restore loads it.
    let o = restore(&s, "vm", &["--mode", "working-set"]);
    assert_continued(&o, last, 8 * 256, "replay of the timed recording");
    assert!(stderr_of(&o).contains("\"loaded\""), "{}", stderr_of(&o));
}
