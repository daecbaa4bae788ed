//! Snapshots end to end on host KVM with the `snaptest` unikernel: snapshot
//! a counting guest, restore it in a new VMM process, and check it goes on
//! from where it stopped with its memory intact; plus sparse memory files
//! and refused bad input.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use crate::common::*;

#[test]
fn kvm_snapshot_restore_in_new_process_continues_counting_with_memory_intact() {
    require_kvm();
    let s = Scratch::new("snap-continue");
    let (sock, state, mem) = (s.path("api.sock"), s.path("vm.state"), s.path("vm.mem"));
    let (mut vmm, rx) = boot_snaptest(&sock, 128, false, "mib=48 rounds=40 sleep_ms=40", &[]);
    let before = read_until(&rx, "count 10");
    assert!(before.iter().any(|l| l == "filled 48 MiB"), "{before:?}");
    snapshot_create(&sock, &state, &mem, false, true);
    let status = vmm.wait().unwrap();
    // The rest of the first VMM's output: where it stopped.
    let mut tail = Vec::new();
    while let Ok(l) = rx.recv_timeout(Duration::from_millis(200)) {
        tail.push(l);
    }
    assert!(!tail.iter().any(|l| l.starts_with("verify")), "{tail:?}");
    let last = *counts(&before)
        .iter()
        .chain(counts(&tail).iter())
        .max()
        .unwrap();
    assert!(status.code().is_some(), "VMM died by a signal: {status:?}");

    let inspect = spore()
        .args(["snapshot", "inspect"])
        .arg(&state)
        .output()
        .unwrap();
    assert!(inspect.status.success(), "{}", stderr_of(&inspect));
    let manifest: serde_json::Value = serde_json::from_str(&stdout_of(&inspect)).unwrap();
    assert_eq!(manifest["mem_size_bytes"], 128u64 << 20);
    assert_eq!(manifest["vcpu_count"], 1);

    // Restore twice from the same files: both runs continue from `last`.
    for _ in 0..2 {
        let o = spore()
            .args(["snapshot", "restore", "--state"])
            .arg(&state)
            .arg("--mem")
            .arg(&mem)
            .output()
            .unwrap();
        let out = stdout_of(&o);
        assert_eq!(
            o.status.code(),
            Some(0),
            "restore: {out}\n{}",
            stderr_of(&o)
        );
        let lines: Vec<String> = out.lines().map(str::to_string).collect();
        assert!(
            !lines.iter().any(|l| l.starts_with("filled")),
            "guest restarted: {out}"
        );
        let c = counts(&lines);
        assert_eq!(
            c.first().copied(),
            Some(last + 1),
            "count did not continue: {out}"
        );
        assert_eq!(c.last().copied(), Some(39), "{out}");
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("verify ok") && l.ends_with("pages=12288")),
            "{out}"
        );
    }
}

#[test]
fn kvm_snapshot_then_resume_keeps_the_guest_running() {
    require_kvm();
    let s = Scratch::new("snap-resume");
    let (sock, state, mem) = (s.path("api.sock"), s.path("vm.state"), s.path("vm.mem"));
    let (mut vmm, rx) = boot_snaptest(&sock, 64, false, "mib=8 rounds=30 sleep_ms=20", &[]);
    read_until(&rx, "count 5");
    snapshot_create(&sock, &state, &mem, false, false);
    let rest = read_until(&rx, "verify");
    assert!(rest.last().unwrap().starts_with("verify ok"), "{rest:?}");
    assert_eq!(vmm.wait().unwrap().code(), Some(0));
    // Loading into a VMM that already runs a VM is refused.
    let s2 = Scratch::new("snap-started");
    let sock2 = s2.path("api.sock");
    let (mut vmm2, rx2) = boot_snaptest(&sock2, 64, false, "mib=1 rounds=1000 sleep_ms=20", &[]);
    read_until(&rx2, "count 1");
    let body = format!(
        r#"{{"snapshot_path": "{}", "mem_backend": {{"backend_type": "File", "backend_path": "{}"}}}}"#,
        state.display(),
        mem.display()
    );
    let (code, reply) = http(&sock2, "PUT", "/snapshot/load", Some(&body));
    assert_eq!(code, 400, "{reply}");
    assert!(reply.contains("before any microVM"), "{reply}");
    // Creating a snapshot of a running (not paused) VM is refused too.
    let body = format!(
        r#"{{"snapshot_path": "{}", "mem_file_path": "{}"}}"#,
        s2.path("x.state").display(),
        s2.path("x.mem").display()
    );
    let (code, reply) = http(&sock2, "PUT", "/snapshot/create", Some(&body));
    assert_eq!(code, 400, "{reply}");
    assert!(reply.contains("paused"), "{reply}");
    vmm2.kill().unwrap();
    vmm2.wait().unwrap();
}

