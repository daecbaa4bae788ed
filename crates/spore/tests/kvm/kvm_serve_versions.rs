//! Lambda's deployment model on `spore serve`: published versions are
//! immutable and keep running their code while `$LATEST` changes; aliases
//! name a version and route a weighted share to a second one; qualified
//! names (`fn:3`, `fn:live`, qualified ARNs, `?Qualifier=`) reach them; bad
//! input gets Lambda's errors and changes nothing.

use std::process::Command;

use crate::common;
use crate::common::fc::repo_root;
use crate::common::serve::{Daemon, Response};
use crate::common::{require_kvm, Scratch};

/// Invokes `target` (a name, maybe qualified, then maybe `?query`).
fn invoke(d: &Daemon, target: &str, payload: &[u8]) -> Response {
    let (name, query) = target.split_once('?').unwrap_or((target, ""));
    d.request(
        "POST",
        &format!("/2015-03-31/functions/{name}/invocations?{query}"),
        payload,
        &[],
    )
}

fn stage_of(d: &Daemon, target: &str) -> (String, String) {
    let r = invoke(d, target, br#"{"env":"STAGE"}"#);
    assert_eq!(r.status, 200, "{target}: {}", r.text());
    (
        r.json()["value"].as_str().unwrap_or_default().to_string(),
        r.header("x-amz-executed-version")
            .unwrap_or_default()
            .to_string(),
    )
}

fn post(d: &Daemon, path: &str, body: serde_json::Value) -> Response {
    d.request("POST", path, body.to_string().as_bytes(), &[])
}

fn publish(d: &Daemon, name: &str) -> String {
    let r = post(
        d,
        &format!("/2015-03-31/functions/{name}/versions"),
        serde_json::json!({}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    r.json()["Version"].as_str().unwrap_or_default().to_string()
}

#[test]
fn kvm_serve_versions_and_aliases() {
    require_kvm();
    let dir = Scratch::new("versions");
    let d = Daemon::start(&dir.path("state"), &[]);
    let extra = serde_json::json!({ "Environment": { "Variables": { "STAGE": "one" } } });
    assert_eq!(d.create("app", "fn-echo", extra).status, 201);

    assert_eq!(publish(&d, "app"), "1");
    // Nothing changed since: publishing again gives version 1 again.
    assert_eq!(publish(&d, "app"), "1");
    d.set_stage("app", "two");
    assert_eq!(publish(&d, "app"), "2");
    d.set_stage("app", "three");

    // Each qualifier runs its own version; $LATEST moved on.
    assert_eq!(stage_of(&d, "app"), ("three".into(), "$LATEST".into()));
    assert_eq!(stage_of(&d, "app:1"), ("one".into(), "1".into()));
    assert_eq!(stage_of(&d, "app:2"), ("two".into(), "2".into()));
    assert_eq!(
        stage_of(&d, "app%3A%24LATEST"),
        ("three".into(), "$LATEST".into())
    );
    assert_eq!(stage_of(&d, "app?Qualifier=1"), ("one".into(), "1".into()));
    assert_eq!(
        stage_of(
            &d,
            "arn%3Aaws%3Alambda%3Aus-east-1%3A000000000000%3Afunction%3Aapp%3A2"
        ),
        ("two".into(), "2".into())
    );
    // A version keeps its warm instance while $LATEST changes.
    d.set_stage("app", "four");
    let r = d.invoke("app:1", br#"{"env":"STAGE"}"#);
    assert_eq!(
        r.header("x-spore-start-path"),
        Some("warm"),
        "{:?}",
        r.headers
    );

    let r = d.request("GET", "/2015-03-31/functions/app/versions", b"", &[]);
    let listed: Vec<String> = r.json()["Versions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| v["Version"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(listed, ["$LATEST", "1", "2"]);
    let r = d.request("GET", "/2015-03-31/functions/app?Qualifier=1", b"", &[]);
    assert_eq!(r.status, 200);
    assert_eq!(
        r.json()["Configuration"]["FunctionArn"],
        "arn:aws:lambda:us-east-1:000000000000:function:app:1"
    );
    assert_eq!(
        r.json()["Configuration"]["Environment"]["Variables"]["STAGE"],
        "one"
    );

    // An alias with 30 % on version 2.
    let r = post(
        &d,
        "/2015-03-31/functions/app/aliases",
        serde_json::json!({
            "Name": "live", "FunctionVersion": "1",
            "RoutingConfig": { "AdditionalVersionWeights": { "2": 0.3 } },
        }),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(
        r.json()["AliasArn"],
        "arn:aws:lambda:us-east-1:000000000000:function:app:live"
    );
    let mut on_two = 0;
    for _ in 0..300 {
        let (stage, version) = stage_of(&d, "app:live");
        assert_eq!((stage == "two"), (version == "2"));
        on_two += usize::from(version == "2");
    }
    // 90 expected; the binomial's standard deviation is ~8.
    assert!((50..=130).contains(&on_two), "{on_two} of 300 on version 2");
    // Shift the alias wholly to version 2.
    let r = d.request(
        "PUT",
        "/2015-03-31/functions/app/aliases/live",
        serde_json::json!({ "FunctionVersion": "2", "RoutingConfig": { "AdditionalVersionWeights": {} } })
            .to_string()
            .as_bytes(),
        &[],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.json().get("RoutingConfig").is_none(), "{}", r.text());
    for _ in 0..20 {
        assert_eq!(stage_of(&d, "app:live").1, "2");
    }

    bad_input_changes_nothing(&d);

    // Version 2 is aliased: its deletion is refused; version 1 goes.
    let r = d.request("DELETE", "/2015-03-31/functions/app?Qualifier=2", b"", &[]);
    assert_eq!(r.status, 409, "{}", r.text());
    let r = d.request("DELETE", "/2015-03-31/functions/app%3A1", b"", &[]);
    assert_eq!(r.status, 204, "{}", r.text());
    assert_eq!(d.invoke("app:1", b"{}").status, 404);
    assert_eq!(stage_of(&d, "app:2").0, "two");
    let r = d.request("DELETE", "/2015-03-31/functions/app/aliases/live", b"", &[]);
    assert_eq!(r.status, 204, "{}", r.text());
    assert_eq!(d.invoke("app:live", b"{}").status, 404);
    // Deleting the function deletes its versions; a new one starts at 1.
    assert_eq!(
        d.request("DELETE", "/2015-03-31/functions/app", b"", &[])
            .status,
        204
    );
    assert_eq!(d.invoke("app:2", b"{}").status, 404);
}

fn bad_input_changes_nothing(d: &Daemon) {
    let aliases = "/2015-03-31/functions/app/aliases";
    for (body, status) in [
        (
            serde_json::json!({ "Name": "x", "FunctionVersion": "9" }),
            404,
        ),
        (
            serde_json::json!({ "Name": "42", "FunctionVersion": "1" }),
            400,
        ),
        (
            serde_json::json!({ "Name": "x", "FunctionVersion": "1", "RoutingConfig": { "AdditionalVersionWeights": { "2": 1.5 } } }),
            400,
        ),
        (
            serde_json::json!({ "Name": "x", "FunctionVersion": "1", "RoutingConfig": { "AdditionalVersionWeights": { "1": 0.5 } } }),
            400,
        ),
        (
            serde_json::json!({ "Name": "x", "FunctionVersion": "$LATEST", "RoutingConfig": { "AdditionalVersionWeights": { "2": 0.5 } } }),
            400,
        ),
        (
            serde_json::json!({ "Name": "live", "FunctionVersion": "1" }),
            409,
        ),
    ] {
        let r = post(d, aliases, body.clone());
        assert_eq!(r.status, status, "{body}: {}", r.text());
    }
    let names: Vec<String> = d.request("GET", aliases, b"", &[]).json()["Aliases"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| a["Name"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(names, ["live"]);
    for (target, status) in [
        ("app:9", 404),
        ("app:nope", 404),
        ("app:a.b", 400),
        ("app:1?Qualifier=2", 400),
    ] {
        let r = invoke(d, target, b"{}");
        assert_eq!(r.status, status, "{target}: {}", r.text());
    }
    let r = post(
        d,
        "/2015-03-31/functions/app/versions",
        serde_json::json!({ "RevisionId": "not-the-revision" }),
    );
    assert_eq!(r.status, 412, "{}", r.text());
    // An update of the whole function refuses a qualified name.
    let r = d.request(
        "PUT",
        "/2015-03-31/functions/app%3A1/configuration",
        br#"{"Timeout":9}"#,
        &[],
    );
    assert_eq!(r.status, 400, "{}", r.text());
}

/// The AWS CLI publishes, aliases with 10 % on the new version and shifts;
/// boto3 invokes through the alias 1,000 times (`tests/serve/versions_scenario.py`).
#[test]
fn kvm_serve_versions_through_the_aws_cli_and_boto3() {
    require_kvm();
    let venv = super::kvm_serve_clients::client_venv();
    let dir = Scratch::new("versions-cli");
    let d = Daemon::start(&dir.path("state"), &[]);
    let out = Command::new(venv.join("bin/python"))
        .arg(repo_root().join("tests/serve/versions_scenario.py"))
        .args(["--endpoint", &format!("http://{}", d.addr)])
        .arg("--aws")
        .arg(venv.join("bin/aws"))
        .arg("--echo-elf")
        .arg(common::uk_image("fn-echo"))
        .output()
        .expect("running the versions scenario");
    assert!(
        out.status.success(),
        "versions scenario failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{}", String::from_utf8_lossy(&out.stdout));
}
