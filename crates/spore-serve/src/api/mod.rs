//! The Lambda API (`2015-03-31`) over HTTP/1.1: routing, request bodies and
//! responses. The control plane is in [`control`], [`provisioned_config`]
//! and [`event_invoke_config`], Invoke in [`invoke`].
//! Paths, JSON shapes and error shapes are Lambda's, so the AWS CLI, boto3
//! and the tools built on them drive the daemon unmodified.

mod account;
mod control;
pub mod error;
mod event_invoke_config;
mod events;
mod function_url_config;
mod function_urls;
mod invoke;
mod provisioned_config;
mod tags;
mod versions;

use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use error::LambdaError;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};

use crate::accounts::{Account, Accounts};
use crate::catalog::Catalog;
use crate::instances::Instances;

/// What request handlers share.
pub struct Daemon {
    pub state_dir: PathBuf,
    pub catalog: Arc<Catalog>,
    pub instances: Arc<Instances>,
    /// Serialises control-plane writes (create, update, delete).
    pub admin: tokio::sync::Mutex<()>,
    /// With `--auth`: the access keys requests must be signed with.
    pub auth: Option<crate::auth::Keys>,
    /// Every account: the keys file's and the default one.
    pub accounts: Arc<Accounts>,
    /// Accepted `Event` invocations, on disk until they ran.
    pub events: Arc<crate::events::EventQueue>,
    /// The API's open connections (served by `crate::server`).
    pub connections: Arc<crate::connections::Connections>,
    /// Where function URLs are served, once listening (`--url-listen`).
    pub url_base: std::sync::OnceLock<UrlBase>,
    /// In a cluster: this node (`--cluster`).
    pub cluster: Option<Arc<crate::cluster::Node>>,
    /// With `--sandbox-listen`: the sandboxes.
    pub sandboxes: Option<Arc<crate::sandboxes::Sandboxes>>,
}

pub use events::spawn_dispatcher as spawn_event_dispatcher;
pub use function_urls::{handle as handle_function_url, UrlBase};

type Resp = Response<Full<Bytes>>;

/// Largest request body of any operation (a base64 zip of 50 MB).
pub const MAX_BODY: usize = 70 * 1024 * 1024;

/// A request with its whole body read.
pub type Req = Request<Bytes>;

/// Routes one request; never fails (errors become Lambda-shaped responses).
/// A body with a pause longer than `body_timeout` is answered 408.
pub async fn handle(
    daemon: Arc<Daemon>,
    req: Request<Incoming>,
    body_timeout: std::time::Duration,
) -> Result<Resp, Infallible> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    if let (Some(node), true) = (
        &daemon.cluster,
        path.starts_with(crate::cluster::INTERNAL_PREFIX),
    ) {
        // Another node's request: the cluster key, not SigV4.
        let forwarded = path
            .strip_prefix(crate::cluster::INTERNAL_PREFIX)
            .and_then(|p| p.strip_prefix("invoke/"));
        if let Some(function) = forwarded {
            let function = function.to_string();
            return Ok(invoke::forwarded(&daemon, node, &function, req, body_timeout).await);
        }
        let snapshot = path
            .strip_prefix(crate::cluster::INTERNAL_PREFIX)
            .and_then(|p| p.strip_prefix("snapshot/"));
        if let Some(rest) = snapshot {
            return Ok(crate::cluster::serve_snapshot(
                node,
                daemon.instances.snapshot_store(),
                &daemon.catalog,
                req.headers(),
                rest,
            )
            .await);
        }
        return Ok(crate::cluster::serve_internal(
            node,
            &daemon.state_dir,
            req.headers(),
            &path,
        ));
    }
    let result = async {
        let req = read_whole(req, body_timeout).await?;
        let caller = match &daemon.auth {
            Some(keys) => authenticate(keys, &req)?,
            None => daemon.accounts.default_account(),
        };
        route(&daemon, &caller, req).await
    }
    .await;
    let resp = result.unwrap_or_else(|e| {
        tracing::debug!("{method} {path}: {} {}", e.kind, e.message);
        e.into_response()
    });
    Ok(resp)
}

