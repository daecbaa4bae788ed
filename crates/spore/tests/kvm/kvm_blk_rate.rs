//! virtio-blk rate limiting and `PATCH /drives/{id}` on host KVM, with the
//! `blkrate` unikernel: it reads sector 0 of its disk (printing its text)
//! and then `mib` MiB, timing that by its own clock, round after round.

use std::path::Path;
use std::sync::mpsc::Receiver;
use std::time::Instant;

use crate::common::*;

const MIB: u64 = 1 << 20;

/// An 8 MiB image whose sector 0 starts with `tag`.
fn image(path: &Path, tag: &str) {
    sparse_file(path, 8 * MIB, &[(0, tag.as_bytes())]);
}

/// The next round's `(sector0 text, guest µs to read, host seconds)`.
fn next_round(rx: &Receiver<String>) -> (String, u64, f64) {
    let lines = read_until(rx, "blk round=");
    let sector0 = lines
        .last()
        .and_then(|l| l.split("sector0=").nth(1))
        .unwrap_or_else(|| panic!("no sector0 in {lines:?}"))
        .to_string();
    let t = Instant::now();
    let lines = read_until(rx, "blk round=");
    let last = lines.last().unwrap();
    let us = last
        .split("us=")
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no us= in {last:?}"));
    (sector0, us, t.elapsed().as_secs_f64())
}

/// The guest's arguments unless a test gives its own.
const ROUNDS: &str = "rounds=1000 mib=4 chunk_kib=128 sleep_ms=20";

fn boot(sock: &Path, disk: &Path, rate_limiter: &str) -> (VmmChild, Receiver<String>) {
    boot_with(sock, disk, rate_limiter, "Sync", ROUNDS)
}

fn boot_with(
    sock: &Path,
    disk: &Path,
    rate_limiter: &str,
    io_engine: &str,
    boot_args: &str,
) -> (VmmChild, Receiver<String>) {
    let (vmm, rx) = spawn_vmm_lines(sock);
    api_ok(
        sock,
        "PUT",
        "/boot-source",
        &format!(
            r#"{{"kernel_image_path": "{}", "boot_args": "{boot_args}"}}"#,
            uk_image("blkrate").display()
        ),
    );
    api_ok(
        sock,
        "PUT",
        "/machine-config",
        r#"{"vcpu_count": 1, "mem_size_mib": 64}"#,
    );
    api_ok(
        sock,
        "PUT",
        "/drives/disk0",
        &format!(
            r#"{{"drive_id": "disk0", "path_on_host": "{}", "is_root_device": false, "is_read_only": false, "io_engine": "{io_engine}", "rate_limiter": {rate_limiter}}}"#,
            disk.display()
        ),
    );
    (vmm, rx)
}