#[test]
fn kvm_idle_1gib_guest_memory_file_is_sparse() {
    require_kvm();
    let s = Scratch::new("snap-sparse");
    let (sock, state, mem) = (s.path("api.sock"), s.path("vm.state"), s.path("vm.mem"));
    let (mut vmm, rx) = boot_snaptest(&sock, 1024, false, "mib=4 rounds=1000 sleep_ms=20", &[]);
    read_until(&rx, "count 2");
    snapshot_create(&sock, &state, &mem, false, true);
    vmm.wait().unwrap();
    let md = std::fs::metadata(&mem).unwrap();
    // Guest memory, then the 4 KiB trailer naming the snapshot.
    assert_eq!(md.len(), (1 << 30) + 4096);
    let on_disk = md.blocks() * 512;
    // 4 MiB of pattern + page tables, heap metadata, the image: well under 32 MiB.
    assert!(
        on_disk < 32 << 20,
        "memory file takes {on_disk} bytes on disk"
    );
    assert!(
        on_disk >= 4 << 20,
        "memory file too small to hold the pattern: {on_disk}"
    );
}

#[test]
fn kvm_bad_snapshots_are_refused() {
    require_kvm();
    let s = Scratch::new("snap-bad");
    let (sock, state, mem) = (s.path("api.sock"), s.path("vm.state"), s.path("vm.mem"));
    let (mut vmm, rx) = boot_snaptest(&sock, 64, false, "mib=1 rounds=1000 sleep_ms=20", &[]);
    read_until(&rx, "count 1");
    snapshot_create(&sock, &state, &mem, false, true);
    vmm.wait().unwrap();
    // A memory file from a 128 MiB VM.
    let sock2 = s.path("api2.sock");
    let (mut vmm2, rx2) = boot_snaptest(&sock2, 128, false, "mib=1 rounds=1000 sleep_ms=20", &[]);
    read_until(&rx2, "count 1");
    let (state128, mem128) = (s.path("128.state"), s.path("128.mem"));
    snapshot_create(&sock2, &state128, &mem128, false, true);
    vmm2.wait().unwrap();

    let restore = |st: &Path, m: &Path| {
        spore()
            .args(["snapshot", "restore", "--state"])
            .arg(st)
            .arg("--mem")
            .arg(m)
            .output()
            .unwrap()
    };
    let o = restore(&state, &mem128);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr_of(&o).contains("has 134217728 bytes but the snapshot's guest has 67108864"),
        "{}",
        stderr_of(&o)
    );

    // Another snapshot's memory file of the right size: refused by its tag.
    let sock3 = s.path("api3.sock");
    let (mut vmm3, rx3) = boot_snaptest(&sock3, 64, false, "mib=1 rounds=1000 sleep_ms=20", &[]);
    read_until(&rx3, "count 1");
    let (state_other, mem_other) = (s.path("other.state"), s.path("other.mem"));
    snapshot_create(&sock3, &state_other, &mem_other, false, true);
    vmm3.wait().unwrap();
    let o = restore(&state, &mem_other);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr_of(&o).contains("from different snapshots"),
        "{}",
        stderr_of(&o)
    );

    let truncated = s.path("trunc.mem");
    std::fs::copy(&mem, &truncated).unwrap();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&truncated)
        .unwrap();
    f.set_len((64 << 20) - 4096).unwrap();
    let o = restore(&state, &truncated);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr_of(&o).contains("truncated"), "{}", stderr_of(&o));

    let mut bytes = std::fs::read(&state).unwrap();
    let flipped = s.path("flipped.state");
    let i = bytes.len() / 2;
    bytes[i] ^= 1;
    std::fs::write(&flipped, &bytes).unwrap();
    let o = restore(&flipped, &mem);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr_of(&o).contains("checksum mismatch"),
        "{}",
        stderr_of(&o)
    );
}

