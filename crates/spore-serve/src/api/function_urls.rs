//! Serving function URLs (`--url-listen`): a plain HTTP request becomes
//! Lambda's function URL event (payload format 2.0), the function runs as
//! any invocation (same start paths, log and metrics), and its answer
//! becomes the HTTP response, as Lambda translates it: an object with
//! `statusCode` gives the status, headers, cookies and (base64) body; any
//! other answer is a 200 JSON body.
//!
//! A request names its URL by host (`<url-id>.lambda-url.<region>.<domain>`)
//! or, for plain local use, by its first path segment (`/<url-id>/path`).
//! `AWS_IAM` URLs need a SigV4 signature by one of the daemon's `--auth`
//! keys; `NONE` URLs are public.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use base64::Engine;
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderName, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};

use super::error::LambdaError;
use super::{invoke, versions, Daemon, Resp};
use crate::catalog::FunctionUrl;
use crate::server::Peer;

/// Lambda's payload limit for function URLs (request and response).
const URL_PAYLOAD: usize = 6 * 1024 * 1024;

/// Where URLs are served, to write each one's `FunctionUrl`.
pub struct UrlBase {
    addr: SocketAddr,
    domain: Option<String>,
}

impl UrlBase {
    pub fn new(addr: SocketAddr, domain: Option<String>) -> Self {
        UrlBase { addr, domain }
    }
}

/// A URL as clients reach it (what `FunctionUrl` shows).
pub fn url_of(daemon: &Daemon, url_id: &str) -> String {
    let region = crate::config::REGION;
    match daemon.url_base.get() {
        Some(UrlBase {
            domain: Some(d),
            addr,
        }) => {
            let port = if addr.port() == 80 {
                String::new()
            } else {
                format!(":{}", addr.port())
            };
            format!("http://{url_id}.lambda-url.{region}.{d}{port}/")
        }
        Some(UrlBase { addr, .. }) => format!("http://{addr}/{url_id}/"),
        // Not served (no --url-listen): the name it would have.
        None => format!("http://{url_id}.lambda-url.{region}.localhost/"),
    }
}

/// Serves one request to a function URL. Never fails: errors are HTTP
/// answers in Lambda's URL shape (`{"Message": …}`).
pub async fn handle(
    daemon: Arc<Daemon>,
    req: Request<Incoming>,
    body_timeout: std::time::Duration,
) -> Result<Resp, Infallible> {
    let received = Instant::now();
    let peer = req.extensions().get::<Peer>().copied();
    let request_id = super::random_uuid();
    let mut resp = match serve(&daemon, req, body_timeout, peer, &request_id, received).await {
        Ok(r) => r,
        Err(e) => message(e.status, &e.message),
    };
    if let Ok(v) = HeaderValue::from_str(&request_id) {
        resp.headers_mut().insert("x-amzn-requestid", v);
    }
    Ok(resp)
}

