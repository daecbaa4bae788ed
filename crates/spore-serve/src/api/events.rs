//! The dispatcher of `Event` invocations: takes each due event from the
//! durable queue ([`crate::events`]), runs it as an invocation (logged and
//! counted as any other), and tells the queue the outcome: done, throttled
//! (waited out), failed (retried, then dropped), or dropped at once (too
//! old, function deleted), each drop logged with the event's request id.
//! The function's `FunctionEventInvokeConfig` sets its retries and maximum
//! age and where records go: on success, and when its retries are used up
//! or it grew too old, a destination record (Lambda's JSON) is queued as an
//! `Event` of the destination function before the event itself ends.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::StatusCode;

use super::{invoke, Daemon};
use crate::catalog::{EventInvokeConfig, Function};
use crate::config::function_arn;
use crate::events::{DropReason, EventQueue, TakenEvent};

/// Events running at once; the instance manager's own limits (concurrency,
/// reserved concurrency) apply to each as to any invocation.
const MAX_IN_FLIGHT: usize = 256;

/// Runs the queue's events until the daemon stops (abort the task).
pub fn spawn_dispatcher(daemon: Arc<Daemon>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let slots = Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT));
        loop {
            let Ok(slot) = slots.clone().acquire_owned().await else {
                return;
            };
            // A fenced cluster node runs nothing: another node may take
            // over its events.
            while daemon.cluster.as_ref().is_some_and(|n| n.is_fenced()) {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            let ev = daemon.events.next_due().await;
            let daemon = daemon.clone();
            tokio::spawn(async move {
                run_event(&daemon, ev).await;
                drop(slot);
            });
        }
    })
}

async fn run_event(daemon: &Arc<Daemon>, ev: TakenEvent) {
    let queue = daemon.events.clone();
    let (function, request_id) = (ev.meta.function.clone(), ev.meta.request_id.clone());
    let found =
        super::versions::resolve(daemon, &function, ev.meta.qualifier.as_deref()).and_then(|f| {
            // The configuration of the qualifier the event was invoked with.
            let qualifier = ev.meta.qualifier.as_deref().unwrap_or("$LATEST");
            let cfg = daemon
                .catalog
                .event_invoke_config(&function, qualifier)
                .map_err(super::error::catalog_err)?;
            Ok((f, cfg.unwrap_or_default()))
        });
    let (f, cfg) = match found {
        Ok(found) => found,
        Err(e) if e.status == StatusCode::NOT_FOUND => {
            tracing::warn!(%function, %request_id,
                "event dropped: its function, version or alias was deleted ({})", e.message);
            return off_thread(queue, move |q| {
                q.drop_event(ev, DropReason::FunctionDeleted)
            })
            .await;
        }
        Err(e) => {
            let why = format!("the catalogue: {}", e.message);
            return off_thread(queue, move |q| {
                q.failed(ev, &why, None);
            })
            .await;
        }
    };
    let read = {
        let queue = queue.clone();
        tokio::task::spawn_blocking(move || {
            let payload = queue.payload(&ev);
            (ev, payload)
        })
        .await
    };
    let Ok((ev, payload)) = read else {
        // The blocking task panicked: the event stays on disk for the next
        // start, and counts as running until then.
        tracing::error!(%function, %request_id, "event payload read failed");
        return;
    };
    let payload = match payload {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(%function, %request_id, "event dropped: its file cannot be read: {e}");
            return off_thread(queue, move |q| q.drop_event(ev, DropReason::Unreadable)).await;
        }
    };
    let max_age = cfg
        .max_age_s
        .map_or(queue.config().max_age, |s| Duration::from_secs(s.into()));
    if ev.age() > max_age {
        tracing::warn!(%function, %request_id,
            "event dropped: older than {max_age:?} (accepted {:?} ago)", ev.age());
        let record = Record::failure("EventAgeExceeded", &f, &cfg, &payload, None);
        return off_thread(queue, move |q| {
            record.send(q, &ev);
            q.drop_event(ev, DropReason::Expired);
        })
        .await;
    }
    let max_retries = cfg.max_retries;
    let last_try = ev.meta.attempts >= max_retries.unwrap_or(queue.config().max_retries);
    match invoke::run(daemon, &f, &request_id, &payload, Instant::now()).await {
        Ok(done) if !done.function_error => {
            let record = Record::success(&f, &cfg, &payload, &done.body);
            off_thread(queue, move |q| {
                record.send(q, &ev);
                q.done(ev);
            })
            .await
        }
        Ok(done) => {
            let response = Response {
                status: 200,
                function_error: true,
                body: done.body,
            };
            let record = Record::failure("RetriesExhausted", &f, &cfg, &payload, Some(response))
                .only_if(last_try);
            off_thread(queue, move |q| {
                record.send(q, &ev);
                q.failed(ev, "the function returned an error", max_retries);
            })
            .await;
        }
        Err(e) if e.status == StatusCode::TOO_MANY_REQUESTS => {
            off_thread(queue, move |q| q.throttled(ev)).await;
        }
        Err(e) if e.status.is_server_error() => {
            // A system error (a host fault, an instance that could not
            // start): back to the queue as a throttle is, not counted as a
            // retry, until the event's maximum age (Lambda's rule).
            tracing::warn!(%function, %request_id, "event attempt lost to a system error, tried again later: {}", e.message);
            off_thread(queue, move |q| q.throttled(ev)).await;
        }
        Err(e) => {
            let response = Response {
                status: e.status.as_u16(),
                function_error: false,
                body: serde_json::json!({ "errorType": e.kind, "errorMessage": e.message })
                    .to_string()
                    .into_bytes(),
            };
            let record = Record::failure("RetriesExhausted", &f, &cfg, &payload, Some(response))
                .only_if(last_try);
            let why = e.message;
            off_thread(queue, move |q| {
                record.send(q, &ev);
                q.failed(ev, &why, max_retries);
            })
            .await;
        }
    }
}