/// Checks the request's SigV4 signature against the configured keys (403);
/// the account of the key that signed it.
pub(super) fn authenticate(keys: &crate::auth::Keys, req: &Req) -> Result<Caller, LambdaError> {
    let headers: Vec<(String, String)> = req
        .headers()
        .iter()
        .filter_map(|(k, v)| Some((k.as_str().to_string(), v.to_str().ok()?.to_string())))
        .collect();
    let now = crate::clock::unix_ms() / 1000;
    keys.verify(
        req.method().as_str(),
        req.uri().path(),
        req.uri().query().unwrap_or(""),
        &headers,
        req.body(),
        now,
    )
    .map_err(|e| LambdaError::new(StatusCode::FORBIDDEN, e.kind(), e.to_string()))
}

/// The account a request is served as.
pub type Caller = Arc<Account>;

async fn route(daemon: &Arc<Daemon>, caller: &Caller, req: Req) -> Result<Resp, LambdaError> {
    let path = req.uri().path().to_string();
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let method = req.method().clone();
    match (method, segments.as_slice()) {
        (Method::GET, ["metrics"]) => Ok(control::metrics(daemon, caller).await),
        (Method::GET, ["2016-08-19", "account-settings"]) => account::get(daemon, caller),
        (Method::POST, ["2015-03-31", "functions"]) => control::create(daemon, caller, req).await,
        (Method::GET, ["2015-03-31", "functions"]) => control::list(daemon, caller),
        (Method::GET, ["2015-03-31", "functions", name]) => {
            let (name, q) = name_and_any_qualifier(caller, name, &req)?;
            control::get(
                daemon,
                &versions::resolve_exact(daemon, &name, q.as_deref())?,
                &req,
            )
        }
        (Method::GET, ["spore", "functions", name, "code.zip"]) => {
            let (name, q) = name_and_any_qualifier(caller, name, &req)?;
            control::code_zip(
                daemon,
                &versions::resolve_exact(daemon, &name, q.as_deref())?,
            )
            .await
        }
        (Method::GET, ["2015-03-31", "functions", name, "configuration"]) => {
            let (name, q) = name_and_any_qualifier(caller, name, &req)?;
            Ok(control::get_configuration(&versions::resolve_exact(
                daemon,
                &name,
                q.as_deref(),
            )?))
        }
        (Method::DELETE, ["2015-03-31", "functions", name]) => {
            match name_and_any_qualifier(caller, name, &req)? {
                (name, None) => control::delete(daemon, &name).await,
                (name, Some(q)) => versions::delete_version(daemon, &name, &q).await,
            }
        }
        (Method::POST, ["2015-03-31", "functions", name, "versions"]) => {
            let name = fn_name(caller, name)?;
            versions::publish(daemon, &name, req).await
        }
        (Method::GET, ["2015-03-31", "functions", name, "versions"]) => {
            versions::list_versions(daemon, &fn_name(caller, name)?)
        }
        (Method::POST, ["2015-03-31", "functions", name, "aliases"]) => {
            let name = fn_name(caller, name)?;
            versions::create_alias(daemon, &name, req).await
        }
        (Method::GET, ["2015-03-31", "functions", name, "aliases"]) => {
            versions::list_aliases(daemon, &fn_name(caller, name)?, &req)
        }
        (Method::GET, ["2015-03-31", "functions", name, "aliases", alias]) => {
            versions::get_alias(daemon, &fn_name(caller, name)?, &alias_name(alias)?)
        }
        (Method::PUT, ["2015-03-31", "functions", name, "aliases", alias]) => {
            let (name, alias) = (fn_name(caller, name)?, alias_name(alias)?);
            versions::update_alias(daemon, &name, &alias, req).await
        }
        (Method::DELETE, ["2015-03-31", "functions", name, "aliases", alias]) => {
            versions::delete_alias(daemon, &fn_name(caller, name)?, &alias_name(alias)?).await
        }
        (Method::PUT, ["2015-03-31", "functions", name, "code"]) => {
            let name = fn_name(caller, name)?;
            control::update_code(daemon, &name, req).await
        }
        (Method::PUT, ["2015-03-31", "functions", name, "configuration"]) => {
            let name = fn_name(caller, name)?;
            control::update_configuration(daemon, &name, req).await
        }
        (Method::PUT, ["2017-10-31", "functions", name, "concurrency"]) => {
            let name = fn_name(caller, name)?;
            control::put_concurrency(daemon, &name, req).await
        }
        (Method::DELETE, ["2017-10-31", "functions", name, "concurrency"]) => {
            control::delete_concurrency(daemon, &fn_name(caller, name)?).await
        }
        (Method::GET, ["2019-09-30", "functions", name, "concurrency"]) => {
            control::get_concurrency(daemon, &fn_name(caller, name)?)
        }
        (Method::PUT, ["2019-09-30", "functions", name, "provisioned-concurrency"]) => {
            let name = fn_name(caller, name)?;
            provisioned_config::put(daemon, &name, req).await
        }
        (Method::GET, ["2019-09-30", "functions", name, "provisioned-concurrency"]) => {
            let name = fn_name(caller, name)?;
            if req
                .uri()
                .query()
                .is_some_and(|q| q.split('&').any(|kv| kv == "List=ALL"))
            {
                provisioned_config::list(daemon, &name)
            } else {
                provisioned_config::get(daemon, &name, &req)
            }
        }
        (Method::DELETE, ["2019-09-30", "functions", name, "provisioned-concurrency"]) => {
            let name = fn_name(caller, name)?;
            provisioned_config::delete(daemon, &name, &req).await
        }
        (Method::POST, ["2017-03-31", "tags", resource]) => {
            tags::tag(daemon, caller, resource, req).await
        }
        (Method::DELETE, ["2017-03-31", "tags", resource]) => {
            tags::untag(daemon, caller, resource, &req).await
        }
        (Method::GET, ["2017-03-31", "tags", resource]) => tags::list(daemon, caller, resource),
        (Method::POST, ["2015-03-31", "functions", name, "invocations"]) => {
            let (name, q) = name_and_any_qualifier(caller, name, &req)?;
            invoke::invoke(daemon, &name, q, req).await
        }
        (m, rest) => route_configs(daemon, caller, m, rest, req).await,
    }
}

