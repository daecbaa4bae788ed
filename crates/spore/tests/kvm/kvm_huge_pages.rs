//! `huge_pages: "2M"` on host KVM: guest RAM on 2 MiB hugetlbfs pages,
//! reserved at build time; a clean refusal when the host has too few; a
//! Full snapshot works, a Diff one is refused as Firecracker refuses it.
//! Restores go where Firecracker allows them: through userfaultfd (the
//! built-in handler, or an external one told the 2 MiB page size) into new
//! hugetlbfs RAM, the guest's memory intact; the File backend and clones
//! are refused, and so is a restore when the host has too few huge pages.
//!
//! The host's huge page pool is set through /proc/sys/vm/nr_hugepages (as
//! root) and put back to what it was, so the whole scenario is one test.

use std::path::Path;

use crate::common::*;

const NR: &str = "/proc/sys/vm/nr_hugepages";

/// Puts the host's huge page count back when dropped.
struct Pool(String);

impl Pool {
    fn take() -> Pool {
        let old = std::fs::read_to_string(NR)
            .unwrap_or_else(|e| panic!("{NR}: {e} (this test needs hugetlbfs)"));
        Pool(old.trim().to_string())
    }

    fn set(&self, n: u64) {
        std::fs::write(NR, n.to_string())
            .unwrap_or_else(|e| panic!("cannot set {NR} to {n}: {e} (this test must run as root)"));
        assert_eq!(
            meminfo("HugePages_Total"),
            n,
            "the host did not give {n} huge pages"
        );
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let _ = std::fs::write(NR, &self.0);
    }
}

fn meminfo(key: &str) -> u64 {
    let info = std::fs::read_to_string("/proc/meminfo").unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {key} in /proc/meminfo"))
}

fn configure(sock: &Path) {
    for (path, body) in [
        (
            "/boot-source",
            format!(
                r#"{{"kernel_image_path": "{}", "boot_args": "rounds=100000 sleep_ms=20"}}"#,
                uk_image("cloneid").display()
            ),
        ),
        (
            "/machine-config",
            r#"{"vcpu_count": 1, "mem_size_mib": 64, "huge_pages": "2M"}"#.to_string(),
        ),
    ] {
        let (code, reply) = call(sock, "PUT", path, &body);
        assert_eq!(code, 204, "PUT {path}: {reply}");
    }
}

