//! spore-agent with the `provided` runtime: the function's own `bootstrap`
//! speaking the Runtime API (here a shell script with curl).

#![allow(
    clippy::tests_outside_test_module,
    reason = "an integration-test crate is built for tests only: no cfg(test) module needed"
)]

mod agent_support;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use agent_support::{config_json, Agent};
use spore_abi::function::Kind;

/// A provided runtime in sh + curl: echoes each event with its handler name.
const BOOTSTRAP: &str = r#"#!/bin/sh
set -eu
api="http://$AWS_LAMBDA_RUNTIME_API/2018-06-01/runtime"
echo "bootstrap up in $(pwd), handler $_HANDLER" >&2
headers="$(mktemp)"
while :; do
    event="$(curl -sS -D "$headers" "$api/invocation/next")"
    id="$(grep -i '^lambda-runtime-aws-request-id:' "$headers" | cut -d' ' -f2 | tr -d '\r')"
    arn="$(grep -i '^lambda-runtime-invoked-function-arn:' "$headers" | cut -d' ' -f2 | tr -d '\r')"
    echo "event for $id"
    if [ "$event" = '"fail"' ]; then
        curl -sS -H 'Lambda-Runtime-Function-Error-Type: Custom.Failure' \
            -d '{"errorMessage":"asked to fail","errorType":"Custom.Failure"}' \
            "$api/invocation/$id/error" >/dev/null
    else
        curl -sS -d "{\"echo\":$event,\"handler\":\"$_HANDLER\",\"arn\":\"$arn\",\"region\":\"$AWS_REGION\"}" \
            "$api/invocation/$id/response" >/dev/null
    fi
done
"#;

fn write_exec(path: &Path, text: &str, mode: u32) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn provided_bootstrap_serves_invocations() {
    let agent = Agent::start("provided");
    write_exec(&agent.code_dir().join("bootstrap"), BOOTSTRAP, 0o755);
    let mut host = agent.connect();
    host.expect(Kind::Standby);
    host.configure(&config_json("my.handler", &agent.code_dir()));
    host.expect(Kind::Ready);
    for n in 0..3 {
        let r = host.invoke(&format!("p-{n}"), &format!(r#"{{"n":{n}}}"#));
        assert_eq!(r.kind, Kind::ResultOk, "{}", r.a_str());
        let v = r.a_json();
        assert_eq!(v["echo"]["n"], n);
        assert_eq!(v["handler"], "my.handler");
        assert_eq!(v["region"], "eu-west-1");
        assert_eq!(
            v["arn"],
            "arn:aws:lambda:eu-west-1:000000000000:function:test-fn"
        );
        assert_eq!(r.b_str(), format!("event for p-{n}\n"));
    }
    let r = host.invoke("p-fail", r#""fail""#);
    assert_eq!(r.kind, Kind::ResultError);
    assert_eq!(r.a_json()["errorType"], "Custom.Failure");
}

#[test]
fn non_executable_bootstrap_is_an_init_error() {
    let agent = Agent::start("provided");
    write_exec(&agent.code_dir().join("bootstrap"), BOOTSTRAP, 0o644);
    let mut host = agent.connect();
    host.expect(Kind::Standby);
    host.configure(&config_json("x.y", &agent.code_dir()));
    let v = host.expect(Kind::InitError).a_json();
    assert_eq!(v["errorType"], "Runtime.InvalidEntrypoint");
    assert!(
        v["errorMessage"]
            .as_str()
            .unwrap()
            .contains("not an executable"),
        "{v}"
    );
}

#[test]
fn missing_bootstrap_is_an_init_error() {
    let agent = Agent::start("provided");
    let mut host = agent.connect();
    host.expect(Kind::Standby);
    host.configure(&config_json("x.y", &agent.code_dir()));
    let v = host.expect(Kind::InitError).a_json();
    assert_eq!(v["errorType"], "Runtime.InvalidEntrypoint");
    assert!(
        v["errorMessage"]
            .as_str()
            .unwrap()
            .contains("Couldn't find valid bootstrap"),
        "{v}"
    );
}

#[test]
fn bootstrap_exiting_during_init_is_an_exit_error_with_its_log() {
    let agent = Agent::start("provided");
    write_exec(
        &agent.code_dir().join("bootstrap"),
        "#!/bin/sh\necho 'cannot find my config' >&2\nexit 3\n",
        0o755,
    );
    let mut host = agent.connect();
    host.expect(Kind::Standby);
    host.configure(&config_json("x.y", &agent.code_dir()));
    let e = host.expect(Kind::InitError);
    let v = e.a_json();
    assert_eq!(v["errorType"], "Runtime.ExitError");
    assert!(
        v["errorMessage"]
            .as_str()
            .unwrap()
            .contains("exit status 3"),
        "{v}"
    );
    assert!(
        e.b_str().contains("cannot find my config"),
        "log: {}",
        e.b_str()
    );
    assert!(e.arg > 0, "init time");
}

#[test]
fn runtime_posting_init_error() {
    let agent = Agent::start("provided");
    write_exec(
        &agent.code_dir().join("bootstrap"),
        r#"#!/bin/sh
curl -sS -d '{"errorMessage":"no database","errorType":"Custom.InitFailed"}' \
    "http://$AWS_LAMBDA_RUNTIME_API/2018-06-01/runtime/init/error"
sleep 3
"#,
        0o755,
    );
    let mut host = agent.connect();
    host.expect(Kind::Standby);
    host.configure(&config_json("x.y", &agent.code_dir()));
    let e = host.expect(Kind::InitError);
    let v = e.a_json();
    assert_eq!(v["errorType"], "Custom.InitFailed");
    assert_eq!(v["errorMessage"], "no database");
}
