//! Asynchronous invocation configuration (`2019-09-25`): Put, Update, Get,
//! Delete and List of `FunctionEventInvokeConfig`, in Lambda's shapes, one
//! per qualifier (`$LATEST` without one, a version or an alias): it applies
//! to `Event` invocations made with that qualifier. A configuration overrides the daemon's `--event-max-retries` and
//! `--event-max-age-s` for its `Event` invocations and names where their
//! records go (`DestinationConfig`); the dispatcher that applies it is
//! [`super::events`].
//!
//! spore delivers destination records to functions (a Lambda function ARN of
//! this daemon); Lambda's other destination kinds (SQS, SNS, EventBridge, S3)
//! are services spore does not run, and are refused with a clear error.

use std::sync::Arc;

use hyper::StatusCode;
use serde::Deserialize;

use super::control::existing;
use super::error::{catalog_err, LambdaError};
use super::{empty_response, json_response, parse_json, Daemon, Req, Resp};
use crate::catalog::EventInvokeConfig;
use crate::config::function_arn;

/// Lambda's bounds.
const MAX_RETRY_ATTEMPTS: i64 = 2;
const MIN_EVENT_AGE_S: i64 = 60;
const MAX_EVENT_AGE_S: i64 = 21_600;

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase")]
struct ConfigBody {
    maximum_retry_attempts: Option<i64>,
    maximum_event_age_in_seconds: Option<i64>,
    destination_config: Option<DestinationsBody>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase")]
struct DestinationsBody {
    on_success: Option<DestinationBody>,
    on_failure: Option<DestinationBody>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase")]
struct DestinationBody {
    destination: Option<String>,
}

/// The configuration's qualifier: the query's `Qualifier` (`$LATEST`
/// without one), which must be `$LATEST`, a version or an alias of `name`.
fn config_qualifier(daemon: &Daemon, name: &str, req: &Req) -> Result<String, LambdaError> {
    existing(daemon, name)?;
    let q = super::query_qualifier(req)?.unwrap_or_else(|| "$LATEST".to_string());
    let exists = match q.parse::<u32>() {
        _ if q == "$LATEST" => true,
        Ok(n) => daemon
            .catalog
            .version(name, n)
            .map_err(catalog_err)?
            .is_some(),
        Err(_) => daemon
            .catalog
            .alias(name, &q)
            .map_err(catalog_err)?
            .is_some(),
    };
    if !exists {
        return Err(LambdaError::new(
            StatusCode::NOT_FOUND,
            "ResourceNotFoundException",
            format!("Function not found: {}:{q}", function_arn(name)),
        ));
    }
    Ok(q)
}

fn not_configured(name: &str, qualifier: &str) -> LambdaError {
    LambdaError::new(
        StatusCode::NOT_FOUND,
        "ResourceNotFoundException",
        format!(
            "The function {}:{qualifier} doesn't have an EventInvokeConfig",
            function_arn(name)
        ),
    )
}

fn config_json(c: &EventInvokeConfig) -> serde_json::Value {
    let destination = |d: &Option<String>| match d {
        Some(arn) => serde_json::json!({ "Destination": arn }),
        None => serde_json::json!({}),
    };
    let mut v = serde_json::json!({
        "FunctionArn": format!("{}:{}", function_arn(&c.function), c.qualifier),
        // A REST-JSON timestamp: seconds since the epoch.
        "LastModified": c.last_modified_ms as f64 / 1000.0,
        "DestinationConfig": {
            "OnSuccess": destination(&c.on_success),
            "OnFailure": destination(&c.on_failure),
        },
    });
    if let Some(n) = c.max_retries {
        v["MaximumRetryAttempts"] = n.into();
    }
    if let Some(s) = c.max_age_s {
        v["MaximumEventAgeInSeconds"] = s.into();
    }
    v
}

/// A destination as configured: `None` for an empty one (which clears it),
/// else a function of this daemon that exists.
fn destination(
    daemon: &Daemon,
    function: &str,
    which: &str,
    arn: Option<String>,
) -> Result<Option<String>, LambdaError> {
    let Some(arn) = arn.filter(|a| !a.is_empty()) else {
        return Ok(None);
    };
    let service = arn.split(':').nth(2).unwrap_or("");
    if !arn.starts_with("arn:") || service != "lambda" || !arn.contains(":function:") {
        return Err(LambdaError::invalid(format!(
            "The {which} destination {arn} is not supported: spore serve delivers destination records to functions only (arn:aws:lambda:REGION:ACCOUNT:function:NAME), not to SQS, SNS, EventBridge or S3"
        )));
    }
    // A destination is a function of the same account.
    let owner = daemon.accounts.of_key(function);
    let name = super::fn_name(&owner, &arn).map_err(|e| {
        LambdaError::invalid(format!("The {which} destination {arn}: {}", e.message))
    })?;
    if daemon.catalog.get(&name).map_err(catalog_err)?.is_none() {
        return Err(LambdaError::invalid(format!(
            "The {which} destination {arn} does not exist: create the function first"
        )));
    }
    Ok(Some(function_arn(&name)))
}

fn bounded(v: Option<i64>, min: i64, max: i64, field: &str) -> Result<Option<u32>, LambdaError> {
    match v {
        None => Ok(None),
        Some(n) if (min..=max).contains(&n) => Ok(u32::try_from(n).ok()),
        Some(n) => Err(LambdaError::invalid(format!(
            "1 validation error detected: Value '{n}' at '{field}' failed to satisfy constraint: Member must have value between {min} and {max}"
        ))),
    }
}

/// `PutFunctionEventInvokeConfig` (`replace`) and
/// `UpdateFunctionEventInvokeConfig` (only the fields given change).
pub async fn put(
    daemon: &Arc<Daemon>,
    name: &str,
    req: Req,
    replace: bool,
) -> Result<Resp, LambdaError> {
    let op = if replace {
        "PutFunctionEventInvokeConfig"
    } else {
        "UpdateFunctionEventInvokeConfig"
    };
    let body = super::body_within(&req, 64 * 1024, op)?;
    let b: ConfigBody = parse_json(&body)?;
    if b.maximum_retry_attempts.is_none()
        && b.maximum_event_age_in_seconds.is_none()
        && b.destination_config.is_none()
    {
        return Err(LambdaError::invalid(
            "You must specify at least one of error handling or destination setting.",
        ));
    }
    let retries = bounded(
        b.maximum_retry_attempts,
        0,
        MAX_RETRY_ATTEMPTS,
        "maximumRetryAttempts",
    )?;
    let age = bounded(
        b.maximum_event_age_in_seconds,
        MIN_EVENT_AGE_S,
        MAX_EVENT_AGE_S,
        "maximumEventAgeInSeconds",
    )?;
    let _admin = daemon.admin.lock().await;
    let f = existing(daemon, name)?;
    let q = config_qualifier(daemon, name, &req)?;
    let old = daemon
        .catalog
        .event_invoke_config(&f.name, &q)
        .map_err(catalog_err)?;
    let mut c = match (replace, old) {
        (false, Some(old)) => old,
        (false, None) => return Err(not_configured(&f.name, &q)),
        (true, _) => EventInvokeConfig {
            function: f.name.clone(),
            qualifier: q,
            ..Default::default()
        },
    };
    if replace || retries.is_some() {
        c.max_retries = retries;
    }
    if replace || age.is_some() {
        c.max_age_s = age;
    }
    let d = b.destination_config.unwrap_or_default();
    if replace || d.on_success.is_some() {
        c.on_success = destination(
            daemon,
            &f.name,
            "OnSuccess",
            d.on_success.and_then(|d| d.destination),
        )?;
    }
    if replace || d.on_failure.is_some() {
        c.on_failure = destination(
            daemon,
            &f.name,
            "OnFailure",
            d.on_failure.and_then(|d| d.destination),
        )?;
    }
    c.last_modified_ms = crate::clock::unix_ms();
    daemon
        .catalog
        .put_event_invoke_config(&c)
        .map_err(catalog_err)?;
    tracing::info!(function = %f.name, qualifier = %c.qualifier, "event invoke config set");
    Ok(json_response(StatusCode::OK, &config_json(&c)))
}

pub fn get(daemon: &Arc<Daemon>, name: &str, req: &Req) -> Result<Resp, LambdaError> {
    let q = config_qualifier(daemon, name, req)?;
    let c = daemon
        .catalog
        .event_invoke_config(name, &q)
        .map_err(catalog_err)?
        .ok_or_else(|| not_configured(name, &q))?;
    Ok(json_response(StatusCode::OK, &config_json(&c)))
}

pub async fn delete(daemon: &Arc<Daemon>, name: &str, req: &Req) -> Result<Resp, LambdaError> {
    let _admin = daemon.admin.lock().await;
    let q = config_qualifier(daemon, name, req)?;
    if !daemon
        .catalog
        .delete_event_invoke_config(name, &q)
        .map_err(catalog_err)?
    {
        return Err(not_configured(name, &q));
    }
    Ok(empty_response(StatusCode::NO_CONTENT))
}

/// `ListFunctionEventInvokeConfigs`: one per qualifier that has one.
pub fn list(daemon: &Arc<Daemon>, name: &str) -> Result<Resp, LambdaError> {
    existing(daemon, name)?;
    let configs: Vec<serde_json::Value> = daemon
        .catalog
        .event_invoke_configs(name)
        .map_err(catalog_err)?
        .iter()
        .map(config_json)
        .collect();
    Ok(json_response(
        StatusCode::OK,
        &serde_json::json!({ "FunctionEventInvokeConfigs": configs }),
    ))
}
