//! Lambda's control plane: CreateFunction, GetFunction(Configuration),
//! ListFunctions, UpdateFunctionCode, UpdateFunctionConfiguration,
//! DeleteFunction, Put/Get/DeleteFunctionConcurrency, and `/metrics`.
//! Every input is checked before anything is stored; a refused request
//! changes nothing.

use std::collections::BTreeMap;
use std::sync::Arc;

use base64::Engine;
use hyper::StatusCode;
use serde::Deserialize;

use super::error::{catalog_err, LambdaError};
use super::{empty_response, json_response, parse_json, Daemon, Resp};
use crate::accounts::{plain_name, Account};
use crate::catalog::Function;
use crate::clock::lambda_now;
use crate::config::function_arn;
use crate::{code, runtime};

/// Request bodies may carry a base64 zip of up to 50 MB.
const CONTROL_BODY_LIMIT: usize = 70 * 1024 * 1024;
pub const MEMORY_MIB: std::ops::RangeInclusive<u32> = 64..=10240;
pub const TIMEOUT_S: std::ops::RangeInclusive<u32> = 1..=900;
/// Lambda's limit on the environment's total size.
const ENV_BYTES: usize = 4096;

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct CodeBody {
    zip_file: Option<String>,
    s3_bucket: Option<String>,
    image_uri: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase")]
struct EnvironmentBody {
    #[serde(default)]
    variables: BTreeMap<String, String>,
}

/// `SporeNetwork`: spore's own field of CreateFunction and
/// UpdateFunctionConfiguration (and of the configuration it answers).
/// Not Lambda's `VpcConfig`: that attaches a function to subnets and
/// security groups of a VPC, and a Lambda function without it already has
/// outbound internet access; here a function has no network at all unless
/// it asks, so reusing it would invert its meaning. A Lambda client that
/// does not know the field never sends it and ignores it in answers.
#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
struct SporeNetworkBody {
    enabled: bool,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct CreateBody {
    function_name: String,
    runtime: Option<String>,
    handler: Option<String>,
    code: CodeBody,
    #[serde(default)]
    role: String,
    #[serde(default)]
    description: String,
    memory_size: Option<u32>,
    timeout: Option<u32>,
    environment: Option<EnvironmentBody>,
    package_type: Option<String>,
    spore_network: Option<SporeNetworkBody>,
    tags: Option<super::tags::Tags>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct UpdateCodeBody {
    zip_file: Option<String>,
    s3_bucket: Option<String>,
    image_uri: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct UpdateConfigBody {
    runtime: Option<String>,
    handler: Option<String>,
    role: Option<String>,
    description: Option<String>,
    memory_size: Option<u32>,
    timeout: Option<u32>,
    environment: Option<EnvironmentBody>,
    spore_network: Option<SporeNetworkBody>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ConcurrencyBody {
    reserved_concurrent_executions: i64,
}

/// Lambda's `FunctionConfiguration` of a function.
pub fn configuration(f: &Function) -> serde_json::Value {
    use base64::engine::general_purpose::STANDARD;
    let sha_b64 = (0..f.code_sha256.len() / 2)
        .filter_map(|i| u8::from_str_radix(f.code_sha256.get(2 * i..2 * i + 2)?, 16).ok())
        .collect::<Vec<u8>>();
    serde_json::json!({
        "FunctionName": plain_name(&f.name),
        "FunctionArn": match f.published {
            Some(n) => format!("{}:{n}", function_arn(&f.name)),
            None => function_arn(&f.name),
        },
        "Runtime": f.runtime,
        "Role": f.role,
        "Handler": f.handler,
        "CodeSize": f.code_size,
        "Description": f.description,
        "Timeout": f.timeout_s,
        "MemorySize": f.memory_mib,
        "LastModified": f.last_modified,
        "CodeSha256": STANDARD.encode(sha_b64),
        "Version": f.qualifier(),
        "Environment": { "Variables": f.env },
        "TracingConfig": { "Mode": "PassThrough" },
        "RevisionId": f.revision_id,
        "State": "Active",
        "LastUpdateStatus": "Successful",
        "PackageType": "Zip",
        "Architectures": ["x86_64"],
        "EphemeralStorage": { "Size": 512 },
        "SporeNetwork": { "Enabled": f.network },
    })
}

fn check_memory(m: u32) -> Result<u32, LambdaError> {
    if MEMORY_MIB.contains(&m) {
        Ok(m)
    } else {
        Err(LambdaError::invalid(format!(
            "1 validation error detected: Value '{m}' at 'memorySize' failed to satisfy constraint: Member must have value between {} and {} (MiB)",
            MEMORY_MIB.start(),
            MEMORY_MIB.end()
        )))
    }
}

fn check_timeout(t: u32) -> Result<u32, LambdaError> {
    if TIMEOUT_S.contains(&t) {
        Ok(t)
    } else {
        Err(LambdaError::invalid(format!(
            "1 validation error detected: Value '{t}' at 'timeout' failed to satisfy constraint: Member must have value between {} and {}",
            TIMEOUT_S.start(),
            TIMEOUT_S.end()
        )))
    }
}

fn check_runtime(r: &str) -> Result<(), LambdaError> {
    match runtime::find(r) {
        Some(_) => Ok(()),
        None => Err(LambdaError::invalid(format!(
            "Value {r} at 'runtime' failed to satisfy constraint: Member must satisfy enum value set: {:?}",
            runtime::NAMES
        ))),
    }
}

fn check_env(env: &BTreeMap<String, String>) -> Result<(), LambdaError> {
    let mut total = 0;
    for (k, v) in env {
        let mut chars = k.chars();
        let ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic())
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !ok {
            return Err(LambdaError::invalid(format!(
                "Environment variable name '{k}' must match [a-zA-Z]([a-zA-Z0-9_])+"
            )));
        }
        total += k.len() + v.len();
    }
    if total > ENV_BYTES {
        return Err(LambdaError::invalid(format!(
            "Lambda was unable to configure your environment variables because the environment variables you have provided exceeded the 4KB limit. Size: {total}"
        )));
    }
    Ok(())
}

/// A Linux runtime needs its image built (checked when a function is
/// created or changed to it, and again at every cold start), and has no
/// networking yet.
fn check_linux(daemon: &Daemon, runtime: &str, network: bool) -> Result<(), LambdaError> {
    let Some(rt) = runtime::find(runtime).filter(|r| r.linux()) else {
        return Ok(());
    };
    if network {
        return Err(LambdaError::invalid(format!(
            "SporeNetwork is not supported for the {runtime} runtime yet"
        )));
    }
    crate::images::newest(&daemon.instances.image_cache(), rt.name())
        .map_err(|e| LambdaError::invalid(e.to_string()))?;
    Ok(())
}

fn code_err(e: code::CodeError) -> LambdaError {
    if e.is_disk_full() {
        // Lambda's name for "no room for more code"; nothing was kept.
        LambdaError::new(
            StatusCode::BAD_REQUEST,
            "CodeStorageExceededException",
            format!("The host has no room to store the code: {e}"),
        )
    } else if e.is_user_error() {
        LambdaError::invalid(e.to_string())
    } else {
        LambdaError::service(e.to_string())
    }
}

/// Decodes and checks an uploaded zip for `runtime` and `handler`, and
/// stores it (for a Linux runtime with its code disk).
fn accept_code(
    daemon: &Daemon,
    zip_b64: Option<&str>,
    s3: bool,
    image: bool,
    runtime: &str,
    handler: &str,
) -> Result<code::CheckedCode, LambdaError> {
    if s3 || image {
        return Err(LambdaError::invalid(
            "spore serve takes code only as Code.ZipFile (no S3 or container images)",
        ));
    }
    let zip_b64 = zip_b64.ok_or_else(|| LambdaError::invalid("Code.ZipFile is required"))?;
    let zip = base64::engine::general_purpose::STANDARD
        .decode(zip_b64.trim())
        .map_err(|e| LambdaError::invalid(format!("Code.ZipFile is not valid base64: {e}")))?;
    let checked = code::check(&zip, runtime, handler).map_err(code_err)?;
    // Building a code disk runs mkfs.ext4 (tens of ms to seconds): off the
    // async workers.
    tokio::task::block_in_place(|| code::store(&daemon.state_dir, &zip, &checked, handler))
        .map_err(code_err)?;
    Ok(checked)
}

pub async fn create(
    daemon: &Arc<Daemon>,
    caller: &Account,
    req: super::Req,
) -> Result<Resp, LambdaError> {
    let body = super::body_within(&req, CONTROL_BODY_LIMIT, "CreateFunction")?;
    let b: CreateBody = parse_json(&body)?;
    super::check_name(&b.function_name)?;
    let key = caller.key(&b.function_name);
    if b.package_type.as_deref().is_some_and(|p| p != "Zip") {
        return Err(LambdaError::invalid(
            "spore serve supports PackageType Zip only",
        ));
    }
    let runtime = b
        .runtime
        .ok_or_else(|| LambdaError::invalid("Runtime is required"))?;
    check_runtime(&runtime)?;
    let handler = b
        .handler
        .ok_or_else(|| LambdaError::invalid("Handler is required"))?;
    let memory = check_memory(b.memory_size.unwrap_or(128))?;
    let timeout = check_timeout(b.timeout.unwrap_or(3))?;
    let env = b.environment.unwrap_or_default().variables;
    check_env(&env)?;
    let network = b.spore_network.unwrap_or_default().enabled;
    check_linux(daemon, &runtime, network)?;
    let tags = b.tags.unwrap_or_default();
    super::tags::check(&tags, &Default::default())?;
    let _admin = daemon.admin.lock().await;
    if daemon.catalog.get(&key).map_err(catalog_err)?.is_some() {
        return Err(LambdaError::conflict(format!(
            "Function already exist: {}",
            b.function_name
        )));
    }
    let zip_len = super::account::zip_len(b.code.zip_file.as_deref());
    super::account::check_room(daemon, caller, 1, zip_len)?;
    let code = accept_code(
        daemon,
        b.code.zip_file.as_deref(),
        b.code.s3_bucket.is_some(),
        b.code.image_uri.is_some(),
        &runtime,
        &handler,
    )?;
    let f = Function {
        name: key,
        runtime,
        handler,
        memory_mib: memory,
        timeout_s: timeout,
        env,
        description: b.description,
        role: b.role,
        code_sha256: code.sha256_hex,
        code_size: code.size,
        version: 1,
        revision_id: super::random_uuid(),
        last_modified: lambda_now(),
        reserved_concurrency: None,
        network,
        published: None,
    };
    // Stored before the function, replacing any a deleted one of this name left.
    daemon
        .catalog
        .replace_tags(&f.name, &tags)
        .map_err(catalog_err)?;
    if !daemon.catalog.insert(&f).map_err(catalog_err)? {
        return Err(LambdaError::conflict(format!(
            "Function already exist: {}",
            b.function_name
        )));
    }
    tracing::info!(function = %f.name, "created ({} bytes of code)", f.code_size);
    Ok(json_response(StatusCode::CREATED, &configuration(&f)))
}

pub(super) fn existing(daemon: &Daemon, name: &str) -> Result<Function, LambdaError> {
    daemon
        .catalog
        .get(name)
        .map_err(catalog_err)?
        .ok_or_else(|| LambdaError::not_found(name))
}

/// GetFunction. `Code.Location` is where the zip can be downloaded from
/// (Lambda: a presigned URL; here the daemon's own `GET
/// /spore/functions/NAME/code.zip`, at the host the request named).
pub fn get(daemon: &Daemon, f: &Function, req: &super::Req) -> Result<Resp, LambdaError> {
    let host = req
        .headers()
        .get(hyper::header::HOST)
        .and_then(|h| h.to_str().ok())
        .filter(|h| {
            !h.is_empty()
                && h.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b))
        })
        .unwrap_or("localhost");
    let location = match f.published {
        Some(n) => format!(
            "http://{host}/spore/functions/{}/code.zip?Qualifier={n}",
            plain_name(&f.name)
        ),
        None => format!(
            "http://{host}/spore/functions/{}/code.zip",
            plain_name(&f.name)
        ),
    };
    let mut v = serde_json::json!({
        "Configuration": configuration(f),
        "Code": { "RepositoryType": "S3", "Location": location },
    });
    if let Some(n) = f.reserved_concurrency {
        v["Concurrency"] = serde_json::json!({ "ReservedConcurrentExecutions": n });
    }
    super::tags::add_to_function(daemon, &f.name, &mut v)?;
    Ok(json_response(StatusCode::OK, &v))
}

/// `GET /spore/functions/NAME/code.zip`: the function's code as uploaded.
pub async fn code_zip(daemon: &Arc<Daemon>, f: &Function) -> Result<Resp, LambdaError> {
    let path = code::dir(&daemon.state_dir, &f.code_sha256).join("code.zip");
    let zip = tokio::task::spawn_blocking(move || std::fs::read(&path))
        .await
        .map_err(|e| LambdaError::service(format!("reading the function's code: {e}")))?
        .map_err(|e| LambdaError::service(format!("reading the function's code: {e}")))?;
    let mut resp = hyper::Response::new(http_body_util::Full::new(bytes::Bytes::from(zip)));
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/zip"),
    );
    Ok(resp)
}

pub fn get_configuration(f: &Function) -> Resp {
    json_response(StatusCode::OK, &configuration(f))
}

/// ListFunctions: the caller's account's functions only.
pub fn list(daemon: &Arc<Daemon>, caller: &Account) -> Result<Resp, LambdaError> {
    let all = daemon.catalog.list().map_err(catalog_err)?;
    let functions: Vec<_> = all
        .iter()
        .filter(|f| caller.owns(&f.name))
        .map(configuration)
        .collect();
    Ok(json_response(
        StatusCode::OK,
        &serde_json::json!({ "Functions": functions }),
    ))
}

pub async fn delete(daemon: &Arc<Daemon>, name: &str) -> Result<Resp, LambdaError> {
    let _admin = daemon.admin.lock().await;
    let f = existing(daemon, name)?;
    daemon.catalog.delete(name).map_err(catalog_err)?;
    daemon
        .catalog
        .delete_all_provisioned(name)
        .map_err(catalog_err)?;
    daemon
        .catalog
        .delete_event_invoke_configs(name)
        .map_err(catalog_err)?;
    daemon.catalog.delete_tags(name).map_err(catalog_err)?;
    daemon.instances.set_reserved(name, None);
    daemon.instances.forget(name).await;
    if !daemon.catalog.code_in_use(&f.code_sha256).unwrap_or(true) {
        let _ = std::fs::remove_dir_all(code::dir(&daemon.state_dir, &f.code_sha256));
    }
    tracing::info!(function = %name, "deleted");
    Ok(empty_response(StatusCode::NO_CONTENT))
}

/// Stores a changed function as a new version: instances and the zygote of
/// the old version are ended and never serve it again.
async fn replace(daemon: &Daemon, old: &Function, mut f: Function) -> Result<Resp, LambdaError> {
    f.version = old.version + 1;
    f.revision_id = super::random_uuid();
    f.last_modified = lambda_now();
    daemon.catalog.update(&f).map_err(catalog_err)?;
    daemon.instances.forget(&f.name).await;
    if old.code_sha256 != f.code_sha256
        && !daemon.catalog.code_in_use(&old.code_sha256).unwrap_or(true)
    {
        let _ = std::fs::remove_dir_all(code::dir(&daemon.state_dir, &old.code_sha256));
    }
    tracing::info!(function = %f.name, version = f.version, "updated");
    Ok(json_response(StatusCode::OK, &configuration(&f)))
}

pub async fn update_code(
    daemon: &Arc<Daemon>,
    name: &str,
    req: super::Req,
) -> Result<Resp, LambdaError> {
    let body = super::body_within(&req, CONTROL_BODY_LIMIT, "UpdateFunctionCode")?;
    let b: UpdateCodeBody = parse_json(&body)?;
    let _admin = daemon.admin.lock().await;
    let old = existing(daemon, name)?;
    let owner = daemon.accounts.of_key(name);
    let zip_len = super::account::zip_len(b.zip_file.as_deref());
    super::account::check_room(daemon, &owner, 0, zip_len.saturating_sub(old.code_size))?;
    let code = accept_code(
        daemon,
        b.zip_file.as_deref(),
        b.s3_bucket.is_some(),
        b.image_uri.is_some(),
        &old.runtime,
        &old.handler,
    )?;
    let mut f = old.clone();
    f.code_sha256 = code.sha256_hex;
    f.code_size = code.size;
    replace(daemon, &old, f).await
}

pub async fn update_configuration(
    daemon: &Arc<Daemon>,
    name: &str,
    req: super::Req,
) -> Result<Resp, LambdaError> {
    let body = super::body_within(&req, CONTROL_BODY_LIMIT, "UpdateFunctionConfiguration")?;
    let b: UpdateConfigBody = parse_json(&body)?;
    let _admin = daemon.admin.lock().await;
    let old = existing(daemon, name)?;
    let mut f = old.clone();
    if let Some(r) = b.runtime {
        check_runtime(&r)?;
        f.runtime = r;
    }
    if let Some(m) = b.memory_size {
        f.memory_mib = check_memory(m)?;
    }
    if let Some(t) = b.timeout {
        f.timeout_s = check_timeout(t)?;
    }
    if let Some(env) = b.environment {
        check_env(&env.variables)?;
        f.env = env.variables;
    }
    if let Some(d) = b.description {
        f.description = d;
    }
    if let Some(n) = b.spore_network {
        f.network = n.enabled;
    }
    if let Some(r) = b.role {
        f.role = r;
    }
    if let Some(h) = b.handler {
        f.handler = h;
    }
    check_linux(daemon, &f.runtime, f.network)?;
    if f.handler != old.handler || f.runtime != old.runtime {
        let (state, sha, rt, h) = (&daemon.state_dir, &f.code_sha256, &f.runtime, &f.handler);
        tokio::task::block_in_place(|| code::rehandle(state, sha, rt, h)).map_err(code_err)?;
    }
    replace(daemon, &old, f).await
}

/// A concurrency count from a request, when it lies in `min..=max`; `None`
/// for anything else, including a count no `u32` holds.
pub(super) fn concurrency_within(value: i64, min: u32, max: usize) -> Option<u32> {
    let n = u32::try_from(value).ok()?;
    let within_max = usize::try_from(n).is_ok_and(|n| n <= max);
    (n >= min && within_max).then_some(n)
}

pub async fn put_concurrency(
    daemon: &Arc<Daemon>,
    name: &str,
    req: super::Req,
) -> Result<Resp, LambdaError> {
    let body = super::body_within(&req, 64 * 1024, "PutFunctionConcurrency")?;
    let b: ConcurrencyBody = parse_json(&body)?;
    let account = daemon.accounts.of_key(name);
    let max = daemon
        .instances
        .max_concurrency()
        .min(account.limits.concurrency as usize);
    let Some(n) = concurrency_within(b.reserved_concurrent_executions, 0, max) else {
        return Err(LambdaError::invalid(format!(
            "ReservedConcurrentExecutions must be between 0 and the account's concurrency limit on this host ({max})"
        )));
    };
    let _admin = daemon.admin.lock().await;
    let mut f = existing(daemon, name)?;
    f.reserved_concurrency = Some(n);
    daemon.catalog.update(&f).map_err(catalog_err)?;
    daemon.instances.set_reserved(name, Some(n));
    Ok(json_response(
        StatusCode::OK,
        &serde_json::json!({ "ReservedConcurrentExecutions": n }),
    ))
}

pub fn get_concurrency(daemon: &Arc<Daemon>, name: &str) -> Result<Resp, LambdaError> {
    let f = existing(daemon, name)?;
    let v = match f.reserved_concurrency {
        Some(n) => serde_json::json!({ "ReservedConcurrentExecutions": n }),
        None => serde_json::json!({}),
    };
    Ok(json_response(StatusCode::OK, &v))
}

pub async fn delete_concurrency(daemon: &Arc<Daemon>, name: &str) -> Result<Resp, LambdaError> {
    let _admin = daemon.admin.lock().await;
    let mut f = existing(daemon, name)?;
    f.reserved_concurrency = None;
    daemon.catalog.update(&f).map_err(catalog_err)?;
    daemon.instances.set_reserved(name, None);
    Ok(empty_response(StatusCode::NO_CONTENT))
}

/// `/metrics` (Prometheus text). An account sees the series of its own
/// functions only (labelled with their plain names); host-wide series are
/// the operator's: the default account's.
pub async fn metrics(daemon: &Arc<Daemon>, caller: &Account) -> Resp {
    let gauges = daemon.instances.gauges().await;
    let mut text = daemon.instances.metrics.render(&gauges);
    daemon.events.render_metrics(&mut text);
    if let Some(node) = &daemon.cluster {
        node.render_metrics(&mut text);
    }
    let (open, refused, evicted) = daemon.connections.counts();
    text.push_str(&format!(
        "# HELP spore_api_connections Open connections to the Lambda API.\n\
         # TYPE spore_api_connections gauge\nspore_api_connections {open}\n\
         # HELP spore_api_connections_refused_total Connections refused: every open one was busy.\n\
         # TYPE spore_api_connections_refused_total counter\nspore_api_connections_refused_total {refused}\n\
         # HELP spore_api_connections_evicted_total Idle connections closed to make room for a new one.\n\
         # TYPE spore_api_connections_evicted_total counter\nspore_api_connections_evicted_total {evicted}\n"
    ));
    let mut text = crate::metrics::for_account(&text, caller);
    if let Some(node) = &daemon.cluster {
        text = crate::metrics::with_node(&text, &node.cluster.node_id);
    }
    let mut resp = hyper::Response::new(http_body_util::Full::new(bytes::Bytes::from(text)));
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concurrency_counts_lie_within_the_host_limit() {
        assert_eq!(concurrency_within(0, 0, 10), Some(0));
        assert_eq!(concurrency_within(10, 1, 10), Some(10));
        assert_eq!(concurrency_within(0, 1, 10), None);
        assert_eq!(concurrency_within(11, 0, 10), None);
        assert_eq!(concurrency_within(-1, 0, 10), None);
        // Counts no u32 holds are refused, not truncated into range.
        let wraps_to_five = (1_i64 << 32) + 5;
        assert_eq!(concurrency_within(wraps_to_five, 0, usize::MAX), None);
        assert_eq!(concurrency_within(i64::MAX, 0, usize::MAX), None);
    }
}
