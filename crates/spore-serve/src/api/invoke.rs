//! Lambda's Invoke: `RequestResponse` (the function's answer), `Event`
//! (202, run in the background), `DryRun` (204); function errors carry
//! `X-Amz-Function-Error`, `LogType: Tail` the last 4 KB of the log in
//! `X-Amz-Log-Result`. Every invocation's log is kept under
//! `<state>/logs/<function>.log`.

use std::sync::Arc;
use std::time::Instant;

use base64::Engine;
use bytes::Bytes;
use hyper::header::HeaderValue;
use hyper::StatusCode;

use super::error::LambdaError;
use super::{empty_response, Daemon, Resp};
use crate::catalog::Function;
use crate::events::AcceptError;
use crate::instances::{AcquireError, Invocation, Outcome};
use crate::logs;

/// Lambda's synchronous payload limit.
const SYNC_PAYLOAD: usize = spore_abi::function::MAX_PAYLOAD as usize;
/// Lambda's asynchronous (`Event`) payload limit.
const ASYNC_PAYLOAD: usize = 256 * 1024;
/// `X-Amz-Log-Result` carries this much of the log's end.
const LOG_TAIL: usize = 4096;

enum InvocationType {
    RequestResponse,
    Event,
    DryRun,
}

pub async fn invoke(
    daemon: &Arc<Daemon>,
    name: &str,
    qualifier: Option<String>,
    req: super::Req,
) -> Result<Resp, LambdaError> {
    let received = Instant::now();
    if daemon.cluster.as_ref().is_some_and(|n| n.is_fenced()) {
        return Err(LambdaError::new(
            hyper::StatusCode::SERVICE_UNAVAILABLE,
            "ServiceException",
            "this node lost its cluster lease and is fenced: retry through another node",
        ));
    }
    let header = |k: &str| {
        req.headers()
            .get(k)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let kind = match header("x-amz-invocation-type").as_deref() {
        None | Some("RequestResponse") => InvocationType::RequestResponse,
        Some("Event") => InvocationType::Event,
        Some("DryRun") => InvocationType::DryRun,
        Some(other) => {
            return Err(LambdaError::invalid(format!(
                "Value '{other}' at 'invocationType' failed to satisfy constraint: Member must satisfy enum value set: [Event, RequestResponse, DryRun]"
            )))
        }
    };
    let tail = match header("x-amz-log-type").as_deref() {
        None | Some("None") => false,
        Some("Tail") => true,
        Some(other) => {
            return Err(LambdaError::invalid(format!(
                "Value '{other}' at 'logType' failed to satisfy constraint: Member must satisfy enum value set: [None, Tail]"
            )))
        }
    };
    let limit = match kind {
        InvocationType::Event => ASYNC_PAYLOAD,
        _ => SYNC_PAYLOAD,
    };
    let payload = super::body_within(&req, limit, "Invoke")?;
    // Lambda takes JSON events only (an empty body is passed on as it is).
    if !payload.is_empty() {
        if let Err(e) = serde_json::from_slice::<serde::de::IgnoredAny>(&payload) {
            return Err(LambdaError::new(
                StatusCode::BAD_REQUEST,
                "InvalidRequestContentException",
                format!("Could not parse request body into json: {e}"),
            ));
        }
    }
    // An alias is resolved here for a synchronous call (its weights pick a
    // version per invocation), and again when a queued event runs.
    let f = super::versions::resolve(daemon, name, qualifier.as_deref())?;
    match kind {
        InvocationType::DryRun => Ok(empty_response(StatusCode::NO_CONTENT)),
        InvocationType::Event => {
            // On disk (fsynced) before the 202: an accepted event survives
            // the daemon's death and runs at least once (api::events).
            let request_id = super::random_uuid();
            let queue = daemon.events.clone();
            let (function, id) = (f.name.clone(), request_id.clone());
            let kept = tokio::task::spawn_blocking(move || {
                queue.accept(&function, qualifier.as_deref(), &id, &payload)
            })
            .await
            .map_err(|e| LambdaError::service(format!("keeping the event: {e}")))?;
            match kept {
                Ok(()) => {}
                Err(e @ AcceptError::Full(_)) => {
                    daemon.instances.metrics.throttled(&f.name);
                    let mut err = LambdaError::throttled("EventQueueFull");
                    err.message = format!("Rate Exceeded. ({e})");
                    return Err(err);
                }
                Err(e @ AcceptError::Io(_)) => return Err(LambdaError::service(e.to_string())),
            }
            let mut resp = empty_response(StatusCode::ACCEPTED);
            if let Ok(v) = HeaderValue::from_str(&request_id) {
                resp.headers_mut().insert("x-amzn-requestid", v);
            }
            Ok(resp)
        }
        InvocationType::RequestResponse => {
            if let Some(resp) = forward(daemon, &f, &req).await {
                return Ok(resp);
            }
            let request_id = super::random_uuid();
            let done = run(daemon, &f, &request_id, &payload, received).await?;
            let mut resp = hyper::Response::new(http_body_util::Full::new(Bytes::from(done.body)));
            let h = resp.headers_mut();
            if let Ok(v) = HeaderValue::from_str(&f.qualifier()) {
                h.insert("x-amz-executed-version", v);
            }
            if let Ok(v) = HeaderValue::from_str(&request_id) {
                h.insert("x-amzn-requestid", v);
            }
            h.insert(
                hyper::header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            // spore extensions: how the instance started, and the time from
            // the request's arrival to the response (for benchmarks).
            h.insert(
                "x-spore-start-path",
                HeaderValue::from_static(done.path.as_str()),
            );
            if let Ok(v) = HeaderValue::from_str(&done.micros.to_string()) {
                h.insert("x-spore-duration-us", v);
            }
            // In a cluster: the node that ran it (a forwarded one's owner).
            if let Some(node) = &daemon.cluster {
                if let Ok(v) = HeaderValue::from_str(&node.cluster.node_id) {
                    h.insert("x-spore-node", v);
                }
            }
            if done.function_error {
                h.insert(
                    "x-amz-function-error",
                    HeaderValue::from_static("Unhandled"),
                );
            }
            if tail {
                let log = &done.log[done.log.len().saturating_sub(LOG_TAIL)..];
                let b64 = base64::engine::general_purpose::STANDARD.encode(log);
                if let Ok(v) = HeaderValue::from_str(&b64) {
                    h.insert("x-amz-log-result", v);
                }
            }
            Ok(resp)
        }
    }
}

pub(super) struct Done {
    pub(super) body: Vec<u8>,
    pub(super) function_error: bool,
    log: Vec<u8>,
    path: crate::metrics::StartPath,
    micros: u64,
}

/// Runs one invocation through the instance manager and keeps its log.
pub(super) async fn run(
    daemon: &Daemon,
    f: &Function,
    request_id: &str,
    payload: &[u8],
    received: Instant,
) -> Result<Done, LambdaError> {
    // The account's concurrency first: one tenant's burst cannot take the
    // whole host's.
    let account = daemon.accounts.of_key(&f.name);
    let _slot = crate::account_slots::start_invocation(daemon.cluster.as_deref(), &account)
        .await
        .ok_or_else(|| LambdaError::throttled("ConcurrentInvocationLimitExceeded"))?;
    let started = daemon
        .instances
        .invoke(f, request_id, payload, account.limits.memory)
        .await;
    let inv: Invocation = match started {
        Ok(i) => i,
        Err(AcquireError::Throttled { reserved }) => {
            return Err(LambdaError::throttled(if reserved {
                "ReservedFunctionConcurrentInvocationLimitExceeded"
            } else {
                "ConcurrentInvocationLimitExceeded"
            }))
        }
        Err(AcquireError::AccountMemory { .. }) => {
            return Err(LambdaError::throttled("AccountMemoryLimitExceeded"))
        }
        Err(e @ (AcquireError::Start(_) | AcquireError::Init(_))) => {
            return Err(LambdaError::service(e.to_string()))
        }
    };
    let (body, function_error, outcome, function_log) = match inv.outcome {
        Outcome::Done(r) => {
            let outcome = if r.ok { "success" } else { "function_error" };
            (r.body, !r.ok, outcome, r.log)
        }
        Outcome::TimedOut { log } => {
            let msg = format!(
                "{} {request_id} Task timed out after {}.00 seconds",
                crate::clock::lambda_now(),
                f.timeout_s
            );
            (
                serde_json::json!({ "errorMessage": msg })
                    .to_string()
                    .into_bytes(),
                true,
                "timeout",
                log,
            )
        }
        Outcome::Crashed { why, console, log } => {
            let msg = format!("RequestId: {request_id} Error: {why}");
            (
                serde_json::json!({ "errorType": "Runtime.ExitError", "errorMessage": msg })
                    .to_string()
                    .into_bytes(),
                true,
                "function_error",
                logs::died_log(log, &console),
            )
        }
        Outcome::OutOfMemory {
            limit_bytes,
            console,
            log,
        } => {
            // Lambda's words for it, with the limit that was reached.
            let msg = format!(
                "RequestId: {request_id} Error: Runtime exited with error: signal: killed (the instance went past its memory limit of {} MiB, MemorySize {} MiB and the VMM's own)",
                limit_bytes >> 20,
                f.memory_mib
            );
            (
                serde_json::json!({ "errorType": "Runtime.OutOfMemory", "errorMessage": msg })
                    .to_string()
                    .into_bytes(),
                true,
                "function_error",
                logs::died_log(log, &console),
            )
        }
        Outcome::HostFault { why, console, log } => {
            // Not the function's fault: logged and counted as a service
            // error, answered 500 (an Event invocation goes back to its
            // queue, as Lambda does on a system error).
            let seconds = received.elapsed().as_secs_f64();
            daemon
                .instances
                .metrics
                .invoked(&f.name, inv.path, "service_error", seconds);
            let log = logs::invocation_log(
                f,
                request_id,
                inv.path,
                seconds,
                "service_error",
                &logs::died_log(log, &console),
            );
            logs::append(&daemon.state_dir, &f.name, log);
            return Err(LambdaError::service(format!(
                "RequestId: {request_id} Error: the invocation was lost to a host fault, not the function's: {why}"
            )));
        }
    };
    let elapsed = received.elapsed();
    let seconds = elapsed.as_secs_f64();
    daemon
        .instances
        .metrics
        .invoked(&f.name, inv.path, outcome, seconds);
    let log = logs::invocation_log(f, request_id, inv.path, seconds, outcome, &function_log);
    logs::append(&daemon.state_dir, &f.name, log.clone());
    Ok(Done {
        body,
        function_error,
        log,
        path: inv.path,
        // Saturates only after 584,000 years.
        micros: u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX),
    })
}

/// In a cluster, an invocation goes to the node placement names
/// (`crate::cluster`: one holding a warm instance, zygote or snapshot of
/// its revision, else an owner); `None`: run it here (a single daemon, the
/// best place, a forwarded request, or no node named answered).
async fn forward(daemon: &Daemon, f: &Function, req: &super::Req) -> Option<Resp> {
    let node = daemon.cluster.as_ref()?;
    if req.headers().contains_key(crate::cluster::FORWARDED_HEADER) {
        return None;
    }
    let nodes = node.placement(&f.name, f.version)?;
    let forwarded = node
        .forward_invoke(
            &nodes,
            &f.name,
            &f.qualifier(),
            std::time::Duration::from_secs(u64::from(f.timeout_s)),
            req.headers(),
            req.body().clone(),
        )
        .await;
    match forwarded {
        Ok(resp) => Some(resp),
        Err(crate::cluster::ForwardError::NotTaken(e)) => {
            tracing::warn!(function = %f.name, "no node took the invocation ({e}): run here");
            None
        }
        // It may be running there: never run it twice.
        Err(crate::cluster::ForwardError::Abandoned(e)) => {
            tracing::warn!(function = %f.name, "forwarded invocation abandoned: {e}");
            Some(
                LambdaError::new(
                    hyper::StatusCode::SERVICE_UNAVAILABLE,
                    "ServiceException",
                    format!("the node running the invocation did not answer ({e}): retry"),
                )
                .into_response(),
            )
        }
    }
}

/// An invocation another node forwarded (`crate::cluster`): checked by the
/// cluster key, then run as any Invoke, never forwarded again.
pub async fn forwarded(
    daemon: &Arc<Daemon>,
    node: &crate::cluster::Node,
    function: &str,
    req: hyper::Request<hyper::body::Incoming>,
    body_timeout: std::time::Duration,
) -> Resp {
    if !node.authorised(req.headers()) {
        return LambdaError::new(
            StatusCode::FORBIDDEN,
            crate::cluster::REFUSED_KIND,
            "the cluster key is missing or wrong",
        )
        .into_response();
    }
    let result = async {
        let valid = !function.is_empty()
            && function
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_:".contains(&b));
        if !valid {
            return Err(LambdaError::invalid(
                "a forwarded invocation names no function key",
            ));
        }
        let req = super::read_whole(req, body_timeout).await?;
        let qualifier = super::query_qualifier(&req)?;
        invoke(daemon, function, qualifier, req).await
    }
    .await;
    result.unwrap_or_else(LambdaError::into_response)
}
