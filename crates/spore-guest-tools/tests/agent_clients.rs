//! spore-agent with AWS's own Lambda runtime clients, unmodified, as the
//! `provided` runtime's `bootstrap` (and, for Python, as a python3 zip's): the Rust `lambda_runtime` crate
//! (tests/fixtures/lambda-rust, built by its build.sh) and Python's
//! `awslambdaric` from PyPI (tests/fixtures/awslambdaric/install.sh). Both
//! are pinned and cached under `${SPORE_CACHE:-/var/cache/spore}`; a failed
//! build or download fails the test.

#![allow(
    clippy::tests_outside_test_module,
    reason = "an integration-test crate is built for tests only: no cfg(test) module needed"
)]

mod agent_support;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use agent_support::{config_json, Agent, Host};
use spore_abi::function::Kind;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The host's real Python interpreter (not a pyenv shim).
fn python() -> PathBuf {
    let out = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python3 on the host");
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// Runs a fixture script; its last stdout line (a path) or a loud failure.
fn run_script(script: &str, envs: &[(&str, &Path)]) -> PathBuf {
    let path = repo_root().join(script);
    let out = Command::new("sh")
        .arg(&path)
        .envs(envs.iter().map(|(k, v)| (k, v)))
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", path.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{script} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let last = stdout.lines().last().unwrap_or_default();
    let p = PathBuf::from(last);
    assert!(
        p.exists(),
        "{script} printed {last:?}, which does not exist"
    );
    p
}

fn write_exec(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// Invokes `{"n": n, "s": "héllo"}` as request `id`; checks what every
/// fixture echoes (the event, the request id, the function name) and
/// returns the frame and its JSON for the client-specific checks.
fn invoke_echo(host: &mut Host, id: &str, n: i32) -> (agent_support::Frame, serde_json::Value) {
    let r = host.invoke(id, &format!(r#"{{"n":{n},"s":"héllo"}}"#));
    assert_eq!(r.kind, Kind::ResultOk, "{}", r.a_str());
    let v = r.a_json();
    assert_eq!(v["echo"]["n"], n, "{v}");
    assert_eq!(v["echo"]["s"], "héllo", "{v}");
    assert_eq!(v["request_id"], id, "{v}");
    assert_eq!(v["function_name"], "test-fn", "{v}");
    (r, v)
}

/// Configures the function and waits for Ready.
fn start(agent: &Agent, config: &str) -> Host {
    let mut host = agent.connect();
    host.expect(Kind::Standby);
    host.configure(config);
    host.expect(Kind::Ready);
    host
}

#[test]
fn rust_lambda_runtime_crate() {
    let bin = run_script("tests/fixtures/lambda-rust/build.sh", &[]);
    let agent = Agent::start("provided");
    std::fs::copy(&bin, agent.code_dir().join("bootstrap")).unwrap();
    let mut host = start(&agent, &config_json("bootstrap", &agent.code_dir()));
    for n in 0..3 {
        let id = format!("rust-{n}");
        let (_, v) = invoke_echo(&mut host, &id, n);
        assert_eq!(v["client"], "lambda_runtime", "{v}");
    }
    let r = host.invoke("rust-fail", r#"{"fail":true}"#);
    assert_eq!(r.kind, Kind::ResultError, "{}", r.a_str());
    let v = r.a_json();
    assert_eq!(v["errorMessage"], "asked to fail in rust-fail", "{v}");
    // lambda_runtime names the error's Rust type.
    let ty = v["errorType"].as_str().unwrap_or_default();
    assert!(ty.contains("Error"), "{v}");
    // The runtime goes on after a handler error.
    let r = host.invoke("rust-after", r#"{"n":9}"#);
    assert_eq!(r.kind, Kind::ResultOk, "{}", r.a_str());
    assert_eq!(r.a_json()["request_id"], "rust-after");
}

const PY_HANDLER: &str = r#"
import os
import sys

class Failure(Exception):
    pass

def fn(event, context):
    if isinstance(event, dict) and event.get("fail"):
        raise Failure("asked to fail in " + context.aws_request_id)
    print("handling", context.aws_request_id)
    return {
        "echo": event,
        "request_id": context.aws_request_id,
        "function_name": context.function_name,
        "arn": context.invoked_function_arn,
        "remaining_ms_positive": context.get_remaining_time_in_millis() > 0,
        "greeting": os.environ.get("GREETING"),
        "client": "awslambdaric",
        # What ran the handler: awslambdaric, not spore's bootstrap.
        "ric_loaded": "awslambdaric.bootstrap" in sys.modules,
    }
"#;

#[test]
fn python_awslambdaric_from_pypi() {
    awslambdaric_as_bootstrap("provided");
}

/// On the python3 runtime, a zip's executable `bootstrap` replaces spore's
/// Python bootstrap once the function is configured.
#[test]
fn python3_runtime_runs_a_zips_awslambdaric_bootstrap() {
    awslambdaric_as_bootstrap("python3");
}

fn awslambdaric_as_bootstrap(runtime: &str) {
    let py = python();
    let ric = run_script("tests/fixtures/awslambdaric/install.sh", &[("PYTHON", &py)]);
    let agent = Agent::start(runtime);
    let code = agent.code_dir();
    let st = Command::new("cp")
        .arg("-a")
        .arg(ric.join("."))
        .arg(&code)
        .status()
        .unwrap();
    assert!(st.success(), "copying {}", ric.display());
    std::fs::write(code.join("handler.py"), PY_HANDLER).unwrap();
    write_exec(
        &code.join("bootstrap"),
        "#!/bin/sh\nexport PYTHONPATH=\"$LAMBDA_TASK_ROOT\"\nexec python3 -m awslambdaric handler.fn\n",
    );
    // The function's PATH finds the interpreter install.sh used first (its
    // compiled extension was built for it).
    let mut config: serde_json::Value =
        serde_json::from_str(&config_json("handler.fn", &code)).unwrap();
    config["env"]["PATH"] = format!(
        "{}:/usr/local/bin:/usr/bin:/bin",
        py.parent().unwrap().display()
    )
    .into();
    let mut host = start(&agent, &config.to_string());
    for n in 0..3 {
        let id = format!("py-{n}");
        let (r, v) = invoke_echo(&mut host, &id, n);
        assert_eq!(
            v["arn"], "arn:aws:lambda:eu-west-1:000000000000:function:test-fn",
            "{v}"
        );
        assert_eq!(v["remaining_ms_positive"], true, "{v}");
        assert_eq!(v["greeting"], "hello", "{v}");
        assert_eq!(v["ric_loaded"], true, "{v}");
        assert!(
            r.b_str().contains(&format!("handling {id}")),
            "log: {}",
            r.b_str()
        );
    }
    let r = host.invoke("py-fail", r#"{"fail":true}"#);
    assert_eq!(r.kind, Kind::ResultError, "{}", r.a_str());
    let v = r.a_json();
    assert_eq!(v["errorType"], "Failure", "{v}");
    assert_eq!(v["errorMessage"], "asked to fail in py-fail", "{v}");
    assert!(v["stackTrace"].is_array(), "{v}");
    let r = host.invoke("py-after", r#"{"n":9}"#);
    assert_eq!(r.kind, Kind::ResultOk, "{}", r.a_str());
    assert_eq!(r.a_json()["request_id"], "py-after");
}
