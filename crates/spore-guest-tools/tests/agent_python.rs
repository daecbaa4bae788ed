//! spore-agent with the python3 runtime: the real bootstrap
//! (guest/runtimes/python3/bootstrap.py) on the host's Python.

#![allow(
    clippy::tests_outside_test_module,
    reason = "an integration-test crate is built for tests only: no cfg(test) module needed"
)]

mod agent_support;

use std::time::Duration;

use agent_support::{config_json, Agent};
use spore_abi::function::Kind;

const HANDLER: &str = r#"
import os

calls = 0

def handler(event, context):
    global calls
    calls += 1
    print("handling", event.get("n"))
    return {
        "double": event["n"] * 2,
        "calls": calls,
        "greeting": os.environ["GREETING"],
        "name": context.function_name,
        "arn": context.invoked_function_arn,
        "request_id": context.aws_request_id,
        "memory": context.memory_limit_in_mb,
        "remaining_ok": 0 < context.get_remaining_time_in_millis() <= 20000,
        "log_group": context.log_group_name,
        "task_root": os.environ["LAMBDA_TASK_ROOT"],
        "cwd": os.getcwd(),
    }

def fails(event, context):
    print("about to fail")
    raise ValueError("boom " + str(event.get("n")))

def exits(event, context):
    import threading
    if event.get("now"):
        os._exit(4)
    threading.Timer(0.05, lambda: os._exit(5)).start()
    return "bye"

def slow(event, context):
    import time
    time.sleep(event.get("sleep", 0))
    return "slept"
"#;

fn started(handler: &str) -> (Agent, agent_support::Host, u64) {
    let agent = Agent::start("python3");
    std::fs::write(agent.code_dir().join("app.py"), HANDLER).unwrap();
    let mut host = agent.connect();
    let standby = host.expect(Kind::Standby);
    assert!(
        standby.arg > 0,
        "Standby carries the time since the agent started"
    );
    host.configure(&config_json(handler, &agent.code_dir()));
    let ready = host.expect(Kind::Ready);
    (agent, host, ready.arg)
}

