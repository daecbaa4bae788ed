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
