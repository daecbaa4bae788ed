//! spore as a drop-in `firecracker`: Firecracker's command line through a
//! `firecracker` symlink, and the Firecracker API answers spore adds (version,
//! snapshot create's 204, logger, metrics). Tests that boot need /dev/kvm
//! and are named `kvm_*`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

/// A `firecracker` symlink to the spore binary inside `s`.
fn firecracker(s: &Scratch) -> Command {
    let link = s.path("firecracker");
    if !link.exists() {
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_spore"), &link).unwrap();
    }
    Command::new(link)
}

fn code_of(c: &mut Command) -> (Option<i32>, String, String) {
    let o = c.stdin(Stdio::null()).output().unwrap();
    (o.status.code(), stdout_of(&o), stderr_of(&o))
}

/// Waits until `path` holds a line containing `needle`; returns the text.
fn wait_for_text(path: &Path, needle: &str) -> String {
    let t0 = Instant::now();
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.contains(needle) {
            return text;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "{} never showed {needle:?}: {text}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn start(c: &mut Command, sock: &Path) -> VmmChild {
    let child = c
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let r = VmmChild::new(child);
    wait_for_path(sock, Duration::from_secs(10));
    r
}

#[test]
fn version_and_snapshot_version_print_firecrackers_format() {
    let s = Scratch::new("fc-version");
    let (code, out, _) = code_of(firecracker(&s).arg("--version"));
    assert_eq!(code, Some(0));
    let first = out.lines().next().unwrap_or_default();
    // `Firecracker vMAJOR.MINOR.PATCH[-pre]`, as the reference prints it.
    let v = first
        .strip_prefix("Firecracker v")
        .unwrap_or_else(|| panic!("{out}"));
    let core = v.split('-').next().unwrap();
    assert!(
        core.split('.').count() == 3 && core.split('.').all(|n| n.parse::<u32>().is_ok()),
        "{first}"
    );
    assert!(out.contains("spore v"), "{out}");
    // The same through `spore firecracker`.
    let o = spore().args(["firecracker", "--version"]).output().unwrap();
    assert_eq!(stdout_of(&o).lines().next(), Some(first));
    let (code, out, _) = code_of(firecracker(&s).arg("--snapshot-version"));
    assert_eq!(code, Some(0));
    assert!(
        out.trim().starts_with('v') && out.trim().ends_with(".0.0"),
        "{out}"
    );
}

#[test]
fn bad_command_lines_exit_as_firecracker_does() {
    let s = Scratch::new("fc-bad");
    let sock = s.path("api.sock");
    let sock = sock.to_str().unwrap();
    for args in [
        &["--bogus"][..],
        &["-api-sock", sock],
        &["--id", "bad_id!"],
        &["--id", &"a".repeat(65)],
        &["--http-api-max-payload-size", "abc"],
        &["--mmds-size-limit", "abc"],
        &["--start-time-us", "abc"],
        &["--start-time-cpu-us", "-1"],
        &["--parent-cpu-time-us", "x"],
        &["--no-api"],
        &["--no-seccomp", "--seccomp-filter", "/f"],
        &["--module"],
        &["--log-path"],
    ] {
        let (code, _, err) = code_of(firecracker(&s).args(args));
        assert_eq!(code, Some(153), "{args:?}: {err}");
        assert!(!Path::new(sock).exists());
    }
    let (code, _, err) = code_of(firecracker(&s).args(["--level", "loud", "--api-sock", sock]));
    assert_eq!(code, Some(152), "{err}");
    assert!(err.contains("loud"), "{err}");
    // A log path that cannot be opened, and a snapshot that is not one.
    let (code, _, err) =
        code_of(firecracker(&s).args(["--log-path", "/nonexistent/dir/log", "--api-sock", sock]));
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("/nonexistent/dir/log"), "{err}");
    std::fs::write(s.path("garbage"), "not a snapshot").unwrap();
    let (code, _, err) = code_of(
        firecracker(&s)
            .arg("--describe-snapshot")
            .arg(s.path("garbage")),
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("snapshot"), "{err}");
}

