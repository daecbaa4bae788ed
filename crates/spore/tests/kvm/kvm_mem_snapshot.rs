//! Host-KVM tier: snapshots of a VM with virtio-mem memory plugged (the
//! `memtest mode=persist` unikernel). The guest plugs 256 MiB of a 512 MiB
//! region and writes a pattern in every page; the VM is snapshotted and
//! stopped, then restored in a new VMM process: the pattern is intact, the
//! device still reports the memory plugged, and when the guest unplugs it
//! the restored VMM's RSS drops by about that much. The memory file holds
//! the region after boot RAM with unplugged blocks as holes. The VM also
//! has a balloon, whose target survives the restore.
//!
//! Diff snapshots of such a VM (`memtest mode=diff`, with dirty page
//! tracking): a full snapshot, then a diff after the guest rewrote some
//! plugged pages, unplugged blocks and plugged others, then a diff of
//! that diff (after a whole KVM slot was unplugged). Each chain restores in a new
//! VMM (lazily, eagerly, and merged into one full layer), where the guest
//! finds every block as it left it: new pages where it wrote them, the
//! full snapshot's elsewhere, and unplugged or released blocks empty. The
//! diffs hold the changed pages only.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Stdio;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use crate::common::*;

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
            r#"{{"kernel_image_path": "{}", "boot_args": "mode=persist size=256 hold_ms=1500 snap_hold_ms=60000"}}"#,
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
    let before = rss_bytes(pid).unwrap();
    expect_line(&rx2, "memtest: reclaimed", &mut seen2);
    std::thread::sleep(Duration::from_millis(300));
    let after = rss_bytes(pid).unwrap();
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

/// `spore snapshot inspect STATE` as JSON.
fn inspect(state: &Path) -> serde_json::Value {
    let o = spore()
        .args(["snapshot", "inspect"])
        .arg(state)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr_of(&o));
    serde_json::from_str(&stdout_of(&o)).unwrap()
}

/// Restores (state, mem) with `args` in a new VMM and runs the guest to its
/// end: it must verify `phases` and finish cleanly.
fn restore_diff_guest(state: &Path, mem: &Path, args: &[&str], phases: &[u64], what: &str) {
    let o = spore()
        .args(["snapshot", "restore", "--state"])
        .arg(state)
        .arg("--mem")
        .arg(mem)
        .args(args)
        .output()
        .unwrap();
    let out = stdout_of(&o);
    assert_eq!(o.status.code(), Some(0), "{what}: {out}\n{}", stderr_of(&o));
    for p in phases {
        assert!(
            out.contains(&format!("memtest: verified phase {p}")),
            "{what}: phase {p} not verified: {out}"
        );
    }
    assert!(out.contains("memtest: diff done"), "{what}: {out}");
    assert!(
        !out.contains("memtest: phase 1") && !out.contains("FAILED"),
        "{what}: {out}"
    );
}

