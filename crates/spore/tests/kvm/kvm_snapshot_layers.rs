//! Diff and layered snapshots end to end on host KVM with the `snaptest`
//! unikernel rewriting part of its pattern every round: base ← diff ←
//! diff restored in a new VMM process (the guest goes on counting and finds
//! every page of its pattern as it last wrote it), the same through
//! `snapshot merge`, a restored VM continuing the chain, diff sizes that
//! track what was written, and refused bad chains.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::clone::{put_clone, read, wait_until, Reaper};
use crate::common::*;

struct Layer {
    state: PathBuf,
    mem: PathBuf,
}

impl Layer {
    fn new(s: &Scratch, name: &str) -> Self {
        Self {
            state: s.path(&format!("{name}.state")),
            mem: s.path(&format!("{name}.mem")),
        }
    }
}

fn restore_cmd(l: &Layer) -> Command {
    let mut c = spore();
    c.args(["snapshot", "restore", "--state"])
        .arg(&l.state)
        .arg("--mem")
        .arg(&l.mem);
    c
}

/// Restores `l` to completion; checks the guest went on from `last` and
/// verified its whole pattern.
fn restore_and_verify(l: &Layer, last: u64, what: &str) {
    restore_and_verify_with(l, last, what, &[]);
}

/// [`restore_and_verify`] with extra `spore snapshot restore` arguments.
fn restore_and_verify_with(l: &Layer, last: u64, what: &str, args: &[&str]) {
    let o = restore_cmd(l).args(args).output().unwrap();
    let out = stdout_of(&o);
    assert_eq!(o.status.code(), Some(0), "{what}: {out}\n{}", stderr_of(&o));
    let lines: Vec<String> = out.lines().map(str::to_string).collect();
    assert!(
        !lines.iter().any(|l| l.starts_with("filled")),
        "{what}: guest restarted: {out}"
    );
    assert_eq!(
        counts(&lines).first().copied(),
        Some(last + 1),
        "{what}: count did not continue: {out}"
    );
    assert!(
        lines.iter().any(|l| l.starts_with("verify ok")),
        "{what}: {out}"
    );
}

fn disk_bytes(p: &Path) -> u64 {
    std::fs::metadata(p).unwrap().blocks() * 512
}