#[test]
fn every_firecracker_flag_is_accepted_and_the_api_answers() {
    let s = Scratch::new("fc-flags");
    let (sock, log, metrics) = (s.path("api.sock"), s.path("fc.log"), s.path("fc.metrics"));
    std::fs::write(s.path("meta.json"), r#"{"latest": {}}"#).unwrap();
    std::fs::write(s.path("filter.bpf"), "").unwrap();
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros()
        .to_string();
    let mut c = firecracker(&s);
    c.arg("--api-sock").arg(&sock);
    c.args(["--id", "fc-flags-1", "--boot-timer", "--enable-pci"]);
    c.args(["--http-api-max-payload-size", "2000", "--level", "debug"]);
    c.arg("--log-path").arg(&log);
    c.args(["--show-level", "--show-log-origin", "--module", "spore"]);
    c.arg("--metrics-path").arg(&metrics);
    c.arg("--metadata").arg(s.path("meta.json"));
    c.args(["--mmds-size-limit", "51200", "--parent-cpu-time-us", "10"]);
    c.args(["--start-time-us", &now_us, "--start-time-cpu-us", "0"]);
    c.arg("--no-seccomp");
    let _vmm = start(&mut c, &sock);

    let (code, body) = http(&sock, "GET", "/version", None);
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(v["firecracker_version"].as_str().unwrap().starts_with("1."));
    assert_eq!(v["spore_version"], env!("CARGO_PKG_VERSION"));
    let (code, body) = http(&sock, "GET", "/", None);
    assert_eq!(code, 200);
    assert!(body.contains("fc-flags-1"), "{body}");
    // --http-api-max-payload-size bounds bodies.
    let long = format!(
        r#"{{"kernel_image_path": "/k", "boot_args": "{}"}}"#,
        "x".repeat(2100)
    );
    assert_eq!(http(&sock, "PUT", "/boot-source", Some(&long)).0, 413);

    // Firecracker endpoints spore lacks: 400 naming it, or Firecracker's
    // invalid-request answer for a method Firecracker does not serve either.
    let (code, reply) = http(&sock, "PATCH", "/pmem/p0", Some("{}"));
    assert_eq!(code, 400, "PATCH /pmem/p0: {reply}");
    assert!(reply.contains("spore does not support"), "{reply}");
    let (code, reply) = http(&sock, "GET", "/pmem/p0", None);
    assert_eq!(code, 400);
    assert!(
        reply.contains("Invalid request method and/or path: GET pmem/p0."),
        "{reply}"
    );
    // Balloon free page hinting is served: before boot it needs a running
    // microVM, as in Firecracker.
    for (method, path, body) in [
        ("GET", "/balloon/hinting/status", ""),
        ("PATCH", "/balloon/hinting/start", "{}"),
        ("PATCH", "/balloon/hinting/stop", ""),
    ] {
        let (code, reply) = http(&sock, method, path, Some(body));
        assert_eq!(code, 400, "{method} {path}: {reply}");
        assert!(reply.contains("not started"), "{reply}");
    }
    // --metadata filled the MMDS (PATCH needs an initialized store).
    let (code, reply) = http(&sock, "GET", "/mmds", None);
    assert_eq!(code, 200, "{reply}");
    assert_eq!(http(&sock, "PATCH", "/mmds", Some(r#"{"p": 1}"#)).0, 204);
    // Served now, pre-boot: 204 as Firecracker answers.
    for (path, body) in [
        ("/entropy", "{}"),
        ("/serial", r#"{"serial_out_path": "/tmp/x"}"#),
        ("/cpu-config", "{}"),
        ("/mmds", "{}"),
    ] {
        let (code, reply) = http(&sock, "PUT", path, Some(body));
        assert_eq!(code, 204, "PUT {path}: {reply}");
    }
    // spore's answer for a served path and another method: 405.
    assert_eq!(http(&sock, "GET", "/entropy", None).0, 405);
    // Before a VM exists: no snapshot, and no FlushMetrics (as Firecracker).
    assert_eq!(http(&sock, "GET", "/snapshot/last", None).0, 404);
    let flush = r#"{"action_type": "FlushMetrics"}"#;
    assert_eq!(http(&sock, "PUT", "/actions", Some(flush)).0, 400);
    // Metrics are configured once per process (--metrics-path did).
    let again = format!(r#"{{"metrics_path": "{}"}}"#, s.path("m2").display());
    let (code, reply) = http(&sock, "PUT", "/metrics", Some(&again));
    assert_eq!(code, 400, "{reply}");

    // The log: Firecracker's line shape, with the level and the origin.
    let text = wait_for_text(&log, "path=/version");
    let line = text.lines().find(|l| l.contains("path=/version")).unwrap();
    assert!(line.contains("[fc-flags-1:spore-api:DEBUG:"), "{line}");
    assert!(line.contains(".rs:"), "{line}");
    assert!(
        line.as_bytes().get(4) == Some(&b'-') && line.contains('T'),
        "{line}"
    );
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&log).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600);

    // PUT /logger moves the log elsewhere, at another level, filtered.
    let log2 = s.path("fc2.log");
    let body = format!(
        r#"{{"log_path": "{}", "level": "Info", "show_level": false, "module": "spore"}}"#,
        log2.display()
    );
    assert_eq!(http(&sock, "PUT", "/logger", Some(&body)).0, 204);
    assert_eq!(http(&sock, "GET", "/version", None).0, 200);
    std::thread::sleep(Duration::from_millis(100));
    let text2 = std::fs::read_to_string(&log2).unwrap();
    assert!(
        !text2.contains("path=/version"),
        "debug lines at Info: {text2}"
    );
    let (code, cfg) = http(&sock, "GET", "/vm/config", None);
    assert_eq!(code, 200);
    let cfg: serde_json::Value = serde_json::from_str(&cfg).unwrap();
    assert_eq!(cfg["logger"]["level"], "Info");
}

/// A FIFO as the log path, opened without a reader and never blocking.
#[test]
fn a_fifo_log_path_never_blocks_the_vmm() {
    let s = Scratch::new("fc-fifo");
    let (sock, fifo) = (s.path("api.sock"), s.path("log.fifo"));
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo reads a NUL-terminated path that lives through the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let mut cmd = firecracker(&s);
    cmd.arg("--api-sock").arg(&sock).args(["--level", "Trace"]);
    cmd.arg("--log-path").arg(&fifo);
    let _vmm = start(&mut cmd, &sock);
    // Far more than a pipe's 64 KiB of lines, with nobody reading.
    for _ in 0..600 {
        assert_eq!(http(&sock, "GET", "/version", None).0, 200);
    }
}

fn write_config(s: &Scratch, kernel: &Path, args: &str, extra: &str) -> PathBuf {
    let config = format!(
        r#"{{
  "boot-source": {{"kernel_image_path": "{}", "boot_args": "{args}", "initrd_path": null}},
  "drives": [],
  "machine-config": {{"vcpu_count": 1, "mem_size_mib": 256, "smt": false, "track_dirty_pages": false}},
  "balloon": null, "vsock": null, "network-interfaces": [], "mmds-config": null,
  "cpu-config": null, "entropy": null{extra}
}}"#,
        kernel.display()
    );
    let path = s.path("vm.json");
    std::fs::write(&path, config).unwrap();
    path
}

#[test]
fn kvm_no_api_config_file_boots_a_unikernel() {
    require_kvm();
    let s = Scratch::new("fc-noapi");
    let log = s.path("boot.log");
    let extra = format!(
        r#", "logger": {{"log_path": "{}", "level": "Info"}}, "metrics": null"#,
        log.display()
    );
    let config = write_config(&s, &uk_image("hello"), "exit=0", &extra);
    let o = firecracker(&s)
        .arg("--no-api")
        .arg("--config-file")
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr_of(&o));
    assert!(stdout_of(&o).contains("hello"), "{}", stdout_of(&o));
    assert!(!s.path("firecracker.socket").exists());
    // The config file's logger section was applied.
    assert!(log.exists());
    let config = write_config(&s, &uk_image("hello"), "exit=3", "");
    let o = firecracker(&s)
        .arg("--no-api")
        .arg("--config-file")
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(3), "{}", stderr_of(&o));
}

