//! Host-KVM tier: the spore unikernel on /dev/kvm, driven through the real
//! `spore` binary. Every test here needs /dev/kvm; `make test` skips the tier
//! (and says so) on a host without it.

use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::common::*;

#[test]
fn kvm_unikernel_greets_checks_heap_and_exits_with_its_code() {
    require_kvm();
    let out = spore()
        .args(["run", "--mem", "128M", "--cmdline", "exit=42", "--kernel"])
        .arg(uk_image("hello"))
        .output()
        .unwrap();
    let stdout = stdout_of(&out);
    assert!(stdout.contains("hello from spore-uk"), "stdout: {stdout}");
    assert!(stdout.contains("heap check passed"), "stdout: {stdout}");
    assert_eq!(out.status.code(), Some(42), "stderr: {}", stderr_of(&out));
}

#[test]
fn kvm_unikernel_exit_zero() {
    require_kvm();
    let out = spore()
        .args(["run", "--mem", "128M", "--kernel"])
        .arg(uk_image("hello"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr_of(&out));
}

#[test]
fn kvm_unikernel_heap_too_small_fails_cleanly() {
    require_kvm();
    // 32 MiB of RAM cannot hold a 64 MiB heap: the app says so and exits 1.
    let out = spore()
        .args(["run", "--mem", "32M", "--kernel"])
        .arg(uk_image("hello"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "stdout: {}", stdout_of(&out));
}

/// CPU time (user + system) a child used, from wait4.
fn run_and_measure_cpu(mut cmd: std::process::Command) -> (i32, Duration, Duration) {
    let start = Instant::now();
    #[allow(clippy::zombie_processes)] // reaped by wait4 below, which also gives its rusage
    let child = cmd.stdout(Stdio::null()).spawn().unwrap();
    let mut status = 0;
    // SAFETY: rusage is plain data filled by the kernel.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waiting for our own child with valid out-pointers.
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut ru) };
    assert_eq!(pid, child.id() as i32);
    let wall = start.elapsed();
    let tv = |t: libc::timeval| {
        let micros = u32::try_from(t.tv_usec).expect("tv_usec is below a million");
        Duration::new(t.tv_sec as u64, micros * 1000)
    };
    let cpu = tv(ru.ru_utime) + tv(ru.ru_stime);
    (libc::WEXITSTATUS(status), wall, cpu)
}

#[test]
fn kvm_idle_unikernel_costs_under_5_percent_of_a_core() {
    require_kvm();
    let mut cmd = spore();
    cmd.args(["run", "--mem", "64M", "--cmdline", "secs=3", "--kernel"])
        .arg(uk_image("idle"));
    let (code, wall, cpu) = run_and_measure_cpu(cmd);
    assert_eq!(code, 0);
    assert!(wall >= Duration::from_secs(3), "ran only {wall:?}");
    let share = cpu.as_secs_f64() / wall.as_secs_f64();
    eprintln!(
        "idle unikernel: {cpu:?} CPU over {wall:?} = {:.2}% of a core",
        share * 100.0
    );
    assert!(
        share < 0.05,
        "idle guest used {:.1}% of a core",
        share * 100.0
    );
}

#[test]
fn kvm_marks_are_recorded() {
    require_kvm();
    let dir = Scratch::new("marks");
    let marks = dir.path("marks.json");
    let out = spore()
        .args(["run", "--mem", "64M", "--marks-file"])
        .arg(&marks)
        .arg("--kernel")
        .arg(uk_image("boot-mark"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr_of(&out));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&marks).unwrap()).unwrap();
    assert_eq!(v[0]["mark"], 1, "marks: {v}");
    assert!(v[0]["monotonic_ns"].as_u64().unwrap() > 0);
}

#[test]
fn kvm_guest_garbage_on_signal_port_does_not_stop_the_vmm() {
    require_kvm();
    let out = spore()
        .args(["run", "--mem", "64M", "--kernel"])
        .arg(uk_image("signal-garbage"))
        .output()
        .unwrap();
    // The app writes junk of every width and opcode, then exits 0.
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr_of(&out));
    assert!(stdout_of(&out).contains("survived"), "{}", stdout_of(&out));
    assert!(stderr_of(&out).contains("signal port: ignored"));
}

