//! Snapshot integrity end to end on host KVM with the `snaptest` unikernel:
//! a state file is paired with its own memory file by the memory file's
//! trailer, with or without xattrs; a snapshot key (HMAC) refuses unsigned,
//! edited and wrongly signed state files; a recorded memory hash refuses a
//! flipped byte on `inspect --verify` and eager restores; and a memory file
//! truncated under a restored VM fails its next snapshot instead of writing
//! an empty one.

use std::ffi::OsStr;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Output;

use crate::common::*;

/// The guest: 1 MiB of pattern, counting every 20 ms for a short while (a
/// restore that resumes runs to completion quickly).
const GUEST: &str = "mib=1 rounds=40 sleep_ms=20";

struct Snap {
    state: PathBuf,
    mem: PathBuf,
}

/// Boots snaptest (with `vmm_args`), snapshots it at its first count with
/// `create_args` and stops it.
fn take(s: &Scratch, name: &str, vmm_args: &[&OsStr], create_args: &[&str]) -> Snap {
    let sock = s.path(&format!("{name}.sock"));
    let (mut vmm, rx) = boot_snaptest_args(&sock, vmm_args, 64, false, GUEST, &[]);
    read_until(&rx, "count 1");
    let snap = Snap {
        state: s.path(&format!("{name}.state")),
        mem: s.path(&format!("{name}.mem")),
    };
    let o = spore()
        .args(["snapshot", "create"])
        .arg(&sock)
        .arg("--state")
        .arg(&snap.state)
        .arg("--mem")
        .arg(&snap.mem)
        .arg("--stop")
        .args(create_args)
        .output()
        .unwrap();
    assert!(o.status.success(), "snapshot create: {}", stderr_of(&o));
    vmm.wait().unwrap();
    snap
}

/// `spore [pre...] snapshot restore --state S --mem M [post...]`.
fn restore(pre: &[&OsStr], state: &Path, mem: &Path, post: &[&str]) -> Output {
    spore()
        .args(pre)
        .args(["snapshot", "restore", "--state"])
        .arg(state)
        .arg("--mem")
        .arg(mem)
        .args(post)
        .output()
        .unwrap()
}

fn restored_ok(o: &Output, what: &str) {
    let out = stdout_of(o);
    assert_eq!(o.status.code(), Some(0), "{what}: {out}\n{}", stderr_of(o));
    assert!(out.contains("verify ok"), "{what}: {out}");
    assert!(
        !out.contains("filled"),
        "{what}: the guest restarted: {out}"
    );
}

fn refused(o: &Output, needle: &str) {
    assert_eq!(o.status.code(), Some(1), "{}", stdout_of(o));
    assert!(
        stderr_of(o).contains(needle),
        "want {needle:?}: {}",
        stderr_of(o)
    );
}

/// `cp --no-preserve=xattr SRC DST`: a copy without extended attributes.
fn cp_no_xattr(src: &Path, dst: &Path) {
    let st = std::process::Command::new("cp")
        .arg("--no-preserve=xattr")
        .arg(src)
        .arg(dst)
        .status()
        .unwrap();
    assert!(st.success());
}

#[test]
fn kvm_a_swapped_memory_file_is_refused_with_and_without_xattrs() {
    require_kvm();
    let s = Scratch::new("integrity-swap");
    let a = take(&s, "a", &[], &[]);
    let b = take(&s, "b", &[], &[]);
    // The same guest size, so only the pairing tells them apart.
    assert_eq!(
        std::fs::metadata(&a.mem).unwrap().len(),
        std::fs::metadata(&b.mem).unwrap().len()
    );
    refused(
        &restore(&[], &a.state, &b.mem, &[]),
        "from different snapshots",
    );
    // Copies without xattrs (a tool or file system that drops them).
    let (a2, b2) = (s.path("a2.mem"), s.path("b2.mem"));
    cp_no_xattr(&a.mem, &a2);
    cp_no_xattr(&b.mem, &b2);
    refused(
        &restore(&[], &a.state, &b2, &[]),
        "from different snapshots",
    );
    for mode in ["lazy", "eager", "uffd", "working-set"] {
        refused(
            &restore(&[], &b.state, &a2, &["--mode", mode]),
            "from different snapshots",
        );
    }
    // A's own memory, copied without xattrs, restores A.
    restored_ok(
        &restore(&[], &a.state, &a2, &[]),
        "A from its xattr-less copy",
    );
    // inspect checks the pairing too.
    let o = spore()
        .args(["snapshot", "inspect"])
        .arg(&a.state)
        .arg("--mem")
        .arg(&b2)
        .output()
        .unwrap();
    refused(&o, "from different snapshots");
}

/// CRC-32 (IEEE), as the state file's trailer uses: an editor can always
/// recompute it.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0xEDB8_8320 & (!(crc & 1)).wrapping_add(1));
        }
    }
    !crc
}