#[test]
fn kvm_three_layer_chain_restores_merges_and_continues() {
    require_kvm();
    let s = Scratch::new("snap-layers");
    let sock = s.path("api.sock");
    let (base, d1, d2) = (
        Layer::new(&s, "base"),
        Layer::new(&s, "d1"),
        Layer::new(&s, "d2"),
    );
    let (mut vmm, rx) = boot_snaptest(
        &sock,
        128,
        true,
        "mib=24 rounds=70 sleep_ms=50 rewrite=1",
        &[],
    );
    read_until(&rx, "count 3");
    snapshot_create(&sock, &base.state, &base.mem, false, false);
    // A diff that fails (its directory does not exist) must not lose the
    // pages it collected: d1 still holds the chunks rewritten until now
    // (rounds 4..=6), or the restores below would find them stale.
    read_until(&rx, "count 6");
    assert_eq!(
        http(&sock, "PATCH", "/vm", Some(r#"{"state":"Paused"}"#)).0,
        204
    );
    let body = format!(
        r#"{{"snapshot_type": "Diff", "snapshot_path": "{0}/x.state", "mem_file_path": "{0}/x.mem"}}"#,
        s.path("no-such-dir").display()
    );
    let (code, reply) = http(&sock, "PUT", "/snapshot/create", Some(&body));
    assert_eq!(code, 400, "{reply}");
    assert_eq!(
        http(&sock, "PATCH", "/vm", Some(r#"{"state":"Resumed"}"#)).0,
        204
    );
    read_until(&rx, "count 10");
    let t_diff = snapshot_create(&sock, &d1.state, &d1.mem, true, false);
    read_until(&rx, "count 17");
    snapshot_create(&sock, &d2.state, &d2.mem, true, true);
    vmm.wait().unwrap();
    let tail = drain(&rx);
    assert!(!tail.iter().any(|l| l.starts_with("verify")), "{tail:?}");
    let last = counts(&tail).into_iter().max().unwrap_or(17).max(17);
    eprintln!("diff create took {t_diff:?}");

    // The diffs hold about what was rewritten (7 rounds of 1 MiB), far
    // less than the base's 24 MiB of pattern.
    for d in [&d1, &d2] {
        let b = disk_bytes(&d.mem);
        assert!(
            (6 << 20..14 << 20).contains(&b),
            "{}: {b} bytes",
            d.mem.display()
        );
    }
    // (A third of the rewritten chunks are zeros, which a full layer skips.)
    assert!(disk_bytes(&base.mem) >= 20 << 20);

    // inspect lists the chain, newest first.
    let o = spore()
        .args(["snapshot", "inspect"])
        .arg(&d2.state)
        .arg("--mem")
        .arg(&d2.mem)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr_of(&o));
    let j: serde_json::Value = serde_json::from_str(&stdout_of(&o)).unwrap();
    let kinds: Vec<_> = j["chain"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["kind"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(kinds, ["Diff", "Diff", "Full"]);
    assert_eq!(j["layer"]["parent"]["state_path"], "d1.state");
    assert_eq!(j["vcpu_count"], 1);

    // The 3-layer chain restores, twice, and through every restore path
    // (working set: a recording run, then a replay of the recorded set).
    for _ in 0..2 {
        restore_and_verify(&d2, last, "3-layer chain");
    }
    for mode in ["eager", "working-set", "working-set", "uffd"] {
        restore_and_verify_with(
            &d2,
            last,
            &format!("3-layer chain, {mode}"),
            &["--mode", mode],
        );
    }
    assert!(
        std::fs::metadata(format!("{}.ws", d2.state.display())).is_ok(),
        "no working set was recorded beside the newest layer"
    );

    // Merged into one full snapshot: the same guest.
    let merged = Layer::new(&s, "merged");
    let o = spore()
        .args(["snapshot", "merge", "--state"])
        .arg(&d2.state)
        .arg("--mem")
        .arg(&d2.mem)
        .arg("--out-state")
        .arg(&merged.state)
        .arg("--out-mem")
        .arg(&merged.mem)
        .output()
        .unwrap();
    assert!(o.status.success(), "merge: {}", stderr_of(&o));
    let m: serde_json::Value = serde_json::from_str(&stdout_of(&o)).unwrap();
    assert_eq!(m["layer"]["kind"], "Full");
    // Sparse: the pattern, not the whole 128 MiB.
    assert!(disk_bytes(&merged.mem) < 48 << 20);
    restore_and_verify(&merged, last, "merged");

    // A restored VM continues the chain: its diff's parent is d2.
    let sock2 = s.path("api2.sock");
    let mut restored = restore_cmd(&d2)
        .arg("--api-sock")
        .arg(&sock2)
        .arg("--track-dirty-pages")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let rx2 = lines_of(&mut restored);
    wait_for_path(&sock2, Duration::from_secs(10));
    read_until(&rx2, &format!("count {}", last + 4));
    let d3 = Layer::new(&s, "d3");
    snapshot_create(&sock2, &d3.state, &d3.mem, true, true);
    restored.wait().unwrap();
    let last3 = counts(&drain(&rx2))
        .into_iter()
        .max()
        .unwrap_or(last + 4)
        .max(last + 4);
    let (m3, _) = read_manifest(&d3.state);
    assert_eq!(m3["layer"]["kind"], "Diff");
    assert_eq!(m3["layer"]["parent"]["state_path"], "d2.state");
    restore_and_verify(&d3, last3, "4-layer chain from a restored VM");
}

/// A clone's Diff applies to the snapshot its source wrote last (how
/// `spore serve` pauses a sandbox: a diff on its template's base): the
/// source, tracking dirty pages, writes a Full snapshot, runs on and is
/// cloned; the clone counts on, and its Diff (the pages changed since the
/// base, the source's before the clone included) restores on that base
/// in a new VMM, where the guest counts on and verifies its whole pattern.
#[test]
fn kvm_a_clones_diff_applies_to_its_sources_last_snapshot() {
    require_kvm();
    let s = Scratch::new("clone-diff");
    let sock = s.path("api.sock");
    let (base, diff) = (Layer::new(&s, "base"), Layer::new(&s, "clone"));
    let (_vmm, rx) = boot_snaptest(
        &sock,
        128,
        true,
        "mib=24 rounds=40 sleep_ms=50 rewrite=1",
        &[],
    );
    read_until(&rx, "count 3");
    snapshot_create(&sock, &base.state, &base.mem, false, false);
    read_until(&rx, "count 5");
    let (code, report) = put_clone(&sock, r#"{"count": 1}"#);
    assert_eq!(code, 200, "{report}");
    let mut reaper = Reaper {
        source: None,
        pids: Vec::new(),
        dir: s.0.clone(),
    };
    reaper.add_from(&report);
    let clone = &report["clones"][0];
    let (csock, log) = (
        PathBuf::from(clone["socket"].as_str().unwrap()),
        PathBuf::from(clone["log"].as_str().unwrap()),
    );
    let counted = |log: &Path| {
        let lines: Vec<String> = read(log).lines().map(str::to_string).collect();
        counts(&lines).into_iter().max().unwrap_or(0)
    };
    wait_until(&s.0, 30, "the clone's guest to count to 10", || {
        counted(&log) >= 10
    });
    snapshot_create(&csock, &diff.state, &diff.mem, true, true);
    let last = counted(&log);

    let (m, _) = read_manifest(&diff.state);
    assert_eq!(m["layer"]["kind"], "Diff");
    assert_eq!(m["layer"]["parent"]["state_path"], "base.state");
    // About the chunks rewritten since the base (rounds 4 to ~11 of 1 MiB),
    // far less than the base's 24 MiB of pattern.
    let b = disk_bytes(&diff.mem);
    assert!(
        (4 << 20..16 << 20).contains(&b),
        "the clone's diff: {b} bytes"
    );
    assert!(disk_bytes(&base.mem) >= 20 << 20);
    restore_and_verify(&diff, last, "a clone's diff on its source's snapshot");
}

fn read_manifest(state: &Path) -> (serde_json::Value, String) {
    let o = spore()
        .args(["snapshot", "inspect"])
        .arg(state)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr_of(&o));
    let out = stdout_of(&o);
    (serde_json::from_str(&out).unwrap(), out)
}

#[test]
fn kvm_diff_of_5_percent_of_512_mib_is_small() {
    require_kvm();
    let s = Scratch::new("snap-diff-size");
    let sock = s.path("api.sock");
    let (base, diff) = (Layer::new(&s, "base"), Layer::new(&s, "diff"));
    // 26 MiB of pattern; each round rewrites 1 MiB of it.
    let (mut vmm, rx) = boot_snaptest(
        &sock,
        512,
        true,
        "mib=26 rounds=1000 sleep_ms=60 rewrite=1",
        &[],
    );
    read_until(&rx, "count 1");
    snapshot_create(&sock, &base.state, &base.mem, false, false);
    // 25 more rounds: 25 MiB, 4.9% of 512 MiB.
    read_until(&rx, "count 26");
    let took = snapshot_create(&sock, &diff.state, &diff.mem, true, true);
    vmm.wait().unwrap();
    let on_disk = disk_bytes(&diff.mem);
    let limit = 512u64 * (1 << 20) * 6 / 100;
    eprintln!(
        "diff of 512 MiB guest: {} KiB on disk (limit {} KiB), created in {took:?}",
        on_disk >> 10,
        limit >> 10
    );
    // Guest memory, then the 4 KiB trailer naming the snapshot.
    assert_eq!(
        std::fs::metadata(&diff.mem).unwrap().len(),
        (512 << 20) + 4096
    );
    assert!(on_disk <= limit, "diff takes {on_disk} bytes on disk");
    assert!(
        on_disk >= 25 << 20,
        "diff misses rewritten pages: {on_disk}"
    );
    let (m, _) = read_manifest(&diff.state);
    assert_eq!(m["layer"]["kind"], "Diff");
    assert!(m["layer"]["mem_data_bytes"].as_u64().unwrap() >= 25 << 20);
}

#[test]
fn kvm_bad_chains_and_diffs_are_refused() {
    require_kvm();
    let s = Scratch::new("snap-bad-chain");
    let sock = s.path("api.sock");
    let (base, d1) = (Layer::new(&s, "base"), Layer::new(&s, "d1"));

    // Diff with no snapshot before it, and without tracking.
    let (mut vmm, rx) = boot_snaptest(
        &sock,
        64,
        true,
        "mib=2 rounds=150 sleep_ms=20 rewrite=1",
        &[],
    );
    read_until(&rx, "count 1");
    assert_eq!(
        http(&sock, "PATCH", "/vm", Some(r#"{"state":"Paused"}"#)).0,
        204
    );
    let body = format!(
        r#"{{"snapshot_type": "Diff", "snapshot_path": "{}", "mem_file_path": "{}"}}"#,
        d1.state.display(),
        d1.mem.display()
    );
    let (code, reply) = http(&sock, "PUT", "/snapshot/create", Some(&body));
    assert_eq!(code, 400, "{reply}");
    assert!(reply.contains("create a Full snapshot first"), "{reply}");
    assert!(!d1.state.exists() && !d1.mem.exists());
    assert_eq!(
        http(&sock, "PATCH", "/vm", Some(r#"{"state":"Resumed"}"#)).0,
        204
    );
    snapshot_create(&sock, &base.state, &base.mem, false, false);
    read_until(&rx, "count 5");
    snapshot_create(&sock, &d1.state, &d1.mem, true, true);
    vmm.wait().unwrap();

    let sock2 = s.path("api2.sock");
    let (mut untracked, rx2) =
        boot_snaptest(&sock2, 64, false, "mib=1 rounds=1000 sleep_ms=20", &[]);
    read_until(&rx2, "count 1");
    let other = Layer::new(&s, "other");
    snapshot_create(&sock2, &other.state, &other.mem, false, false);
    assert_eq!(
        http(&sock2, "PATCH", "/vm", Some(r#"{"state":"Paused"}"#)).0,
        204
    );
    let body = format!(
        r#"{{"snapshot_type": "Diff", "snapshot_path": "{}", "mem_file_path": "{}"}}"#,
        s.path("x.state").display(),
        s.path("x.mem").display()
    );
    let (code, reply) = http(&sock2, "PUT", "/snapshot/create", Some(&body));
    assert_eq!(code, 400, "{reply}");
    assert!(reply.contains("track_dirty_pages"), "{reply}");
    untracked.kill().unwrap();
    untracked.wait().unwrap();

    // A VM with hotplug memory (virtio-mem) takes diffs like any other
    // (kvm_mem_snapshot restores them): refused only without a parent.
    let sock3 = s.path("api3.sock");
    let (mut hp, rx3) = boot_snaptest(
        &sock3,
        64,
        true,
        "mib=1 rounds=1000 sleep_ms=20",
        &[(
            "/hotplug/memory",
            r#"{"total_size_mib": 256, "block_size_mib": 2, "slot_size_mib": 128}"#,
        )],
    );
    read_until(&rx3, "count 1");
    assert_eq!(
        http(&sock3, "PATCH", "/vm", Some(r#"{"state":"Paused"}"#)).0,
        204
    );
    let (code, reply) = http(&sock3, "PUT", "/snapshot/create", Some(&body));
    assert_eq!(code, 400, "{reply}");
    assert!(reply.contains("previous snapshot"), "{reply}");
    let full = format!(
        r#"{{"snapshot_type": "Full", "snapshot_path": "{}", "mem_file_path": "{}"}}"#,
        s.path("hp.state").display(),
        s.path("hp.mem").display()
    );
    let (code, reply) = http(&sock3, "PUT", "/snapshot/create", Some(&full));
    assert_eq!(code, 204, "{reply}");
    let (code, reply) = http(&sock3, "PUT", "/snapshot/create", Some(&body));
    assert_eq!(code, 204, "{reply}");
    hp.kill().unwrap();
    hp.wait().unwrap();

    let refused = |c: &mut Command, needle: &str| {
        let o = c.output().unwrap();
        assert_eq!(o.status.code(), Some(1), "{}", stdout_of(&o));
        assert!(
            stderr_of(&o).contains(needle),
            "want {needle:?}: {}",
            stderr_of(&o)
        );
    };
    // A plain `cp` of the chain (it turns the diff's zeroed pages into
    // holes, and drops xattrs) still restores the same guest: the
    // diff's manifest lists its zero pages.
    let (m1, _) = read_manifest(&d1.state);
    assert!(
        !m1["layer"]["zero_runs"].as_array().unwrap().is_empty(),
        "the guest zeroed no page in the diff: {m1}"
    );
    let copied = s.path("copied");
    std::fs::create_dir_all(&copied).unwrap();
    for f in [&base.state, &base.mem, &d1.state, &d1.mem] {
        let st = Command::new("cp").arg(f).arg(&copied).status().unwrap();
        assert!(st.success());
    }
    let o = restore_cmd(&Layer {
        state: copied.join("d1.state"),
        mem: copied.join("d1.mem"),
    })
    .output()
    .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr_of(&o));
    assert!(stdout_of(&o).contains("verify ok"), "{}", stdout_of(&o));

    // The diff moved without its parent.
    let moved_dir = s.path("moved");
    std::fs::create_dir_all(&moved_dir).unwrap();
    let moved = Layer {
        state: moved_dir.join("d1.state"),
        mem: moved_dir.join("d1.mem"),
    };
    std::fs::rename(&d1.state, &moved.state).unwrap();
    std::fs::rename(&d1.mem, &moved.mem).unwrap();
    refused(&mut restore_cmd(&moved), "is missing");
    // ... and found again when named explicitly (checked, then restored).
    let mut named = restore_cmd(&moved);
    named.arg("--parent").arg(&base.state).arg(&base.mem);
    let o = named.output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr_of(&o));
    assert!(stdout_of(&o).contains("verify ok"));
    // A different parent named in its place.
    let mut wrong = restore_cmd(&moved);
    wrong.arg("--parent").arg(&other.state).arg(&other.mem);
    refused(&mut wrong, "is not its parent");
    std::fs::rename(&moved.state, &d1.state).unwrap();
    std::fs::rename(&moved.mem, &d1.mem).unwrap();
    // The parent replaced under its name by another snapshot.
    std::fs::copy(&other.state, &base.state).unwrap();
    refused(&mut restore_cmd(&d1), "is not its parent");
    // A truncated layer.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&d1.mem)
        .unwrap();
    f.set_len((64 << 20) - 4096).unwrap();
    refused(&mut restore_cmd(&d1), "truncated");
}

/// A load with `track_dirty_pages: false` turns dirty logging off for a VM
/// whose snapshot had it on (a diff is then refused); one that does not
/// say keeps the snapshot's tracking, so a diff on the loaded snapshot works.
#[test]
fn kvm_load_turns_tracking_off_when_asked() {
    require_kvm();
    let s = Scratch::new("snap-load-tracking");
    let sock = s.path("api.sock");
    let base = Layer::new(&s, "base");
    let (mut vmm, rx) = boot_snaptest(&sock, 64, true, "mib=1 rounds=1000 sleep_ms=20", &[]);
    read_until(&rx, "count 1");
    snapshot_create(&sock, &base.state, &base.mem, false, true);
    vmm.wait().unwrap();

    let load = |sock: &Path, extra: &str| {
        let (child, rx) = spawn_vmm_lines(sock);
        let body = format!(
            r#"{{"snapshot_path": "{}", "mem_backend": {{"backend_type": "File", "backend_path": "{}"}}, "resume_vm": true{extra}}}"#,
            base.state.display(),
            base.mem.display()
        );
        let (code, reply) = http(sock, "PUT", "/snapshot/load", Some(&body));
        assert_eq!(code, 204, "{reply}");
        read_until(&rx, "count");
        assert_eq!(
            http(sock, "PATCH", "/vm", Some(r#"{"state":"Paused"}"#)).0,
            204
        );
        child
    };
    let diff_body = |name: &str| {
        format!(
            r#"{{"snapshot_type": "Diff", "snapshot_path": "{}", "mem_file_path": "{}"}}"#,
            s.path(&format!("{name}.state")).display(),
            s.path(&format!("{name}.mem")).display()
        )
    };

    let off_sock = s.path("off.sock");
    let mut off = load(&off_sock, r#", "track_dirty_pages": false"#);
    let (code, reply) = http(
        &off_sock,
        "PUT",
        "/snapshot/create",
        Some(&diff_body("off")),
    );
    assert_eq!(code, 400, "{reply}");
    assert!(reply.contains("track_dirty_pages"), "{reply}");
    let (_, config) = http(&off_sock, "GET", "/vm/config", None);
    assert!(config.contains(r#""track_dirty_pages":false"#), "{config}");
    let _ = off.kill();
    let _ = off.wait();

    let kept_sock = s.path("kept.sock");
    let mut kept = load(&kept_sock, "");
    let (code, reply) = http(
        &kept_sock,
        "PUT",
        "/snapshot/create",
        Some(&diff_body("kept")),
    );
    assert_eq!(code, 204, "{reply}");
    let _ = kept.kill();
    let _ = kept.wait();
}