#[test]
fn kvm_virtio_mem_diff_snapshots_restore_as_a_chain() {
    require_kvm();
    let s = Scratch::new("memdiff");
    let sock = s.path("api.sock");
    let layer = |n: &str| (s.path(&format!("{n}.state")), s.path(&format!("{n}.mem")));
    let (base, d1, d2) = (layer("base"), layer("d1"), layer("d2"));
    let (mut vmm, rx) = spawn_vmm_lines(&sock);
    let put = |path: &str, body: &str| {
        let (code, resp) = http(&sock, "PUT", path, Some(body));
        assert_eq!(code, 204, "PUT {path} {body}: {resp}");
    };
    put(
        "/boot-source",
        &format!(
            r#"{{"kernel_image_path": "{}", "boot_args": "mode=diff snap_hold_ms=60000"}}"#,
            uk_image("memtest").display()
        ),
    );
    put(
        "/machine-config",
        r#"{"vcpu_count": 1, "mem_size_mib": 64, "track_dirty_pages": true}"#,
    );
    // 4 blocks per KVM slot: the guest empties a whole slot.
    put(
        "/hotplug/memory",
        r#"{"total_size_mib": 512, "block_size_mib": 2, "slot_size_mib": 8}"#,
    );
    put("/actions", r#"{"action_type": "InstanceStart"}"#);
    let (code, resp) = http(
        &sock,
        "PATCH",
        "/hotplug/memory",
        Some(r#"{"requested_size_mib": 64}"#),
    );
    assert_eq!(code, 204, "{resp}");
    let mut seen = Vec::new();
    expect_line(&rx, "memtest: phase 1", &mut seen);
    let t_full = snapshot_create(&sock, &base.0, &base.1, false, false);
    // The guest holds at each phase until the requested size moves (the
    // host's "taken"): a timed hold raced the snapshot on a loaded machine.
    let release = |mib: u64| {
        let body = format!(r#"{{"requested_size_mib": {mib}}}"#);
        let (code, resp) = http(&sock, "PATCH", "/hotplug/memory", Some(&body));
        assert_eq!(code, 204, "{resp}");
    };
    release(66);
    expect_line(&rx, "memtest: verified phase 1", &mut seen);
    expect_line(&rx, "memtest: phase 2", &mut seen);
    let t_d1 = snapshot_create(&sock, &d1.0, &d1.1, true, false);
    release(68);
    expect_line(&rx, "memtest: verified phase 2", &mut seen);
    expect_line(&rx, "memtest: phase 3", &mut seen);
    let t_d2 = snapshot_create(&sock, &d2.0, &d2.1, true, true);
    vmm.wait().unwrap();
    eprintln!("snapshot create: full {t_full:?}, diff {t_d1:?}, diff of diff {t_d2:?}");

    // The full layer: all 32 plugged blocks, one non-zero word per page.
    let mb = inspect(&base.0);
    let hp = &mb["hotplug"];
    assert_eq!(hp["plugged_bytes"], 64 * MIB, "{mb:#}");
    assert_eq!(hp["data_bytes"], 64 * MIB, "{mb:#}");
    assert!(hp.get("released_runs").is_none(), "{mb:#}");

    // The first diff: the pages written since (2 MiB of block 1, 16 pages
    // of block 2, 1 of block 5, 4 MiB of blocks 32 and 33), not the
    // region's 64 MiB; and the blocks released, 3..6, as file offsets after
    // 64 MiB of boot RAM.
    let m1 = inspect(&d1.0);
    assert_eq!(m1["layer"]["kind"], "Diff");
    let hp1 = &m1["hotplug"];
    let changed1 = (512 + 16 + 1 + 1024) * 4096u64;
    let data1 = hp1["data_bytes"].as_u64().unwrap();
    assert!(
        (changed1..changed1 + MIB).contains(&data1),
        "the diff holds {data1} bytes of the region, {changed1} changed: {m1:#}"
    );
    assert_eq!(hp1["plugged_bytes"], 64 * MIB, "{m1:#}");
    assert_eq!(
        hp1["released_runs"],
        serde_json::json!([[70 * MIB, 6 * MIB]]),
        "{m1:#}"
    );
    // The second: two pages (block 28's were released with its slot), and
    // blocks 28..33 released.
    let m2 = inspect(&d2.0);
    let hp2 = &m2["hotplug"];
    let data2 = hp2["data_bytes"].as_u64().unwrap();
    assert!(
        (2 * 4096..2 * 4096 + MIB).contains(&data2),
        "the diff of the diff holds {data2} bytes of the region: {m2:#}"
    );
    assert_eq!(hp2["plugged_bytes"], 58 * MIB, "{m2:#}");
    assert_eq!(
        hp2["released_runs"],
        serde_json::json!([[120 * MIB, 10 * MIB]]),
        "{m2:#}"
    );
    let disk = |p: &Path| std::fs::metadata(p).unwrap().blocks() * 512;
    eprintln!(
        "memory files: full {} KiB of data ({} KiB on disk); diff {} KiB ({} KiB of the region, \
         {} KiB on disk); diff of diff {} KiB ({} KiB of the region, {} KiB on disk)",
        mb["layer"]["mem_data_bytes"].as_u64().unwrap() / 1024,
        disk(&base.1) / 1024,
        m1["layer"]["mem_data_bytes"].as_u64().unwrap() / 1024,
        data1 / 1024,
        disk(&d1.1) / 1024,
        m2["layer"]["mem_data_bytes"].as_u64().unwrap() / 1024,
        data2 / 1024,
        disk(&d2.1) / 1024,
    );
    assert!(disk(&d1.1) < 16 * MIB, "{} bytes on disk", disk(&d1.1));

    // Each chain in a new VMM: full + diff goes on from phase 2 (and
    // through phase 3, deleting a slot and re-plugging released blocks in
    // the restored VM), full + diff + diff from phase 3 (lazily and
    // eagerly).
    restore_diff_guest(&d1.0, &d1.1, &[], &[2, 3], "full + diff");
    restore_diff_guest(&d2.0, &d2.1, &[], &[3], "full + diff + diff");
    restore_diff_guest(&d2.0, &d2.1, &["--mode", "eager"], &[3], "eager");
    // userfaultfd does not serve the region: refused, saying so.
    let o = spore()
        .args(["snapshot", "restore", "--state"])
        .arg(&d2.0)
        .arg("--mem")
        .arg(&d2.1)
        .args(["--mode", "uffd"])
        .output()
        .unwrap();
    assert!(!o.status.success(), "uffd restore: {}", stdout_of(&o));
    assert!(stderr_of(&o).contains("virtio-mem"), "{}", stderr_of(&o));

    // Merged into one full layer: the same guest, released blocks as holes.
    let merged = layer("merged");
    let o = spore()
        .args(["snapshot", "merge", "--state"])
        .arg(&d2.0)
        .arg("--mem")
        .arg(&d2.1)
        .arg("--out-state")
        .arg(&merged.0)
        .arg("--out-mem")
        .arg(&merged.1)
        .output()
        .unwrap();
    assert!(o.status.success(), "merge: {}", stderr_of(&o));
    let mm = inspect(&merged.0);
    assert_eq!(mm["layer"]["kind"], "Full");
    // 26 whole blocks of A or B, and one page of blocks 5 and 29 each:
    // block 3 is plugged but empty.
    let hpm = &mm["hotplug"];
    assert_eq!(hpm["data_bytes"], (26 * 512 + 2) * 4096, "{mm:#}");
    restore_diff_guest(&merged.0, &merged.1, &[], &[3], "merged");
}
