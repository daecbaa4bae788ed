//! Provisioned concurrency (`2019-09-30`): Put, Get, Delete and List of
//! `ProvisionedConcurrencyConfig`, in Lambda's shapes. As in Lambda, it is
//! set on a published version or an alias (the version the alias points
//! to), never on `$LATEST`; a configuration follows its alias when the alias
//! moves. What a provisioned instance is: `instances::provisioned`.

use std::sync::Arc;

use hyper::StatusCode;
use serde::Deserialize;

use super::control::{concurrency_within, existing};
use super::error::{catalog_err, LambdaError};
use super::{empty_response, json_response, parse_json, Daemon, Req, Resp};
use crate::catalog::ProvisionedRecord;
use crate::clock::lambda_now;
use crate::config::function_arn;

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ProvisionedBody {
    provisioned_concurrent_executions: i64,
}

/// The `Qualifier` query parameter: required, a version or an alias of
/// function `name` that exists and reaches a published version.
fn qualifier(daemon: &Daemon, name: &str, req: &Req) -> Result<String, LambdaError> {
    let q = super::query_qualifier(req)?
        .ok_or_else(|| LambdaError::invalid("Qualifier is required"))?;
    if q == "$LATEST" {
        return Err(unpublished());
    }
    existing(daemon, name)?;
    if q.parse::<u32>().is_err() {
        // An alias: it must exist, and point to a published version.
        let alias = daemon
            .catalog
            .alias(name, &q)
            .map_err(catalog_err)?
            .ok_or_else(|| missing_qualifier(name, &q))?;
        if alias.version == "$LATEST" {
            return Err(unpublished());
        }
    }
    if daemon.instances.provisioned_target(name, &q).is_none() {
        return Err(missing_qualifier(name, &q));
    }
    Ok(q)
}

fn unpublished() -> LambdaError {
    LambdaError::invalid(
        "Provisioned Concurrency Configs cannot be applied to unpublished function versions.",
    )
}

fn missing_qualifier(name: &str, q: &str) -> LambdaError {
    LambdaError::new(
        StatusCode::NOT_FOUND,
        "ResourceNotFoundException",
        format!("Function not found: {}:{q}", function_arn(name)),
    )
}

fn not_configured(name: &str) -> LambdaError {
    LambdaError::new(
        StatusCode::NOT_FOUND,
        "ProvisionedConcurrencyConfigNotFoundException",
        format!(
            "No Provisioned Concurrency Config found for this function: {}",
            function_arn(name)
        ),
    )
}

fn config_json(daemon: &Daemon, p: &ProvisionedRecord) -> serde_json::Value {
    let available = daemon
        .instances
        .provisioned_target(&p.function, &p.qualifier)
        .map_or(0, |v| {
            daemon
                .instances
                .provisioned_status(&p.function, v)
                .available
                .min(p.count)
        });
    serde_json::json!({
        "RequestedProvisionedConcurrentExecutions": p.count,
        "AvailableProvisionedConcurrentExecutions": available,
        "AllocatedProvisionedConcurrentExecutions": available,
        "Status": if available >= p.count { "READY" } else { "IN_PROGRESS" },
        "LastModified": p.last_modified,
    })
}

pub async fn put(daemon: &Arc<Daemon>, name: &str, req: Req) -> Result<Resp, LambdaError> {
    let body = super::body_within(&req, 64 * 1024, "PutProvisionedConcurrencyConfig")?;
    let b: ProvisionedBody = parse_json(&body)?;
    let account = daemon.accounts.of_key(name);
    let max = daemon
        .instances
        .max_concurrency()
        .min(account.limits.concurrency as usize);
    let Some(count) = concurrency_within(b.provisioned_concurrent_executions, 1, max) else {
        return Err(LambdaError::invalid(format!(
            "ProvisionedConcurrentExecutions must be between 1 and the account's concurrency limit on this host ({max})"
        )));
    };
    let _admin = daemon.admin.lock().await;
    let q = qualifier(daemon, name, &req)?;
    let rec = ProvisionedRecord {
        function: name.to_string(),
        qualifier: q,
        count,
        last_modified: lambda_now(),
    };
    daemon.catalog.put_provisioned(&rec).map_err(catalog_err)?;
    daemon.instances.sync_provisioned(name).await;
    tracing::info!(function = %name, qualifier = %rec.qualifier, "provisioned concurrency {}", rec.count);
    Ok(json_response(
        StatusCode::ACCEPTED,
        &config_json(daemon, &rec),
    ))
}

pub fn get(daemon: &Arc<Daemon>, name: &str, req: &Req) -> Result<Resp, LambdaError> {
    let q = qualifier(daemon, name, req)?;
    let rec = daemon
        .catalog
        .provisioned(name, &q)
        .map_err(catalog_err)?
        .ok_or_else(|| not_configured(name))?;
    Ok(json_response(StatusCode::OK, &config_json(daemon, &rec)))
}

pub async fn delete(daemon: &Arc<Daemon>, name: &str, req: &Req) -> Result<Resp, LambdaError> {
    let _admin = daemon.admin.lock().await;
    let q = qualifier(daemon, name, req)?;
    if !daemon
        .catalog
        .delete_provisioned(name, &q)
        .map_err(catalog_err)?
    {
        return Err(not_configured(name));
    }
    daemon.instances.sync_provisioned(name).await;
    Ok(empty_response(StatusCode::NO_CONTENT))
}

/// `ListProvisionedConcurrencyConfigs` (`?List=ALL`).
pub fn list(daemon: &Arc<Daemon>, name: &str) -> Result<Resp, LambdaError> {
    let f = existing(daemon, name)?;
    let configs: Vec<_> = daemon
        .catalog
        .provisioned_of(name)
        .map_err(catalog_err)?
        .into_iter()
        .map(|p| {
            let mut v = config_json(daemon, &p);
            v["FunctionArn"] = format!("{}:{}", function_arn(&f.name), p.qualifier).into();
            v
        })
        .collect();
    Ok(json_response(
        StatusCode::OK,
        &serde_json::json!({ "ProvisionedConcurrencyConfigs": configs }),
    ))
}