/// The per-function configurations of later API versions: asynchronous
/// invocation (`2019-09-25`) and function URLs (`2021-10-31`).
async fn route_configs(
    daemon: &Arc<Daemon>,
    caller: &Caller,
    method: Method,
    segments: &[&str],
    req: Req,
) -> Result<Resp, LambdaError> {
    match (method, segments) {
        (Method::PUT, ["2019-09-25", "functions", name, "event-invoke-config"]) => {
            let name = fn_name(caller, name)?;
            event_invoke_config::put(daemon, &name, req, true).await
        }
        (Method::POST, ["2019-09-25", "functions", name, "event-invoke-config"]) => {
            let name = fn_name(caller, name)?;
            event_invoke_config::put(daemon, &name, req, false).await
        }
        (Method::GET, ["2019-09-25", "functions", name, "event-invoke-config"]) => {
            event_invoke_config::get(daemon, &fn_name(caller, name)?, &req)
        }
        (Method::DELETE, ["2019-09-25", "functions", name, "event-invoke-config"]) => {
            event_invoke_config::delete(daemon, &fn_name(caller, name)?, &req).await
        }
        (Method::GET, ["2019-09-25", "functions", name, "event-invoke-config", "list"]) => {
            event_invoke_config::list(daemon, &fn_name(caller, name)?)
        }
        (Method::POST, ["2021-10-31", "functions", name, "url"]) => {
            let name = fn_name(caller, name)?;
            function_url_config::create(daemon, &name, req).await
        }
        (Method::GET, ["2021-10-31", "functions", name, "url"]) => {
            function_url_config::get(daemon, &fn_name(caller, name)?, &req)
        }
        (Method::PUT, ["2021-10-31", "functions", name, "url"]) => {
            let name = fn_name(caller, name)?;
            function_url_config::update(daemon, &name, req).await
        }
        (Method::DELETE, ["2021-10-31", "functions", name, "url"]) => {
            function_url_config::delete(daemon, &fn_name(caller, name)?, &req).await
        }
        (Method::GET, ["2021-10-31", "functions", name, "urls"]) => {
            function_url_config::list(daemon, &fn_name(caller, name)?)
        }
        (m, _) => Err(LambdaError::new(
            StatusCode::NOT_FOUND,
            "UnknownOperationException",
            format!("no operation at {m} {}", req.uri().path()),
        )),
    }
}

