//! Host-KVM tier: what a VM's tmem pool costs the host, with the
//! `tmem-fill` unikernel (every kind of value, small and large, random and
//! compressible, until the quota refuses each kind).
//!
//! - The VMM's RSS (without guest RAM) grows by at most the quota plus the
//!   documented overhead (README, "tmem accounting") while the pool is full.

use std::process::Stdio;
use std::sync::mpsc::Receiver;

use crate::common::*;

const MIB: u64 = 1 << 20;
/// The documented bound on what a full pool may cost beyond its quota (see
/// `spore_vmm::devices::tmem::accounting`): a fixed part, plus what each
/// vCPU may hold in flight (a value being put or got, and its lz4 copy).
const FIXED_OVERHEAD: u64 = 8 * MIB;

/// Resident KiB of a process outside guest RAM (the `spore-guest-ram`
/// memfd mappings), from `/proc/PID/smaps`.
fn rss_without_guest_kib(pid: u32) -> u64 {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let (mut total, mut guest) = (0u64, false);
    for line in smaps.lines() {
        if let Some(rest) = line.strip_prefix("Rss:") {
            if !guest {
                total += rest
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .unwrap();
            }
        } else if line.split_whitespace().next().is_some_and(|r| {
            r.contains('-') && r.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
        }) {
            guest = line.contains("spore-guest-ram");
        }
    }
    total
}

