//! Function URL configuration (`2021-10-31`): Create, Get, Update, Delete
//! and List of `FunctionUrlConfig`, in Lambda's shapes. Serving the URLs is
//! [`super::function_urls`].

use std::sync::Arc;

use hyper::StatusCode;
use serde::Deserialize;

use super::control::existing;
use super::error::{catalog_err, LambdaError};
use super::{empty_response, json_response, parse_json, Daemon, Req, Resp};
use crate::catalog::FunctionUrl;
use crate::config::function_arn;

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase")]
struct UrlBody {
    auth_type: Option<String>,
    cors: Option<serde_json::Value>,
    invoke_mode: Option<String>,
}

/// The `Qualifier` a URL belongs to: `$LATEST` (none given) or an alias that
/// exists; Lambda gives no URL to a version number.
fn url_qualifier(daemon: &Daemon, name: &str, req: &Req) -> Result<String, LambdaError> {
    let q = super::query_qualifier(req)?.unwrap_or_else(|| "$LATEST".into());
    if q == "$LATEST" {
        return Ok(q);
    }
    if q.bytes().all(|b| b.is_ascii_digit()) {
        return Err(LambdaError::invalid(format!(
            "1 validation error detected: Value '{q}' at 'qualifier' failed to satisfy constraint: a function URL belongs to $LATEST or an alias, not a version number"
        )));
    }
    if daemon
        .catalog
        .alias(name, &q)
        .map_err(catalog_err)?
        .is_none()
    {
        return Err(LambdaError::new(
            StatusCode::NOT_FOUND,
            "ResourceNotFoundException",
            format!("Alias not found: {}:{q}", function_arn(name)),
        ));
    }
    Ok(q)
}

fn check_auth_type(a: &str) -> Result<(), LambdaError> {
    match a {
        "NONE" | "AWS_IAM" => Ok(()),
        other => Err(LambdaError::invalid(format!(
            "1 validation error detected: Value '{other}' at 'authType' failed to satisfy constraint: Member must satisfy enum value set: [NONE, AWS_IAM]"
        ))),
    }
}

fn check_invoke_mode(m: Option<&str>) -> Result<(), LambdaError> {
    match m {
        None | Some("BUFFERED") => Ok(()),
        Some("RESPONSE_STREAM") => Err(LambdaError::invalid(
            "InvokeMode RESPONSE_STREAM is not supported by spore serve: responses are buffered",
        )),
        Some(other) => Err(LambdaError::invalid(format!(
            "1 validation error detected: Value '{other}' at 'invokeMode' failed to satisfy constraint: Member must satisfy enum value set: [BUFFERED, RESPONSE_STREAM]"
        ))),
    }
}

/// `Cors` as given, checked to be an object (kept as JSON).
fn cors_json(c: Option<serde_json::Value>) -> Result<Option<String>, LambdaError> {
    match c {
        None => Ok(None),
        Some(v @ serde_json::Value::Object(_)) => Ok(Some(v.to_string())),
        Some(_) => Err(LambdaError::invalid("Cors must be an object")),
    }
}

fn config_json(daemon: &Daemon, u: &FunctionUrl) -> serde_json::Value {
    let arn = if u.qualifier == "$LATEST" {
        function_arn(&u.function)
    } else {
        format!("{}:{}", function_arn(&u.function), u.qualifier)
    };
    let cors: serde_json::Value = serde_json::from_str(&u.cors_json).unwrap_or_default();
    let mut v = serde_json::json!({
        "FunctionUrl": super::function_urls::url_of(daemon, &u.url_id),
        "FunctionArn": arn,
        "AuthType": u.auth_type,
        "CreationTime": u.creation_time,
        "LastModifiedTime": u.last_modified_time,
        "InvokeMode": "BUFFERED",
    });
    if cors.as_object().is_some_and(|o| !o.is_empty()) {
        v["Cors"] = cors;
    }
    v
}

/// 32 lowercase letters and digits, as Lambda's URL ids.
fn new_url_id() -> String {
    const ALPHABET: &[u8; 36] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut b = [0u8; 32];
    if getrandom::fill(&mut b).is_err() {
        // Without the OS generator: a UUID's randomness (itself falling
        // back to the clock), still unique.
        b.copy_from_slice(&super::random_uuid().as_bytes()[..32]);
    }
    b.iter()
        .map(|x| char::from(ALPHABET[usize::from(*x) % ALPHABET.len()]))
        .collect()
}

