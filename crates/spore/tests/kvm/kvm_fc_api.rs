//! Host-KVM tier: Firecracker's pre-boot settings that spore now serves,
//! end to end through the real `spore` binary and the unikernel on KVM:
//! `PUT /serial` (the console goes to the file), `PUT /cpu-config` (a
//! templated VM boots, and its template survives a snapshot restore),
//! static `cpu_template` and `smt` refusals as Firecracker answers them,
//! the MMDS data store with its size limits (`spore vmm` and `firecracker
//! --mmds-size-limit --metadata`), `GET /vm/config` after run-time changes,
//! and the snapshot-load overrides (`network_overrides`, `clock_realtime`).
//! x86_64 only, as the unikernel it boots and the CPU templates it checks.
#![cfg(target_arch = "x86_64")]

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use crate::common::*;

const START: &str = r#"{"action_type": "InstanceStart"}"#;

fn boot_source(sock: &Path, app: &str, cmdline: &str) {
    let body = format!(
        r#"{{"kernel_image_path": "{}", "boot_args": "{cmdline}"}}"#,
        uk_image(app).display()
    );
    put(sock, "/boot-source", &body);
}

/// The ECX of the first `cpuid 0x1/0x0:` line, and its round number.
fn leaf1_ecx(line: &str) -> Option<(u32, u32)> {
    let rest = line.strip_prefix("cpuid 0x1/0x0: ")?;
    let ecx = rest
        .split_whitespace()
        .find_map(|w| w.strip_prefix("ecx=0x"))?;
    let round = rest.rsplit(' ').next()?.parse().ok()?;
    Some((u32::from_str_radix(ecx, 16).ok()?, round))
}

/// Boots the `cpuid` app with `extra` PUTs before start; returns the VMM
/// and its stdout lines.
fn boot_cpuid(
    sock: &Path,
    rounds: u32,
    extra: &[(&str, &str)],
) -> (VmmChild, std::sync::mpsc::Receiver<String>) {
    let (child, rx) = spawn_vmm_lines(sock);
    boot_source(sock, "cpuid", &format!("leaf=1 rounds={rounds}"));
    for (path, body) in extra {
        put(sock, path, body);
    }
    put(sock, "/actions", START);
    (child, rx)
}

/// Clears SSE3 (leaf 1 ECX bit 0) and sets nothing else.
const CLEAR_SSE3: &str = r#"{"cpuid_modifiers": [{"leaf": "0x1", "subleaf": "0x0", "flags": 0,
    "modifiers": [{"register": "ecx", "bitmap": "0bxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx0"}]}]}"#;

