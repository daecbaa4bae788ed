//! Host-KVM tier: the balloon API through the real `spore` binary. The
//! unikernel does not drive the balloon, so this checks what the VMM owns:
//! configuration before boot, the run-time target, statistics settings and
//! the refusals, each answered as Firecracker does.

use crate::common::*;

#[test]
fn kvm_balloon_api() {
    require_kvm();
    let dir = Scratch::new("balloon");
    let sock = dir.path("api.sock");
    let child = spawn_vmm(&sock);

    // Before boot: no balloon yet, then one, checked against the memory.
    let (code, body) = http(&sock, "GET", "/balloon", None);
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("fault_message"), "{body}");
    let boot = format!(
        r#"{{"kernel_image_path": "{}", "boot_args": "secs=3"}}"#,
        uk_image("idle").display()
    );
    assert_eq!(http(&sock, "PUT", "/boot-source", Some(&boot)).0, 204);
    let machine = r#"{"vcpu_count": 1, "mem_size_mib": 64}"#;
    assert_eq!(http(&sock, "PUT", "/machine-config", Some(machine)).0, 204);
    let too_big = r#"{"amount_mib": 65, "deflate_on_oom": false}"#;
    assert_eq!(http(&sock, "PUT", "/balloon", Some(too_big)).0, 400);
    let (code, body) = http(
        &sock,
        "PUT",
        "/balloon",
        Some(r#"{"amount_mib": 8, "deflate_on_oom": true, "stats_polling_interval_s": 1}"#),
    );
    assert_eq!(code, 204, "{body}");
    let (code, body) = http(&sock, "GET", "/balloon", None);
    assert_eq!(code, 200);
    assert!(body.contains(r#""amount_mib":8"#), "{body}");
    assert_eq!(
        http(&sock, "GET", "/balloon/statistics", None).0,
        400,
        "statistics need a running VM"
    );
    assert_eq!(
        http(
            &sock,
            "PUT",
            "/actions",
            Some(r#"{"action_type": "InstanceStart"}"#)
        )
        .0,
        204
    );

    // Running: the target moves, the driver (absent here) has not acted.
    assert_eq!(
        http(&sock, "PATCH", "/balloon", Some(r#"{"amount_mib": 16}"#)).0,
        204
    );
    let (code, body) = http(&sock, "GET", "/balloon", None);
    assert_eq!(code, 200);
    for want in [
        r#""amount_mib":16"#,
        r#""target_pages":4096"#,
        r#""actual_pages":0"#,
        r#""deflate_on_oom":true"#,
    ] {
        assert!(body.contains(want), "{want} in {body}");
    }
    let (code, body) = http(&sock, "GET", "/balloon/statistics", None);
    assert_eq!(code, 200, "{body}");
    assert!(body.contains(r#""target_mib":16"#), "{body}");
    for (method, path, bad) in [
        ("PATCH", "/balloon", r#"{"amount_mib": 65}"#),
        ("PATCH", "/balloon", r#"{"amount_mib": -1}"#),
        (
            "PATCH",
            "/balloon/statistics",
            r#"{"stats_polling_interval_s": 0}"#,
        ),
        (
            "PUT",
            "/balloon",
            r#"{"amount_mib": 1, "deflate_on_oom": true}"#,
        ),
    ] {
        let (code, body) = http(&sock, method, path, Some(bad));
        assert_eq!(code, 400, "{method} {path} {bad}: {body}");
        assert!(body.contains("fault_message"), "{body}");
    }
    assert_eq!(
        http(
            &sock,
            "PATCH",
            "/balloon/statistics",
            Some(r#"{"stats_polling_interval_s": 5}"#)
        )
        .0,
        204
    );
    assert!(http(&sock, "GET", "/balloon", None)
        .1
        .contains(r#""stats_polling_interval_s":5"#));

    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr_of(&out));
}
