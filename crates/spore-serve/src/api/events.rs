//! The dispatcher of `Event` invocations: takes each due event from the
//! durable queue ([`crate::events`]), runs it as an invocation (logged and
//! counted as any other), and tells the queue the outcome: done, throttled
//! (waited out), failed (retried, then dropped), or dropped at once (too
//! old, function deleted), each drop logged with the event's request id.

use std::sync::Arc;
use std::time::Instant;

use hyper::StatusCode;

use super::{invoke, Daemon};
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
    let max_age = queue.config().max_age;
    if ev.age() > max_age {
        tracing::warn!(%function, %request_id,
            "event dropped: older than {max_age:?} (accepted {:?} ago)", ev.age());
        return off_thread(queue, move |q| q.drop_event(ev, DropReason::Expired)).await;
    }
    let f = match daemon.catalog.get(&function) {
        Ok(Some(f)) => f,
        Ok(None) => {
            tracing::warn!(%function, %request_id, "event dropped: its function was deleted");
            return off_thread(queue, move |q| {
                q.drop_event(ev, DropReason::FunctionDeleted)
            })
            .await;
        }
        Err(e) => {
            let why = format!("the catalogue: {e}");
            return off_thread(queue, move |q| {
                q.failed(ev, &why);
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
    match invoke::run(daemon, &f, &request_id, &payload, Instant::now()).await {
        Ok(done) if !done.function_error => off_thread(queue, move |q| q.done(ev)).await,
        Ok(_) => {
            off_thread(queue, move |q| {
                q.failed(ev, "the function returned an error");
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
            let why = e.message;
            off_thread(queue, move |q| {
                q.failed(ev, &why);
            })
            .await;
        }
    }
}

/// Runs a queue update that touches the disk (remove, rewrite, fsync) on a
/// blocking thread.
async fn off_thread(queue: Arc<EventQueue>, update: impl FnOnce(&EventQueue) + Send + 'static) {
    if let Err(e) = tokio::task::spawn_blocking(move || update(&queue)).await {
        tracing::error!("event queue update failed: {e}");
    }
}
