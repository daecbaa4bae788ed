//! Lambda's deployment model: published versions (`PublishVersion`,
//! `ListVersionsByFunction`, `DeleteFunction?Qualifier=N`), aliases with
//! weighted routing (`CreateAlias` … `ListAliases`), and the resolution of a
//! qualifier (`$LATEST`, a number, an alias) to the function configuration
//! an invocation runs.
//!
//! A published version is an immutable copy of `$LATEST`'s code and
//! configuration, numbered 1, 2, … and never renumbered. It keeps the
//! revision `$LATEST` had (`Function::version`), so instances, zygotes and
//! snapshots are shared while `$LATEST` has not changed since.

use std::sync::Arc;

use hyper::StatusCode;
use serde::Deserialize;

use super::control::{configuration, existing};
use super::error::{catalog_err, LambdaError};
use super::{empty_response, json_response, parse_json, Daemon, Req, Resp};
use crate::catalog::{Alias, Function};
use crate::config::function_arn;

/// What an invocation of an alias runs, and which version that was.
pub fn resolve(
    daemon: &Daemon,
    name: &str,
    qualifier: Option<&str>,
) -> Result<Function, LambdaError> {
    match qualifier {
        None | Some("$LATEST") => existing(daemon, name),
        Some(q) => match q.parse::<u32>() {
            Ok(n) => version(daemon, name, n),
            Err(_) => {
                let alias = alias(daemon, name, q)?;
                let picked = match &alias.additional {
                    Some((v, weight)) if random_unit() < *weight => v.clone(),
                    _ => alias.version.clone(),
                };
                resolve(daemon, name, Some(&picked))
            }
        },
    }
}

/// The configuration a qualifier names, for reading it (`GetFunction`): an
/// alias gives its primary version, never a weighted pick.
pub fn resolve_exact(
    daemon: &Daemon,
    name: &str,
    qualifier: Option<&str>,
) -> Result<Function, LambdaError> {
    match qualifier {
        Some(q) if q != "$LATEST" && q.parse::<u32>().is_err() => {
            let a = alias(daemon, name, q)?;
            resolve(daemon, name, Some(&a.version))
        }
        q => resolve(daemon, name, q),
    }
}

fn version(daemon: &Daemon, name: &str, n: u32) -> Result<Function, LambdaError> {
    daemon
        .catalog
        .version(name, n)
        .map_err(catalog_err)?
        .ok_or_else(|| LambdaError::not_found(&format!("{}:{n}", function_arn(name))))
}

fn alias(daemon: &Daemon, name: &str, alias: &str) -> Result<Alias, LambdaError> {
    existing(daemon, name)?;
    daemon
        .catalog
        .alias(name, alias)
        .map_err(catalog_err)?
        .ok_or_else(|| {
            LambdaError::new(
                StatusCode::NOT_FOUND,
                "ResourceNotFoundException",
                format!("Alias not found: {}:{alias}", function_arn(name)),
            )
        })
}

