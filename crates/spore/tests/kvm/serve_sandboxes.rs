//! The sandbox API's refusals, without a guest (Linux sandboxes boot in the
//! nested tier: tests/nested/scenarios/sandbox-envd.sh): API keys per
//! account, E2B's error bodies for a missing sandbox or template, malformed
//! requests and bounds (egress rules spore cannot enforce, a logs query), a
//! template whose zygote cannot boot, the proxy for a sandbox that is not
//! there; nothing is left on disk by a failed create.

use crate::common::serve::{http, Daemon, Response};
use crate::common::Scratch;

const KEY_A: &str = "e2b_0000000000000000000000000000000000000a11";
const KEY_B: &str = "e2b_0000000000000000000000000000000000000b22";

fn call(d: &Daemon, method: &str, path: &str, body: &str, key: Option<&str>) -> Response {
    let addr = d
        .sandbox_addr
        .as_deref()
        .expect("the sandbox API's address");
    let mut headers = vec![("Content-Type", "application/json")];
    if let Some(k) = key {
        headers.push(("X-API-Key", k));
    }
    http(addr, method, path, body.as_bytes(), &headers)
}

/// E2B's error body: `{"code": status, "message": ...}`; the message.
fn refused(r: &Response, status: u16) -> String {
    assert_eq!(r.status, status, "{}", r.text());
    let v = r.json();
    assert_eq!(v["code"], status, "{v}");
    v["message"].as_str().expect("a message").to_string()
}

/// autoResume wakes only a sandbox its timeout pauses.
fn auto_resume_needs_auto_pause(d: &Daemon) {
    let m = refused(
        &call(
            d,
            "POST",
            "/v2/sandboxes",
            r#"{"templateID": "base", "autoResume": {"enabled": true}}"#,
            Some(KEY_A),
        ),
        400,
    );
    assert!(m.contains("autoResume needs autoPause"), "{m}");
}

