//! envd's plain HTTP API (besides `/files`): `/health`, `/init`, `/envs`,
//! `/metrics`. Errors are E2B's `{"message", "code"}` JSON.

use std::collections::HashMap;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use serde::Deserialize;

use crate::connect::{read_body, Body};
use crate::state::State;

/// The largest `/init` body accepted.
const MAX_INIT_BYTES: usize = 1 << 20;

pub fn json_response(status: StatusCode, value: &serde_json::Value) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(value.to_string())).boxed());
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    response
}

/// An error in E2B's shape for the HTTP API.
pub fn error(status: StatusCode, message: impl Into<String>) -> Response<Body> {
    json_response(
        status,
        &serde_json::json!({ "message": message.into(), "code": status.as_u16() }),
    )
}

pub fn no_content() -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::new()).boxed());
    *response.status_mut() = StatusCode::NO_CONTENT;
    response
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct InitRequest {
    env_vars: Option<HashMap<String, String>>,
    access_token: Option<String>,
    timestamp: Option<String>,
    default_user: Option<String>,
    default_workdir: Option<String>,
}

/// `POST /init`: what the host tells a sandbox when it starts or resumes.
/// Fields left out keep their value.
pub async fn init(state: &State, req: Request<Incoming>, manage_clock: bool) -> Response<Body> {
    let body = match read_body(req.into_body(), MAX_INIT_BYTES).await {
        Ok(body) => body,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.message),
    };
    let init: InitRequest = if body.iter().all(u8::is_ascii_whitespace) {
        InitRequest {
            env_vars: None,
            access_token: None,
            timestamp: None,
            default_user: None,
            default_workdir: None,
        }
    } else {
        match serde_json::from_slice(&body) {
            Ok(init) => init,
            Err(e) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    format!("malformed /init body: {e}"),
                )
            }
        }
    };
    if manage_clock {
        if let Some(ts) = &init.timestamp {
            if let Err(e) = crate::clock::set_from_rfc3339(ts) {
                return error(StatusCode::BAD_REQUEST, e);
            }
        }
    }
    let mut settings = state.settings();
    if let Some(env_vars) = init.env_vars {
        settings.env_vars.extend(env_vars);
    }
    if let Some(token) = init.access_token.filter(|t| !t.is_empty()) {
        settings.access_token = Some(token);
    }
    if let Some(user) = init.default_user.filter(|u| !u.is_empty()) {
        settings.default_user = Some(user);
    }
    if let Some(dir) = init.default_workdir.filter(|d| !d.is_empty()) {
        settings.default_workdir = Some(dir);
    }
    no_content()
}

/// `GET /envs`: the environment `/init` set.
pub fn envs(state: &State) -> Response<Body> {
    let env_vars = state.settings().env_vars.clone();
    json_response(StatusCode::OK, &serde_json::json!(env_vars))
}

/// `GET /metrics`: the guest's CPU, memory and root filesystem use.
pub async fn metrics() -> Response<Body> {
    match tokio::task::spawn_blocking(crate::metrics::sample).await {
        Ok(Ok(m)) => json_response(StatusCode::OK, &m),
        Ok(Err(e)) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("reading metrics: {e}"),
        ),
        Err(e) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("reading metrics: {e}"),
        ),
    }
}