/// The function name of a path segment that names no version: percent-
/// decoded, an ARN reduced to its name, checked against Lambda's rule
/// (`[A-Za-z0-9_-]{1,64}`, so a name can never be a path such as `../`
/// anywhere in the state directory). A qualified name is refused: an
/// operation on the whole function must not be taken for one on a version.
pub fn fn_name(caller: &Account, segment: &str) -> Result<String, LambdaError> {
    match name_and_qualifier(caller, segment)? {
        (name, None) => Ok(name),
        (key, Some(q)) => Err(LambdaError::invalid(format!(
            "This operation takes the function's name without a qualifier, not {}:{q}",
            crate::accounts::plain_name(&key)
        ))),
    }
}

/// A function name as a request gives it (`NAME`, `NAME:QUALIFIER`, a full
/// or partial ARN with or without a qualifier): the caller's key of that
/// function (see [`crate::accounts`]) and the qualifier, if any. An ARN
/// must name this daemon's region and the caller's account: a function of
/// another account is answered exactly as a missing one.
pub fn name_and_qualifier(
    caller: &Account,
    segment: &str,
) -> Result<(String, Option<String>), LambdaError> {
    let decoded = percent_decode(segment).ok_or_else(|| {
        LambdaError::invalid("The function name is not valid percent-encoded UTF-8")
    })?;
    let rest = match decoded.rsplit_once(":function:") {
        Some((owner, rest)) => {
            let account = match owner.split(':').collect::<Vec<_>>().as_slice() {
                [account] => *account,
                ["arn", "aws", "lambda", region, account] if *region == crate::config::REGION => {
                    *account
                }
                ["arn", "aws", "lambda", _, _] => "",
                _ => {
                    return Err(LambdaError::invalid(format!(
                        "1 validation error detected: Value '{decoded}' at 'functionName' failed to satisfy constraint: Member must be a function name or an ARN (arn:aws:lambda:REGION:ACCOUNT:function:NAME)"
                    )))
                }
            };
            if account != caller.id {
                return Err(LambdaError::new(
                    StatusCode::NOT_FOUND,
                    "ResourceNotFoundException",
                    format!("Function not found: {decoded}"),
                ));
            }
            rest
        }
        None => decoded.as_str(),
    };
    let (name, qualifier) = match rest.split_once(':') {
        Some((name, q)) => (name, Some(q)),
        None => (rest, None),
    };
    check_name(name)?;
    if let Some(q) = qualifier {
        check_qualifier(q)?;
    }
    Ok((caller.key(name), qualifier.map(str::to_string)))
}

/// An alias name of a path segment (percent-decoded, checked).
fn alias_name(segment: &str) -> Result<String, LambdaError> {
    let a = percent_decode(segment)
        .ok_or_else(|| LambdaError::invalid("The alias name is not valid percent-encoded UTF-8"))?;
    check_qualifier(&a)?;
    Ok(a)
}

