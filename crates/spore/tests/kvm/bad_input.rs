//! Bad input: every case ends in one clear line and a non-zero exit (CLI) or
//! a 4xx with `fault_message` (API), never a panic. Tests that reach KVM are
//! named `kvm_*` so that `make test` can skip them on a host without /dev/kvm.

use std::process::Stdio;
use std::time::Duration;

use crate::common::*;

fn assert_clean_failure(out: &std::process::Output, needle: &str) {
    let err = stderr_of(out);
    assert_eq!(out.status.code(), Some(1), "stderr: {err}");
    assert!(err.contains(needle), "expected {needle:?} in stderr: {err}");
    assert!(!err.contains("panicked"), "panic: {err}");
}

#[test]
fn missing_kernel_file() {
    let out = spore()
        .args(["run", "--kernel", "/nonexistent/vmlinux"])
        .output()
        .unwrap();
    assert_clean_failure(&out, "cannot open kernel image /nonexistent/vmlinux");
}

#[test]
fn vmm_netns_that_does_not_exist() {
    let dir = Scratch::new("netns-missing");
    let out = spore()
        .args(["vmm", "--netns", "/nonexistent/netns/x", "--api-sock"])
        .arg(dir.path("api.sock"))
        .output()
        .unwrap();
    assert_clean_failure(
        &out,
        "--netns /nonexistent/netns/x: cannot open the network namespace file",
    );
    assert!(
        !dir.path("api.sock").exists(),
        "no API before the namespace"
    );
}

#[test]
fn zero_and_huge_memory_and_zero_vcpus() {
    let out = spore()
        .args(["run", "--kernel", "/k", "--mem", "0"])
        .output()
        .unwrap();
    assert_clean_failure(&out, "mem_size_mib must be at least 1");
    let out = spore()
        .args(["run", "--kernel", "/k", "--mem", "50000G"])
        .output()
        .unwrap();
    assert_clean_failure(&out, "exceeds");
    let out = spore()
        .args(["run", "--kernel", "/k", "--vcpus", "0"])
        .output()
        .unwrap();
    assert_clean_failure(&out, "vcpu_count must be between 1 and");
    let out = spore()
        .args(["run", "--kernel", "/k", "--mem", "12Q"])
        .output()
        .unwrap();
    assert_clean_failure(&out, "--mem 12Q");
}

#[test]
fn memory_larger_than_host() {
    // SAFETY: sysconf has no preconditions.
    let host_mib = unsafe {
        libc::sysconf(libc::_SC_PHYS_PAGES) as u64 * libc::sysconf(libc::_SC_PAGESIZE) as u64
    } >> 20;
    let too_big = format!("{}M", host_mib + 1024);
    let out = spore()
        .args(["run", "--kernel", "/k", "--mem", &too_big])
        .output()
        .unwrap();
    assert_clean_failure(&out, "exceeds");
}