/// The `key=value` numbers of a `tmem-fill: full ...` line.
fn field(line: &str, name: &str) -> u64 {
    line.split_whitespace()
        .find_map(|p| p.strip_prefix(&format!("{name}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name}= in {line:?}"))
}

fn wait_line(rx: &Receiver<String>, prefix: &str) -> String {
    read_until(rx, prefix).pop().unwrap()
}

/// Boots tmem-fill (mixed values) under `quota`; returns (baseline KiB,
/// full KiB, the `full` line).
fn fill_and_measure(quota_mib: u64, compression: &str, extra: &[&str]) -> (u64, u64, String) {
    let mut child = spawn_spore(&[
        &["run", "--mem", "128M", "--vcpus", "1"],
        &["--tmem-quota", &format!("{quota_mib}M")],
        &["--tmem-compression", compression],
        extra,
        &["--kernel", uk_image("tmem-fill").to_str().unwrap()],
        &["--cmdline", "ready_ms=400 hold_ms=600"],
    ]);
    let rx = lines_of(&mut child);
    wait_line(&rx, "tmem-fill: ready");
    let base = rss_without_guest_kib(child.id());
    let full = wait_line(&rx, "tmem-fill: full");
    let at_full = rss_without_guest_kib(child.id());
    let lines = read_until(&rx, "tmem-fill: ");
    let status = child.wait().unwrap();
    assert!(
        lines.iter().any(|l| l.starts_with("tmem-fill: verified")),
        "{lines:?}"
    );
    assert!(status.success(), "{status}");
    (base, at_full, full)
}

/// `spore ARGS...` with its stdout piped, killed on drop.
fn spawn_spore(args: &[&[&str]]) -> VmmChild {
    let child = spore()
        .args(args.iter().flat_map(|a| a.iter()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    VmmChild::new(child)
}

#[test]
fn kvm_tmem_full_pool_rss_stays_within_quota_and_overhead() {
    require_kvm();
    let quota_mib = 64;
    for compression in ["lz4", "none"] {
        let (base, full, line) = fill_and_measure(quota_mib, compression, &[]);
        let growth = (full.saturating_sub(base)) * 1024;
        let bound = quota_mib * MIB + FIXED_OVERHEAD;
        eprintln!(
            "tmem {compression}: {line}; VMM RSS without guest RAM {base} KiB -> {full} KiB, \
             growth {:.1} MiB for a {quota_mib} MiB quota ({:.2}x), bound {:.1} MiB",
            growth as f64 / MIB as f64,
            growth as f64 / (quota_mib * MIB) as f64,
            bound as f64 / MIB as f64
        );
        // Filled: every kind was refused, so the pool is at its quota.
        assert!(
            field(&line, "bytes_stored") > (quota_mib - 2) * MIB,
            "{line}"
        );
        assert!(field(&line, "bytes_stored") <= quota_mib * MIB, "{line}");
        assert!(
            growth <= bound,
            "{compression}: RSS grew by {growth} bytes, more than the quota \
             ({quota_mib} MiB) + {FIXED_OVERHEAD} bytes: {line}"
        );
    }
}

/// Boots tmem-fill (`mode=big`: 1 MiB random values) under a 64 MiB quota
/// and the host cap `cap_mib` shared through `dir`; returns the VMM and the
/// `full` line's bytes_stored and refused.
fn fill_under_host_cap(dir: &std::path::Path, cap_mib: u64) -> (VmmChild, Receiver<String>, u64) {
    let mut child = VmmChild::new(
        spore()
            .env("SPORE_TMEM_HOST_DIR", dir)
            .args(["run", "--mem", "128M", "--tmem-quota", "64M"])
            .args(["--tmem-host-cap", &format!("{cap_mib}M"), "--kernel"])
            .arg(uk_image("tmem-fill"))
            .args(["--cmdline", "mode=big mib=80 hold_ms=60000"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    let rx = lines_of(&mut child);
    let line = wait_line(&rx, "tmem-fill: full");
    assert!(field(&line, "refused") > 0, "the cap never refused: {line}");
    (child, rx, field(&line, "bytes_stored"))
}

#[test]
fn kvm_tmem_host_cap_bounds_two_vmms_and_a_killed_one_gives_back() {
    require_kvm();
    let s = Scratch::new("tmem-host-cap");
    let cap = 40 * MIB;
    // A fills up to the host's cap (below its own 64 MiB quota).
    let (mut a, _rxa, a_stored) = fill_under_host_cap(&s.0, 40);
    assert!(
        a_stored <= cap && a_stored > cap - 6 * MIB,
        "A holds {a_stored}"
    );
    // B, another VMM, gets only what A left.
    let (_b, _rxb, b_stored) = fill_under_host_cap(&s.0, 40);
    eprintln!("host cap 40 MiB: A holds {a_stored} bytes, B {b_stored}");
    assert!(
        a_stored + b_stored <= cap,
        "A {a_stored} + B {b_stored} > {cap}"
    );
    // A dies without a word: its share comes back to the next VMM.
    a.kill().unwrap();
    a.wait().unwrap();
    let (_c, _rxc, c_stored) = fill_under_host_cap(&s.0, 40);
    eprintln!("after kill -9 of A: C holds {c_stored} bytes");
    assert!(
        c_stored + b_stored <= cap,
        "C {c_stored} + B {b_stored} > {cap}"
    );
    assert!(
        c_stored > cap - b_stored - 6 * MIB,
        "A's share did not come back: C holds {c_stored}"
    );
    let file = s.path("tmem-host-cap");
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&file).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600);
}

/// A pool of 300 MiB (random 1 MiB values, stored as they are) is saved
/// in a snapshot and comes back whole in a new VMM process: every value
/// reads back as put. (The state file used to refuse any state over
/// 256 MiB, so such a snapshot could be taken but never loaded.)
#[test]
fn kvm_tmem_pool_over_256_mib_survives_a_snapshot() {
    require_kvm();
    let s = Scratch::new("tmem-big-snap");
    let (sock, state, mem) = (s.path("api.sock"), s.path("vm.state"), s.path("vm.mem"));
    let (vmm, rx) = spawn_vmm_lines(&sock);
    let boot = format!(
        r#"{{"kernel_image_path": "{}", "boot_args": "mode=big mib=300 hold_ms=4000"}}"#,
        uk_image("tmem-fill").display()
    );
    assert_eq!(http(&sock, "PUT", "/boot-source", Some(&boot)).0, 204);
    let mc = r#"{"vcpu_count": 1, "mem_size_mib": 64}"#;
    assert_eq!(http(&sock, "PUT", "/machine-config", Some(mc)).0, 204);
    let quota = r#"{"quota_bytes": 419430400}"#;
    assert_eq!(http(&sock, "PUT", "/tmem", Some(quota)).0, 204);
    let (code, body) = http(
        &sock,
        "PUT",
        "/actions",
        Some(r#"{"action_type": "InstanceStart"}"#),
    );
    assert_eq!(code, 204, "{body}");
    let full = wait_line(&rx, "tmem-fill: full");
    assert_eq!(field(&full, "objects"), 300, "{full}");
    let t = std::time::Instant::now();
    snapshot_create(&sock, &state, &mem, false, true);
    let took_create = t.elapsed();
    drop(vmm);
    let state_len = std::fs::metadata(&state).unwrap().len();
    assert!(state_len > 300 * MIB, "state file of {state_len} bytes");

    let sock2 = s.path("api2.sock");
    let t = std::time::Instant::now();
    let mut restored = VmmChild::new(
        spore()
            .args(["snapshot", "restore", "--state"])
            .arg(&state)
            .arg("--mem")
            .arg(&mem)
            .arg("--api-sock")
            .arg(&sock2)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    let rx2 = lines_of(&mut restored);
    wait_for_path(&sock2, std::time::Duration::from_secs(30));
    // While the guest still holds (then it verifies and stops); until the
    // VM is built the API answers with the default configuration.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let j = loop {
        let (code, body) = http(&sock2, "GET", "/tmem", None);
        assert_eq!(code, 200, "{body}");
        let j: serde_json::Value = serde_json::from_str(&body).unwrap();
        if j["quota_bytes"] == 419430400u64 || std::time::Instant::now() > deadline {
            break j;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(j["objects"], 300, "{j}");
    assert!(j["bytes_stored"].as_u64().unwrap() > 300 * MIB, "{j}");
    let lines = read_until(&rx2, "tmem-fill: ");
    let took_restore = t.elapsed();
    assert_eq!(
        lines.last().map(String::as_str),
        Some("tmem-fill: verified 300 objects"),
        "{lines:?}"
    );
    eprintln!(
        "tmem state of {state_len} bytes: snapshot create {took_create:?}, restore until the guest verified every value {took_restore:?}"
    );
}

/// A bad cap, or a cap directory that cannot be used, is one clear error
/// line and a non-zero exit, before the guest runs.
#[test]
fn kvm_tmem_host_cap_bad_settings_are_clear_errors() {
    require_kvm();
    let s = Scratch::new("tmem-host-cap-bad");
    let not_dir = s.path("file");
    std::fs::write(&not_dir, b"x").unwrap();
    for (env, arg, want) in [
        (
            Some(("SPORE_TMEM_HOST_CAP", "lots")),
            None,
            "SPORE_TMEM_HOST_CAP=\"lots\" is not a size",
        ),
        (None, Some("1X"), "--tmem-host-cap 1X"),
        (
            Some(("SPORE_TMEM_HOST_DIR", not_dir.to_str().unwrap())),
            Some("1G"),
            "tmem host cap file",
        ),
    ] {
        let mut cmd = spore();
        if let Some((k, v)) = env {
            cmd.env(k, v);
        }
        cmd.args(["run", "--mem", "64M", "--kernel"])
            .arg(uk_image("tmem-check"));
        if let Some(a) = arg {
            cmd.args(["--tmem-host-cap", a]);
        }
        let out = cmd.output().unwrap();
        let err = stderr_of(&out);
        assert_ne!(out.status.code(), Some(0), "{want}: {err}");
        assert!(out.status.code().is_some(), "{want}: killed by a signal");
        assert!(err.contains(want), "{want}: {err}");
        assert!(
            !stdout_of(&out).contains("tmem-check: passed"),
            "{want}: the guest ran"
        );
    }
}