/// Egress rules spore cannot enforce are refused before anything starts,
/// and so is a logs query it cannot take.
fn refuses_what_it_cannot_enforce(d: &Daemon) {
    for (network, says) in [
        (
            r#"{"allowOut": ["pypi.org"], "denyOut": ["0.0.0.0/0"]}"#,
            "domain names",
        ),
        (r#"{"denyOut": ["::/0"]}"#, "not an IPv4 address"),
        (
            r#"{"egressProxy": {"address": "10.0.0.1:3128"}}"#,
            "egressProxy",
        ),
    ] {
        let body = format!(r#"{{"templateID": "base", "network": {network}}}"#);
        let m = refused(&call(d, "POST", "/v2/sandboxes", &body, Some(KEY_A)), 400);
        assert!(m.contains(says), "{network}: {m}");
    }
    // A logs query it cannot take.
    refused(
        &call(
            d,
            "GET",
            "/v2/sandboxes/x/logs?direction=sideways",
            "",
            Some(KEY_A),
        ),
        400,
    );
}

#[test]
fn serve_sandbox_api_refuses_what_it_must() {
    let dir = Scratch::new("serve-sbx");
    // A template whose kernel is no kernel: its zygote cannot boot.
    std::fs::write(dir.path("vmlinux"), b"not a kernel").unwrap();
    std::fs::write(dir.path("rootfs.ext4"), b"not an image").unwrap();
    let template = dir.path("base.toml");
    std::fs::write(
        &template,
        format!(
            "name = \"base\"\nkernel = \"{}\"\nrootfs = \"{}\"\n",
            dir.path("vmlinux").display(),
            dir.path("rootfs.ext4").display()
        ),
    )
    .unwrap();
    let keys = dir.path("keys.toml");
    std::fs::write(
        &keys,
        format!(
            "[[keys]]\naccess_key_id = \"A\"\nsecret_access_key = \"a\"\naccount_id = \"111111111111\"\nsandbox_api_key = \"{KEY_A}\"\n\
             [[keys]]\naccess_key_id = \"B\"\nsecret_access_key = \"b\"\naccount_id = \"222222222222\"\nsandbox_api_key = \"{KEY_B}\"\n"
        ),
    )
    .unwrap();
    let state = dir.path("state");
    let d = Daemon::start(
        &state,
        &[
            "--auth",
            keys.to_str().unwrap(),
            "--sandbox-listen",
            "127.0.0.1:0",
            "--sandbox-template",
            template.to_str().unwrap(),
        ],
    );

    // Keys: none or a wrong one is 401; a right one sees its (no) sandboxes.
    refused(&call(&d, "GET", "/v2/sandboxes", "", None), 401);
    let wrong = format!("e2b_{}", "f".repeat(40));
    refused(&call(&d, "GET", "/v2/sandboxes", "", Some(&wrong)), 401);
    let r = call(&d, "GET", "/v2/sandboxes", "", Some(KEY_A));
    assert_eq!(
        (r.status, r.json()),
        (200, serde_json::json!([])),
        "{}",
        r.text()
    );
    let r = call(&d, "GET", "/sandboxes", "", Some(KEY_B));
    assert_eq!(
        (r.status, r.json()),
        (200, serde_json::json!([])),
        "{}",
        r.text()
    );

    // Malformed requests and bounds: 400.
    refused(&call(&d, "POST", "/v2/sandboxes", "{", Some(KEY_A)), 400);
    refused(
        &call(
            &d,
            "POST",
            "/v2/sandboxes",
            r#"{"templateID": 7}"#,
            Some(KEY_A),
        ),
        400,
    );
    let too_long = r#"{"templateID": "base", "timeout": 90000}"#;
    refused(
        &call(&d, "POST", "/v2/sandboxes", too_long, Some(KEY_A)),
        400,
    );
    auto_resume_needs_auto_pause(&d);
    refuses_what_it_cannot_enforce(&d);
    refused(
        &call(&d, "GET", "/v2/sandboxes?state=asleep", "", Some(KEY_A)),
        400,
    );
    refused(
        &call(&d, "GET", "/v2/sandboxes?limit=0", "", Some(KEY_A)),
        400,
    );

    // A template that does not exist is named in the 404.
    let m = refused(
        &call(
            &d,
            "POST",
            "/v2/sandboxes",
            r#"{"templateID": "nope"}"#,
            Some(KEY_A),
        ),
        404,
    );
    assert!(m.contains("nope"), "{m}");
    // One whose zygote cannot boot: 500 naming it; the daemon serves on and
    // the failed create left nothing.
    let m = refused(
        &call(
            &d,
            "POST",
            "/v2/sandboxes",
            r#"{"templateID": "base"}"#,
            Some(KEY_A),
        ),
        500,
    );
    assert!(m.contains("template base could not start"), "{m}");
    let left: Vec<_> = std::fs::read_dir(state.join("sbx")).unwrap().collect();
    assert!(left.is_empty(), "a failed create left {left:?}");

    // A missing sandbox is 404 for every operation, and for the proxy.
    for (method, path, body) in [
        ("GET", "/sandboxes/nosuchsandbox", ""),
        ("DELETE", "/sandboxes/nosuchsandbox", ""),
        ("POST", "/sandboxes/nosuchsandbox/pause", ""),
        ("POST", "/sandboxes/nosuchsandbox/resume", "{}"),
        (
            "POST",
            "/v2/sandboxes/nosuchsandbox/connect",
            r#"{"timeout": 10}"#,
        ),
        (
            "POST",
            "/sandboxes/nosuchsandbox/timeout",
            r#"{"timeout": 10}"#,
        ),
        ("POST", "/sandboxes/nosuchsandbox/fork", r#"{"count": 2}"#),
        ("GET", "/sandboxes/nosuchsandbox/logs", ""),
        ("GET", "/v2/sandboxes/nosuchsandbox/logs?limit=5", ""),
        ("PUT", "/sandboxes/nosuchsandbox/network", "{}"),
    ] {
        let m = refused(&call(&d, method, path, body, Some(KEY_A)), 404);
        assert!(m.contains("nosuchsandbox"), "{method} {path}: {m}");
    }
    refused(
        &call(
            &d,
            "POST",
            "/sandboxes/x/fork",
            r#"{"count": 1000}"#,
            Some(KEY_A),
        ),
        400,
    );
    let addr = d.sandbox_addr.as_deref().unwrap();
    let r = http(
        addr,
        "GET",
        "/health",
        b"",
        &[
            ("E2b-Sandbox-Id", "nosuchsandbox"),
            ("E2b-Sandbox-Port", "49983"),
        ],
    );
    assert!(refused(&r, 404).contains("nosuchsandbox"));
    refused(&call(&d, "GET", "/no/such/route", "", Some(KEY_A)), 404);
}