/// What the last attempt answered, for a destination record.
struct Response {
    status: u16,
    function_error: bool,
    body: Vec<u8>,
}

/// A destination record to queue before the event ends (Lambda's shape:
/// `requestContext`, `requestPayload`, `responseContext`, `responsePayload`).
struct Record {
    /// (destination function, condition, the record's JSON); `None` when
    /// the event's configuration names no destination for its outcome.
    to: Option<(String, &'static str, serde_json::Value)>,
}

impl Record {
    fn success(f: &Function, cfg: &EventInvokeConfig, payload: &[u8], body: &[u8]) -> Self {
        let response = Response {
            status: 200,
            function_error: false,
            body: body.to_vec(),
        };
        Self::to(
            cfg.on_success.as_deref(),
            "Success",
            f,
            payload,
            Some(response),
        )
    }

    fn failure(
        condition: &'static str,
        f: &Function,
        cfg: &EventInvokeConfig,
        payload: &[u8],
        response: Option<Response>,
    ) -> Self {
        Self::to(cfg.on_failure.as_deref(), condition, f, payload, response)
    }

    fn to(
        destination: Option<&str>,
        condition: &'static str,
        f: &Function,
        payload: &[u8],
        response: Option<Response>,
    ) -> Self {
        let Some(name) = destination.and_then(crate::config::key_of_arn) else {
            return Record { to: None };
        };
        let mut record = serde_json::json!({
            "version": "1.0",
            "timestamp": crate::clock::iso_now(),
            "requestContext": {
                "functionArn": format!("{}:{}", function_arn(&f.name), f.qualifier()),
                "condition": condition,
            },
            "requestPayload": json_or_text(payload),
        });
        if let Some(r) = response {
            let mut context = serde_json::json!({
                "statusCode": r.status,
                "executedVersion": f.qualifier(),
            });
            if r.function_error {
                context["functionError"] = "Unhandled".into();
            }
            record["responseContext"] = context;
            record["responsePayload"] = json_or_text(&r.body);
        }
        Record {
            to: Some((name.to_string(), condition, record)),
        }
    }

    /// Keeps the record only when the attempt was the event's last.
    fn only_if(self, last_try: bool) -> Self {
        if last_try {
            self
        } else {
            Record { to: None }
        }
    }

    /// Queues the record (durably) for its destination, naming `ev`'s
    /// request id and attempts. Blocking: run it off the async threads.
    fn send(self, queue: &EventQueue, ev: &TakenEvent) {
        let Some((destination, condition, mut record)) = self.to else {
            return;
        };
        record["requestContext"]["requestId"] = ev.meta.request_id.clone().into();
        // The attempts so far, the one that ended it included when one ran.
        let ran = u32::from(condition != "EventAgeExceeded");
        record["requestContext"]["approximateInvokeCount"] = (ev.meta.attempts + ran).into();
        let id = super::random_uuid();
        queue.accept_record(
            ev,
            &destination,
            condition,
            &id,
            record.to_string().as_bytes(),
        );
    }
}

/// A payload as JSON when it is JSON, else as a string.
fn json_or_text(bytes: &[u8]) -> serde_json::Value {
    serde_json::from_slice(bytes)
        .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(bytes).into_owned()))
}

/// Runs a queue update that touches the disk (remove, rewrite, fsync) on a
/// blocking thread.
async fn off_thread(queue: Arc<EventQueue>, update: impl FnOnce(&EventQueue) + Send + 'static) {
    if let Err(e) = tokio::task::spawn_blocking(move || update(&queue)).await {
        tracing::error!("event queue update failed: {e}");
    }
}
