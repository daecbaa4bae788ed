//! `Event` invocations are durable: each one answered 202 runs at least
//! once, through kill -9 of the daemon, SIGTERM and throttling; failed ones
//! are retried, then dropped with a counter; the queue is bounded (429).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::common::serve::Daemon;
use crate::common::{require_kvm, Scratch};

/// Sends an `Event` invocation; returns its status and request id.
fn event(d: &Daemon, name: &str, payload: &str) -> (u16, String) {
    let r = d.request(
        "POST",
        &format!("/2015-03-31/functions/{name}/invocations"),
        payload.as_bytes(),
        &[("X-Amz-Invocation-Type", "Event")],
    );
    let id = r.header("x-amzn-requestid").unwrap_or_default().to_string();
    (r.status, id)
}

/// Outcomes in the function's log, by request id (every attempt).
fn outcomes(state: &std::path::Path, name: &str) -> BTreeMap<String, Vec<String>> {
    let log = std::fs::read_to_string(state.join(format!("logs/{name}.log"))).unwrap_or_default();
    let mut by_id: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in log.lines() {
        let Some(rest) = line.strip_prefix("REPORT RequestId: ") else {
            continue;
        };
        let id = rest.split('\t').next().unwrap_or_default().to_string();
        let outcome = rest
            .rsplit("Outcome: ")
            .next()
            .unwrap_or_default()
            .to_string();
        by_id.entry(id).or_default().push(outcome);
    }
    by_id
}

/// Reserved concurrency 0: every invocation of `name` is throttled.
fn throttle_all(d: &Daemon, name: &str) {
    let r = d.request(
        "PUT",
        &format!("/2017-10-31/functions/{name}/concurrency"),
        br#"{"ReservedConcurrentExecutions": 0}"#,
        &[],
    );
    assert_eq!(r.status, 200, "{}", r.text());
}

