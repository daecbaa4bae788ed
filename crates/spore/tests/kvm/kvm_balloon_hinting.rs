//! Host-KVM tier: balloon free page hinting through the API, answered as the
//! reference Firecracker answers. The same requests go to spore (as
//! `firecracker`, seccomp on) and to the reference binary, both booting the
//! `boot-mark` unikernel with a balloon that offers hinting; every status code
//! must match. The unikernel has no balloon driver, so after boot the device
//! is not activated: a run cannot start or stop (400), the status answers
//! the initial commands. Hinting itself (a Linux driver) is checked in the
//! balloon unit tests and the nested tier (`tests/nested/scenarios/balloon.sh`).

use std::path::PathBuf;

use crate::common::fc::{self, ApiVmm};
use crate::common::*;

fn reference_fc() -> PathBuf {
    let p = fc::reference_dir().join("firecracker/firecracker");
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
fn both(sp: &ApiVmm, fc: &ApiVmm, steps: &[Step]) -> Vec<((u16, String), (u16, String))> {
    steps
        .iter()
        .map(|&(m, p, b)| {
            let s = http_by_length(&sp.sock, m, p, b);
            let f = http_by_length(&fc.sock, m, p, b);
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
    let sp = fc::launch(&link, &s.path("spore"), &[]);
    let fc = fc::launch(&reference_fc(), &s.path("fc"), &["--no-seccomp"]);

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
    let (code, body) = http_by_length(&sp.sock, "GET", "/balloon/hinting/status", None);
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v, serde_json::json!({"host_cmd": 0, "guest_cmd": null}));
}