fn with_crc(mut bytes: Vec<u8>) -> Vec<u8> {
    let n = bytes.len() - 4;
    let crc = crc32(&bytes[..n]);
    bytes[n..].copy_from_slice(&crc.to_le_bytes());
    bytes
}

#[test]
fn kvm_a_snapshot_key_refuses_unsigned_edited_and_foreign_state_files() {
    require_kvm();
    let s = Scratch::new("integrity-key");
    let (key, other) = (s.path("key"), s.path("other.key"));
    std::fs::write(&key, [0x42u8; 32]).unwrap();
    std::fs::write(&other, [0x17u8; 48]).unwrap();
    let short = s.path("short.key");
    std::fs::write(&short, [1u8; 16]).unwrap();
    let flag = |k: &Path| [OsStr::new("--snapshot-key-file"), k.as_os_str()].map(|a| a.to_owned());
    let (kf, of) = (flag(&key), flag(&other));
    let k: Vec<&OsStr> = kf.iter().map(|a| a.as_os_str()).collect();
    let o: Vec<&OsStr> = of.iter().map(|a| a.as_os_str()).collect();

    let signed = take(&s, "signed", &k, &[]);
    let plain = take(&s, "plain", &[], &[]);
    restored_ok(
        &restore(&k, &signed.state, &signed.mem, &[]),
        "signed, with its key",
    );
    refused(
        &restore(&[], &signed.state, &signed.mem, &[]),
        "carries a MAC",
    );
    refused(
        &restore(&o, &signed.state, &signed.mem, &[]),
        "MAC mismatch",
    );
    refused(&restore(&k, &plain.state, &plain.mem, &[]), "has no MAC");
    let sf = flag(&short);
    let sk: Vec<&OsStr> = sf.iter().map(|a| a.as_os_str()).collect();
    refused(&restore(&sk, &plain.state, &plain.mem, &[]), "at least 32");

    let bytes = std::fs::read(&signed.state).unwrap();
    // A flipped byte in the state (the CRC fixed up, as an editor would).
    let mut flipped = bytes.clone();
    let i = bytes.len() - 4 - 32 - 4 - 100;
    flipped[i] ^= 1;
    let flipped_path = s.path("flipped.state");
    std::fs::write(&flipped_path, with_crc(flipped.clone())).unwrap();
    refused(
        &restore(&k, &flipped_path, &signed.mem, &[]),
        "MAC mismatch",
    );
    std::fs::write(&flipped_path, &flipped).unwrap();
    refused(
        &restore(&k, &flipped_path, &signed.mem, &[]),
        "checksum mismatch",
    );
    // The manifest edited (a plausible value) and the CRC recomputed.
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let at = text.find("\"created_unix_ms\": ").unwrap() + "\"created_unix_ms\": ".len();
    let mut edited = bytes.clone();
    edited[at] = if edited[at] == b'1' { b'2' } else { b'1' };
    let edited_path = s.path("edited.state");
    std::fs::write(&edited_path, with_crc(edited)).unwrap();
    refused(&restore(&k, &edited_path, &signed.mem, &[]), "MAC mismatch");
    // Inspect needs the key as well.
    let o = spore()
        .args(["snapshot", "inspect"])
        .arg(&signed.state)
        .output()
        .unwrap();
    refused(&o, "carries a MAC");
    let o = spore()
        .args(&k)
        .args(["snapshot", "inspect"])
        .arg(&signed.state)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr_of(&o));
}

/// The first offset of `mem` holding a non-zero byte.
fn first_data_byte(mem: &Path) -> u64 {
    let f = std::fs::File::open(mem).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0u64;
    loop {
        let n = f.read_at(&mut buf, off).unwrap();
        assert!(n > 0, "no data in {}", mem.display());
        if let Some(i) = buf[..n].iter().position(|&b| b != 0) {
            return off + i as u64;
        }
        off += n as u64;
    }
}

#[test]
fn kvm_a_flipped_byte_in_hashed_memory_is_refused_by_verify_and_eager_restore() {
    require_kvm();
    let s = Scratch::new("integrity-hash");
    let snap = take(&s, "h", &[], &["--hash-memory"]);
    let inspect = |mem: &Path| {
        spore()
            .args(["snapshot", "inspect", "--verify"])
            .arg(&snap.state)
            .arg("--mem")
            .arg(mem)
            .output()
            .unwrap()
    };
    let o = inspect(&snap.mem);
    assert!(o.status.success(), "{}", stderr_of(&o));
    let j: serde_json::Value = serde_json::from_str(&stdout_of(&o)).unwrap();
    assert!(j["layer"]["mem_sha256"]
        .as_str()
        .is_some_and(|h| h.starts_with("sha256:")));
    assert_eq!(j["verified"]["memory_hashed_layers"], 1, "{j}");
    restored_ok(
        &restore(&[], &snap.state, &snap.mem, &["--mode", "eager"]),
        "hashed, eager",
    );

    let bad = s.path("bad.mem");
    cp_no_xattr(&snap.mem, &bad);
    let at = first_data_byte(&bad);
    let f = std::fs::OpenOptions::new().write(true).open(&bad).unwrap();
    let mut b = [0u8];
    std::fs::File::open(&bad)
        .unwrap()
        .read_exact_at(&mut b, at)
        .unwrap();
    f.write_all_at(&[b[0] ^ 0x01], at).unwrap();
    drop(f);
    refused(&inspect(&bad), "SHA-256");
    refused(
        &restore(&[], &snap.state, &bad, &["--mode", "eager"]),
        "SHA-256",
    );
}