#[test]
fn kvm_serial_out_path_receives_the_console() {
    require_kvm();
    let dir = Scratch::new("fc-serial");
    let sock = dir.path("api.sock");
    let out = dir.path("serial.out");
    let child = spawn_vmm(&sock);
    boot_source(&sock, "hello", "exit=7");
    put(
        &sock,
        "/machine-config",
        r#"{"vcpu_count": 1, "mem_size_mib": 128}"#,
    );
    // Firecracker's shape: unknown fields refused, a missing directory only
    // found when the file is opened at start (and the start can be retried).
    let (code, body) = http(&sock, "PUT", "/serial", Some(r#"{"path": "/x"}"#));
    assert_eq!(code, 400, "{body}");
    let missing = dir.path("no/such/dir/serial.out");
    put(
        &sock,
        "/serial",
        &format!(r#"{{"serial_out_path": "{}"}}"#, missing.display()),
    );
    let (code, body) = http(&sock, "PUT", "/actions", Some(START));
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("serial_out_path"), "{body}");
    put(
        &sock,
        "/serial",
        &format!(r#"{{"serial_out_path": "{}"}}"#, out.display()),
    );
    put(&sock, "/actions", START);
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(7), "{}", stderr_of(&o));
    let console = std::fs::read_to_string(&out).unwrap();
    assert!(console.contains("hello from spore-uk"), "{console}");
    assert!(console.contains("heap check passed"), "{console}");
    assert!(
        !stdout_of(&o).contains("hello from spore-uk"),
        "the console went to stdout too: {}",
        stdout_of(&o)
    );
    let mode = std::fs::metadata(&out).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
}

#[test]
fn kvm_serial_rate_limiter_drops_what_exceeds_the_bucket() {
    require_kvm();
    let dir = Scratch::new("fc-serial-rl");
    let sock = dir.path("api.sock");
    let out = dir.path("serial.out");
    let child = spawn_vmm(&sock);
    boot_source(&sock, "hello", "");
    // 20 bytes, refilled over a minute: the guest's first 20 bytes only.
    put(
        &sock,
        "/serial",
        &format!(
            r#"{{"serial_out_path": "{}", "rate_limiter": {{"size": 20, "refill_time": 60000}}}}"#,
            out.display()
        ),
    );
    put(&sock, "/actions", START);
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr_of(&o));
    let console = std::fs::read(&out).unwrap();
    assert_eq!(console.len(), 20, "{:?}", String::from_utf8_lossy(&console));
    assert!(console.starts_with(b"hello from spore-uk"));
}

/// Boots the cpuid app (with `extra` PUTs), lets it print once, snapshots
/// it and stops it.
fn snapshot_cpuid_vm(dir: &Scratch, name: &str, extra: &[(&str, &str)]) -> std::path::PathBuf {
    let sock = dir.path(&format!("{name}.sock"));
    let (mut child, rx) = boot_cpuid(&sock, 100, extra);
    read_until(&rx, "cpuid 0x1/0x0:");
    let state = dir.path(&format!("{name}.state"));
    snapshot_create(
        &sock,
        &state,
        &dir.path(&format!("{name}.mem")),
        false,
        true,
    );
    child.wait().unwrap();
    state
}

// What the guest reads is not checkable here: under kvm_pvm (this
// project's host tier) the unikernel's ring-3 CPUID runs natively on the
// host CPU, and KVM_GET_CPUID2 answers the host's table whatever was set.
// The nested tier's Linux guests read the template's effect
// (tests/nested/scenarios/cpu-config.sh). Here: a templated VM boots,
// its snapshot carries the template (the vCPUs' CPUID is saved from KVM
// and set back on restore), and a restored VM shows it.
#[test]
fn kvm_cpu_config_boots_and_survives_restore() {
    require_kvm();
    let dir = Scratch::new("fc-cpuid");
    let state = snapshot_cpuid_vm(&dir, "tmpl", &[("/cpu-config", CLEAR_SSE3)]);
    let (_, s, config) = spore_vmm::snapshot::load_state(&state).unwrap();
    assert!(s.vcpus[0].cpuid.iter().any(|e| e.function == 1));
    let t = config
        .cpu_config
        .expect("the snapshot's config has the template");
    assert_eq!(t.cpuid_modifiers[0].leaf, 1);
    assert_eq!(t.cpuid_modifiers[0].modifiers[0].bitmap.filter, 1);

    let sock = dir.path("restored.sock");
    let (mut child, rx) = spawn_vmm_lines(&sock);
    let load = format!(
        r#"{{"snapshot_path": "{}", "mem_backend": {{"backend_type": "File", "backend_path": "{}"}}, "resume_vm": true}}"#,
        state.display(),
        dir.path("tmpl.mem").display()
    );
    put(&sock, "/snapshot/load", &load);
    let lines = read_until(&rx, "cpuid 0x1/0x0:");
    let (_, round) = leaf1_ecx(lines.last().unwrap()).unwrap();
    assert!(round >= 1, "the restored guest went on: {lines:?}");
    let (code, body) = http(&sock, "GET", "/vm/config", None);
    assert_eq!(code, 200);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        v["cpu-config"]["cpuid_modifiers"][0]["leaf"], "0x1",
        "{body}"
    );
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn kvm_cpu_config_refusals_match_firecracker() {
    require_kvm();
    let dir = Scratch::new("fc-cpuid-bad");
    // A leaf KVM does not have, as Firecracker refuses it (at start).
    let sock = dir.path("bad.sock");
    let (_child, _rx) = spawn_vmm_lines(&sock);
    boot_source(&sock, "cpuid", "");
    let bad = r#"{"cpuid_modifiers": [{"leaf": "0x7777", "subleaf": "0x0", "flags": 0, "modifiers": []}]}"#;
    put(&sock, "/cpu-config", bad);
    let (code, body) = http(&sock, "PUT", "/actions", Some(START));
    assert_eq!(code, 400, "{body}");
    assert!(
        body.contains("CPUID entry not supported by KVM: Leaf: 0x7777, Subleaf: 0x0"),
        "{body}"
    );
    // An MSR KVM does not have.
    let bad = r#"{"msr_modifiers": [{"addr": "0x12345", "bitmap": "0b0"}]}"#;
    put(&sock, "/cpu-config", bad);
    let (code, body) = http(&sock, "PUT", "/actions", Some(START));
    assert_eq!(code, 400, "{body}");
    assert!(
        body.contains("MSR entry not supported by KVM: Register Address: 0x12345"),
        "{body}"
    );
    // Refused at parse time as on Firecracker x86: aarch64's fields, bad
    // registers, numbers without a prefix, bad bitmaps.
    for bad in [
        r#"{"vcpu_features": [{"index": 0, "bitmap": "0b1"}]}"#,
        r#"{"reg_modifiers": []}"#,
        r#"{"cpuid_modifiers": [{"leaf": "1", "subleaf": "0x0", "flags": 0, "modifiers": []}]}"#,
        r#"{"cpuid_modifiers": [{"leaf": "0x1", "subleaf": "0x0", "flags": 0, "modifiers": [{"register": "exx", "bitmap": "0b1"}]}]}"#,
        r#"{"msr_modifiers": [{"addr": "0x10", "bitmap": "0b2"}]}"#,
    ] {
        let (code, body) = http(&sock, "PUT", "/cpu-config", Some(bad));
        assert_eq!(code, 400, "{bad}: {body}");
    }
    // A static template for the other vendor: Firecracker's refusal.
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap();
    let other = if cpuinfo.contains("AuthenticAMD") {
        "T2"
    } else {
        "T2A"
    };
    put(
        &sock,
        "/machine-config",
        &format!(r#"{{"vcpu_count": 1, "mem_size_mib": 128, "cpu_template": "{other}"}}"#),
    );
    let (code, body) = http(&sock, "PUT", "/actions", Some(START));
    assert_eq!(code, 400, "{body}");
    assert!(
        body.contains("CPU vendor mismatched between actual CPU and CPU template"),
        "{body}"
    );
    let (code, body) = http(
        &sock,
        "PUT",
        "/machine-config",
        Some(r#"{"vcpu_count": 1, "mem_size_mib": 128, "cpu_template": "V1N1"}"#),
    );
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("unknown variant `V1N1`"), "{body}");
    // SMT: 1 or an even count, in Firecracker's words.
    let (code, body) = http(
        &sock,
        "PUT",
        "/machine-config",
        Some(r#"{"vcpu_count": 3, "mem_size_mib": 128, "smt": true}"#),
    );
    assert_eq!(code, 400, "{body}");
    assert!(
        body.contains("must be 1 or an even number if SMT is enabled"),
        "{body}"
    );
    put(
        &sock,
        "/machine-config",
        r#"{"vcpu_count": 2, "mem_size_mib": 128, "smt": true}"#,
    );
}

#[test]
fn kvm_mmds_data_store_and_limits() {
    require_kvm();
    let dir = Scratch::new("fc-mmds");
    let sock = dir.path("api.sock");
    let _child = spawn_vmm(&sock);
    assert_eq!(http(&sock, "GET", "/mmds", None), (200, "{}".into()));
    let (code, body) = http(&sock, "PATCH", "/mmds", Some(r#"{"a": 1}"#));
    assert_eq!(code, 400);
    assert!(
        body.contains("MMDS data store is not initialized"),
        "{body}"
    );
    put(
        &sock,
        "/mmds",
        r#"{"latest": {"meta-data": {"ami-id": "ami-1", "tags": ["a"]}}, "x": 1}"#,
    );
    let (code, body) = http(
        &sock,
        "PATCH",
        "/mmds",
        Some(r#"{"latest": {"meta-data": {"ami-id": null, "host": "h"}}, "x": null}"#),
    );
    assert_eq!(code, 204, "{body}");
    let (code, body) = http(&sock, "GET", "/mmds", None);
    assert_eq!(code, 200);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"latest": {"meta-data": {"tags": ["a"], "host": "h"}}})
    );
    // The default limit is Firecracker's 51200 bytes (under spore vmm's
    // 64 KiB request limit): a larger store is refused with 413 and the
    // store is kept.
    let big = format!(r#"{{"blob": "{}"}}"#, "x".repeat(52_000));
    let (code, body) = http(&sock, "PUT", "/mmds", Some(&big));
    assert_eq!(code, 413, "{body}");
    assert!(
        body.contains("The MMDS patch request doesn't fit."),
        "{body}"
    );
    let (code, body) = http(&sock, "PATCH", "/mmds", Some(&big));
    assert_eq!(code, 413, "{body}");
    assert_eq!(
        http(&sock, "GET", "/mmds", None).1,
        serde_json::to_string(&v).unwrap()
    );
    // MMDS config: Firecracker's checks, in its order; no interface exists.
    for (body, want) in [
        (
            r#"{"network_interfaces": ["eth0"]}"#,
            "does not correspond to any existing network interface",
        ),
        (
            r#"{"network_interfaces": []}"#,
            "list of network interface IDs that allow forwarding MMDS requests is empty",
        ),
        (
            r#"{"network_interfaces": ["eth0"], "ipv4_address": "1.2.3.4"}"#,
            "not link local",
        ),
        (
            r#"{"version": "V3", "network_interfaces": ["eth0"]}"#,
            "unknown variant `V3`",
        ),
        (r#"{"version": "V2"}"#, "missing field `network_interfaces`"),
    ] {
        let (code, reply) = http(&sock, "PUT", "/mmds/config", Some(body));
        assert_eq!(code, 400, "{body}: {reply}");
        assert!(reply.contains(want), "{body}: {reply}");
    }
}

#[test]
fn kvm_firecracker_mmds_size_limit_and_metadata() {
    require_kvm();
    let dir = Scratch::new("fc-mmds-cli");
    let sock = dir.path("fc.sock");
    let meta = dir.path("meta.json");
    std::fs::write(&meta, r#"{"k": "v"}"#).unwrap();
    let mut child = spore()
        .arg("firecracker")
        .arg("--api-sock")
        .arg(&sock)
        .args(["--mmds-size-limit", "100", "--metadata"])
        .arg(&meta)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_path(&sock, Duration::from_secs(10));
    assert_eq!(
        http(&sock, "GET", "/mmds", None),
        (200, r#"{"k":"v"}"#.into())
    );
    // --metadata initialized the store: PATCH works at once.
    put(&sock, "/mmds", &format!(r#"{{"a": "{}"}}"#, "x".repeat(80)));
    let (code, body) = http(
        &sock,
        "PATCH",
        "/mmds",
        Some(&format!(r#"{{"b": "{}"}}"#, "y".repeat(30))),
    );
    assert_eq!(code, 413, "{body}");
    let (code, body) = http(
        &sock,
        "PUT",
        "/mmds",
        Some(&format!(r#"{{"a": "{}"}}"#, "x".repeat(120))),
    );
    assert_eq!(code, 413, "{body}");
    let _ = child.kill();
    let _ = child.wait();
    // A --metadata file that is not JSON: one line, non-zero exit.
    std::fs::write(&meta, "not json").unwrap();
    let o = spore()
        .arg("firecracker")
        .arg("--api-sock")
        .arg(dir.path("fc2.sock"))
        .arg("--metadata")
        .arg(&meta)
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(stderr_of(&o).contains("--metadata"), "{}", stderr_of(&o));
}

#[test]
fn kvm_vm_config_shows_the_current_state() {
    require_kvm();
    let dir = Scratch::new("fc-vmconfig");
    let sock = dir.path("api.sock");
    let out = dir.path("serial.out");
    let child = spawn_vmm(&sock);
    boot_source(&sock, "idle", "secs=3");
    put(
        &sock,
        "/machine-config",
        r#"{"vcpu_count": 1, "mem_size_mib": 64}"#,
    );
    put(
        &sock,
        "/balloon",
        r#"{"amount_mib": 8, "deflate_on_oom": true}"#,
    );
    put(
        &sock,
        "/entropy",
        r#"{"rate_limiter": {"bandwidth": {"size": 1000, "refill_time": 100}}}"#,
    );
    let (code, body) = http(
        &sock,
        "PUT",
        "/entropy",
        Some(r#"{"rate_limiter": {"bandwidth": {"size": 1000}}}"#),
    );
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("refill_time"), "{body}");
    put(
        &sock,
        "/serial",
        &format!(r#"{{"serial_out_path": "{}"}}"#, out.display()),
    );
    put(&sock, "/cpu-config", r#"{"kvm_capabilities": ["!56"]}"#);
    put(&sock, "/actions", START);
    // Pre-boot only, as in Firecracker.
    assert_eq!(http(&sock, "PUT", "/entropy", Some("{}")).0, 400);
    assert_eq!(
        http(&sock, "PATCH", "/balloon", Some(r#"{"amount_mib": 16}"#)).0,
        204
    );
    let (code, body) = http(&sock, "GET", "/vm/config", None);
    assert_eq!(code, 200);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["balloon"]["amount_mib"], 16, "{body}");
    assert_eq!(
        v["entropy"]["rate_limiter"]["bandwidth"]["refill_time"], 100,
        "{body}"
    );
    assert_eq!(
        v["serial"]["serial_out_path"],
        out.display().to_string(),
        "{body}"
    );
    assert_eq!(v["cpu-config"]["kvm_capabilities"][0], "!56", "{body}");
    assert_eq!(v["machine-config"]["mem_size_mib"], 64, "{body}");
    drop(child);
}

/// The host's clocksource: KVM gives kvmclock a wall-clock reading
/// (`KVM_CLOCK_REALTIME`) only when it is the TSC.
fn host_clocksource() -> String {
    std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
        .unwrap_or_default()
        .trim()
        .to_string()
}

#[test]
fn kvm_snapshot_load_overrides() {
    require_kvm();
    let dir = Scratch::new("fc-load-overrides");
    let state = snapshot_cpuid_vm(&dir, "src", &[]);
    let mem = dir.path("src.mem");
    let load = |extra: &str| {
        format!(
            r#"{{"snapshot_path": "{}", "mem_backend": {{"backend_type": "File", "backend_path": "{}"}}, "resume_vm": true{extra}}}"#,
            state.display(),
            mem.display()
        )
    };
    // network_overrides: the snapshot has no network interface, so any
    // entry names an unknown one (Firecracker's "Unknown Network Device").
    let sock = dir.path("net.sock");
    let _vmm = spawn_vmm(&sock);
    let (code, body) = http(
        &sock,
        "PUT",
        "/snapshot/load",
        Some(&load(
            r#", "network_overrides": [{"iface_id": "eth0", "host_dev_name": "tap1"}]"#,
        )),
    );
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("Unknown Network Device"), "{body}");
    let (code, body) = http(
        &sock,
        "PUT",
        "/snapshot/load",
        Some(&load(r#", "network_overrides": [{"iface_id": "eth0"}]"#)),
    );
    assert_eq!(code, 400, "{body}");
    // An empty list changes nothing: the load goes through, and the
    // restored console goes to PUT /serial's file, as Firecracker's does.
    let console = dir.path("restored-serial.out");
    put(
        &sock,
        "/serial",
        &format!(r#"{{"serial_out_path": "{}"}}"#, console.display()),
    );
    put(
        &sock,
        "/snapshot/load",
        &load(r#", "network_overrides": []"#),
    );
    let t0 = std::time::Instant::now();
    while !std::fs::read_to_string(&console)
        .unwrap_or_default()
        .contains("cpuid 0x1/0x0:")
    {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "no console in {}",
            console.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    // clock_realtime: with a TSC clocksource the snapshot holds the wall
    // clock and KVM advances kvmclock by the time since; otherwise
    // Firecracker's refusal.
    let sock = dir.path("clock.sock");
    let (_vmm, rx) = spawn_vmm_lines(&sock);
    let (code, body) = http(
        &sock,
        "PUT",
        "/snapshot/load",
        Some(&load(r#", "clock_realtime": true"#)),
    );
    if host_clocksource() == "tsc" {
        assert_eq!(code, 204, "{body}");
        read_until(&rx, "cpuid 0x1/0x0:");
    } else {
        assert_eq!(code, 400, "{body}");
        assert!(
            body.contains("clock_realtime requested but not present in the snapshot state"),
            "{body}"
        );
    }
}