#[test]
fn standby_configure_ready_and_three_invokes() {
    let (agent, mut host, _init_us) = started("app.handler");
    for n in 1..=3 {
        let id = format!("req-{n}");
        let r = host.invoke(&id, &format!(r#"{{"n": {n}}}"#));
        assert_eq!(r.kind, Kind::ResultOk, "{}", r.a_str());
        let v = r.a_json();
        assert_eq!(v["double"], n * 2);
        assert_eq!(v["calls"], n, "one warm interpreter");
        assert_eq!(v["greeting"], "hello");
        assert_eq!(v["name"], "test-fn");
        assert_eq!(
            v["arn"],
            "arn:aws:lambda:eu-west-1:000000000000:function:test-fn"
        );
        assert_eq!(v["request_id"], id.as_str());
        assert_eq!(v["memory"], "256");
        assert_eq!(v["remaining_ok"], true);
        assert_eq!(v["log_group"], "/aws/lambda/test-fn");
        let code = agent.code_dir().display().to_string();
        assert_eq!(v["task_root"], code.as_str());
        assert_eq!(v["cwd"], code.as_str());
        // print() in the handler is this invocation's log, and only its.
        assert_eq!(r.b_str(), format!("handling {n}\n"));
        assert!(r.arg > 0, "handler time");
    }
}

#[test]
fn handler_error_is_lambdas_error_json() {
    let (_agent, mut host, _) = started("app.fails");
    let r = host.invoke("e-1", r#"{"n": 7}"#);
    assert_eq!(r.kind, Kind::ResultError);
    let v = r.a_json();
    assert_eq!(v["errorType"], "ValueError");
    assert_eq!(v["errorMessage"], "boom 7");
    let trace = v["stackTrace"].as_array().expect("stackTrace");
    assert!(
        trace.iter().any(|l| l.as_str().unwrap().contains("app.py")),
        "{v}"
    );
    let log = r.b_str();
    assert!(log.contains("about to fail"), "{log}");
    assert!(log.contains("[ERROR] ValueError: boom 7"), "{log}");
    // The instance stays warm after a function error.
    let r = host.invoke("e-2", r#"{"n": 8}"#);
    assert_eq!(r.a_json()["errorMessage"], "boom 8");
}

#[test]
fn missing_module_is_an_init_error() {
    let agent = Agent::start("python3");
    let mut host = agent.connect();
    host.expect(Kind::Standby);
    host.configure(&config_json("nosuchmodule.handler", &agent.code_dir()));
    let e = host.expect(Kind::InitError);
    let v = e.a_json();
    assert_eq!(v["errorType"], "Runtime.ImportModuleError");
    assert!(
        v["errorMessage"]
            .as_str()
            .unwrap()
            .contains("Unable to import module 'nosuchmodule'"),
        "{v}"
    );
    assert!(
        e.b_str().contains("Runtime.ImportModuleError"),
        "log: {}",
        e.b_str()
    );
    host.expect_closed();
    // Every later connection hears the same.
    let mut again = agent.connect();
    assert_eq!(
        again.expect(Kind::InitError).a_json()["errorType"],
        "Runtime.ImportModuleError"
    );
}

#[test]
fn missing_handler_function_is_handler_not_found() {
    let agent = Agent::start("python3");
    std::fs::write(agent.code_dir().join("app.py"), HANDLER).unwrap();
    let mut host = agent.connect();
    host.expect(Kind::Standby);
    host.configure(&config_json("app.nope", &agent.code_dir()));
    let v = host.expect(Kind::InitError).a_json();
    assert_eq!(v["errorType"], "Runtime.HandlerNotFound");
}

#[test]
fn reconnect_gets_ready_again_and_reconfigure_is_acknowledged() {
    let (agent, mut host, init_us) = started("app.handler");
    assert_eq!(host.invoke("a", r#"{"n": 1}"#).a_json()["calls"], 1);
    drop(host);
    // A clone or restored VM reconnects: Ready straight away, same init time.
    let mut host = agent.connect();
    let ready = host.expect(Kind::Ready);
    assert_eq!(ready.arg, init_us);
    assert_eq!(host.invoke("b", r#"{"n": 2}"#).a_json()["calls"], 2);
    // A Configure on a configured agent: new metadata, acknowledged by Ready.
    let mut json: serde_json::Value =
        serde_json::from_str(&config_json("app.handler", &agent.code_dir())).unwrap();
    json["function_version"] = "7".into();
    host.configure(&json.to_string());
    host.expect(Kind::Ready);
    let v = host.invoke("c", r#"{"n": 3}"#).a_json();
    assert_eq!(v["calls"], 3);
    assert_eq!(
        v["arn"], "arn:aws:lambda:eu-west-1:000000000000:function:test-fn:7",
        "the new version is in the invoked ARN"
    );
    // Another function is refused: the connection closes, the agent goes on.
    json["handler"] = "app.fails".into();
    host.configure(&json.to_string());
    host.expect_closed();
    let mut host = agent.connect();
    host.expect(Kind::Ready);
    assert_eq!(host.invoke("d", r#"{"n": 4}"#).a_json()["calls"], 4);
}

#[test]
fn timeout_kills_and_the_next_connection_restarts_the_runtime() {
    let (agent, mut host, _) = started("app.slow");
    let r = host.invoke_with("t-1", r#"{"sleep": 30}"#, Duration::from_millis(700));
    assert_eq!(r.kind, Kind::ResultError);
    let v = r.a_json();
    assert_eq!(v["errorType"], "Sandbox.Timedout");
    assert!(
        v["errorMessage"]
            .as_str()
            .unwrap()
            .contains("Task timed out"),
        "{v}"
    );
    host.expect_closed();
    let mut host = agent.connect();
    host.expect(Kind::Ready);
    let r = host.invoke("t-2", r#"{"sleep": 0}"#);
    assert_eq!(r.kind, Kind::ResultOk, "{}", r.a_str());
    assert_eq!(r.a_str(), r#""slept""#);
}

#[test]
fn a_runtime_that_dies_is_an_exit_error_and_restarts() {
    let (agent, mut host, _) = started("app.exits");
    // Dies in the middle of an invocation.
    let r = host.invoke("x-1", r#"{"now": true}"#);
    assert_eq!(r.kind, Kind::ResultError);
    let v = r.a_json();
    assert_eq!(v["errorType"], "Runtime.ExitError");
    assert!(
        v["errorMessage"]
            .as_str()
            .unwrap()
            .contains("exit status 4"),
        "{v}"
    );
    host.expect_closed();
    // Restarted on the next connection; this time it dies after answering.
    let mut host = agent.connect();
    host.expect(Kind::Ready);
    assert_eq!(host.invoke("x-2", "{}").a_str(), r#""bye""#);
    // Let it die idle: the next invocation finds no runtime.
    std::thread::sleep(Duration::from_millis(500));
    let r = host.invoke("x-3", "{}");
    assert_eq!(
        r.a_json()["errorType"],
        "Runtime.ExitError",
        "{}",
        r.a_str()
    );
    host.expect_closed();
    let mut host = agent.connect();
    host.expect(Kind::Ready);
    assert_eq!(host.invoke("x-4", "{}").a_str(), r#""bye""#);
}