#[test]
fn kvm_a_guest_log_flood_stays_under_the_rate_limit() {
    require_kvm();
    // 20,000 warnings from one call site as fast as the guest can, then one
    // more after the limiter's period: that one comes after a line counting
    // what was dropped.
    let started = std::time::Instant::now();
    let out = spore()
        .args([
            "run",
            "--mem",
            "64M",
            "--cmdline",
            "flood=20000 pause_ms=5200",
        ])
        .arg("--kernel")
        .arg(uk_image("signal-garbage"))
        .output()
        .unwrap();
    let elapsed = started.elapsed().as_secs();
    let stderr = stderr_of(&out);
    assert_eq!(out.status.code(), Some(0), "stderr: {stderr}");
    assert!(stdout_of(&out).contains("flooded 20000"));
    let warnings = stderr.matches("signal port: ignored").count();
    // One burst per started period of the run (however slow the host).
    let periods = elapsed / spore_vmm::log_limit::PERIOD.as_secs() + 2;
    let allowed = spore_vmm::log_limit::BURST as usize
        * usize::try_from(periods).expect("a run of seconds counts few periods");
    assert!(
        (2..=allowed).contains(&warnings),
        "{warnings} warnings reached the log in {elapsed} s (at most {allowed})"
    );
    let dropped: u64 = stderr
        .lines()
        .filter_map(|l| l.split_once(" log lines from "))
        .filter_map(|(head, _)| head.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    assert!(
        dropped + warnings as u64 >= 20_000,
        "the dropped lines are not all counted ({dropped} dropped, {warnings} kept): {stderr}"
    );
    assert!(stderr.len() < 32 * 1024, "{} bytes of log", stderr.len());
}

#[test]
fn kvm_api_configure_start_pause_resume() {
    require_kvm();
    let dir = Scratch::new("api");
    let sock = dir.path("api.sock");
    let child = spawn_vmm(&sock);

    let (code, body) = http(&sock, "GET", "/", None);
    assert_eq!(code, 200);
    assert!(body.contains("Not started"), "{body}");
    let kernel = uk_image("idle");
    let boot = format!(
        r#"{{"kernel_image_path": "{}", "boot_args": "secs=4"}}"#,
        kernel.display()
    );
    assert_eq!(http(&sock, "PUT", "/boot-source", Some(&boot)).0, 204);
    assert_eq!(
        http(
            &sock,
            "PUT",
            "/machine-config",
            Some(r#"{"vcpu_count": 1, "mem_size_mib": 64}"#)
        )
        .0,
        204
    );
    let (code, body) = http(&sock, "GET", "/machine-config", None);
    assert_eq!(code, 200);
    assert!(body.contains("\"mem_size_mib\":64"), "{body}");
    assert_eq!(
        http(
            &sock,
            "PUT",
            "/actions",
            Some(r#"{"action_type": "InstanceStart"}"#)
        )
        .0,
        204
    );
    let (code, body) = http(
        &sock,
        "PUT",
        "/actions",
        Some(r#"{"action_type": "InstanceStart"}"#),
    );
    assert_eq!(code, 400, "second InstanceStart must be refused: {body}");
    assert!(body.contains("fault_message"));
    assert!(http(&sock, "GET", "/", None).1.contains("Running"));

    assert_eq!(
        http(&sock, "PATCH", "/vm", Some(r#"{"state": "Paused"}"#)).0,
        204
    );
    assert!(http(&sock, "GET", "/", None).1.contains("Paused"));
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        http(&sock, "PATCH", "/vm", Some(r#"{"state": "Resumed"}"#)).0,
        204
    );
    assert!(http(&sock, "GET", "/", None).1.contains("Running"));

    // Configuration is frozen once started.
    let (code, _) = http(
        &sock,
        "PUT",
        "/machine-config",
        Some(r#"{"vcpu_count": 1, "mem_size_mib": 128}"#),
    );
    assert_eq!(code, 400);

    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr_of(&out));
    assert!(!sock.exists(), "API socket left behind");
}

#[test]
fn kvm_config_file_boots() {
    require_kvm();
    let dir = Scratch::new("cfg");
    let cfg = dir.path("vm.json");
    std::fs::write(
        &cfg,
        format!(
            r#"{{"boot-source": {{"kernel_image_path": "{}", "boot_args": "exit=5"}},
                "machine-config": {{"vcpu_count": 1, "mem_size_mib": 128}}}}"#,
            uk_image("hello").display()
        ),
    )
    .unwrap();
    let out = spore()
        .args(["vmm", "--config-file"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(5), "stderr: {}", stderr_of(&out));
}

#[test]
fn kvm_sigterm_stops_the_vmm_cleanly() {
    require_kvm();
    let dir = Scratch::new("term");
    let sock = dir.path("api.sock");
    let mut child = spore()
        .args(["vmm", "--api-sock"])
        .arg(&sock)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_path(&sock, Duration::from_secs(10));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(128 + libc::SIGTERM));
    assert!(!sock.exists(), "API socket left behind");
}

#[test]
fn kvm_unikernel_panic_prints_and_exits_101() {
    require_kvm();
    let out = spore()
        .args(["run", "--mem", "64M", "--cmdline", "panic", "--kernel"])
        .arg(uk_image("hello"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(101), "stdout: {}", stdout_of(&out));
    assert!(stdout_of(&out).contains("panic"), "{}", stdout_of(&out));
}

#[test]
fn kvm_unikernel_booted_as_linux_fails_cleanly() {
    require_kvm();
    // A unikernel image booted with the Linux protocol gets no boot info and
    // must fail (or fault) cleanly: a non-zero exit, no hang, no panic.
    let out = spore()
        .args([
            "run",
            "--mem",
            "64M",
            "--boot-protocol",
            "linux",
            "--kernel",
        ])
        .arg(uk_image("boot-mark"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = stderr_of(&out);
    assert_ne!(out.status.code(), Some(0), "stderr: {err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn kvm_guest_fault_stops_the_vmm_naming_the_exit_reason() {
    require_kvm();
    let out = spore()
        .args(["run", "--mem", "64M", "--cmdline", "fault", "--kernel"])
        .arg(uk_image("hello"))
        .output()
        .unwrap();
    let err = stderr_of(&out);
    assert_eq!(out.status.code(), Some(1), "stderr: {err}");
    assert!(err.contains("KVM_EXIT_SHUTDOWN"), "stderr: {err}");
    // Where the guest stopped: its instruction pointer inside the image
    // (loaded at 1 MiB and up) and its page tables.
    let rip = err
        .split("at rip 0x")
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_hexdigit()).next())
        .and_then(|h| u64::from_str_radix(h, 16).ok());
    assert!(
        rip.is_some_and(|r| r >= 0x10_0000),
        "no instruction pointer in the report: {err}"
    );
    assert!(err.contains("cr3 0x"), "stderr: {err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// `/hotplug/memory` end to end: refusals before boot, a VM booted with a
/// hotplug region, target changes at run time, `spore mem`.
#[test]
fn kvm_hotplug_memory_api() {
    require_kvm();
    let dir = Scratch::new("hotplug");
    let sock = dir.path("api.sock");
    let mut child = spore()
        .args(["vmm", "--api-sock"])
        .arg(&sock)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_path(&sock, Duration::from_secs(10));
    let hp = |method: &str, body: Option<&str>| http(&sock, method, "/hotplug/memory", body);

    // Nothing configured yet; PATCH before boot is refused.
    assert_eq!(hp("GET", None).0, 400);
    let (code, body) = hp("PATCH", Some(r#"{"requested_size_mib": 64}"#));
    assert_eq!(code, 400, "{body}");
    assert!(
        body.contains("fault_message") && body.contains("the microVM is not started"),
        "{body}"
    );
    for bad in [
        r#"{"total_size_mib": 1024, "block_size_mib": 3}"#,
        r#"{"total_size_mib": 1024, "block_size_mib": 1}"#,
        r#"{"total_size_mib": 1024, "block_size_mib": 0}"#,
        r#"{"total_size_mib": -1024}"#,
        r#"{"total_size_mib": 1000}"#,
        r#"{"total_size_mib": 1024, "slot_size_mib": 100}"#,
        r#"{"total_size_mib": 1024, "nope": 1}"#,
    ] {
        let (code, body) = hp("PUT", Some(bad));
        assert_eq!(code, 400, "{bad}: {body}");
        assert!(body.contains("fault_message"), "{body}");
    }
    assert_eq!(
        hp(
            "PUT",
            Some(r#"{"total_size_mib": 1024, "block_size_mib": 2, "slot_size_mib": 128}"#)
        )
        .0,
        204
    );
    // Before boot the status is refused, as Firecracker does; the configured
    // region shows in GET /vm/config.
    let (code, body) = hp("GET", None);
    assert_eq!(code, 400, "{body}");
    let (code, body) = http(&sock, "GET", "/vm/config", None);
    assert_eq!(code, 200);
    assert!(
        body.contains("\"memory-hotplug\":{") && body.contains("\"total_size_mib\":1024"),
        "{body}"
    );

    let boot = format!(
        r#"{{"kernel_image_path": "{}", "boot_args": "secs=30"}}"#,
        uk_image("idle").display()
    );
    assert_eq!(http(&sock, "PUT", "/boot-source", Some(&boot)).0, 204);
    assert_eq!(
        http(
            &sock,
            "PUT",
            "/machine-config",
            Some(r#"{"vcpu_count": 1, "mem_size_mib": 64}"#)
        )
        .0,
        204
    );
    let (code, body) = http(
        &sock,
        "PUT",
        "/actions",
        Some(r#"{"action_type": "InstanceStart"}"#),
    );
    assert_eq!(code, 204, "{body}");

    for bad in [
        "3",
        "1026",
        "2048",
        "-2",
        "1e3",
        "18446744073709551616",
        "\"64\"",
        "null",
    ] {
        let (code, body) = hp(
            "PATCH",
            Some(&format!(r#"{{"requested_size_mib": {bad}}}"#)),
        );
        assert_eq!(code, 400, "{bad}: {body}");
        assert!(body.contains("fault_message"), "{body}");
    }
    assert_eq!(hp("PATCH", Some(r#"{"requested_size_mib": 256}"#)).0, 204);
    let (code, body) = hp("GET", None);
    assert_eq!(code, 200);
    assert!(body.contains("\"requested_size_mib\":256"), "{body}");
    assert!(body.contains("\"plugged_size_mib\":0"), "{body}");
    // The region is frozen once the VM runs.
    assert_eq!(hp("PUT", Some(r#"{"total_size_mib": 2048}"#)).0, 400);

    // The CLI: status, a refused target (exit 1), a target set without waiting.
    let out = spore().arg("mem").arg(&sock).output().unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert!(stdout_of(&out).contains("\"requested_size_mib\":256"));
    let out = spore()
        .arg("mem")
        .arg(&sock)
        .args(["--set", "3M"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr_of(&out).contains("block size"),
        "{}",
        stderr_of(&out)
    );
    let out = spore()
        .arg("mem")
        .arg(&sock)
        .args(["--set", "128M"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert!(hp("GET", None).1.contains("\"requested_size_mib\":128"));
    // No driver plugs in this unikernel: --wait times out and says so.
    let out = spore()
        .arg("mem")
        .arg(&sock)
        .args(["--set", "64M", "--wait", "--timeout", "0.2"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr_of(&out).contains("timed out"), "{}", stderr_of(&out));

    let _ = child.kill();
    let _ = child.wait();
}
