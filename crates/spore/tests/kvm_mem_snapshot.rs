//! Host-KVM tier: snapshots of a VM with virtio-mem memory plugged (the
//! `memtest mode=persist` unikernel). The guest plugs 256 MiB of a 512 MiB
//! region and writes a pattern in every page; the VM is snapshotted and
//! stopped, then restored in a new VMM process: the pattern is intact, the
//! device still reports the memory plugged, and when the guest unplugs it
//! the restored VMM's RSS drops by about that much. The memory file holds
//! the region after boot RAM with unplugged blocks as holes. The VM also
//! has a balloon, whose target survives the restore.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Stdio;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use common::*;

const MIB: u64 = 1 << 20;

fn expect_line(rx: &Receiver<String>, want: &str, seen: &mut Vec<String>) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                seen.push(line.clone());
                if line.contains(want) {
                    return line;
                }
            }
            Err(_) => panic!("no line with {want:?}; got {seen:#?}"),
        }
    }
}

fn vm_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

fn json(sock: &Path, path: &str) -> serde_json::Value {
    let (code, body) = http(sock, "GET", path, None);
    assert_eq!(code, 200, "GET {path}: {body}");
    serde_json::from_str(&body).unwrap()
}

#[test]
fn kvm_virtio_mem_snapshot_restore_keeps_plugged_memory_and_unplugs() {
    require_kvm();
    let s = Scratch::new("memsnap");
    let (sock, state, mem) = (s.path("api.sock"), s.path("vm.state"), s.path("vm.mem"));
    let (mut vmm, rx) = spawn_vmm_lines(&sock);
    let put = |path: &str, body: &str| {
        let (code, resp) = http(&sock, "PUT", path, Some(body));
        assert_eq!(code, 204, "PUT {path} {body}: {resp}");
    };
    put(
        "/boot-source",
        &format!(
            r#"{{"kernel_image_path": "{}", "boot_args": "mode=persist size=256 hold_ms=1500"}}"#,
            uk_image("memtest").display()
        ),
    );
    put(
        "/machine-config",
        r#"{"vcpu_count": 1, "mem_size_mib": 64}"#,
    );
    put(
        "/hotplug/memory",
        r#"{"total_size_mib": 512, "block_size_mib": 2, "slot_size_mib": 128}"#,
    );
    // A balloon too (the unikernel leaves it inactive): its state must
    // survive with the VM's.
    put(
        "/balloon",
        r#"{"amount_mib": 0, "deflate_on_oom": true, "stats_polling_interval_s": 1}"#,
    );
    put("/actions", r#"{"action_type": "InstanceStart"}"#);
    let (code, resp) = http(
        &sock,
        "PATCH",
        "/hotplug/memory",
        Some(r#"{"requested_size_mib": 256}"#),
    );
    assert_eq!(code, 204, "{resp}");
    let (code, resp) = http(&sock, "PATCH", "/balloon", Some(r#"{"amount_mib": 8}"#));
    assert_eq!(code, 204, "{resp}");
    let mut seen = Vec::new();
    expect_line(&rx, "memtest: filled 256 MiB", &mut seen);
    snapshot_create(&sock, &state, &mem, false, true);
    vmm.wait().unwrap();
    while let Ok(l) = rx.recv_timeout(Duration::from_millis(200)) {
        seen.push(l);
    }
    assert!(
        !seen.iter().any(|l| l.contains("verified")),
        "the first VM went past the snapshot point: {seen:#?}"
    );

    // The memory file: boot RAM, then the region; only plugged data.
    let md = std::fs::metadata(&mem).unwrap();
    // (and the 4 KiB trailer naming the snapshot)
    assert_eq!(md.len(), (64 + 512) * MIB + 4096);
    let allocated = md.blocks() * 512;
    assert!(
        allocated < (64 + 256 + 16) * MIB,
        "memory file holds {} MiB",
        allocated / MIB
    );
    let inspect = spore()
        .args(["snapshot", "inspect"])
        .arg(&state)
        .output()
        .unwrap();
    assert!(inspect.status.success(), "{}", stderr_of(&inspect));
    let manifest: serde_json::Value = serde_json::from_str(&stdout_of(&inspect)).unwrap();
    let hp = &manifest["hotplug"];
    assert_eq!(hp["file_offset"], 64 * MIB, "{manifest:#}");
    assert_eq!(hp["region_size_bytes"], 512 * MIB);
    assert_eq!(hp["plugged_bytes"], 256 * MIB);
    assert_eq!(hp["requested_bytes"], 256 * MIB);
    // One word per page was written: at least that much data per page.
    let data = hp["data_bytes"].as_u64().unwrap();
    assert!((256 * MIB - MIB..=256 * MIB).contains(&data), "{data}");
    assert_eq!(manifest["layer"]["mem_file_size"], (64 + 512) * MIB);
    assert!(
        manifest["devices"]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["type"] == "virtio-mem"
                && d["detail"].as_str().unwrap().contains("256 MiB plugged")),
        "{manifest:#}"
    );

    // Restore in a new VMM process, with the API to watch the device.
    let sock2 = s.path("api2.sock");
    let mut restored = spore()
        .args(["snapshot", "restore", "--state"])
        .arg(&state)
        .arg("--mem")
        .arg(&mem)
        .arg("--api-sock")
        .arg(&sock2)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let rx2 = lines_of(&mut restored);
    let mut seen2 = Vec::new();
    expect_line(&rx2, "memtest: verified pages=65536", &mut seen2);
    assert!(
        !seen2.iter().any(|l| l.contains("filled")),
        "the guest restarted: {seen2:#?}"
    );
    let status = json(&sock2, "/hotplug/memory");
    assert_eq!(status["plugged_size_mib"], 256, "{status}");
    assert_eq!(status["requested_size_mib"], 256, "{status}");
    let balloon = json(&sock2, "/balloon");
    assert_eq!(balloon["target_mib"], 8, "{balloon}");
    assert_eq!(balloon["deflate_on_oom"], true, "{balloon}");
    let pid = restored.id();
    // The check read every page: the plugged memory is resident now.
    std::thread::sleep(Duration::from_millis(300));
    let before = vm_rss(pid);
    expect_line(&rx2, "memtest: reclaimed", &mut seen2);
    std::thread::sleep(Duration::from_millis(300));
    let after = vm_rss(pid);
    eprintln!(
        "restored VMM RSS: {} MiB with 256 MiB plugged, {} MiB after the unplug",
        before / MIB,
        after / MIB
    );
    let status = json(&sock2, "/hotplug/memory");
    assert_eq!(status["plugged_size_mib"], 0, "{status}");
    let out = restored.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "restored VM: {seen2:#?}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        before >= after + 240 * MIB,
        "RSS of the restored VMM: {} MiB before the unplug, {} MiB after",
        before / MIB,
        after / MIB
    );
}