/// A qualifier: `$LATEST`, a version number or an alias name
/// (`[A-Za-z0-9_-]{1,128}`).
pub fn check_qualifier(q: &str) -> Result<(), LambdaError> {
    let ok = q == "$LATEST"
        || (!q.is_empty()
            && q.len() <= 128
            && q.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
    if ok {
        Ok(())
    } else {
        Err(LambdaError::invalid(format!(
            "1 validation error detected: Value '{q}' at 'qualifier' failed to satisfy constraint: Member must satisfy regular expression pattern: (|[a-zA-Z0-9$_-]+)"
        )))
    }
}

/// The `Qualifier` of the query string, if any (checked).
pub fn query_qualifier(req: &Req) -> Result<Option<String>, LambdaError> {
    let Some(raw) = req
        .uri()
        .query()
        .unwrap_or("")
        .split('&')
        .find_map(|kv| kv.strip_prefix("Qualifier="))
    else {
        return Ok(None);
    };
    let q = percent_decode(raw)
        .ok_or_else(|| LambdaError::invalid("The qualifier is not valid percent-encoded UTF-8"))?;
    check_qualifier(&q)?;
    Ok(Some(q))
}

/// A path segment's name and qualifier, with the query's `Qualifier`: the
/// two must agree when both are given.
pub fn name_and_any_qualifier(
    caller: &Account,
    segment: &str,
    req: &Req,
) -> Result<(String, Option<String>), LambdaError> {
    let (name, in_name) = name_and_qualifier(caller, segment)?;
    let in_query = query_qualifier(req)?;
    match (in_name, in_query) {
        (Some(a), Some(b)) if a != b => Err(LambdaError::invalid(format!(
            "The derived qualifier from the function name does not match the specified qualifier ({a} and {b})"
        ))),
        (a, b) => Ok((name, a.or(b))),
    }
}

pub fn check_name(name: &str) -> Result<(), LambdaError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(LambdaError::invalid(format!(
            "1 validation error detected: Value '{name}' at 'functionName' failed to satisfy constraint: Member must satisfy regular expression pattern: [a-zA-Z0-9-_]+ (1 to 64 characters)"
        )))
    }
}

pub(crate) fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Reads the whole body (at most [`MAX_BODY`]; a larger one is a 413).
/// Reads the whole body (at most [`MAX_BODY`]); a pause of more than
/// `pause_limit` between two pieces of it (a client that declared more than
/// it sends) ends it with 408.
pub(super) async fn read_whole(
    req: Request<Incoming>,
    pause_limit: std::time::Duration,
) -> Result<Req, LambdaError> {
    let (parts, body) = req.into_parts();
    let declared = parts
        .headers
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > MAX_BODY as u64) {
        return Err(too_large(MAX_BODY, "any"));
    }
    let mut body = Limited::new(body, MAX_BODY);
    let mut bytes = bytes::BytesMut::new();
    loop {
        let frame = match tokio::time::timeout(pause_limit, body.frame()).await {
            Err(_) => {
                return Err(LambdaError::new(
                    StatusCode::REQUEST_TIMEOUT,
                    "RequestTimeoutException",
                    format!(
                        "the request body paused for more than {pause_limit:?} ({} bytes read)",
                        bytes.len()
                    ),
                ))
            }
            Ok(None) => break,
            Ok(Some(Ok(frame))) => frame,
            Ok(Some(Err(e)))
                if e.downcast_ref::<http_body_util::LengthLimitError>()
                    .is_some() =>
            {
                return Err(too_large(MAX_BODY, "any"))
            }
            Ok(Some(Err(e))) => {
                return Err(LambdaError::bad_content(format!(
                    "reading the request body: {e}"
                )))
            }
        };
        if let Ok(data) = frame.into_data() {
            bytes.extend_from_slice(&data);
        }
    }
    Ok(Request::from_parts(parts, bytes.freeze()))
}

fn too_large(limit: usize, operation: &str) -> LambdaError {
    LambdaError::too_large(format!(
        "Request must be smaller than {limit} bytes for the {operation} operation"
    ))
}

/// An operation's body, refused with 413 over its own limit.
pub fn body_within(req: &Req, limit: usize, operation: &str) -> Result<Bytes, LambdaError> {
    if req.body().len() > limit {
        return Err(too_large(limit, operation));
    }
    Ok(req.body().clone())
}

/// Parses a JSON request body into `T`; malformed JSON is Lambda's
/// `InvalidRequestContentException`, a wrong field type its
/// `InvalidParameterValueException`.
pub fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, LambdaError> {
    let value: serde_json::Value = serde_json::from_slice(body).map_err(|e| {
        LambdaError::bad_content(format!("Could not parse request body into json: {e}"))
    })?;
    serde_json::from_value(value).map_err(|e| LambdaError::invalid(e.to_string()))
}

pub fn json_response(status: StatusCode, value: &serde_json::Value) -> Resp {
    let mut resp = Response::new(Full::new(Bytes::from(value.to_string())));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    resp
}