#[test]
fn kvm_a_memory_file_truncated_under_a_restored_vm_fails_the_next_snapshot() {
    require_kvm();
    let s = Scratch::new("integrity-trunc");
    let snap = take(&s, "t", &[], &[]);
    for mode in ["lazy", "uffd"] {
        // A working copy the restored VM maps (the original stays intact).
        let mem = s.path(&format!("{mode}.mem"));
        cp_no_xattr(&snap.mem, &mem);
        let sock = s.path(&format!("{mode}.sock"));
        let _vmm = spawn_vmm(&sock);
        let body = match mode {
            "lazy" => format!(
                r#"{{"snapshot_path": "{}", "mem_backend": {{"backend_type": "File", "backend_path": "{}"}}}}"#,
                snap.state.display(),
                mem.display()
            ),
            _ => format!(
                r#"{{"snapshot_path": "{}", "mem_backend": {{"backend_type": "Uffd", "backend_path": "{}"}}}}"#,
                snap.state.display(),
                mem.display()
            ),
        };
        let (code, reply) = http(&sock, "PUT", "/snapshot/load", Some(&body));
        assert_eq!(code, 204, "{mode}: {reply}");
        // The VM stays paused; its memory file is truncated under it.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&mem)
            .unwrap()
            .set_len(64 << 10)
            .unwrap();
        let (out_state, out_mem) = (
            s.path(&format!("{mode}2.state")),
            s.path(&format!("{mode}2.mem")),
        );
        let body = format!(
            r#"{{"snapshot_path": "{}", "mem_file_path": "{}"}}"#,
            out_state.display(),
            out_mem.display()
        );
        let (code, reply) = http(&sock, "PUT", "/snapshot/create", Some(&body));
        assert_eq!(code, 400, "{mode}: {reply}");
        assert!(reply.contains("changed under it"), "{mode}: {reply}");
        assert!(reply.contains("truncated"), "{mode}: {reply}");
        assert!(
            !out_state.exists() && !out_mem.exists(),
            "{mode}: files left"
        );
    }
}

/// The key reaches the VMM processes a keyed VMM starts: a clone of a VM
/// started with `--snapshot-key-file` signs its own snapshots (the clone
/// process inherits SPORE_SNAPSHOT_KEY_FILE), so they need the key to be
/// read, and with it they restore.
#[test]
fn kvm_a_clone_of_a_keyed_vmm_signs_its_snapshots_with_the_same_key() {
    require_kvm();
    let s = Scratch::new("integrity-key-clone");
    let key = s.path("key");
    std::fs::write(&key, [0x5au8; 32]).unwrap();
    let kf = [OsStr::new("--snapshot-key-file"), key.as_os_str()];
    let sock = s.path("src.sock");
    let (_src, rx) = boot_snaptest_args(&sock, &kf, 64, false, "mib=1 rounds=150 sleep_ms=20", &[]);
    read_until(&rx, "count 1");
    let (code, reply) = http(
        &sock,
        "PUT",
        "/clone",
        Some(r#"{"count": 1, "mode": "continue"}"#),
    );
    assert_eq!(code, 200, "PUT /clone: {reply}");
    let report: serde_json::Value = serde_json::from_str(&reply).unwrap();
    let clone_sock = PathBuf::from(report["clones"][0]["socket"].as_str().unwrap());
    let clone_pid =
        i32::try_from(report["clones"][0]["pid"].as_i64().unwrap()).expect("a pid fits i32");
    struct KillOnDrop(i32);
    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            // SAFETY: kill(2) of the clone's pid from its report.
            unsafe { libc::kill(self.0, libc::SIGKILL) };
        }
    }
    let _clone = KillOnDrop(clone_pid);
    wait_for_path(&clone_sock, std::time::Duration::from_secs(10));

    let (state, mem) = (s.path("clone.state"), s.path("clone.mem"));
    let o = spore()
        .args(["snapshot", "create"])
        .arg(&clone_sock)
        .arg("--state")
        .arg(&state)
        .arg("--mem")
        .arg(&mem)
        .arg("--stop")
        .output()
        .unwrap();
    assert!(o.status.success(), "snapshot create: {}", stderr_of(&o));
    let o = spore()
        .args(["snapshot", "inspect"])
        .arg(&state)
        .output()
        .unwrap();
    refused(&o, "carries a MAC");
    restored_ok(
        &restore(&kf, &state, &mem, &[]),
        "the clone's snapshot, with the source's key",
    );
}