#[test]
fn kvm_load_through_the_api_waits_paused_until_resumed() {
    require_kvm();
    let s = Scratch::new("snap-api-load");
    let (sock, state, mem) = (s.path("api.sock"), s.path("vm.state"), s.path("vm.mem"));
    let (mut vmm, rx) = boot_snaptest(&sock, 64, false, "mib=2 rounds=12 sleep_ms=20", &[]);
    read_until(&rx, "count 3");
    snapshot_create(&sock, &state, &mem, false, true);
    vmm.wait().unwrap();
    let mut tail = vec!["count 3".to_string()];
    while let Ok(l) = rx.recv_timeout(Duration::from_millis(200)) {
        tail.push(l);
    }
    let last = *counts(&tail).iter().max().unwrap();

    let sock2 = s.path("api2.sock");
    let (mut child, rx2) = spawn_vmm_lines(&sock2);
    // The deprecated mem_file_path works too; resume_vm defaults to false.
    let body = format!(
        r#"{{"snapshot_path": "{}", "mem_file_path": "{}"}}"#,
        state.display(),
        mem.display()
    );
    let (code, reply) = http(&sock2, "PUT", "/snapshot/load", Some(&body));
    assert_eq!(code, 204, "{reply}");
    let (_, info) = http(&sock2, "GET", "/", None);
    assert!(info.contains("Paused"), "{info}");
    assert!(
        rx2.recv_timeout(Duration::from_millis(300)).is_err(),
        "a paused VM printed"
    );
    // A second load is refused.
    let (code, _) = http(&sock2, "PUT", "/snapshot/load", Some(&body));
    assert_eq!(code, 400);
    assert_eq!(
        http(&sock2, "PATCH", "/vm", Some(r#"{"state": "Resumed"}"#)).0,
        204
    );
    let rest = read_until(&rx2, "verify");
    assert_eq!(counts(&rest).first().copied(), Some(last + 1), "{rest:?}");
    assert!(rest.last().unwrap().starts_with("verify ok"), "{rest:?}");
    assert_eq!(child.wait().unwrap().code(), Some(0));
}

#[test]
fn kvm_a_restored_vm_can_be_snapshotted_again() {
    require_kvm();
    let s = Scratch::new("snap-twice");
    let (sock, state, mem) = (s.path("api.sock"), s.path("a.state"), s.path("a.mem"));
    let (mut vmm, rx) = boot_snaptest(&sock, 256, false, "mib=16 rounds=30 sleep_ms=30", &[]);
    read_until(&rx, "count 4");
    snapshot_create(&sock, &state, &mem, false, true);
    vmm.wait().unwrap();

    // Restore with an API socket, let it count on, snapshot it again.
    let sock2 = s.path("api2.sock");
    let mut restored = spore()
        .args(["snapshot", "restore", "--state"])
        .arg(&state)
        .arg("--mem")
        .arg(&mem)
        .arg("--api-sock")
        .arg(&sock2)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let rx2 = lines_of(&mut restored);
    wait_for_path(&sock2, Duration::from_secs(10));
    read_until(&rx2, "count 12");
    let (state_b, mem_b) = (s.path("b.state"), s.path("b.mem"));
    snapshot_create(&sock2, &state_b, &mem_b, false, true);
    restored.wait().unwrap();
    let mut tail = vec!["count 12".to_string()];
    while let Ok(l) = rx2.recv_timeout(Duration::from_millis(200)) {
        tail.push(l);
    }
    // The second memory file holds only the first one's data and the pages
    // written since: still sparse.
    let blocks = std::fs::metadata(&mem_b).unwrap().blocks() * 512;
    assert!(blocks < 64 << 20, "second memory file takes {blocks} bytes");

    let o = spore()
        .args(["snapshot", "restore", "--state"])
        .arg(&state_b)
        .arg("--mem")
        .arg(&mem_b)
        .output()
        .unwrap();
    let out = stdout_of(&o);
    assert_eq!(o.status.code(), Some(0), "{out}\n{}", stderr_of(&o));
    let mut lines: Vec<String> = out.lines().map(str::to_string).collect();
    // The snapshot may fall in the middle of a console line: the VM that was
    // snapshotted printed its start, the restored one prints the rest first.
    // Joined, they are one line again.
    if lines.first().is_some_and(|l| !l.starts_with("count ")) {
        if let (Some(piece), Some(rest)) = (tail.pop(), lines.first_mut()) {
            *rest = format!("{piece}{rest}");
        }
    }
    let last = *counts(&tail).iter().max().unwrap();
    assert_eq!(counts(&lines).first().copied(), Some(last + 1), "{out}");
    assert!(lines.iter().any(|l| l.starts_with("verify ok")), "{out}");
}