#[test]
fn huge_page_ram_boots_snapshots_and_refuses_what_firecracker_refuses() {
    require_kvm();
    // The host's huge page pool is resized: no other VM may start meanwhile.
    host::alone();
    let pool = Pool::take();
    let dir = Scratch::new("hugepages");

    // Firecracker's configuration rules.
    {
        let sock = dir.path("cfg.sock");
        let _vmm = spawn_vmm(&sock);
        let (code, reply) = call(
            &sock,
            "PUT",
            "/machine-config",
            r#"{"vcpu_count": 1, "mem_size_mib": 65, "huge_pages": "2M"}"#,
        );
        assert_eq!(code, 400);
        assert!(
            reply.contains("not a multiple of the configured page size"),
            "{reply}"
        );
        let (code, reply) = call(
            &sock,
            "PUT",
            "/machine-config",
            r#"{"vcpu_count": 1, "mem_size_mib": 64, "huge_pages": "1G"}"#,
        );
        assert_eq!(code, 400, "{reply}");
    }

    // No free huge pages: InstanceStart fails with a message, the VMM lives.
    pool.set(0);
    {
        let sock = dir.path("none.sock");
        let _vmm = spawn_vmm(&sock);
        configure(&sock);
        let (code, reply) = call(
            &sock,
            "PUT",
            "/actions",
            r#"{"action_type": "InstanceStart"}"#,
        );
        assert_eq!(code, 400, "{reply}");
        assert!(
            reply.contains("not enough free 2 MiB huge pages"),
            "{reply}"
        );
        assert!(reply.contains("32 needed, the host has 0 free"), "{reply}");
        let (code, _) = http(&sock, "GET", "/", None);
        assert_eq!(code, 200, "the VMM must survive a failed start");
    }

    pool.set(40);
    let sock = dir.path("api.sock");
    let (vmm, rx) = spawn_vmm_lines(&sock);
    configure(&sock);
    let (code, reply) = call(
        &sock,
        "PUT",
        "/actions",
        r#"{"action_type": "InstanceStart"}"#,
    );
    assert_eq!(code, 204, "{reply}");
    read_until(&rx, "rand gen=0 round=3 ");
    // All 32 pages of guest RAM are the VM's: in use or reserved for it.
    let (total, free, rsvd) = (
        meminfo("HugePages_Total"),
        meminfo("HugePages_Free"),
        meminfo("HugePages_Rsvd"),
    );
    eprintln!("huge pages: total {total} free {free} reserved {rsvd}");
    assert_eq!(
        total - free + rsvd,
        32,
        "total {total} free {free} rsvd {rsvd}"
    );
    assert!(total - free > 0, "the guest touched no huge page");

    // A Full snapshot works; Diff and restore are refused.
    let (state, mem) = (dir.path("vm.state"), dir.path("vm.mem"));
    snapshot_create(&sock, &state, &mem, false, false);
    assert!(mem.metadata().unwrap().len() >= 64 << 20);
    let (code, reply) = call(&sock, "PATCH", "/vm", r#"{"state": "Paused"}"#);
    assert_eq!(code, 204, "{reply}");
    let (code, reply) = call(
        &sock,
        "PUT",
        "/snapshot/create",
        &format!(
            r#"{{"snapshot_type": "Diff", "snapshot_path": "{}", "mem_file_path": "{}"}}"#,
            dir.path("d.state").display(),
            dir.path("d.mem").display()
        ),
    );
    assert_eq!(code, 400, "{reply}");
    assert!(
        reply.contains("Diff snapshots are not supported"),
        "{reply}"
    );
    let (code, reply) = call(&sock, "PATCH", "/vm", r#"{"state": "Resumed"}"#);
    assert_eq!(code, 204, "{reply}");
    let last = read_until(&rx, "rand gen=0 ");
    assert!(!last.is_empty());
    drop(vmm);
    // The pages went back to the host with the VMM.
    let t = std::time::Instant::now();
    while meminfo("HugePages_Free") != 40 {
        assert!(t.elapsed().as_secs() < 10, "huge pages not given back");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }

    restores(&pool, &dir);
}

/// Waits until every huge page of the pool is free again (the VMMs using
/// them exited).
fn all_free(n: u64) {
    let t = std::time::Instant::now();
    while meminfo("HugePages_Free") != n {
        assert!(t.elapsed().as_secs() < 10, "huge pages not given back");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The guest-RAM mapping of process `pid` (the 2 MiB hugetlbfs memfd) in
/// /proc/PID/smaps: its size and KernelPageSize, in kB.
fn ram_mapping(pid: u32) -> (u64, u64) {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let mut found = None;
    let mut in_ram = false;
    let mut size = 0;
    for l in smaps.lines() {
        // A mapping's header line starts with its address range.
        let header = l.split_whitespace().next().is_some_and(|t| {
            t.contains('-') && t.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
        });
        if header {
            in_ram = l.contains("spore-guest-ram-2m");
        }
        if !in_ram {
            continue;
        }
        let num = |k: &str| -> Option<u64> {
            l.strip_prefix(k)?
                .trim()
                .strip_suffix("kB")?
                .trim()
                .parse()
                .ok()
        };
        if let Some(v) = num("Size:") {
            size = v;
        }
        if let Some(v) = num("KernelPageSize:") {
            assert!(found.is_none(), "two guest RAM mappings in {pid}'s smaps");
            found = Some((size, v));
        }
    }
    found.unwrap_or_else(|| panic!("no spore-guest-ram-2m mapping in /proc/{pid}/smaps"))
}

fn load(sock: &Path, body_tail: &str) -> (u16, String) {
    call(sock, "PUT", "/snapshot/load", &format!("{{{body_tail}}}"))
}

/// A restored snaptest guest: it went on counting from `last` and found its
/// whole pattern intact. Returns its lines.
fn continued(rx: &std::sync::mpsc::Receiver<String>, last: u64, what: &str) -> Vec<String> {
    let lines = read_until(rx, "verify");
    assert!(
        !lines.iter().any(|l| l.starts_with("filled")),
        "{what}: the guest restarted: {lines:?}"
    );
    assert_eq!(
        counts(&lines).first().copied(),
        Some(last + 1),
        "{what}: {lines:?}"
    );
    let verify = lines.last().unwrap();
    assert!(verify.starts_with("verify ok"), "{what}: {lines:?}");
    lines
}

/// Snapshot of a snaptest guest on huge pages, restored through the
/// built-in uffd handler, snapshotted again (every huge page faulted in
/// first), restored through an external handler; plus the refusals.
fn restores(pool: &Pool, dir: &Scratch) {
    pool.set(40);
    let mc = r#"{"vcpu_count": 1, "mem_size_mib": 64, "huge_pages": "2M"}"#;
    let sock = dir.path("snap.sock");
    let (mut vmm, rx) = boot_snaptest(
        &sock,
        64,
        false,
        "mib=24 rounds=150 sleep_ms=20",
        &[("/machine-config", mc)],
    );
    let mut seen = read_until(&rx, "count 4");
    let (state, mem) = (dir.path("a.state"), dir.path("a.mem"));
    snapshot_create(&sock, &state, &mem, false, true);
    vmm.wait().unwrap();
    seen.extend(drain(&rx));
    let last = *counts(&seen).iter().max().unwrap();
    all_free(40);
    let uffd = |m: &Path| {
        format!(
            r#""snapshot_path": "{}", "mem_backend": {{"backend_type": "Uffd", "backend_path": "{}"}}"#,
            state.display(),
            m.display()
        )
    };

    // Refused before anything is reserved: File (Firecracker's message), a
    // clone, too few free huge pages (the VMM survives each).
    let sock = dir.path("refuse.sock");
    let _refusing = spawn_vmm(&sock);
    for body in [
        format!(
            r#""snapshot_path": "{}", "mem_backend": {{"backend_type": "File", "backend_path": "{}"}}"#,
            state.display(),
            mem.display()
        ),
        format!(
            r#""snapshot_path": "{}", "mem_file_path": "{}", "resume_vm": true"#,
            state.display(),
            mem.display()
        ),
    ] {
        let (code, reply) = load(&sock, &body);
        assert_eq!(code, 400, "{reply}");
        assert!(
            reply.contains("Cannot restore hugetlbfs backed snapshot by mapping the memory file. Please use uffd."),
            "{reply}"
        );
    }
    let (code, reply) = load(&sock, &format!(r#"{}, "clone_generation": 1"#, uffd(&mem)));
    assert_eq!(code, 400, "{reply}");
    assert!(reply.contains("cannot be restored as a clone"), "{reply}");
    pool.set(20);
    let (code, reply) = load(&sock, &uffd(&mem));
    assert_eq!(code, 400, "{reply}");
    assert!(
        reply.contains("not enough free 2 MiB huge pages")
            && reply.contains("32 needed, the host has 20 free"),
        "{reply}"
    );
    assert_eq!(meminfo("HugePages_Free"), 20);
    let (code, _) = http(&sock, "GET", "/", None);
    assert_eq!(code, 200, "the VMM must survive refused loads");
    pool.set(40);

    // The built-in handler: RAM on huge pages again, filled 2 MiB a fault.
    let sock = dir.path("builtin.sock");
    let (vmm, rx) = spawn_vmm_lines(&sock);
    let (code, reply) = load(&sock, &format!(r#"{}, "resume_vm": true"#, uffd(&mem)));
    assert_eq!(code, 204, "{reply}");
    let (size_kb, page_kb) = ram_mapping(vmm.id());
    assert_eq!(
        (size_kb, page_kb),
        (64 << 10, 2048),
        "guest RAM mapping (size, KernelPageSize) in kB"
    );
    let (total, free, rsvd) = (
        meminfo("HugePages_Total"),
        meminfo("HugePages_Free"),
        meminfo("HugePages_Rsvd"),
    );
    eprintln!("restored: huge pages total {total} free {free} reserved {rsvd}");
    assert_eq!(
        total - free + rsvd,
        32,
        "total {total} free {free} rsvd {rsvd}"
    );
    let mut seen = read_until(&rx, &format!("count {}", last + 3));
    assert_eq!(counts(&seen).first().copied(), Some(last + 1), "{seen:?}");
    // Snapshotted again: the pages the handler has not served yet are
    // faulted in first, so the new memory file holds all of them.
    let (state2, mem2) = (dir.path("b.state"), dir.path("b.mem"));
    snapshot_create(&sock, &state2, &mem2, false, true);
    vmm.into_child().wait().unwrap();
    seen.extend(drain(&rx));
    let last2 = *counts(&seen).iter().max().unwrap();
    all_free(40);

    // An external handler (`spore snapshot uffd-handler`) told 2 MiB pages.
    let hsock = dir.path("handler.sock");
    let handler = spore()
        .args(["snapshot", "uffd-handler", "--sock"])
        .arg(&hsock)
        .arg("--mem")
        .arg(&mem2)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_path(&hsock, std::time::Duration::from_secs(10));
    let sock = dir.path("external.sock");
    let (vmm, rx) = spawn_vmm_lines(&sock);
    let body = format!(
        r#""snapshot_path": "{}", "mem_backend": {{"backend_type": "Uffd", "backend_path": "{}"}}, "resume_vm": true"#,
        state2.display(),
        hsock.display()
    );
    let (code, reply) = load(&sock, &body);
    assert_eq!(code, 204, "{reply}");
    assert_eq!(ram_mapping(vmm.id()).1, 2048);
    let lines = continued(&rx, last2, "external handler");
    let status = vmm.into_child().wait().unwrap();
    assert!(status.success(), "{status:?}");
    let out = handler.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("page size {2097152}"), "{err}");
    let served: u64 = err
        .split("handler served ")
        .nth(1)
        .and_then(|t| t.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("{err}"));
    eprintln!(
        "external handler served {served} faults; guest: {}",
        lines.last().map_or("", |l| l.as_str())
    );
    // 24 MiB of pattern is at least 12 huge pages; 64 MiB at most 32.
    assert!((12..=32).contains(&served), "{served} faults: {err}");
    all_free(40);
}