/// `CreateFunctionUrlConfig`: 201, one URL per function and qualifier.
pub async fn create(daemon: &Arc<Daemon>, name: &str, req: Req) -> Result<Resp, LambdaError> {
    let body = super::body_within(&req, 64 * 1024, "CreateFunctionUrlConfig")?;
    let b: UrlBody = parse_json(&body)?;
    let auth_type = b
        .auth_type
        .ok_or_else(|| LambdaError::invalid("AuthType is required"))?;
    check_auth_type(&auth_type)?;
    check_invoke_mode(b.invoke_mode.as_deref())?;
    let cors = cors_json(b.cors)?.unwrap_or_else(|| "{}".into());
    let _admin = daemon.admin.lock().await;
    let f = existing(daemon, name)?;
    let qualifier = url_qualifier(daemon, &f.name, &req)?;
    if daemon
        .catalog
        .url(&f.name, &qualifier)
        .map_err(catalog_err)?
        .is_some()
    {
        return Err(LambdaError::conflict(format!(
            "Failed to create function url config for [functionArn = {}]. Error message:  FunctionUrlConfig exists for this Lambda function",
            function_arn(&f.name)
        )));
    }
    let now = crate::clock::iso_now();
    let u = FunctionUrl {
        url_id: new_url_id(),
        function: f.name.clone(),
        qualifier,
        auth_type,
        cors_json: cors,
        creation_time: now.clone(),
        last_modified_time: now,
    };
    daemon.catalog.put_url(&u).map_err(catalog_err)?;
    tracing::info!(function = %f.name, qualifier = %u.qualifier, "function URL created");
    let mut v = config_json(daemon, &u);
    if let Some(o) = v.as_object_mut() {
        o.remove("LastModifiedTime");
    }
    Ok(json_response(StatusCode::CREATED, &v))
}

fn existing_url(daemon: &Daemon, name: &str, req: &Req) -> Result<FunctionUrl, LambdaError> {
    let f = existing(daemon, name)?;
    let qualifier = super::query_qualifier(req)?.unwrap_or_else(|| "$LATEST".into());
    daemon
        .catalog
        .url(&f.name, &qualifier)
        .map_err(catalog_err)?
        .ok_or_else(|| {
            LambdaError::new(
                StatusCode::NOT_FOUND,
                "ResourceNotFoundException",
                format!("The resource you requested does not exist: the function {name} has no URL for {qualifier}"),
            )
        })
}

pub fn get(daemon: &Arc<Daemon>, name: &str, req: &Req) -> Result<Resp, LambdaError> {
    let u = existing_url(daemon, name, req)?;
    Ok(json_response(StatusCode::OK, &config_json(daemon, &u)))
}

/// `UpdateFunctionUrlConfig`: what the body names changes.
pub async fn update(daemon: &Arc<Daemon>, name: &str, req: Req) -> Result<Resp, LambdaError> {
    let body = super::body_within(&req, 64 * 1024, "UpdateFunctionUrlConfig")?;
    let b: UrlBody = parse_json(&body)?;
    if let Some(a) = &b.auth_type {
        check_auth_type(a)?;
    }
    check_invoke_mode(b.invoke_mode.as_deref())?;
    let cors = cors_json(b.cors)?;
    let _admin = daemon.admin.lock().await;
    let mut u = existing_url(daemon, name, &req)?;
    if let Some(a) = b.auth_type {
        u.auth_type = a;
    }
    if let Some(c) = cors {
        u.cors_json = c;
    }
    u.last_modified_time = crate::clock::iso_now();
    daemon.catalog.put_url(&u).map_err(catalog_err)?;
    Ok(json_response(StatusCode::OK, &config_json(daemon, &u)))
}

pub async fn delete(daemon: &Arc<Daemon>, name: &str, req: &Req) -> Result<Resp, LambdaError> {
    let _admin = daemon.admin.lock().await;
    let u = existing_url(daemon, name, req)?;
    daemon
        .catalog
        .delete_url(&u.function, &u.qualifier)
        .map_err(catalog_err)?;
    Ok(empty_response(StatusCode::NO_CONTENT))
}

/// `ListFunctionUrlConfigs`: every URL of the function (one page).
pub fn list(daemon: &Arc<Daemon>, name: &str) -> Result<Resp, LambdaError> {
    let f = existing(daemon, name)?;
    let configs: Vec<serde_json::Value> = daemon
        .catalog
        .urls(&f.name)
        .map_err(catalog_err)?
        .iter()
        .map(|u| config_json(daemon, u))
        .collect();
    Ok(json_response(
        StatusCode::OK,
        &serde_json::json!({ "FunctionUrlConfigs": configs }),
    ))
}