/// A uniform number in [0, 1) from the OS generator (routing weights).
fn random_unit() -> f64 {
    let mut b = [0u8; 8];
    if getrandom::fill(&mut b).is_err() {
        // Without the OS generator: the clock's nanoseconds (routing only).
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        b[..4].copy_from_slice(&t.to_le_bytes());
    }
    (u64::from_le_bytes(b) >> 11) as f64 / (1u64 << 53) as f64
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase")]
struct PublishBody {
    code_sha256: Option<String>,
    description: Option<String>,
    revision_id: Option<String>,
}

/// `PublishVersion`: `$LATEST` as the next version (or the newest one, when
/// it already holds `$LATEST`'s revision, as Lambda does).
pub async fn publish(daemon: &Arc<Daemon>, name: &str, req: Req) -> Result<Resp, LambdaError> {
    let body = super::body_within(&req, 64 * 1024, "PublishVersion")?;
    let b: PublishBody = if body.is_empty() {
        PublishBody::default()
    } else {
        parse_json(&body)?
    };
    let _admin = daemon.admin.lock().await;
    let f = existing(daemon, name)?;
    let latest = configuration(&f);
    if let Some(sha) = b.code_sha256.filter(|s| !s.is_empty()) {
        if latest["CodeSha256"] != sha.as_str() {
            return Err(LambdaError::invalid(format!(
                "CodeSha256 ({sha}) is different from current CodeSha256 in $LATEST ({}). Please try again with the CodeSha256 in $LATEST.",
                latest["CodeSha256"].as_str().unwrap_or("")
            )));
        }
    }
    if let Some(rev) = b.revision_id.filter(|s| !s.is_empty()) {
        if rev != f.revision_id {
            return Err(precondition_failed(&rev));
        }
    }
    // A version keeps its code: it counts against the account's storage.
    super::account::check_room(daemon, &daemon.accounts.of_key(name), 0, f.code_size)?;
    let v = daemon
        .catalog
        .publish(&f, b.description.as_deref().unwrap_or(""))
        .map_err(catalog_err)?;
    tracing::info!(function = %f.name, version = ?v.published, "version published");
    Ok(json_response(StatusCode::CREATED, &configuration(&v)))
}

fn precondition_failed(rev: &str) -> LambdaError {
    LambdaError::new(
        StatusCode::PRECONDITION_FAILED,
        "PreconditionFailedException",
        format!("The Revision Id provided does not match the latest Revision Id ({rev}). Call the GetFunction/GetAlias API to retrieve the latest Revision Id"),
    )
}

/// `ListVersionsByFunction`: `$LATEST`, then each published version.
pub fn list_versions(daemon: &Arc<Daemon>, name: &str) -> Result<Resp, LambdaError> {
    let f = existing(daemon, name)?;
    let mut versions = vec![configuration(&f)];
    versions.extend(
        daemon
            .catalog
            .versions(name)
            .map_err(catalog_err)?
            .iter()
            .map(configuration),
    );
    Ok(json_response(
        StatusCode::OK,
        &serde_json::json!({ "Versions": versions }),
    ))
}

/// `DeleteFunction` with a version number: that version only, refused while
/// an alias routes to it.
pub async fn delete_version(
    daemon: &Arc<Daemon>,
    name: &str,
    qualifier: &str,
) -> Result<Resp, LambdaError> {
    let Ok(n) = qualifier.parse::<u32>() else {
        return Err(LambdaError::invalid(format!(
            "Deletion of {qualifier} is not supported: DeleteFunction takes a version number, or no qualifier for the whole function"
        )));
    };
    let _admin = daemon.admin.lock().await;
    version(daemon, name, n)?;
    let n_str = n.to_string();
    let routed: Vec<String> = daemon
        .catalog
        .aliases(name)
        .map_err(catalog_err)?
        .into_iter()
        .filter(|a| a.version == n_str || a.additional.as_ref().is_some_and(|(v, _)| *v == n_str))
        .map(|a| a.name)
        .collect();
    if !routed.is_empty() {
        return Err(LambdaError::conflict(format!(
            "Unable to delete version because the following aliases reference it: {routed:?}"
        )));
    }
    daemon
        .catalog
        .delete_version(name, n)
        .map_err(catalog_err)?;
    // Its provisioned concurrency and event configuration go with it.
    daemon
        .catalog
        .delete_provisioned(name, &n_str)
        .map_err(catalog_err)?;
    daemon
        .catalog
        .delete_event_invoke_config(name, &n_str)
        .map_err(catalog_err)?;
    daemon.instances.forget(name).await;
    tracing::info!(function = %name, version = n, "version deleted");
    Ok(empty_response(StatusCode::NO_CONTENT))
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase")]
struct AliasBody {
    name: Option<String>,
    function_version: Option<String>,
    description: Option<String>,
    routing_config: Option<RoutingBody>,
    revision_id: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase")]
struct RoutingBody {
    #[serde(default)]
    additional_version_weights: std::collections::BTreeMap<String, f64>,
}

fn alias_json(a: &Alias) -> serde_json::Value {
    let weights: serde_json::Map<String, serde_json::Value> = a
        .additional
        .iter()
        .map(|(v, w)| (v.clone(), (*w).into()))
        .collect();
    let mut v = serde_json::json!({
        "AliasArn": format!("{}:{}", function_arn(&a.function), a.name),
        "Name": a.name,
        "FunctionVersion": a.version,
        "Description": a.description,
        "RevisionId": a.revision_id,
    });
    if !weights.is_empty() {
        v["RoutingConfig"] = serde_json::json!({ "AdditionalVersionWeights": weights });
    }
    v
}

/// An alias name: not a number (that would be a version), Lambda's pattern.
fn check_alias_name(name: &str) -> Result<(), LambdaError> {
    super::check_qualifier(name)?;
    if name == "$LATEST" || name.bytes().all(|b| b.is_ascii_digit()) {
        return Err(LambdaError::invalid(format!(
            "1 validation error detected: Value '{name}' at 'name' failed to satisfy constraint: Member must satisfy regular expression pattern: (?!^[0-9]+$)([a-zA-Z0-9-_]+)"
        )));
    }
    Ok(())
}

/// The version an alias names must exist: `$LATEST` or a published one.
fn check_target(daemon: &Daemon, name: &str, v: &str) -> Result<(), LambdaError> {
    if v == "$LATEST" {
        return Ok(());
    }
    let n = v.parse::<u32>().map_err(|_| {
        LambdaError::invalid(format!(
            "FunctionVersion {v} is neither $LATEST nor a version number"
        ))
    })?;
    version(daemon, name, n).map(drop)
}

/// `RoutingConfig`: at most one other published version, weight in [0, 1].
fn routing(
    daemon: &Daemon,
    name: &str,
    primary: &str,
    r: RoutingBody,
) -> Result<Option<(String, f64)>, LambdaError> {
    let mut weights = r.additional_version_weights.into_iter();
    let Some((v, w)) = weights.next() else {
        return Ok(None);
    };
    if weights.next().is_some() {
        return Err(LambdaError::invalid(
            "Number of items in AdditionalVersionWeights cannot be greater than 1",
        ));
    }
    if !(0.0..=1.0).contains(&w) || w.is_nan() {
        return Err(LambdaError::invalid(format!(
            "1 validation error detected: Value '{w}' at 'routingConfig.additionalVersionWeights' failed to satisfy constraint: Map value must satisfy constraint: [Member must have value less than or equal to 1.0, Member must have value greater than or equal to 0.0]"
        )));
    }
    if primary == "$LATEST" || v.parse::<u32>().is_err() {
        return Err(LambdaError::invalid(
            "Routing between versions needs published versions: neither the alias's FunctionVersion nor the additional version can be $LATEST",
        ));
    }
    if v == primary {
        return Err(LambdaError::invalid(format!(
            "Invalid function version {v}. Function version {v} is already included in routing configuration."
        )));
    }
    check_target(daemon, name, &v)?;
    Ok(Some((v, w)))
}

/// `CreateAlias`.
pub async fn create_alias(daemon: &Arc<Daemon>, name: &str, req: Req) -> Result<Resp, LambdaError> {
    let body = super::body_within(&req, 64 * 1024, "CreateAlias")?;
    let b: AliasBody = parse_json(&body)?;
    let alias_name = b
        .name
        .ok_or_else(|| LambdaError::invalid("Name is required"))?;
    check_alias_name(&alias_name)?;
    let target = b
        .function_version
        .ok_or_else(|| LambdaError::invalid("FunctionVersion is required"))?;
    let _admin = daemon.admin.lock().await;
    let f = existing(daemon, name)?;
    check_target(daemon, &f.name, &target)?;
    let additional = routing(
        daemon,
        &f.name,
        &target,
        b.routing_config.unwrap_or_default(),
    )?;
    if daemon
        .catalog
        .alias(&f.name, &alias_name)
        .map_err(catalog_err)?
        .is_some()
    {
        return Err(LambdaError::conflict(format!(
            "Alias already exists: {}:{alias_name}",
            function_arn(&f.name)
        )));
    }
    let a = Alias {
        function: f.name.clone(),
        name: alias_name,
        version: target,
        description: b.description.unwrap_or_default(),
        additional,
        revision_id: super::random_uuid(),
    };
    daemon.catalog.put_alias(&a).map_err(catalog_err)?;
    Ok(json_response(StatusCode::CREATED, &alias_json(&a)))
}

pub fn get_alias(daemon: &Arc<Daemon>, name: &str, alias_name: &str) -> Result<Resp, LambdaError> {
    Ok(json_response(
        StatusCode::OK,
        &alias_json(&alias(daemon, name, alias_name)?),
    ))
}

/// `UpdateAlias`: what the body names changes; a `RoutingConfig` replaces
/// the routing (an empty one ends it).
pub async fn update_alias(
    daemon: &Arc<Daemon>,
    name: &str,
    alias_name: &str,
    req: Req,
) -> Result<Resp, LambdaError> {
    let body = super::body_within(&req, 64 * 1024, "UpdateAlias")?;
    let b: AliasBody = parse_json(&body)?;
    let _admin = daemon.admin.lock().await;
    let mut a = alias(daemon, name, alias_name)?;
    if let Some(rev) = b.revision_id.filter(|r| !r.is_empty()) {
        if rev != a.revision_id {
            return Err(precondition_failed(&rev));
        }
    }
    if let Some(v) = b.function_version {
        check_target(daemon, name, &v)?;
        a.version = v;
    }
    if let Some(d) = b.description {
        a.description = d;
    }
    a.additional = match b.routing_config {
        Some(r) => routing(daemon, name, &a.version, r)?,
        // The routing stays, if it still makes sense with the new version.
        None => match a.additional.take() {
            Some((v, w)) if v != a.version => Some((v, w)),
            _ => None,
        },
    };
    a.revision_id = super::random_uuid();
    daemon.catalog.put_alias(&a).map_err(catalog_err)?;
    // Provisioned concurrency on the alias moves with it.
    daemon.instances.sync_provisioned(name).await;
    Ok(json_response(StatusCode::OK, &alias_json(&a)))
}

pub async fn delete_alias(
    daemon: &Arc<Daemon>,
    name: &str,
    alias_name: &str,
) -> Result<Resp, LambdaError> {
    let _admin = daemon.admin.lock().await;
    alias(daemon, name, alias_name)?;
    daemon
        .catalog
        .delete_alias(name, alias_name)
        .map_err(catalog_err)?;
    // Its function URL, provisioned concurrency and event configuration go
    // with it.
    daemon
        .catalog
        .delete_url(name, alias_name)
        .map_err(catalog_err)?;
    daemon
        .catalog
        .delete_provisioned(name, alias_name)
        .map_err(catalog_err)?;
    daemon
        .catalog
        .delete_event_invoke_config(name, alias_name)
        .map_err(catalog_err)?;
    daemon.instances.sync_provisioned(name).await;
    Ok(empty_response(StatusCode::NO_CONTENT))
}

/// `ListAliases`, optionally only those routing to `FunctionVersion`.
pub fn list_aliases(daemon: &Arc<Daemon>, name: &str, req: &Req) -> Result<Resp, LambdaError> {
    existing(daemon, name)?;
    let only = req
        .uri()
        .query()
        .unwrap_or("")
        .split('&')
        .find_map(|kv| kv.strip_prefix("FunctionVersion="))
        .and_then(super::percent_decode);
    let aliases: Vec<serde_json::Value> = daemon
        .catalog
        .aliases(name)
        .map_err(catalog_err)?
        .iter()
        .filter(|a| {
            only.as_deref().is_none_or(|v| {
                a.version == v || a.additional.as_ref().is_some_and(|(x, _)| x == v)
            })
        })
        .map(alias_json)
        .collect();
    Ok(json_response(
        StatusCode::OK,
        &serde_json::json!({ "Aliases": aliases }),
    ))
}