pub fn empty_response(status: StatusCode) -> Resp {
    let mut resp = Response::new(Full::new(Bytes::new()));
    *resp.status_mut() = status;
    resp
}

/// A random id in UUID form (revision ids, request ids).
pub fn random_uuid() -> String {
    let mut b = [0u8; 16];
    if getrandom::fill(&mut b).is_err() {
        // Unique enough without the OS generator: time and a counter.
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let t = crate::clock::unix_ms() ^ N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        b[..8].copy_from_slice(&t.to_le_bytes());
    }
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        let me = Account::default_account();
        let fn_name = |s: &str| fn_name(&me, s);
        let name_and_qualifier = |s: &str| name_and_qualifier(&me, s);
        assert_eq!(fn_name("my-fn_1").unwrap(), "my-fn_1");
        assert_eq!(
            fn_name("arn%3Aaws%3Alambda%3Aus-east-1%3A000000000000%3Afunction%3Aecho").unwrap(),
            "echo"
        );
        assert!(fn_name("..%2Fetc").is_err());
        assert!(fn_name("a.b").is_err());
        assert!(fn_name("").is_err());
        assert!(fn_name(&"x".repeat(65)).is_err());
        assert!(fn_name("%zz").is_err());
        assert_eq!(fn_name("000000000000:function:echo").unwrap(), "echo");
        // A qualified name is for operations on versions only.
        assert!(fn_name("arn:aws:lambda:us-east-1:000000000000:function:echo:$LATEST").is_err());
        assert!(fn_name("echo:live").is_err());
        for (given, name, q) in [
            ("echo", "echo", None),
            ("echo:7", "echo", Some("7")),
            ("echo:live", "echo", Some("live")),
            ("echo:$LATEST", "echo", Some("$LATEST")),
            (
                "arn:aws:lambda:us-east-1:000000000000:function:echo:prod",
                "echo",
                Some("prod"),
            ),
            ("000000000000:function:echo:3", "echo", Some("3")),
        ] {
            let got = name_and_qualifier(given).unwrap();
            assert_eq!((got.0.as_str(), got.1.as_deref()), (name, q), "{given}");
        }
        for bad in ["echo:", "echo:a.b", "echo:1:2", ":1"] {
            assert!(name_and_qualifier(bad).is_err(), "{bad}");
        }
        // Another account's or region's function is not found here.
        for other in [
            "arn:aws:lambda:us-east-1:123456789012:function:echo",
            "arn:aws:lambda:eu-west-1:000000000000:function:echo",
            "123456789012:function:echo",
        ] {
            let e = fn_name(other).unwrap_err();
            assert_eq!(
                (e.status, e.kind),
                (StatusCode::NOT_FOUND, "ResourceNotFoundException"),
                "{other}"
            );
        }
        let e = fn_name("arn:aws:s3:::bucket:function:echo").unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
    }

    #[test]
    fn names_are_keys_of_the_callers_account() {
        let a = Account::new("111111111111", crate::accounts::Limits::default());
        assert_eq!(fn_name(&a, "echo").unwrap(), "111111111111:echo");
        assert_eq!(
            fn_name(&a, "arn:aws:lambda:us-east-1:111111111111:function:echo").unwrap(),
            "111111111111:echo"
        );
        let (key, q) = name_and_qualifier(&a, "111111111111:function:echo:live").unwrap();
        assert_eq!(
            (key.as_str(), q.as_deref()),
            ("111111111111:echo", Some("live"))
        );
        // The default account's function, or a third's, is not found.
        for other in [
            "arn:aws:lambda:us-east-1:000000000000:function:echo",
            "arn:aws:lambda:us-east-1:222222222222:function:echo",
        ] {
            let e = fn_name(&a, other).unwrap_err();
            assert_eq!(e.status, StatusCode::NOT_FOUND, "{other}");
        }
    }

    #[test]
    fn uuids_look_like_uuids() {
        let u = random_uuid();
        assert_eq!(u.len(), 36);
        assert_eq!(u.matches('-').count(), 4);
        assert_ne!(u, random_uuid());
    }
}
