//! Host-KVM tier: the tmem API of a running microVM (`GET`/`PUT /tmem`).
//! The guest-side calls are covered in-process by the device tests in
//! `spore-vmm` (real guest memory) and end to end by the unikernel tmem
//! client's tests; here the point is the API against a real VMM process.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::*;

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

#[test]
fn kvm_tmem_api_before_and_after_start() {
    require_kvm();
    let dir = Scratch::new("tmem-api");
    let sock = dir.path("api.sock");
    let child = spore()
        .args(["vmm", "--api-sock"])
        .arg(&sock)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_path(&sock, Duration::from_secs(10));

    let (code, body) = http(&sock, "GET", "/tmem", None);
    assert_eq!(code, 200, "{body}");
    let j = json(&body);
    assert_eq!(j["enabled"], true);
    assert_eq!(j["quota_bytes"], 256u64 << 20);
    assert_eq!(j["compression"], "none");

    // Bad bodies: unknown field, unknown compression, empty update.
    for bad in [r#"{"quota":1}"#, r#"{"compression":"zip"}"#, "{}"] {
        let (code, body) = http(&sock, "PUT", "/tmem", Some(bad));
        assert_eq!(code, 400, "{bad}: {body}");
        assert!(body.contains("fault_message"), "{body}");
    }
    let (code, body) = http(
        &sock,
        "PUT",
        "/tmem",
        Some(r#"{"quota_bytes": 1048576, "compression": "lz4"}"#),
    );
    assert_eq!(code, 204, "{body}");

    let boot = format!(
        r#"{{"kernel_image_path": "{}", "boot_args": "secs=3"}}"#,
        uk_image("idle").display()
    );
    assert_eq!(http(&sock, "PUT", "/boot-source", Some(&boot)).0, 204);
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

    let j = json(&http(&sock, "GET", "/tmem", None).1);
    assert_eq!(j["enabled"], true);
    assert_eq!(j["quota_bytes"], 1u64 << 20);
    assert_eq!(j["compression"], "lz4");
    for counter in [
        "objects",
        "bytes_used",
        "bytes_stored",
        "puts",
        "gets",
        "refused",
    ] {
        assert_eq!(j[counter], 0, "{counter} in {j}");
    }

    // Running: the quota can move both ways; compression is fixed.
    let (code, body) = http(&sock, "PUT", "/tmem", Some(r#"{"compression": "none"}"#));
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("quota_bytes"), "{body}");
    assert_eq!(
        http(&sock, "PUT", "/tmem", Some(r#"{"quota_bytes": 4194304}"#)).0,
        204
    );
    assert_eq!(
        json(&http(&sock, "GET", "/tmem", None).1)["quota_bytes"],
        4u64 << 20
    );
    assert_eq!(
        http(&sock, "PUT", "/tmem", Some(r#"{"quota_bytes": 0}"#)).0,
        204
    );
    assert_eq!(json(&http(&sock, "GET", "/tmem", None).1)["quota_bytes"], 0);

    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr_of(&out));
}