fn message(status: StatusCode, text: &str) -> Resp {
    let mut resp = Response::new(Full::new(Bytes::from(
        serde_json::json!({ "Message": text }).to_string(),
    )));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

fn forbidden() -> LambdaError {
    LambdaError::new(StatusCode::FORBIDDEN, "Forbidden", "Forbidden")
}

/// The URL id a request names and the path the function sees.
fn url_id_and_path(req: &Request<Incoming>) -> Option<(String, String)> {
    let path = req.uri().path();
    let host = req
        .headers()
        .get(hyper::header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    if let Some((label, _)) = host.split_once(".lambda-url.") {
        if is_url_id(label) {
            return Some((label.to_string(), path.to_string()));
        }
    }
    let rest = path.strip_prefix('/')?;
    let (id, tail) = rest.split_once('/').unwrap_or((rest, ""));
    is_url_id(id).then(|| (id.to_string(), format!("/{tail}")))
}

fn is_url_id(s: &str) -> bool {
    s.len() == 32
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

async fn serve(
    daemon: &Arc<Daemon>,
    req: Request<Incoming>,
    body_timeout: std::time::Duration,
    peer: Option<Peer>,
    request_id: &str,
    received: Instant,
) -> Result<Resp, LambdaError> {
    let (url_id, raw_path) = url_id_and_path(&req).ok_or_else(forbidden)?;
    let url = daemon
        .catalog
        .url_by_id(&url_id)
        .map_err(super::error::catalog_err)?
        .ok_or_else(forbidden)?;
    let cors: serde_json::Value = serde_json::from_str(&url.cors_json).unwrap_or_default();
    if req.method() == Method::OPTIONS
        && req.headers().contains_key("access-control-request-method")
    {
        return Ok(preflight(&cors, &req));
    }
    let req = super::read_whole(req, body_timeout).await?;
    if req.body().len() > URL_PAYLOAD {
        return Err(LambdaError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "RequestTooLargeException",
            format!(
                "Request must be smaller than {URL_PAYLOAD} bytes for the InvokeFunction operation"
            ),
        ));
    }
    if url.auth_type == "AWS_IAM" {
        // No keys, no way to authorise: refused, never served as public.
        // Only the function's own account may call it (spore has no
        // resource policies to grant another).
        let keys = daemon.auth.as_ref().ok_or_else(forbidden)?;
        let signer = super::authenticate(keys, &req).map_err(|_| forbidden())?;
        if !signer.owns(&url.function) {
            return Err(forbidden());
        }
    }
    let f = versions::resolve(daemon, &url.function, Some(&url.qualifier))?;
    let event = url_event(&url, &req, &raw_path, peer, request_id);
    let origin = req
        .headers()
        .get(hyper::header::ORIGIN)
        .and_then(|o| o.to_str().ok())
        .map(str::to_string);
    let done = invoke::run(
        daemon,
        &f,
        request_id,
        event.to_string().as_bytes(),
        received,
    )
    .await;
    let mut resp = match done {
        Ok(done) if done.function_error => {
            message(StatusCode::BAD_GATEWAY, "Internal Server Error")
        }
        Ok(done) => function_response(&done.body),
        Err(e) if e.status.is_server_error() => {
            message(StatusCode::INTERNAL_SERVER_ERROR, "Internal Server Error")
        }
        Err(e) => message(e.status, &e.message),
    };
    add_cors(&mut resp, &cors, origin.as_deref());
    Ok(resp)
}

/// Lambda's function URL event, payload format 2.0.
fn url_event(
    url: &FunctionUrl,
    req: &super::Req,
    raw_path: &str,
    peer: Option<Peer>,
    request_id: &str,
) -> serde_json::Value {
    let mut headers = serde_json::Map::new();
    let mut cookies = Vec::new();
    for (name, value) in req.headers() {
        let Ok(value) = value.to_str() else { continue };
        if name == hyper::header::COOKIE {
            cookies.extend(value.split(';').map(|c| c.trim().to_string()));
            continue;
        }
        let joined = match headers.get(name.as_str()).and_then(|v| v.as_str()) {
            Some(before) => format!("{before},{value}"),
            None => value.to_string(),
        };
        headers.insert(name.as_str().to_string(), joined.into());
    }
    let raw_query = req.uri().query().unwrap_or("");
    let mut query = serde_json::Map::new();
    for kv in raw_query.split('&').filter(|kv| !kv.is_empty()) {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        let k = super::percent_decode(&k.replace('+', " ")).unwrap_or_else(|| k.to_string());
        let v = super::percent_decode(&v.replace('+', " ")).unwrap_or_else(|| v.to_string());
        let joined = match query.get(&k).and_then(|x| x.as_str()) {
            Some(before) => format!("{before},{v}"),
            None => v,
        };
        query.insert(k, joined.into());
    }
    let header = |n: &str| {
        headers
            .get(n)
            .and_then(|v| v.as_str())
            .unwrap_or("")
            .to_string()
    };
    let now_ms = crate::clock::unix_ms();
    let mut event = serde_json::json!({
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": raw_path,
        "rawQueryString": raw_query,
        "headers": headers,
        "requestContext": {
            "accountId": if url.auth_type == "AWS_IAM" { crate::accounts::split_key(&url.function).0 } else { "anonymous" },
            "apiId": url.url_id,
            "domainName": header("host"),
            "domainPrefix": url.url_id,
            "http": {
                "method": req.method().as_str(),
                "path": raw_path,
                "protocol": "HTTP/1.1",
                "sourceIp": peer.map(|p| p.0.ip().to_string()).unwrap_or_default(),
                "userAgent": header("user-agent"),
            },
            "requestId": request_id,
            "routeKey": "$default",
            "stage": "$default",
            "time": clf_time(),
            "timeEpoch": now_ms,
        },
        "isBase64Encoded": false,
    });
    if !cookies.is_empty() {
        event["cookies"] = cookies.into();
    }
    if !query.is_empty() {
        event["queryStringParameters"] = query.into();
    }
    let body = req.body();
    if !body.is_empty() {
        match std::str::from_utf8(body) {
            Ok(text) if is_text(&header("content-type")) => event["body"] = text.into(),
            _ => {
                event["body"] = base64::engine::general_purpose::STANDARD
                    .encode(body)
                    .into();
                event["isBase64Encoded"] = true.into();
            }
        }
    }
    event
}

/// Bodies passed as text (else base64), as Lambda decides by content type.
fn is_text(content_type: &str) -> bool {
    let ct = content_type.to_ascii_lowercase();
    ct.starts_with("text/")
        || ["json", "xml", "javascript", "x-www-form-urlencoded", "yaml"]
            .iter()
            .any(|t| ct.contains(t))
}

/// Now as the event's `time`: `12/Mar/2020:19:03:58 +0000`.
fn clf_time() -> String {
    // From Lambda's timestamp form, `2020-03-12T19:03:58.123+0000`.
    let t = crate::clock::lambda_now();
    let month = |m: &str| {
        let names = [
            "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
        ];
        m.parse::<usize>()
            .ok()
            .and_then(|n| names.get(n.wrapping_sub(1)))
            .copied()
            .unwrap_or("Jan")
    };
    match (t.get(0..4), t.get(5..7), t.get(8..10), t.get(11..19)) {
        (Some(y), Some(m), Some(d), Some(hms)) => format!("{d}/{}/{y}:{hms} +0000", month(m)),
        _ => t,
    }
}

/// The function's answer as HTTP, as Lambda translates it.
fn function_response(body: &[u8]) -> Resp {
    let parsed: Option<serde_json::Map<String, serde_json::Value>> =
        serde_json::from_slice(body).ok();
    let Some(obj) = parsed.filter(|o| o.contains_key("statusCode")) else {
        let mut resp = Response::new(Full::new(Bytes::copy_from_slice(body)));
        resp.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        return resp;
    };
    let status = obj
        .get("statusCode")
        .and_then(serde_json::Value::as_u64)
        .and_then(|s| u16::try_from(s).ok())
        .and_then(|s| StatusCode::from_u16(s).ok());
    let Some(status) = status else {
        return message(StatusCode::BAD_GATEWAY, "Internal Server Error");
    };
    let text = match obj.get("body") {
        Some(serde_json::Value::String(s)) => s.clone(),
        None | Some(serde_json::Value::Null) => String::new(),
        Some(other) => other.to_string(),
    };
    let bytes = if obj.get("isBase64Encoded") == Some(&serde_json::Value::Bool(true)) {
        match base64::engine::general_purpose::STANDARD.decode(text.as_bytes()) {
            Ok(b) => b,
            Err(_) => return message(StatusCode::BAD_GATEWAY, "Internal Server Error"),
        }
    } else {
        text.into_bytes()
    };
    if bytes.len() > URL_PAYLOAD {
        return message(
            StatusCode::BAD_GATEWAY,
            "Response payload size exceeded maximum allowed payload size",
        );
    }
    let mut resp = Response::new(Full::new(Bytes::from(bytes)));
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    if let Some(serde_json::Value::Object(headers)) = obj.get("headers") {
        for (k, v) in headers {
            let value = match v {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            if let (Ok(k), Ok(v)) = (
                HeaderName::from_bytes(k.as_bytes()),
                HeaderValue::from_str(&value),
            ) {
                h.append(k, v);
            }
        }
    }
    if let Some(serde_json::Value::Array(cookies)) = obj.get("cookies") {
        for c in cookies.iter().filter_map(|c| c.as_str()) {
            if let Ok(v) = HeaderValue::from_str(c) {
                h.append(hyper::header::SET_COOKIE, v);
            }
        }
    }
    if !h.contains_key(hyper::header::CONTENT_TYPE) {
        h.insert(
            hyper::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
    }
    resp
}

/// The `Cors` list `key` as one header value.
fn cors_list(cors: &serde_json::Value, key: &str) -> Option<String> {
    let items: Vec<&str> = cors
        .get(key)?
        .as_array()?
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    (!items.is_empty()).then(|| items.join(","))
}

/// The origin CORS allows for this request, if any.
fn allowed_origin(cors: &serde_json::Value, origin: Option<&str>) -> Option<String> {
    let origin = origin?;
    let allowed = cors.get("AllowOrigins")?.as_array()?;
    allowed
        .iter()
        .filter_map(|o| o.as_str())
        .find(|o| *o == "*" || *o == origin)
        .map(|o| o.to_string())
}

fn add_cors(resp: &mut Resp, cors: &serde_json::Value, origin: Option<&str>) {
    let Some(allow) = allowed_origin(cors, origin) else {
        return;
    };
    let h = resp.headers_mut();
    let mut set = |name: &'static str, value: String| {
        if let Ok(v) = HeaderValue::from_str(&value) {
            h.insert(name, v);
        }
    };
    set("access-control-allow-origin", allow);
    if cors.get("AllowCredentials") == Some(&serde_json::Value::Bool(true)) {
        set("access-control-allow-credentials", "true".into());
    }
    if let Some(e) = cors_list(cors, "ExposeHeaders") {
        set("access-control-expose-headers", e);
    }
}

/// A CORS preflight, answered from the URL's `Cors` without running the
/// function.
fn preflight(cors: &serde_json::Value, req: &Request<Incoming>) -> Resp {
    let origin = req
        .headers()
        .get(hyper::header::ORIGIN)
        .and_then(|o| o.to_str().ok());
    let mut resp = Response::new(Full::new(Bytes::new()));
    add_cors(&mut resp, cors, origin);
    if resp.headers().contains_key("access-control-allow-origin") {
        let h = resp.headers_mut();
        for (name, key) in [
            ("access-control-allow-methods", "AllowMethods"),
            ("access-control-allow-headers", "AllowHeaders"),
        ] {
            if let Some(v) = cors_list(cors, key).and_then(|v| HeaderValue::from_str(&v).ok()) {
                h.insert(name, v);
            }
        }
        if let Some(age) = cors.get("MaxAge").and_then(serde_json::Value::as_u64) {
            h.insert("access-control-max-age", HeaderValue::from(age));
        }
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_translate_as_lambdas() {
        let plain = function_response(br#"{"hello":1}"#);
        assert_eq!(plain.status(), StatusCode::OK);
        assert_eq!(plain.headers()["content-type"], "application/json");
        let full = function_response(
            br#"{"statusCode":201,"headers":{"x-a":"b","content-type":"text/plain"},"cookies":["c=1","d=2"],"body":"aGk=","isBase64Encoded":true}"#,
        );
        assert_eq!(full.status(), StatusCode::CREATED);
        assert_eq!(full.headers()["x-a"], "b");
        assert_eq!(full.headers()["content-type"], "text/plain");
        assert_eq!(full.headers().get_all("set-cookie").iter().count(), 2);
        for bad in [
            &br#"{"statusCode":"x"}"#[..],
            br#"{"statusCode":99999}"#,
            br#"{"statusCode":200,"body":"%%%","isBase64Encoded":true}"#,
        ] {
            assert_eq!(function_response(bad).status(), StatusCode::BAD_GATEWAY);
        }
    }

    #[test]
    fn times_are_common_log_format() {
        let t = clf_time();
        assert_eq!(t.len(), "12/Mar/2020:19:03:58 +0000".len(), "{t}");
        assert!(t.ends_with(" +0000"), "{t}");
    }

    #[test]
    fn ids_are_lambdas() {
        assert!(is_url_id("abcdefghijklmnopqrstuvwxyz012345"));
        assert!(!is_url_id("ABCDEFGHIJKLMNOPQRSTUVWXYZ012345"));
        assert!(!is_url_id("short"));
    }
}
