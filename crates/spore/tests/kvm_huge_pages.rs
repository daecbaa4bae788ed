//! `huge_pages: "2M"` on host KVM: guest RAM on 2 MiB hugetlbfs pages,
//! reserved at build time; a clean refusal when the host has too few; a
//! Full snapshot works, a Diff one and a restore are refused as Firecracker
//! refuses them (its restore needs a UFFD backend serving huge pages).
//!
//! The host's huge page pool is set through /proc/sys/vm/nr_hugepages (as
//! root) and put back to what it was, so the whole scenario is one test.

mod common;

use std::path::Path;

use common::*;

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

fn call(sock: &Path, method: &str, path: &str, body: &str) -> (u16, String) {
    http(sock, method, path, Some(body))
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

    let sock = dir.path("load.sock");
    let _vmm = spawn_vmm(&sock);
    let (code, reply) = call(
        &sock,
        "PUT",
        "/snapshot/load",
        &format!(
            r#"{{"snapshot_path": "{}", "mem_file_path": "{}", "resume_vm": true}}"#,
            state.display(),
            mem.display()
        ),
    );
    assert_eq!(code, 400, "{reply}");
    assert!(reply.contains("huge_pages"), "{reply}");
    assert_eq!(meminfo("HugePages_Free"), 40);
}