fn wait_until_queue_empty(d: &Daemon, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let r = d.request("GET", "/metrics", b"", &[]);
        if r.text().lines().any(|l| l == "spore_events_queued 0") {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "events still queued after {limit:?}: {}",
            r.text()
                .lines()
                .filter(|l| l.starts_with("spore_events"))
                .collect::<Vec<_>>()
                .join("; ")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn kvm_serve_accepted_events_run_after_the_daemon_is_killed() {
    require_kvm();
    let dir = Scratch::new("ev-kill");
    let state = dir.path("state");
    let mut d = Daemon::start(&state, &[]);
    assert_eq!(d.create("ev", "fn-echo", serde_json::json!({})).status, 201);
    let mut accepted = Vec::new();
    for i in 0..50 {
        let (status, id) = event(&d, "ev", &format!("{{\"sleep_ms\":300,\"n\":{i}}}"));
        assert_eq!(status, 202);
        assert!(!id.is_empty(), "202 without x-amzn-requestid");
        accepted.push(id);
    }
    // Most are still queued or running.
    d.kill9();
    let d = Daemon::start(&state, &[]);
    wait_until_queue_empty(&d, Duration::from_secs(180));
    let ran = outcomes(&state, "ev");
    let missing: Vec<_> = accepted
        .iter()
        .filter(|id| {
            !ran.get(*id)
                .is_some_and(|o| o.iter().any(|o| o == "success"))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "{} of 50 accepted events never ran: {missing:?}",
        missing.len()
    );
    assert_eq!(
        d.metric("spore_events_dropped_total"),
        0.0,
        "nothing dropped"
    );
    assert_eq!(
        std::fs::read_dir(state.join("events")).unwrap().count(),
        0,
        "every event file removed once it ran"
    );
}

#[test]
fn kvm_serve_throttled_events_wait_sigterm_keeps_them_and_the_queue_is_bounded() {
    require_kvm();
    let dir = Scratch::new("ev-held");
    let state = dir.path("state");
    let args = ["--event-queue-max", "5"];
    let d = Daemon::start(&state, &args);
    assert_eq!(
        d.create("held", "fn-echo", serde_json::json!({})).status,
        201
    );
    throttle_all(&d, "held");
    let mut accepted = Vec::new();
    for i in 0..5 {
        let (status, id) = event(&d, "held", &format!("{{\"n\":{i}}}"));
        assert_eq!(status, 202);
        accepted.push(id);
    }
    let r = d.request(
        "POST",
        "/2015-03-31/functions/held/invocations",
        b"{}",
        &[("X-Amz-Invocation-Type", "Event")],
    );
    assert_eq!(r.status, 429, "a full queue refuses: {}", r.text());
    assert_eq!(r.error_type(), Some("TooManyRequestsException"));
    std::thread::sleep(Duration::from_secs(2));
    assert!(outcomes(&state, "held").is_empty(), "throttled events ran");
    // SIGTERM (the drop): the events stay on disk for the next daemon.
    drop(d);
    let d = Daemon::start(&state, &args);
    assert_eq!(d.metric("spore_events_queued"), 5.0);
    let r = d.request("DELETE", "/2017-10-31/functions/held/concurrency", b"", &[]);
    assert_eq!(r.status, 204, "{}", r.text());
    wait_until_queue_empty(&d, Duration::from_secs(120));
    let ran = outcomes(&state, "held");
    for id in &accepted {
        assert!(
            ran.get(id)
                .is_some_and(|o| o.iter().any(|o| o == "success")),
            "{id} never ran: {ran:?}"
        );
    }
}

#[test]
fn kvm_serve_failed_events_are_retried_then_dropped_and_counted() {
    require_kvm();
    let dir = Scratch::new("ev-fail");
    let state = dir.path("state");
    let d = Daemon::start(
        &state,
        &["--event-retries", "2", "--event-retry-delay-ms", "100"],
    );
    assert_eq!(
        d.create("bad", "fn-echo", serde_json::json!({})).status,
        201
    );
    let (status, id) = event(&d, "bad", r#"{"fail":"always"}"#);
    assert_eq!(status, 202);
    wait_until_queue_empty(&d, Duration::from_secs(60));
    let ran = outcomes(&state, "bad");
    assert_eq!(
        ran.get(&id).map(Vec::len),
        Some(3),
        "one attempt and two retries: {ran:?}"
    );
    assert_eq!(
        d.metric("spore_events_dropped_total{function=\"bad\",reason=\"retries_exhausted\"}"),
        1.0
    );
    // An event of a deleted function is dropped, not run and not kept.
    assert_eq!(
        d.create("gone", "fn-echo", serde_json::json!({})).status,
        201
    );
    throttle_all(&d, "gone");
    assert_eq!(event(&d, "gone", "{}").0, 202);
    // Deleted once it waits (throttled): an event taken just before the
    // delete may still run, as Lambda's may.
    let deadline = Instant::now() + Duration::from_secs(30);
    while d.metric("spore_throttles_total{function=\"gone\"}") < 1.0 {
        assert!(Instant::now() < deadline, "the event was never throttled");
        std::thread::sleep(Duration::from_millis(20));
    }
    let r = d.request("DELETE", "/2015-03-31/functions/gone", b"", &[]);
    assert_eq!(r.status, 204, "{}", r.text());
    wait_until_queue_empty(&d, Duration::from_secs(60));
    let m = d.request("GET", "/metrics", b"", &[]).text();
    assert!(
        m.lines()
            .any(|l| l
                == "spore_events_dropped_total{function=\"gone\",reason=\"function_deleted\"} 1"),
        "{}",
        m.lines()
            .filter(|l| l.starts_with("spore_events"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// The lines a destination function (fn-echo with `ECHO_SINK=1`)
/// logged for its payloads: one JSON record each.
fn records(state: &std::path::Path, name: &str) -> Vec<serde_json::Value> {
    let log = std::fs::read_to_string(state.join(format!("logs/{name}.log"))).unwrap_or_default();
    log.lines()
        .filter_map(|l| l.split("fn-echo: payload ").nth(1))
        .filter_map(|p| serde_json::from_str(p).ok())
        .collect()
}

fn event_config(
    d: &Daemon,
    method: &str,
    name: &str,
    body: serde_json::Value,
) -> (u16, serde_json::Value) {
    let r = d.request(
        method,
        &format!("/2019-09-25/functions/{name}/event-invoke-config"),
        body.to_string().as_bytes(),
        &[],
    );
    let v = serde_json::from_slice(&r.body).unwrap_or(serde_json::Value::Null);
    (r.status, v)
}

#[test]
fn kvm_serve_event_destinations_get_lambdas_records() {
    require_kvm();
    let dir = Scratch::new("ev-dest");
    let state = dir.path("state");
    let d = Daemon::start(
        &state,
        &["--event-retry-delay-ms", "100", "--event-max-age-s", "1"],
    );
    let sink = serde_json::json!({ "Environment": { "Variables": { "ECHO_SINK": "1" } } });
    for name in ["src", "on-ok", "on-fail"] {
        let extra = if name == "src" {
            serde_json::json!({})
        } else {
            sink.clone()
        };
        assert_eq!(d.create(name, "fn-echo", extra).status, 201);
    }
    let arn = |n: &str| format!("arn:aws:lambda:us-east-1:000000000000:function:{n}");

    refuses_bad_configurations(&d, &arn);
    let (status, v) = event_config(&d, "GET", "src", serde_json::json!({}));
    assert_eq!(status, 404, "{v}");

    let (status, v) = event_config(
        &d,
        "PUT",
        "src",
        serde_json::json!({
            "MaximumRetryAttempts": 1,
            "MaximumEventAgeInSeconds": 60,
            "DestinationConfig": {
                "OnSuccess": { "Destination": arn("on-ok") },
                "OnFailure": { "Destination": arn("on-fail") },
            },
        }),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["MaximumRetryAttempts"], 1, "{v}");
    assert_eq!(v["FunctionArn"], format!("{}:$LATEST", arn("src")), "{v}");
    assert_eq!(
        v["DestinationConfig"]["OnFailure"]["Destination"],
        arn("on-fail")
    );
    assert!(v["LastModified"].as_f64().is_some_and(|t| t > 1.7e9), "{v}");

    // A failing event: one attempt, one retry, then its record on failure.
    let (status, failing) = event(&d, "src", r#"{"fail":"nope"}"#);
    assert_eq!(status, 202);
    let (status, succeeding) = event(&d, "src", r#"{"fine":1}"#);
    assert_eq!(status, 202);
    wait_until_queue_empty(&d, Duration::from_secs(60));
    assert_eq!(outcomes(&state, "src").get(&failing).map(Vec::len), Some(2));
    let failed = records(&state, "on-fail");
    assert_eq!(
        failed.len(),
        1,
        "{}",
        std::fs::read_to_string(state.join("logs/on-fail.log")).unwrap_or_default()
    );
    let r = &failed[0];
    assert_eq!(r["version"], "1.0");
    assert_eq!(r["requestContext"]["requestId"], failing.as_str());
    assert_eq!(r["requestContext"]["condition"], "RetriesExhausted");
    assert_eq!(r["requestContext"]["approximateInvokeCount"], 2);
    assert_eq!(r["requestPayload"], serde_json::json!({ "fail": "nope" }));
    assert_eq!(r["responseContext"]["functionError"], "Unhandled");
    assert_eq!(r["responsePayload"]["errorMessage"], "nope");
    let ok = records(&state, "on-ok");
    assert_eq!(ok.len(), 1, "{ok:?}");
    assert_eq!(ok[0]["requestContext"]["requestId"], succeeding.as_str());
    assert_eq!(ok[0]["requestContext"]["condition"], "Success");
    assert_eq!(ok[0]["responseContext"]["statusCode"], 200);
    assert_eq!(
        ok[0]["responsePayload"]["echo"],
        serde_json::json!({ "fine": 1 })
    );

    // An update changes only what it names; the destinations stay.
    let (status, v) = event_config(
        &d,
        "POST",
        "src",
        serde_json::json!({ "MaximumRetryAttempts": 0 }),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["MaximumRetryAttempts"], 0);
    assert_eq!(
        v["DestinationConfig"]["OnSuccess"]["Destination"],
        arn("on-ok")
    );
    assert_eq!(v["MaximumEventAgeInSeconds"], 60);
    let r = d.request(
        "GET",
        "/2019-09-25/functions/src/event-invoke-config/list",
        b"",
        &[],
    );
    assert_eq!(r.status, 200);
    let list: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(
        list["FunctionEventInvokeConfigs"].as_array().map(Vec::len),
        Some(1)
    );

    expired_events_are_recorded_too(&d, &state, &arn);
    // Deleted, then gone; deleting the function deletes its configuration.
    let (status, _) = event_config(&d, "DELETE", "src", serde_json::json!({}));
    assert_eq!(status, 204);
    assert_eq!(event_config(&d, "GET", "src", serde_json::json!({})).0, 404);
    assert_eq!(
        event_config(&d, "DELETE", "src", serde_json::json!({})).0,
        404
    );
}

/// Bad configurations are refused with Lambda's errors.
fn refuses_bad_configurations(d: &Daemon, arn: &dyn Fn(&str) -> String) {
    for (body, why) in [
        (serde_json::json!({}), "at least one"),
        (
            serde_json::json!({ "MaximumRetryAttempts": 3 }),
            "between 0 and 2",
        ),
        (
            serde_json::json!({ "MaximumEventAgeInSeconds": 59 }),
            "between 60 and 21600",
        ),
        (
            serde_json::json!({ "DestinationConfig": { "OnFailure": { "Destination": "arn:aws:sqs:us-east-1:000000000000:q" } } }),
            "functions only",
        ),
        (
            serde_json::json!({ "DestinationConfig": { "OnFailure": { "Destination": arn("nobody") } } }),
            "does not exist",
        ),
    ] {
        let (status, v) = event_config(d, "PUT", "src", body.clone());
        assert_eq!(status, 400, "{body}: {v}");
        assert!(v.to_string().contains(why), "{body}: {v}");
    }
}

/// Too old (the daemon's 1 s, once a Put replaced the whole configuration and
/// the function sets no age of its own): an event throttled past it goes to
/// OnFailure as EventAgeExceeded.
fn expired_events_are_recorded_too(
    d: &Daemon,
    state: &std::path::Path,
    arn: &dyn Fn(&str) -> String,
) {
    let (status, v) = event_config(
        d,
        "PUT",
        "src",
        serde_json::json!({ "DestinationConfig": { "OnFailure": { "Destination": arn("on-fail") } } }),
    );
    assert_eq!(status, 200, "{v}");
    assert!(v.get("MaximumRetryAttempts").is_none(), "{v}");
    assert!(v.get("MaximumEventAgeInSeconds").is_none(), "{v}");
    assert_eq!(v["DestinationConfig"]["OnSuccess"], serde_json::json!({}));
    throttle_all(d, "src");
    let (status, expired) = event(d, "src", r#"{"late":true}"#);
    assert_eq!(status, 202);
    wait_until_queue_empty(d, Duration::from_secs(60));
    let failed = records(state, "on-fail");
    let late = failed
        .iter()
        .find(|r| r["requestContext"]["requestId"] == expired.as_str())
        .unwrap_or_else(|| panic!("no record of the expired event: {failed:?}"));
    assert_eq!(late["requestContext"]["condition"], "EventAgeExceeded");
    assert_eq!(late["requestPayload"], serde_json::json!({ "late": true }));
    assert_eq!(
        d.metric("spore_events_destination_records_total{condition=\"RetriesExhausted\"}"),
        1.0
    );
    assert_eq!(
        d.metric("spore_events_destination_records_total{condition=\"EventAgeExceeded\"}"),
        1.0
    );
    assert_eq!(
        d.metric("spore_events_destination_records_total{condition=\"Success\"}"),
        1.0
    );
}

/// An event invoke configuration belongs to one qualifier, as in Lambda:
/// set on an alias, it applies to events invoked through that alias only,
/// and goes when the alias goes.
#[test]
fn kvm_serve_event_configs_are_per_qualifier() {
    require_kvm();
    let dir = Scratch::new("ev-qual");
    let state = dir.path("state");
    let d = Daemon::start(&state, &["--event-retry-delay-ms", "100"]);
    assert_eq!(
        d.create("src", "fn-echo", serde_json::json!({})).status,
        201
    );
    let sink = serde_json::json!({ "Environment": { "Variables": { "ECHO_SINK": "1" } } });
    assert_eq!(d.create("sink", "fn-echo", sink).status, 201);
    let r = d.request("POST", "/2015-03-31/functions/src/versions", b"{}", &[]);
    assert_eq!(r.status, 201, "{}", r.text());
    let r = d.request(
        "POST",
        "/2015-03-31/functions/src/aliases",
        br#"{"Name":"live","FunctionVersion":"1"}"#,
        &[],
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let config = |method: &str, qualifier: &str, body: &serde_json::Value| {
        let r = d.request(
            method,
            &format!("/2019-09-25/functions/src/event-invoke-config?Qualifier={qualifier}"),
            body.to_string().as_bytes(),
            &[],
        );
        let v = serde_json::from_slice(&r.body).unwrap_or(serde_json::Value::Null);
        (r.status, v)
    };
    let to_sink = serde_json::json!({ "DestinationConfig": { "OnSuccess": {
        "Destination": "arn:aws:lambda:us-east-1:000000000000:function:sink" } } });
    // A qualifier that does not exist has no configuration to set.
    for missing in ["7", "nope"] {
        let (status, v) = config("PUT", missing, &to_sink);
        assert_eq!(status, 404, "{missing}: {v}");
    }
    let (status, v) = config("PUT", "live", &to_sink);
    assert_eq!(status, 200, "{v}");
    assert!(
        v["FunctionArn"]
            .as_str()
            .is_some_and(|a| a.ends_with(":src:live")),
        "{v}"
    );
    assert_eq!(config("GET", "%24LATEST", &serde_json::json!({})).0, 404);
    // Through the alias: a record. Through $LATEST or the version: none.
    let (status, via_alias) = event(&d, "src:live", r#"{"via":"alias"}"#);
    assert_eq!(status, 202);
    assert_eq!(event(&d, "src", r#"{"via":"latest"}"#).0, 202);
    assert_eq!(event(&d, "src:1", r#"{"via":"version"}"#).0, 202);
    wait_until_queue_empty(&d, Duration::from_secs(60));
    let got = records(&state, "sink");
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0]["requestContext"]["requestId"], via_alias.as_str());
    assert_eq!(listed_configs(&d, "src"), 1);
    // The alias deleted: its configuration with it.
    let r = d.request("DELETE", "/2015-03-31/functions/src/aliases/live", b"", &[]);
    assert_eq!(r.status, 204, "{}", r.text());
    assert_eq!(listed_configs(&d, "src"), 0);
}

/// A destination record is queued durably before its source event ends:
/// kill -9 of the daemon while events with an OnSuccess destination are
/// being dispatched loses none of their records (Lambda's contract is at
/// least once: a record may arrive twice, never not at all).
#[test]
fn kvm_serve_destination_records_survive_kill_9_mid_dispatch() {
    require_kvm();
    let dir = Scratch::new("ev-dkill");
    let state = dir.path("state");
    let mut d = Daemon::start(&state, &["--event-retry-delay-ms", "100"]);
    assert_eq!(
        d.create("src", "fn-echo", serde_json::json!({})).status,
        201
    );
    let sink = serde_json::json!({ "Environment": { "Variables": { "ECHO_SINK": "1" } } });
    assert_eq!(d.create("sink", "fn-echo", sink).status, 201);
    let (status, v) = event_config(
        &d,
        "PUT",
        "src",
        serde_json::json!({ "DestinationConfig": { "OnSuccess": {
            "Destination": "arn:aws:lambda:us-east-1:000000000000:function:sink" } } }),
    );
    assert_eq!(status, 200, "{v}");
    let ids: Vec<String> = (0..60)
        .map(|i| {
            let (status, id) = event(&d, "src", &format!(r#"{{"n":{i},"sleep_ms":5}}"#));
            assert_eq!(status, 202);
            id
        })
        .collect();
    // Killed while records are being written: some have arrived, not all.
    let deadline = Instant::now() + Duration::from_secs(30);
    while records(&state, "sink").len() < 10 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    d.kill9();
    let before = records(&state, "sink").len();
    drop(d);
    let d = Daemon::start(&state, &["--event-retry-delay-ms", "100"]);
    wait_until_queue_empty(&d, Duration::from_secs(120));
    let got = records(&state, "sink");
    let seen: BTreeMap<String, usize> = got.iter().fold(BTreeMap::new(), |mut m, r| {
        if let Some(id) = r["requestContext"]["requestId"].as_str() {
            *m.entry(id.to_string()).or_default() += 1;
        }
        m
    });
    let missing: Vec<&String> = ids.iter().filter(|id| !seen.contains_key(*id)).collect();
    eprintln!(
        "{} records before the kill, {} after the restart, {} events recorded twice",
        before,
        got.len(),
        seen.values().filter(|&&n| n > 1).count()
    );
    assert!(missing.is_empty(), "records lost for {missing:?}");
    assert!(
        before < ids.len(),
        "the kill came after every record: the test proved nothing"
    );
}

/// How many event invoke configurations ListFunctionEventInvokeConfigs
/// shows for `name`.
fn listed_configs(d: &Daemon, name: &str) -> usize {
    let r = d.request(
        "GET",
        &format!("/2019-09-25/functions/{name}/event-invoke-config/list"),
        b"",
        &[],
    );
    let list: serde_json::Value = serde_json::from_slice(&r.body).unwrap_or_default();
    list["FunctionEventInvokeConfigs"]
        .as_array()
        .map_or(usize::MAX, Vec::len)
}
