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

/// A daemon with accounts A and B and a template `base` whose kernel is no
/// kernel (its zygote cannot boot); `extra` is more of the template's TOML.
fn daemon_with_unbootable_base(dir: &Scratch, extra: &str) -> Daemon {
    daemon_with_limits(dir, extra, "")
}

/// As [`daemon_with_unbootable_base`], account A with `limits_a` (lines of
/// its `[[keys]]` entry).
fn daemon_with_limits(dir: &Scratch, extra: &str, limits_a: &str) -> Daemon {
    std::fs::write(dir.path("vmlinux"), b"not a kernel").unwrap();
    std::fs::write(dir.path("rootfs.ext4"), b"not an image").unwrap();
    let template = dir.path("base.toml");
    std::fs::write(
        &template,
        format!(
            "name = \"base\"\nkernel = \"{}\"\nrootfs = \"{}\"\n{extra}",
            dir.path("vmlinux").display(),
            dir.path("rootfs.ext4").display()
        ),
    )
    .unwrap();
    let keys = dir.path("keys.toml");
    std::fs::write(
        &keys,
        format!(
            "[[keys]]\naccess_key_id = \"A\"\nsecret_access_key = \"a\"\naccount_id = \"111111111111\"\nsandbox_api_key = \"{KEY_A}\"\n{limits_a}\
             [[keys]]\naccess_key_id = \"B\"\nsecret_access_key = \"b\"\naccount_id = \"222222222222\"\nsandbox_api_key = \"{KEY_B}\"\n"
        ),
    )
    .unwrap();
    Daemon::start(
        &dir.path("state"),
        &[
            "--auth",
            keys.to_str().unwrap(),
            "--sandbox-listen",
            "127.0.0.1:0",
            "--sandbox-template",
            template.to_str().unwrap(),
        ],
    )
}