#[test]
fn bandwidth_and_ops_buckets_cap_reads_and_patch_changes_them() {
    require_kvm();
    let dir = Scratch::new("blkrate");
    let sock = dir.path("api.sock");
    let (a, b) = (dir.path("a.img"), dir.path("b.img"));
    image(&a, "image-a");
    image(&b, "image-b");
    // 1 MiB per second.
    let (_vmm, rx) = boot(
        &sock,
        &a,
        r#"{"bandwidth": {"size": 1048576, "refill_time": 1000}}"#,
    );
    // Firecracker's pre-boot answer: PATCH is for a running VM.
    let (code, reply) = call(&sock, "PATCH", "/drives/disk0", r#"{"drive_id": "disk0"}"#);
    assert_eq!(code, 400, "{reply}");
    assert!(
        reply.contains("not supported before starting the microVM"),
        "{reply}"
    );
    api_ok(
        &sock,
        "PUT",
        "/actions",
        r#"{"action_type": "InstanceStart"}"#,
    );

    // 4 MiB at 1 MiB/s with a full 1 MiB bucket to start: at least 3 s
    // (rounds after the first start with an almost empty bucket: ~4 s).
    let (s0, us, host) = next_round(&rx);
    assert_eq!(s0, "image-a");
    eprintln!("bandwidth 1 MiB/s: 4 MiB in {us} us (host {host:.2} s)");
    assert!(us >= 2_700_000, "4 MiB at 1 MiB/s took only {us} us");
    assert!(
        host >= 2.7,
        "4 MiB at 1 MiB/s took only {host:.2} s on the host"
    );
    assert!(us < 12_000_000, "throttled far below the limit: {us} us");
    let limited = us;

    // Lift the bandwidth bucket, add an ops bucket of 10 per second: a
    // round is 1 + 32 requests (128 KiB each), so at least ~2.2 s.
    api_ok(
        &sock,
        "PATCH",
        "/drives/disk0",
        r#"{"drive_id": "disk0", "rate_limiter": {"bandwidth": {"size": 0, "refill_time": 0}, "ops": {"size": 10, "refill_time": 1000}}}"#,
    );
    let (code, cfg) = http(&sock, "GET", "/vm/config", None);
    assert_eq!(code, 200);
    assert!(
        cfg.contains(r#""rate_limiter":{"ops":{"refill_time":1000,"size":10}}"#),
        "{cfg}"
    );
    // The round in flight may have started under the old limits.
    next_round(&rx);
    let (_, us, _) = next_round(&rx);
    eprintln!("ops 10/s: 33 requests in {us} us");
    assert!(us >= 2_000_000, "33 requests at 10/s took only {us} us");

    // No limits at all: the same 4 MiB from the page cache.
    api_ok(
        &sock,
        "PATCH",
        "/drives/disk0",
        r#"{"drive_id": "disk0", "rate_limiter": {"ops": {"size": 0, "refill_time": 0}}}"#,
    );
    next_round(&rx);
    let (_, us, _) = next_round(&rx);
    eprintln!("unlimited: 4 MiB in {us} us");
    assert!(
        us * 3 < limited,
        "unlimited ({us} us) is not clearly faster than 1 MiB/s ({limited} us)"
    );
    let _ = MIB;
}

#[test]
fn patch_path_on_host_swaps_the_image_under_a_running_guest() {
    require_kvm();
    let dir = Scratch::new("blkswap");
    let sock = dir.path("api.sock");
    let (a, b) = (dir.path("a.img"), dir.path("b.img"));
    image(&a, "image-a");
    image(&b, "image-b");
    let (_vmm, rx) = boot(&sock, &a, "null");
    api_ok(
        &sock,
        "PUT",
        "/actions",
        r#"{"action_type": "InstanceStart"}"#,
    );
    assert_eq!(next_round(&rx).0, "image-a");

    // Refusals change nothing: a missing image, another drive id, an id
    // that differs between path and body, an empty path.
    for (path, body, says) in [
        (
            "/drives/disk0",
            format!(
                r#"{{"drive_id": "disk0", "path_on_host": "{}"}}"#,
                dir.path("none.img").display()
            ),
            "does not exist",
        ),
        (
            "/drives/disk9",
            r#"{"drive_id": "disk9"}"#.to_string(),
            "no drive",
        ),
        (
            "/drives/disk0",
            r#"{"drive_id": "disk1"}"#.to_string(),
            "differs",
        ),
        (
            "/drives/disk0",
            r#"{"drive_id": "disk0", "path_on_host": ""}"#.to_string(),
            "empty",
        ),
        (
            "/drives/disk0",
            r#"{"drive_id": "disk0", "bogus": 1}"#.to_string(),
            "bogus",
        ),
    ] {
        let (code, reply) = call(&sock, "PATCH", path, &body);
        assert_eq!(code, 400, "PATCH {path} {body}: {reply}");
        assert!(reply.contains(says), "PATCH {path} {body}: {reply}");
    }
    next_round(&rx);
    assert_eq!(next_round(&rx).0, "image-a");

    api_ok(
        &sock,
        "PATCH",
        "/drives/disk0",
        &format!(
            r#"{{"drive_id": "disk0", "path_on_host": "{}"}}"#,
            b.display()
        ),
    );
    next_round(&rx);
    assert_eq!(next_round(&rx).0, "image-b");
    let (code, cfg) = http(&sock, "GET", "/vm/config", None);
    assert_eq!(code, 200);
    assert!(cfg.contains(&format!("{}", b.display())), "{cfg}");
}

#[test]
fn limits_survive_a_snapshot_taken_with_a_request_held_back() {
    snapshot_with_a_request_held_back("Sync");
}

/// The same through the io_uring engine: reads complete asynchronously, the
/// limiter still caps them, and the snapshot drains what the kernel holds.
#[test]
fn async_engine_under_a_limiter_and_across_a_snapshot() {
    snapshot_with_a_request_held_back("Async");
}

fn snapshot_with_a_request_held_back(io_engine: &str) {
    require_kvm();
    let dir = Scratch::new("blkrate-snap");
    let sock = dir.path("api.sock");
    let a = dir.path("a.img");
    image(&a, "image-a");
    let (vmm, _rx) = boot(
        &sock,
        &a,
        r#"{"bandwidth": {"size": 1048576, "refill_time": 1000}}"#,
    );
    api_ok(
        &sock,
        "PUT",
        "/actions",
        r#"{"action_type": "InstanceStart"}"#,
    );
    // Mid-round: the bucket is empty and a request waits on the timer.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let (state, mem) = (dir.path("vm.state"), dir.path("vm.mem"));
    snapshot_create(&sock, &state, &mem, false, true);
    drop(vmm);

    let sock = dir.path("load.sock");
    let (_vmm, rx) = spawn_vmm_lines(&sock);
    api_ok(
        &sock,
        "PUT",
        "/snapshot/load",
        &format!(
            r#"{{"snapshot_path": "{}", "mem_file_path": "{}", "resume_vm": true}}"#,
            state.display(),
            mem.display()
        ),
    );
    // The held request is served after the restore (the round ends), and
    // the restored limiter still caps a whole round at 1 MiB/s.
    read_until(&rx, "blk round=0 read_mib=");
    let (s0, _, host) = next_round(&rx);
    assert_eq!(s0, "image-a");
    eprintln!("{io_engine} restored: 4 MiB in {host:.2} s (host)");
    assert!(host >= 2.7, "the restored drive read 4 MiB in {host:.2} s");
    let (code, cfg) = http(&sock, "GET", "/vm/config", None);
    assert_eq!(code, 200);
    assert!(
        cfg.contains(r#""bandwidth":{"refill_time":1000,"size":1048576}"#),
        "{cfg}"
    );
}

/// A 10 MiB/s bandwidth limit holds within 10 % over a 5 s read (the
/// network interface's limiter is held to the same in `kvm_net.rs`).
#[test]
fn a_10_mib_per_s_limit_holds_within_10_percent_over_5_s() {
    require_kvm();
    let dir = Scratch::new("blkrate-10");
    let sock = dir.path("api.sock");
    let disk = dir.path("big.img");
    // 64 MiB, sparse but for its tag: reads of holes still cost the limiter.
    sparse_file(&disk, 64 * MIB, &[(0, b"image-big")]);
    // 10 MiB/s as a 1 MiB bucket refilled every 100 ms.
    let (_vmm, rx) = boot_with(
        &sock,
        &disk,
        r#"{"bandwidth": {"size": 1048576, "refill_time": 100}}"#,
        "Sync",
        "rounds=3 mib=50 chunk_kib=128 sleep_ms=20",
    );
    api_ok(
        &sock,
        "PUT",
        "/actions",
        r#"{"action_type": "InstanceStart"}"#,
    );
    // The first round starts with a full bucket; the second is measured.
    next_round(&rx);
    let (sector0, us, host) = next_round(&rx);
    assert_eq!(sector0, "image-big");
    let mib_s = 50.0 / (us as f64 / 1e6);
    eprintln!("10 MiB/s limit: 50 MiB in {us} us = {mib_s:.2} MiB/s (host {host:.2} s)");
    assert!(
        (9.0..=11.0).contains(&mib_s),
        "{mib_s:.2} MiB/s is not within 10 % of 10 MiB/s"
    );
}