#[test]
fn kvm_snapshot_create_is_204_and_its_manifest_is_at_snapshot_last() {
    require_kvm();
    let s = Scratch::new("fc-snap");
    let (sock, log, metrics) = (s.path("api.sock"), s.path("fc.log"), s.path("fc.metrics"));
    let mut c = firecracker(&s);
    c.arg("--api-sock").arg(&sock).arg("--boot-timer");
    c.arg("--log-path").arg(&log).args(["--level", "Info"]);
    let _vmm = start(&mut c, &sock);
    let kernel = uk_image("boot-mark");
    let boot = format!(
        r#"{{"kernel_image_path": "{}", "boot_args": "hold_ms=60000", "initrd_path": null}}"#,
        kernel.display()
    );
    for (path, body) in [
        ("/boot-source", boot.as_str()),
        (
            "/machine-config",
            r#"{"vcpu_count": 1, "mem_size_mib": 64}"#,
        ),
        ("/balloon", r#"{"amount_mib": 0, "deflate_on_oom": false}"#),
    ] {
        let (code, reply) = http(&sock, "PUT", path, Some(body));
        assert_eq!(code, 204, "PUT {path}: {reply}");
    }
    let body = format!(r#"{{"metrics_path": "{}"}}"#, metrics.display());
    assert_eq!(http(&sock, "PUT", "/metrics", Some(&body)).0, 204);
    let start_body = r#"{"action_type": "InstanceStart"}"#;
    assert_eq!(http(&sock, "PUT", "/actions", Some(start_body)).0, 204);
    // --boot-timer: the guest's first mark logs Firecracker's line.
    let text = wait_for_text(&log, "Guest-boot-time =");
    assert!(text.contains(" us ") && text.contains(" CPU us "), "{text}");

    // GET /vm/config shows the balloon's current target.
    assert_eq!(
        http(&sock, "PATCH", "/balloon", Some(r#"{"amount_mib": 16}"#)).0,
        204
    );
    let (_, cfg) = http(&sock, "GET", "/vm/config", None);
    let cfg: serde_json::Value = serde_json::from_str(&cfg).unwrap();
    assert_eq!(cfg["balloon"]["amount_mib"], 16, "{cfg}");

    assert_eq!(
        http(&sock, "PATCH", "/vm", Some(r#"{"state": "Paused"}"#)).0,
        204
    );
    let (state, mem) = (s.path("vm.state"), s.path("vm.mem"));
    let body = format!(
        r#"{{"snapshot_type": "Full", "snapshot_path": "{}", "mem_file_path": "{}"}}"#,
        state.display(),
        mem.display()
    );
    let (code, reply) = http(&sock, "PUT", "/snapshot/create", Some(&body));
    assert_eq!(code, 204, "{reply}");
    assert!(reply.is_empty(), "204 carries no body: {reply:?}");
    let (code, manifest) = http(&sock, "GET", "/snapshot/last", None);
    assert_eq!(code, 200, "{manifest}");
    let m: serde_json::Value = serde_json::from_str(&manifest).unwrap();
    assert_eq!(m["vcpu_count"], 1, "{m:#}");
    assert_eq!(m["mem_size_bytes"], 64u64 << 20, "{m:#}");
    // The same manifest as the state file's.
    let inspect = spore()
        .args(["snapshot", "inspect"])
        .arg(&state)
        .output()
        .unwrap();
    let on_disk: serde_json::Value = serde_json::from_str(&stdout_of(&inspect)).unwrap();
    assert_eq!(on_disk["format_version"], m["format_version"]);
    assert_eq!(on_disk["state_bytes"], m["state_bytes"]);

    // --describe-snapshot prints its data format version.
    let (code, out, err) = code_of(firecracker(&s).arg("--describe-snapshot").arg(&state));
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out.trim(), format!("v{}.0.0", m["format_version"]));

    // FlushMetrics writes one JSON line in Firecracker's shape.
    let flush = r#"{"action_type": "FlushMetrics"}"#;
    assert_eq!(http(&sock, "PUT", "/actions", Some(flush)).0, 204);
    let text = wait_for_text(&metrics, "utc_timestamp_ms");
    let line: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert!(line["utc_timestamp_ms"].as_u64().unwrap() > 1_700_000_000_000);
    assert_eq!(
        line["put_api_requests"]["snapshot_create_count"], 1,
        "{line}"
    );
    assert!(
        line["put_api_requests"]["boot_source_count"].as_u64() >= Some(1),
        "{line}"
    );
    assert!(line["vcpu"]["exit_io_out"].as_u64() >= Some(1), "{line}");
    assert_eq!(http(&sock, "PUT", "/actions", Some(flush)).0, 204);
    let text = wait_for_text(&metrics, "\n{");
    let second: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    // Counters are increases since the previous line.
    assert_eq!(
        second["put_api_requests"]["snapshot_create_count"], 0,
        "{second}"
    );
}
