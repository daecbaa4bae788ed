//! Clone identity and copy-on-write disks on host KVM, without the clone
//! machinery: a "clone" here is a snapshot restored in a new VMM process
//! with the test-only load options `clone_generation`, `vsock_cid` and
//! `clone_disks`. The `cloneid` unikernel prints its random numbers,
//! its vsock CID and what it reads from its disk.

use std::path::Path;
use std::sync::mpsc::Receiver;
use std::time::Duration;

use crate::common::*;

/// A VMM and its stdout lines.
type LinedVmm = (VmmChild, Receiver<String>);

/// The VMM's lines up to and including the first that starts with `prefix`
/// (30 s at most for each).
fn until(vmm: &LinedVmm, prefix: &str) -> Vec<String> {
    read_until_within(&vmm.1, prefix, Duration::from_secs(30))
}

/// Kills the clone processes a source started (not this test's children).
struct ClonePids(Vec<i32>);

impl Drop for ClonePids {
    fn drop(&mut self) {
        for &pid in &self.0 {
            // SAFETY: kill(2) with a pid from the clone report; no memory involved.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// Boots cloneid with a 1 MiB disk `base` and a vsock device (CID 3).
fn boot_source(sock: &Path, base: &Path, vsock: &Path) -> LinedVmm {
    let vmm = spawn_vmm_lines(sock);
    let kernel = uk_image("cloneid");
    put(
        sock,
        "/boot-source",
        &format!(
            r#"{{"kernel_image_path": "{}", "boot_args": "rounds=100000 sleep_ms=20"}}"#,
            kernel.display()
        ),
    );
    put(
        sock,
        "/machine-config",
        r#"{"vcpu_count": 1, "mem_size_mib": 64}"#,
    );
    put(
        sock,
        "/drives/disk0",
        &format!(
            r#"{{"drive_id": "disk0", "path_on_host": "{}", "is_root_device": false, "is_read_only": false}}"#,
            base.display()
        ),
    );
    put(
        sock,
        "/vsock",
        &format!(r#"{{"guest_cid": 3, "uds_path": "{}"}}"#, vsock.display()),
    );
    put(sock, "/actions", r#"{"action_type": "InstanceStart"}"#);
    vmm
}

/// Pauses the VM, snapshots it and stops its VMM.
fn snapshot(sock: &Path, vmm: LinedVmm, state: &Path, mem: &Path) {
    snapshot_create(sock, state, mem, false, true);
    drop(vmm);
}

/// Restores the snapshot in a new VMM with `extra` load options and resumes it.
fn restore(sock: &Path, state: &Path, mem: &Path, extra: &str) -> LinedVmm {
    let vmm = spawn_vmm_lines(sock);
    let body = format!(
        r#"{{"snapshot_path": "{}", "mem_file_path": "{}", "resume_vm": true{extra}}}"#,
        state.display(),
        mem.display()
    );
    put(sock, "/snapshot/load", &body);
    vmm
}

/// The value of the first `rand` line in `lines`.
fn first_value(lines: &[String]) -> String {
    lines
        .iter()
        .find_map(|l| {
            l.starts_with("rand ")
                .then(|| l.split_whitespace().find_map(|w| w.strip_prefix("value=")))
                .flatten()
        })
        .unwrap_or_else(|| panic!("no rand line in {lines:?}"))
        .to_string()
}

fn clone_opts(generation: u64, cid: u32, dir: &Path, name: &str) -> String {
    format!(
        r#", "clone_generation": {generation}, "vsock_cid": {cid}, "clone_disks": {{"dir": "{}", "name": "{name}"}}"#,
        dir.display()
    )
}

#[test]
fn kvm_clones_reseed_get_their_cid_and_private_disks() {
    require_kvm();
    let s = Scratch::new("cloneid");
    let base = s.path("base.img");
    sparse_file(&base, 1 << 20, &[(512, b"base sector 1")]);
    let vsock = s.path("v.sock");
    let (state, mem) = (s.path("src.state"), s.path("src.mem"));

    // The source writes "source" into sector 0 of its (raw) disk, draws numbers.
    let sock = s.path("src.sock");
    let src = boot_source(&sock, &base, &vsock);
    let boot = until(&src, "rand gen=0 round=3 ");
    assert!(boot.iter().any(|l| l == "disk source wrote"), "{boot:?}");
    assert!(boot.iter().any(|l| l == "vsock cid=3"), "{boot:?}");
    snapshot(&sock, src, &state, &mem);

    // Two plain restores: the generator state is in memory, so both print
    // the same next number, without a reseed.
    let mut plain = Vec::new();
    for i in 0..2 {
        let sock = s.path(&format!("plain{i}.sock"));
        let vmm = restore(&sock, &state, &mem, "");
        let lines = until(&vmm, "rand ");
        assert!(!lines.iter().any(|l| l.starts_with("cloned")), "{lines:?}");
        assert!(lines.last().unwrap().contains("reseeds=1"), "{lines:?}");
        plain.push(first_value(&lines));
        drop(vmm);
    }
    assert_eq!(plain[0], plain[1], "plain restores diverged");

    // Clones: each reseeds from virtio-rng, sees its new CID, and writes
    // its own disk overlay, never the base or a sibling's.
    let mut values = Vec::new();
    for (generation, cid, name) in [(1u64, 7u32, "a"), (2, 8, "b")] {
        let sock = s.path(&format!("{name}.sock"));
        let vmm = restore(
            &sock,
            &state,
            &mem,
            &clone_opts(generation, cid, &s.0, name),
        );
        let lines = until(&vmm, "rand ");
        assert!(
            lines.contains(&format!("cloned gen={generation} reseeds=2")),
            "{lines:?}"
        );
        assert!(lines.contains(&format!("vsock cid={cid}")), "{lines:?}");
        assert!(
            lines.contains(&format!(
                "disk gen={generation} sector0=source before=base sector 1 after=clone {generation}"
            )),
            "{lines:?}"
        );
        let v = first_value(&lines);
        assert!(
            !plain.contains(&v),
            "clone {name} drew the source's number {v}"
        );
        values.push(v);
        if name == "a" {
            // Keep clone a's state for a clone of it.
            snapshot(&sock, vmm, &s.path("a.state"), &s.path("a.mem"));
        } else {
            drop(vmm);
        }
        assert!(s.path(&format!("{name}.disk0.cow")).exists());
    }
    assert_ne!(values[0], values[1], "two clones drew the same number");
    let after = std::fs::read(&base).unwrap();
    assert_eq!(&after[..6], b"source");
    assert_eq!(&after[512..525], b"base sector 1", "a clone wrote the base");

    // Clones of clone a start from a's disk and diverge from it and each other.
    for (generation, name) in [(3u64, "aa"), (4, "ab")] {
        let sock = s.path(&format!("{name}.sock"));
        let vmm = restore(
            &sock,
            &s.path("a.state"),
            &s.path("a.mem"),
            &clone_opts(generation, 9, &s.0, name),
        );
        let lines = until(&vmm, "rand ");
        assert!(
            lines.contains(&format!(
                "disk gen={generation} sector0=source before=clone 1 after=clone {generation}"
            )),
            "{lines:?}"
        );
        assert!(lines.contains(&"vsock cid=9".to_string()), "{lines:?}");
        let v = first_value(&lines);
        assert!(!values.contains(&v), "clone {name} repeated a number");
        values.push(v);
        drop(vmm);
    }
}

/// Bad clone options are refused with a clear message, and a clone whose
/// base image vanished before it was made cannot be created.
#[test]
fn kvm_clone_options_are_checked() {
    require_kvm();
    let s = Scratch::new("cloneid-bad");
    let base = s.path("base.img");
    sparse_file(&base, 1 << 20, &[]);
    let (state, mem) = (s.path("src.state"), s.path("src.mem"));
    let sock = s.path("src.sock");
    let src = boot_source(&sock, &base, &s.path("v.sock"));
    until(&src, "rand gen=0 round=1 ");
    snapshot(&sock, src, &state, &mem);

    let try_load = |tag: &str, extra: &str| {
        let sock = s.path(&format!("{tag}.sock"));
        let vmm = spawn_vmm_lines(&sock);
        let body = format!(
            r#"{{"snapshot_path": "{}", "mem_file_path": "{}", "resume_vm": true{extra}}}"#,
            state.display(),
            mem.display()
        );
        let reply = http(&sock, "PUT", "/snapshot/load", Some(&body));
        drop(vmm);
        reply
    };
    let (code, reply) = try_load("nocid", r#", "vsock_cid": 5"#);
    assert_eq!(code, 400, "{reply}");
    assert!(reply.contains("clone_generation"), "{reply}");
    let (code, reply) = try_load("cid2", r#", "clone_generation": 1, "vsock_cid": 2"#);
    assert_eq!(code, 400, "{reply}");
    assert!(reply.contains("vsock_cid"), "{reply}");
    std::fs::remove_file(&base).unwrap();
    let (code, reply) = try_load("gone", &clone_opts(1, 5, &s.0, "x"));
    assert_eq!(code, 400, "{reply}");
    assert!(reply.contains("base.img"), "{reply}");
}

/// The first line of the log at `path` that starts with `prefix`, waiting
/// for it up to 30 s.
fn log_line(path: &Path, prefix: &str) -> String {
    for _ in 0..300 {
        if let Ok(text) = std::fs::read_to_string(path) {
            // Whole lines only: the console is written a byte at a time, so
            // the last line may still be on its way.
            if let Some(l) = text
                .split_inclusive('\n')
                .find(|l| l.ends_with('\n') && l.starts_with(prefix))
            {
                return l.trim_end().to_string();
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!(
        "no line starting with {prefix:?} in {}: {}",
        path.display(),
        std::fs::read_to_string(path).unwrap_or_default()
    );
}

/// The real clone path (`PUT /clone`): two clones of a running source each
/// reseed (different numbers), get their own CID and a private disk overlay
/// over the frozen base, and the base image keeps what the source wrote.
#[test]
fn kvm_put_clone_reseeds_each_clone_and_gives_it_a_cid_and_a_disk() {
    require_kvm();
    let s = Scratch::new("cloneid-put");
    let base = s.path("base.img");
    sparse_file(&base, 1 << 20, &[(512, b"base sector 1")]);
    let sock = s.path("src.sock");
    let src = boot_source(&sock, &base, &s.path("v.sock"));
    let boot = until(&src, "rand gen=0 round=3 ");
    assert!(boot.iter().any(|l| l == "disk source wrote"), "{boot:?}");

    // Each clone may make one clone of its own (below).
    put(
        &sock,
        "/clone/config",
        r#"{"mode": "zygote", "clone_budget": 1}"#,
    );
    let body = format!(
        r#"{{"count": 2, "mode": "zygote", "socket_dir": "{}"}}"#,
        s.0.display()
    );
    let (code, reply) = http(&sock, "PUT", "/clone", Some(&body));
    assert_eq!(code, 200, "{reply}");
    let report: serde_json::Value = serde_json::from_str(&reply).unwrap();
    let clones = report["clones"].as_array().expect("clones in the report");
    let _pids = ClonePids(
        clones
            .iter()
            .filter_map(|c| {
                c["pid"]
                    .as_i64()
                    .map(|p| i32::try_from(p).expect("a pid fits i32"))
            })
            .collect(),
    );
    assert_eq!(clones.len(), 2, "{reply}");
    let mut values = Vec::new();
    for c in clones {
        let index = c["index"].as_u64().unwrap();
        let log = std::path::PathBuf::from(c["log"].as_str().unwrap());
        assert_eq!(
            log_line(&log, "cloned gen="),
            "cloned gen=1 reseeds=2",
            "clone {index} did not reseed"
        );
        assert_eq!(
            log_line(&log, "vsock cid="),
            format!("vsock cid={}", 3 + index)
        );
        assert_eq!(
            log_line(&log, "disk gen="),
            "disk gen=1 sector0=source before=base sector 1 after=clone 1"
        );
        let rand = log_line(&log, "rand gen=1 ");
        let v = rand
            .split_whitespace()
            .find_map(|w| w.strip_prefix("value="))
            .unwrap()
            .to_string();
        values.push(v);
    }
    assert_ne!(values[0], values[1], "two clones drew the same number");
    let after = std::fs::read(&base).unwrap();
    assert_eq!(&after[..6], b"source");
    assert_eq!(&after[512..525], b"base sector 1", "a clone wrote the base");

    // A clone of a clone: its source's device has CID 4 while the source's
    // configuration keeps the zygote's 3; the clone restores the device's
    // and takes the next one.
    let c1_sock = std::path::PathBuf::from(clones[0]["socket"].as_str().unwrap());
    let nested_dir = s.path("nested");
    std::fs::create_dir_all(&nested_dir).unwrap();
    let body = format!(
        r#"{{"count": 1, "mode": "continue", "socket_dir": "{}"}}"#,
        nested_dir.display()
    );
    let (code, reply) = http(&c1_sock, "PUT", "/clone", Some(&body));
    assert_eq!(code, 200, "a clone of a clone: {reply}");
    let report: serde_json::Value = serde_json::from_str(&reply).unwrap();
    let nested = &report["clones"][0];
    let _nested_pid = ClonePids(
        nested["pid"]
            .as_i64()
            .map(|p| i32::try_from(p).expect("a pid fits i32"))
            .into_iter()
            .collect(),
    );
    let log = std::path::PathBuf::from(nested["log"].as_str().unwrap());
    assert_eq!(log_line(&log, "cloned gen="), "cloned gen=2 reseeds=3");
    assert_eq!(log_line(&log, "vsock cid="), "vsock cid=5");

    // A clone's snapshot restores, and runs on: its state carries the
    // clone's CID (its configuration derives from the source's).
    let c2_sock = std::path::PathBuf::from(clones[1]["socket"].as_str().unwrap());
    let (code, reply) = http(&c2_sock, "PATCH", "/vm", Some(r#"{"state": "Paused"}"#));
    assert_eq!(code, 204, "{reply}");
    let (state, mem) = (s.path("c2.state"), s.path("c2.mem"));
    let create = format!(
        r#"{{"snapshot_type": "Full", "snapshot_path": "{}", "mem_file_path": "{}"}}"#,
        state.display(),
        mem.display()
    );
    let (code, reply) = http(&c2_sock, "PUT", "/snapshot/create", Some(&create));
    assert_eq!(code, 204, "{reply}");
    let restored_sock = s.path("restored.sock");
    let restored = spawn_vmm_lines(&restored_sock);
    let load = format!(
        r#"{{"snapshot_path": "{}", "mem_file_path": "{}", "resume_vm": true, "vsock_override": {{"uds_path": "{}"}}}}"#,
        state.display(),
        mem.display(),
        s.path("restored.vsock").display()
    );
    let (code, reply) = http(&restored_sock, "PUT", "/snapshot/load", Some(&load));
    assert_eq!(code, 204, "a clone's snapshot restores: {reply}");
    until(&restored, "rand gen=1 ");
    drop(restored);
    drop(src);
}