#[test]
fn kvm_kernel_that_is_neither_elf_nor_bzimage() {
    require_kvm();
    let dir = Scratch::new("badkernel");
    let k = dir.path("garbage");
    std::fs::write(&k, vec![0x5au8; 64 * 1024]).unwrap();
    let out = spore().args(["run", "--kernel"]).arg(&k).output().unwrap();
    assert_clean_failure(&out, "unknown kernel format");
    let empty = dir.path("empty");
    std::fs::write(&empty, b"").unwrap();
    let out = spore()
        .args(["run", "--kernel"])
        .arg(&empty)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn kvm_disk_that_does_not_exist() {
    require_kvm();
    let out = spore()
        .args([
            "run",
            "--mem",
            "64M",
            "--disk",
            "/nonexistent/disk.img",
            "--kernel",
        ])
        .arg(uk_image("hello"))
        .output()
        .unwrap();
    assert_clean_failure(&out, "/nonexistent/disk.img");
}

#[test]
fn kvm_unikernel_with_two_vcpus_is_refused() {
    require_kvm();
    let out = spore()
        .args(["run", "--vcpus", "2", "--kernel"])
        .arg(uk_image("hello"))
        .output()
        .unwrap();
    assert_clean_failure(&out, "one vCPU");
}

#[test]
fn config_file_errors() {
    let dir = Scratch::new("badcfg");
    let cfg = dir.path("vm.json");
    std::fs::write(&cfg, "{ not json").unwrap();
    let out = spore()
        .args(["vmm", "--config-file"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert_clean_failure(&out, "parsing");
    std::fs::write(
        &cfg,
        r#"{"machine-config": {"vcpu_count": 1, "mem_size_mib": 64, "wings": 2}}"#,
    )
    .unwrap();
    let out = spore()
        .args(["vmm", "--config-file"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert_clean_failure(&out, "wings");
    let out = spore()
        .args(["vmm", "--config-file", "/nonexistent.json"])
        .output()
        .unwrap();
    assert_clean_failure(&out, "/nonexistent.json");
}

#[test]
fn api_rejects_bad_requests_without_dying() {
    let dir = Scratch::new("badapi");
    let sock = dir.path("api.sock");
    let child = spore()
        .args(["vmm", "--api-sock"])
        .arg(&sock)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_path(&sock, Duration::from_secs(10));
    let cases: &[(&str, &str, Option<&str>, u16, &str)] = &[
        (
            "PUT",
            "/machine-config",
            Some("{ nope"),
            400,
            "fault_message",
        ),
        (
            "PUT",
            "/machine-config",
            Some(r#"{"vcpu_count":1,"mem_size_mib":64,"x":1}"#),
            400,
            "x",
        ),
        (
            "PUT",
            "/machine-config",
            Some(r#"{"vcpu_count":0,"mem_size_mib":64}"#),
            400,
            "vcpu_count",
        ),
        (
            "PUT",
            "/machine-config",
            Some(r#"{"vcpu_count":1,"mem_size_mib":0}"#),
            400,
            "mem_size_mib",
        ),
        (
            "PUT",
            "/boot-source",
            Some(r#"{"kernel_image_path": 7}"#),
            400,
            "kernel_image_path",
        ),
        (
            "PUT",
            "/drives/a",
            Some(
                r#"{"drive_id":"b","path_on_host":"/x","is_root_device":false,"is_read_only":true}"#,
            ),
            400,
            "fault_message",
        ),
        (
            "PUT",
            "/vsock",
            Some(r#"{"guest_cid":1,"uds_path":"/tmp/v"}"#),
            400,
            "guest_cid",
        ),
        (
            "PUT",
            "/actions",
            Some(r#"{"action_type":"Explode"}"#),
            400,
            "fault_message",
        ),
        (
            "PATCH",
            "/vm",
            Some(r#"{"state":"Paused"}"#),
            400,
            "not started",
        ),
        ("GET", "/no-such-thing", None, 404, "fault_message"),
        ("DELETE", "/machine-config", None, 405, "fault_message"),
    ];
    for (method, path, body, want, needle) in cases {
        let (code, resp) = http(&sock, method, path, *body);
        assert_eq!(code, *want, "{method} {path} {body:?} -> {resp}");
        assert!(resp.contains(needle), "{method} {path}: {resp}");
    }
    // InstanceStart without a boot source fails cleanly; the VMM stays up.
    let (code, resp) = http(
        &sock,
        "PUT",
        "/actions",
        Some(r#"{"action_type":"InstanceStart"}"#),
    );
    assert_eq!(code, 400, "{resp}");
    assert!(resp.contains("boot-source"), "{resp}");
    assert_eq!(http(&sock, "GET", "/", None).0, 200);
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    assert!(!stderr_of(&out).contains("panicked"));
}

#[test]
fn vsock_forward_bad_listen_address_and_busy_port() {
    let out = spore()
        .args(["vsock", "forward", "--uds", "/tmp/x", "--port", "1"])
        .args(["--listen", "udp:1.2.3.4:5"])
        .output()
        .unwrap();
    // A clap usage error: exit 2, naming the accepted forms.
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
    assert!(stderr_of(&out).contains("expected tcp:HOST:PORT or unix:PATH"));
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap();
    let out = spore()
        .args(["vsock", "forward", "--uds", "/tmp/x", "--port", "1"])
        .arg("--listen")
        .arg(format!("tcp:{addr}"))
        .output()
        .unwrap();
    assert_clean_failure(&out, "Address already in use");
}

#[test]
fn vsock_forward_to_a_missing_vm_closes_the_client() {
    use std::io::Read;
    let dir = Scratch::new("fwd-novm");
    let sock = dir.path("fwd.sock");
    let mut fwd = spore()
        .args(["vsock", "forward", "--uds"])
        .arg(dir.path("no-such-vm.sock"))
        .args(["--port", "6379", "--listen"])
        .arg(format!("unix:{}", sock.display()))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t = std::time::Instant::now();
    let mut c = loop {
        match std::os::unix::net::UnixStream::connect(&sock) {
            Ok(c) => break c,
            Err(e) => assert!(t.elapsed() < Duration::from_secs(10), "{e}"),
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = [0u8; 8];
    // A signal to the test process (another test's child ending) may
    // interrupt the read: read again.
    let n = loop {
        match c.read(&mut buf) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            other => break other.unwrap(),
        }
    };
    assert_eq!(n, 0, "client not closed");
    // The forwarder itself keeps running until told to stop.
    assert!(fwd.try_wait().unwrap().is_none(), "forwarder exited");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(fwd.id() as i32, libc::SIGINT) };
    let out = fwd.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let err = stderr_of(&out);
    assert!(err.contains("no-such-vm.sock"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(!sock.exists());
}

#[test]
fn sandbox_exec_without_a_vm_behind_the_socket() {
    let dir = Scratch::new("sbx-exec-missing");
    let out = spore()
        .args(["sandbox", "exec", "--vsock"])
        .arg(dir.path("none.vsock"))
        .args(["--timeout", "5", "--", "true"])
        .output()
        .unwrap();
    assert_clean_failure(&out, "running it through the envd behind");
    assert_eq!(stderr_of(&out).trim().lines().count(), 1, "one line");
}
