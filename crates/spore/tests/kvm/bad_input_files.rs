//! Bad files and slow clients (issue 13, item 5): a path the API opens that
//! is a FIFO or a device is refused at once (never blocks, never reads
//! without end), snapshot files replace regular files only and are created
//! 0600, `..` is refused in snapshot paths, stale temporary files of killed
//! VMMs are cleaned, and a slow client neither holds the API nor keeps
//! SIGTERM from stopping the VMM. Tests that reach KVM are named `kvm_*`.

use std::io::{Read, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::common;
use crate::common::*;

/// One request with a short read timeout: (status, body), or (0, "") when
/// no answer came in time (the VMM is blocked).
fn http_within(
    sock: &Path,
    method: &str,
    path: &str,
    body: &str,
    within: Duration,
) -> (u16, String) {
    let mut s = UnixStream::connect(sock).expect("connect to API socket");
    s.set_read_timeout(Some(within)).unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut resp = Vec::new();
    if s.read_to_end(&mut resp).is_err() && resp.is_empty() {
        return (0, String::new());
    }
    common::status_and_body(&String::from_utf8_lossy(&resp))
}

const QUICK: Duration = Duration::from_secs(5);

fn mkfifo(p: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

fn load_body(state: &Path, mem: &Path) -> String {
    format!(
        r#"{{"snapshot_path": "{}", "mem_backend": {{"backend_type": "File", "backend_path": "{}"}}}}"#,
        state.display(),
        mem.display()
    )
}

fn create_body(state: &Path, mem: &Path) -> String {
    format!(
        r#"{{"snapshot_path": "{}", "mem_file_path": "{}"}}"#,
        state.display(),
        mem.display()
    )
}

fn assert_refused(reply: (u16, String), needles: &[&str]) {
    let (code, body) = reply;
    assert_eq!(code, 400, "expected a 400 at once: {code} {body}");
    assert!(body.contains("fault_message"), "{body}");
    for n in needles {
        assert!(body.contains(n), "expected {n:?} in {body}");
    }
}

#[test]
fn snapshot_load_of_a_fifo_or_a_device_is_refused_at_once() {
    let s = Scratch::new("files-load");
    let sock = s.path("api.sock");
    let fifo = s.path("state.fifo");
    mkfifo(&fifo);
    let _vmm = spawn_vmm(&sock);
    let body = load_body(&fifo, &s.path("vm.mem"));
    let fifo_name = fifo.display().to_string();
    assert_refused(
        http_within(&sock, "PUT", "/snapshot/load", &body, QUICK),
        &[&fifo_name, "FIFO"],
    );
    let body = load_body(Path::new("/dev/zero"), &s.path("vm.mem"));
    assert_refused(
        http_within(&sock, "PUT", "/snapshot/load", &body, QUICK),
        &["/dev/zero", "character device"],
    );
    // The VMM still answers.
    assert_eq!(http_within(&sock, "GET", "/", "", QUICK).0, 200);
}

#[test]
fn dotdot_in_snapshot_paths_is_refused() {
    let s = Scratch::new("files-dotdot");
    let sock = s.path("api.sock");
    let _vmm = spawn_vmm(&sock);
    let up = s.path("sub/../vm.state");
    let up_name = up.display().to_string();
    let body = load_body(&up, &s.path("vm.mem"));
    assert_refused(
        http_within(&sock, "PUT", "/snapshot/load", &body, QUICK),
        &[&up_name, ".."],
    );
    let body = create_body(&s.path("vm.state"), &s.path("x/../vm.mem"));
    assert_refused(
        http_within(&sock, "PUT", "/snapshot/create", &body, QUICK),
        &["x/../vm.mem"],
    );
    let body = format!(r#"{{"directory": "{}/.."}}"#, s.0.display());
    assert_refused(
        http_within(&sock, "PUT", "/snapshot/guest-triggered", &body, QUICK),
        &[".."],
    );
}

#[test]
fn snapshot_create_never_replaces_device_nodes_fifos_or_directories() {
    let s = Scratch::new("files-target");
    let sock = s.path("api.sock");
    let _vmm = spawn_vmm(&sock);
    let fifo = s.path("fifo");
    mkfifo(&fifo);
    let link = s.path("null-link");
    std::os::unix::fs::symlink("/dev/null", &link).unwrap();
    let mem = s.path("vm.mem");
    for (target, what) in [
        (Path::new("/dev/null"), "character device"),
        (fifo.as_path(), "FIFO"),
        (s.0.as_path(), "directory"),
        (link.as_path(), "character device"),
    ] {
        let name = target.display().to_string();
        let body = create_body(target, &mem);
        assert_refused(
            http_within(&sock, "PUT", "/snapshot/create", &body, QUICK),
            &[&name, what],
        );
        let body = create_body(&s.path("vm.state"), target);
        assert_refused(
            http_within(&sock, "PUT", "/snapshot/create", &body, QUICK),
            &[&name, what],
        );
    }
    let t = std::fs::metadata("/dev/null").unwrap().file_type();
    assert!(t.is_char_device(), "/dev/null was replaced");
    assert!(std::fs::symlink_metadata(&fifo)
        .unwrap()
        .file_type()
        .is_fifo());
}

#[test]
fn a_slow_body_does_not_hold_the_api() {
    let s = Scratch::new("files-slow");
    let sock = s.path("api.sock");
    let _vmm = spawn_vmm(&sock);
    let mut slow = UnixStream::connect(&sock).unwrap();
    slow.write_all(
        b"PUT /boot-source HTTP/1.1\r\nHost: x\r\nContent-Length: 200\r\n\r\n{\"kernel_image",
    )
    .unwrap();
    let t0 = Instant::now();
    // Another client is served while the first one is still connected.
    assert_eq!(http_within(&sock, "GET", "/", "", QUICK).0, 200);
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    // The slow one is answered 408 (or closed) after the request timeout.
    slow.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut out = Vec::new();
    let _ = slow.read_to_end(&mut out);
    let out = String::from_utf8_lossy(&out);
    assert!(
        t0.elapsed() < Duration::from_secs(9),
        "the slow client was held for {:?}",
        t0.elapsed()
    );
    assert!(out.is_empty() || out.starts_with("HTTP/1.1 408"), "{out}");
}

#[test]
fn sigterm_stops_a_vmm_with_a_slow_client_and_a_fifo_request() {
    let s = Scratch::new("files-sigterm");
    let sock = s.path("api.sock");
    let fifo = s.path("state.fifo");
    mkfifo(&fifo);
    let vmm = spawn_vmm(&sock);
    let mut slow = UnixStream::connect(&sock).unwrap();
    slow.write_all(b"PUT /boot-source HTTP/1.1\r\nHost: x\r\nContent-Length: 200\r\n\r\n{")
        .unwrap();
    // Before the fix, this request blocked the API thread in open().
    let _ = http_within(
        &sock,
        "PUT",
        "/snapshot/load",
        &load_body(&fifo, &s.path("vm.mem")),
        Duration::from_secs(2),
    );
    let mut child = vmm.into_child();
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let t0 = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{status:?}");
            break;
        }
        if t0.elapsed() > QUICK {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the VMM did not stop within {QUICK:?} of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(slow);
    assert!(!sock.exists(), "the API socket was left behind");
}

#[test]
fn kvm_kernel_and_drive_fifos_are_refused_at_once() {
    require_kvm();
    let s = Scratch::new("files-kernel");
    let sock = s.path("api.sock");
    let fifo = s.path("kernel.fifo");
    mkfifo(&fifo);
    let _vmm = spawn_vmm(&sock);
    let body = format!(r#"{{"kernel_image_path": "{}"}}"#, fifo.display());
    assert_eq!(
        http_within(&sock, "PUT", "/boot-source", &body, QUICK).0,
        204
    );
    let fifo_name = fifo.display().to_string();
    let start = r#"{"action_type": "InstanceStart"}"#;
    assert_refused(
        http_within(&sock, "PUT", "/actions", start, QUICK),
        &[&fifo_name, "FIFO"],
    );

    let s2 = Scratch::new("files-drive");
    let sock2 = s2.path("api.sock");
    let _vmm2 = spawn_vmm(&sock2);
    let body = format!(
        r#"{{"kernel_image_path": "{}"}}"#,
        uk_image("idle").display()
    );
    assert_eq!(
        http_within(&sock2, "PUT", "/boot-source", &body, QUICK).0,
        204
    );
    let drive = format!(
        r#"{{"drive_id":"d","path_on_host":"{}","is_root_device":false,"is_read_only":false}}"#,
        fifo.display()
    );
    assert_eq!(
        http_within(&sock2, "PUT", "/drives/d", &drive, QUICK).0,
        204
    );
    assert_refused(
        http_within(&sock2, "PUT", "/actions", start, QUICK),
        &[&fifo_name, "FIFO"],
    );
}

#[test]
fn kvm_snapshot_files_are_private_and_stale_temp_files_are_removed() {
    require_kvm();
    let s = Scratch::new("files-create");
    let sock = s.path("api.sock");
    let (mut vmm, rx) = boot_snaptest(&sock, 64, false, "mib=1 rounds=1000 sleep_ms=20", &[]);
    read_until(&rx, "count 1");
    let paused = r#"{"state": "Paused"}"#;
    assert_eq!(http_within(&sock, "PATCH", "/vm", paused, QUICK).0, 204);
    // What a VMM killed during a snapshot left, and what must stay.
    let stale = s.path(".vm.mem.spore-tmp-4194305");
    let foreign = s.path(".vm.mem.tmp-4194305");
    let live = s.path(&format!(".vm.mem.spore-tmp-{}", std::process::id()));
    for f in [&stale, &foreign, &live] {
        std::fs::write(f, b"left over").unwrap();
    }
    // An existing regular file may be replaced.
    let (state, mem) = (s.path("vm.state"), s.path("vm.mem"));
    std::fs::write(&state, b"old").unwrap();
    let (code, body) = http_within(
        &sock,
        "PUT",
        "/snapshot/create",
        &create_body(&state, &mem),
        Duration::from_secs(30),
    );
    assert_eq!(code, 204, "{body}");
    // The manifest of what was written is at GET /snapshot/last.
    let (code, manifest) = http_within(&sock, "GET", "/snapshot/last", "", QUICK);
    assert_eq!(code, 200, "{manifest}");
    assert!(manifest.contains("\"format_version\""), "{manifest}");
    for f in [&state, &mem] {
        let mode = std::fs::metadata(f).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{} has mode {mode:o}", f.display());
    }
    assert!(!stale.exists(), "a dead process's temp file was left");
    assert!(
        foreign.exists() && live.exists(),
        "another file was removed"
    );
    // The running VM's snapshot into a device node is refused too.
    assert_refused(
        http_within(
            &sock,
            "PUT",
            "/snapshot/create",
            &create_body(&s.path("b.state"), Path::new("/dev/null")),
            QUICK,
        ),
        &["/dev/null", "character device"],
    );
    vmm.kill().unwrap();
    vmm.wait().unwrap();

    // A memory file that is a FIFO is refused at load, at once.
    let s2 = Scratch::new("files-load-mem");
    let sock2 = s2.path("api.sock");
    let fifo = s2.path("mem.fifo");
    mkfifo(&fifo);
    let _vmm2 = spawn_vmm(&sock2);
    let fifo_name = fifo.display().to_string();
    assert_refused(
        http_within(
            &sock2,
            "PUT",
            "/snapshot/load",
            &load_body(&state, &fifo),
            QUICK,
        ),
        &[&fifo_name, "FIFO"],
    );
}
