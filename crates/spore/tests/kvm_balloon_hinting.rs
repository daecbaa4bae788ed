//! Host-KVM tier: balloon free page hinting through the API, answered as the
//! reference Firecracker answers. The same requests go to spore (as
//! `firecracker`, seccomp on) and to the reference binary, both booting the
//! `boot-mark` unikernel with a balloon that offers hinting; every status code
//! must match. The unikernel has no balloon driver, so after boot the device
//! is not activated: a run cannot start or stop (400), the status answers
//! the initial commands. Hinting itself (a Linux driver) is checked in the
//! balloon unit tests and the nested tier (`tests/nested/scenarios/balloon.sh`).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;

/// A VMM child killed on drop.
struct Vmm {
    child: Child,
    sock: PathBuf,
}

impl Drop for Vmm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn launch(bin: &Path, dir: &Path, extra: &[&str]) -> Vmm {
    std::fs::create_dir_all(dir).unwrap();
    let sock = dir.join("api.sock");
    let child = Command::new(bin)
        .arg("--api-sock")
        .arg(&sock)
        .args(extra)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("start {}: {e}", bin.display()));
    wait_for_path(&sock, Duration::from_secs(10));
    Vmm { child, sock }
}

fn reference_fc() -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/reference/firecracker/firecracker");
    assert!(
        p.exists(),
        "this test needs the reference Firecracker at {} (as the swagger replay does)",
        p.display()
    );
    p
}

/// `(method, path, body)` of one step.
type Step<'a> = (&'a str, &'a str, Option<&'a str>);

/// Sends the steps to both VMMs; the codes must match. Returns both answers.
fn both(sp: &Vmm, fc: &Vmm, steps: &[Step]) -> Vec<((u16, String), (u16, String))> {
    steps
        .iter()
        .map(|&(m, p, b)| {
            let s = http(&sp.sock, m, p, b);
            let f = http(&fc.sock, m, p, b);
            assert_eq!(
                s.0, f.0,
                "{m} {p} {b:?}: spore {} {}, Firecracker {} {}",
                s.0, s.1, f.0, f.1
            );
            (s, f)
        })
        .collect()
}

#[test]
fn kvm_balloon_hinting_api_matches_firecracker() {
    require_kvm();
    let s = Scratch::new("balloon-hinting");
    let link = s.path("firecracker");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_spore"), &link).unwrap();
    // spore with its seccomp filters on; the reference as the replay runs it.
    let sp = launch(&link, &s.path("spore"), &[]);
    let fc = launch(&reference_fc(), &s.path("fc"), &["--no-seccomp"]);

    // Before boot: Firecracker serves none of the three yet.
    for ((code, body), _) in both(
        &sp,
        &fc,
        &[
            ("PATCH", "/balloon/hinting/start", Some("{}")),
            ("GET", "/balloon/hinting/status", None),
            ("PATCH", "/balloon/hinting/stop", None),
            // A body of the wrong type is refused before the phase is looked at.
            (
                "PATCH",
                "/balloon/hinting/start",
                Some(r#"{"acknowledge_on_stop": 3}"#),
            ),
        ],
    ) {
        assert_eq!(code, 400);
        assert!(body.contains("fault_message"), "{body}");
    }

    let kernel = uk_image("boot-mark").display().to_string();
    let boot_source =
        format!(r#"{{"kernel_image_path": "{kernel}", "boot_args": "hold_ms=60000"}}"#);
    let boot: [Step; 5] = [
        ("PUT", "/boot-source", Some(&boot_source)),
        (
            "PUT",
            "/machine-config",
            Some(r#"{"vcpu_count": 1, "mem_size_mib": 64}"#),
        ),
        (
            "PUT",
            "/balloon",
            Some(r#"{"amount_mib": 0, "deflate_on_oom": false, "free_page_hinting": true}"#),
        ),
        ("GET", "/balloon", None),
        (
            "PUT",
            "/actions",
            Some(r#"{"action_type": "InstanceStart"}"#),
        ),
    ];
    let answers = both(&sp, &fc, &boot);
    for ((code, body), (_, fc_body)) in &answers {
        assert!(*code == 204 || *code == 200, "{body}");
        if *code == 200 {
            assert!(body.contains(r#""free_page_hinting":true"#), "{body}");
            assert!(fc_body.contains(r#""free_page_hinting":true"#), "{fc_body}");
        }
    }

    // Running, no driver: the status is the initial one, byte for byte.
    let answers = both(&sp, &fc, &[("GET", "/balloon/hinting/status", None)]);
    let ((code, body), (_, fc_body)) = &answers[0];
    assert_eq!(*code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    let fv: serde_json::Value = serde_json::from_str(fc_body).unwrap();
    assert_eq!(v, serde_json::json!({"host_cmd": 0, "guest_cmd": null}));
    assert_eq!(v, fv);

    // Start and stop need the guest's driver; both refuse.
    for ((code, body), (_, fc_body)) in both(
        &sp,
        &fc,
        &[
            ("PATCH", "/balloon/hinting/start", Some("{}")),
            ("PATCH", "/balloon/hinting/start", None),
            (
                "PATCH",
                "/balloon/hinting/start",
                Some(r#"{"acknowledge_on_stop": false}"#),
            ),
            ("PATCH", "/balloon/hinting/stop", None),
        ],
    ) {
        assert_eq!(code, 400, "{body}");
        assert!(body.contains("not activated"), "{body}");
        assert!(fc_body.contains("not activated"), "{fc_body}");
    }
    for ((code, body), _) in both(
        &sp,
        &fc,
        &[(
            "PATCH",
            "/balloon/hinting/start",
            Some(r#"{"acknowledge_on_stop": "yes"}"#),
        )],
    ) {
        assert_eq!(code, 400, "{body}");
        assert!(body.contains("acknowledge_on_stop"), "{body}");
    }
    // The refusals left no run behind.
    let (code, body) = http(&sp.sock, "GET", "/balloon/hinting/status", None);
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v, serde_json::json!({"host_cmd": 0, "guest_cmd": null}));
}
/// One request; the answer is read by its Content-Length, since Firecracker
/// keeps the connection open whatever `Connection: close` says.
fn http(sock: &Path, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    use std::io::{BufRead, BufReader, Read, Write};
    let mut s = std::os::unix::net::UnixStream::connect(sock).expect("connect to API socket");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let body = body.unwrap_or("");
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nAccept: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut r = BufReader::new(s);
    let mut head = String::new();
    let mut len = 0usize;
    loop {
        let mut line = String::new();
        let n = r
            .read_line(&mut line)
            .unwrap_or_else(|e| panic!("{method} {path}: no answer: {e}"));
        if n == 0 || line == "\r\n" {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                len = v.trim().parse().unwrap_or(0);
            }
        }
        head.push_str(&line);
    }
    let mut b = vec![0u8; len];
    r.read_exact(&mut b)
        .unwrap_or_else(|e| panic!("{method} {path}: short body: {e}"));
    let (code, _) = status_and_body(&head);
    (code, String::from_utf8_lossy(&b).into_owned())
}