/// An account's memory limit covers its sandboxes: a create past it is
/// refused with 429 before anything starts.
#[test]
fn serve_sandbox_past_its_accounts_memory_limit_is_refused() {
    let dir = Scratch::new("serve-sbx-mem");
    let d = daemon_with_limits(&dir, "memory_mib = 512\n", "memory = \"256M\"\n");
    let body = r#"{"templateID": "base", "timeout": 60}"#;
    let refused_create = call(&d, "POST", "/sandboxes", body, Some(KEY_A));
    let message = refused(&refused_create, 429);
    assert!(message.contains("account memory limit"), "{message}");
    assert!(message.contains("of 256 MiB"), "{message}");
    // Nothing was started for it: no sandbox directory, no VMM.
    let sandboxes = std::fs::read_dir(dir.path("state").join("sbx"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(sandboxes, 0);
    // Another account, without a limit, gets as far as its template (which
    // cannot boot here).
    let other = call(&d, "POST", "/sandboxes", body, Some(KEY_B));
    assert_eq!(other.status, 500, "{}", other.text());
}

#[test]
fn serve_sandbox_api_refuses_what_it_must() {
    let dir = Scratch::new("serve-sbx");
    // A template whose kernel is no kernel: its zygote cannot boot.
    let d = daemon_with_unbootable_base(&dir, "");
    let state = dir.path("state");

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

/// E2B's template-build API up to the VM (the build's guest is Linux,
/// tested in the nested tier): a build is asked for, its files uploaded
/// through the link's token (not the key), checked before it starts, and
/// a build whose parent cannot boot ends in `error` with its reason and
/// log; another account sees none of it.
#[test]
fn serve_template_builds_are_checked_and_report_their_end() {
    let dir = Scratch::new("sbx-bld");
    let d = daemon_with_unbootable_base(&dir, "network = false\n");
    let asked = call(
        &d,
        "POST",
        "/v3/templates",
        r#"{"name": "mine:v1", "cpuCount": 1, "memoryMB": 512}"#,
        Some(KEY_A),
    );
    assert_eq!(asked.status, 202, "{}", asked.text());
    let v = asked.json();
    let (tid, bid) = (
        v["templateID"].as_str().unwrap().to_string(),
        v["buildID"].as_str().unwrap().to_string(),
    );
    assert_eq!(v["names"], serde_json::json!(["mine"]));
    // Template.exists: its account's name (tag and team ignored), the
    // daemon's templates; not another account's, not a missing one.
    for alias in ["mine", "mine%3Av2", "team%2Fmine"] {
        let got = call(
            &d,
            "GET",
            &format!("/templates/aliases/{alias}"),
            "",
            Some(KEY_A),
        );
        assert_eq!(got.status, 200, "{alias}: {}", got.text());
        assert_eq!(got.json()["templateID"], tid.as_str(), "{alias}");
    }
    let daemons = call(&d, "GET", "/templates/aliases/base", "", Some(KEY_B));
    assert_eq!(daemons.status, 200, "{}", daemons.text());
    assert_eq!(daemons.json()["public"], true);
    refused(
        &call(&d, "GET", "/templates/aliases/mine", "", Some(KEY_B)),
        404,
    );
    refused(
        &call(&d, "GET", "/templates/aliases/nothing", "", Some(KEY_A)),
        404,
    );
    refused(
        &call(
            &d,
            "POST",
            "/v3/templates",
            r#"{"name": "base"}"#,
            Some(KEY_A),
        ),
        409,
    );
    refused(
        &call(
            &d,
            "POST",
            "/v3/templates",
            r#"{"name": "Not Valid"}"#,
            Some(KEY_A),
        ),
        400,
    );

    let hash = upload_files(&d, &tid);
    start_build_checked(&d, &tid, &bid, &hash);
    // Its parent cannot boot: it ends in error, saying so, at `base`.
    let status = format!("/templates/{tid}/builds/{bid}/status");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let end = loop {
        let v = call(&d, "GET", &status, "", Some(KEY_A)).json();
        if v["status"] != "building" && v["status"] != "waiting" {
            break v;
        }
        assert!(std::time::Instant::now() < deadline, "still {v}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    assert_eq!(end["status"], "error", "{end}");
    assert_eq!(end["reason"]["step"], "base", "{end}");
    assert!(
        end["reason"]["message"]
            .as_str()
            .unwrap()
            .contains("build VM"),
        "{end}"
    );
    let entries = end["logEntries"].as_array().unwrap();
    assert!(
        entries.iter().any(|e| e["message"]
            .as_str()
            .unwrap()
            .contains("building template mine from base")),
        "{end}"
    );
    let later = call(
        &d,
        "GET",
        &format!("{status}?logsOffset={}", entries.len()),
        "",
        Some(KEY_A),
    )
    .json();
    assert_eq!(later["logEntries"], serde_json::json!([]), "{later}");
    refused(&call(&d, "GET", &status, "", Some(KEY_B)), 404);
    // Nothing to create from: the template was never built.
    refused(
        &call(
            &d,
            "POST",
            "/v2/sandboxes",
            r#"{"templateID": "mine"}"#,
            Some(KEY_A),
        ),
        404,
    );
}

/// A COPY's files: the link, an upload with the link's token only; the
/// files' hash.
fn upload_files(d: &Daemon, tid: &str) -> String {
    // A COPY's files: the link, an upload with the link's token only.
    let hash = "ab".repeat(32);
    let files = format!("/templates/{tid}/files/{hash}");
    let link = call(d, "GET", &files, "", Some(KEY_A));
    assert_eq!(link.status, 201, "{}", link.text());
    assert_eq!(link.json()["present"], false);
    let url = link.json()["url"].as_str().unwrap().to_string();
    let upload_path = url
        .split_once(d.sandbox_addr.as_deref().unwrap())
        .unwrap()
        .1;
    assert!(upload_path.starts_with(&files), "{url}");
    refused(&call(d, "GET", &files, "", Some(KEY_B)), 404);
    let addr = d.sandbox_addr.as_deref().unwrap();
    let wrong = format!("{files}?token={}", "0".repeat(64));
    assert_eq!(http(addr, "PUT", &wrong, b"tar", &[]).status, 404);
    assert_eq!(http(addr, "PUT", upload_path, b"tar", &[]).status, 200);
    assert_eq!(
        call(d, "GET", &files, "", Some(KEY_A)).json()["present"],
        true
    );

    hash
}

/// A build's start is checked before it runs; then it runs, once.
fn start_build_checked(d: &Daemon, tid: &str, bid: &str, hash: &str) {
    // The build's start is checked first.
    let start = format!("/v2/templates/{tid}/builds/{bid}");
    for (body, says) in [
        (r#"{"fromImage": "python:3.12"}"#, "not pulled"),
        (
            r#"{"fromTemplate": "base", "steps": [{"type": "COPY", "args": ["a", "/b"], "filesHash": "cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd"}]}"#,
            "not uploaded",
        ),
        (
            r#"{"fromTemplate": "base", "steps": [{"type": "FROM", "args": ["x"]}]}"#,
            "not a step",
        ),
        (r#"{"fromTemplate": "nope"}"#, "not found"),
    ] {
        let r = call(d, "POST", &start, body, Some(KEY_A));
        assert!(matches!(r.status, 400 | 404), "{body}: {}", r.text());
        assert!(
            r.json()["message"].as_str().unwrap().contains(says),
            "{body}: {}",
            r.text()
        );
    }
    refused(
        &call(
            d,
            "POST",
            &start,
            r#"{"fromTemplate": "base"}"#,
            Some(KEY_B),
        ),
        404,
    );
    let body = format!(
        r#"{{"fromTemplate": "base", "steps": [{{"type": "RUN", "args": ["true"]}}, {{"type": "COPY", "args": ["a", "/b"], "filesHash": "{hash}"}}]}}"#
    );
    let r = call(d, "POST", &start, &body, Some(KEY_A));
    assert_eq!(r.status, 202, "{}", r.text());
    refused(&call(d, "POST", &start, &body, Some(KEY_A)), 409);
}
