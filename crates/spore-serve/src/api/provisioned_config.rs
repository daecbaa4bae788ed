//! Provisioned concurrency (`2019-09-30`): Put, Get, Delete and List of
//! `ProvisionedConcurrencyConfig`, in Lambda's shapes. spore has no published
//! versions or aliases, so the one qualifier is `$LATEST` (Lambda itself
//! refuses `$LATEST` here; spore accepts it because it is all there is).
//! What a provisioned instance is: `instances::provisioned`.

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

/// The `Qualifier` query parameter, which must name `$LATEST`.
fn qualifier(req: &Req) -> Result<String, LambdaError> {
    let q = req
        .uri()
        .query()
        .unwrap_or("")
        .split('&')
        .find_map(|kv| kv.strip_prefix("Qualifier="))
        .and_then(super::percent_decode)
        .ok_or_else(|| LambdaError::invalid("Qualifier is required"))?;
    if q != "$LATEST" {
        return Err(LambdaError::new(
            StatusCode::NOT_FOUND,
            "ResourceNotFoundException",
            format!("Qualifier {q} does not exist: spore serve has only $LATEST"),
        ));
    }
    Ok(q)
}

fn not_configured(name: &str) -> LambdaError {
    LambdaError::new(
        StatusCode::NOT_FOUND,
        "ProvisionedConcurrencyConfigNotFoundException",
        format!("No Provisioned Concurrency Config found for this function: {name}"),
    )
}

fn config_json(daemon: &Daemon, p: &ProvisionedRecord) -> serde_json::Value {
    let status = daemon.instances.provisioned_status(&p.function);
    let ready = status.available >= p.count;
    serde_json::json!({
        "RequestedProvisionedConcurrentExecutions": p.count,
        "AvailableProvisionedConcurrentExecutions": status.available,
        "AllocatedProvisionedConcurrentExecutions": status.available,
        "Status": if ready { "READY" } else { "IN_PROGRESS" },
        "LastModified": p.last_modified,
    })
}

pub async fn put(daemon: &Arc<Daemon>, name: &str, req: Req) -> Result<Resp, LambdaError> {
    let q = qualifier(&req)?;
    let body = super::body_within(&req, 64 * 1024, "PutProvisionedConcurrencyConfig")?;
    let b: ProvisionedBody = parse_json(&body)?;
    let max = daemon.instances.max_concurrency();
    let Some(count) = concurrency_within(b.provisioned_concurrent_executions, 1, max) else {
        return Err(LambdaError::invalid(format!(
            "ProvisionedConcurrentExecutions must be between 1 and this host's limit ({max})"
        )));
    };
    let _admin = daemon.admin.lock().await;
    let f = existing(daemon, name)?;
    let rec = ProvisionedRecord {
        function: f.name.clone(),
        qualifier: q,
        count,
        last_modified: lambda_now(),
    };
    daemon.catalog.put_provisioned(&rec).map_err(catalog_err)?;
    daemon.instances.set_provisioned(&f, Some(rec.count)).await;
    tracing::info!(function = %f.name, "provisioned concurrency {}", rec.count);
    Ok(json_response(
        StatusCode::ACCEPTED,
        &config_json(daemon, &rec),
    ))
}

pub fn get(daemon: &Arc<Daemon>, name: &str, req: &Req) -> Result<Resp, LambdaError> {
    qualifier(req)?;
    existing(daemon, name)?;
    let rec = daemon
        .catalog
        .provisioned(name)
        .map_err(catalog_err)?
        .ok_or_else(|| not_configured(name))?;
    Ok(json_response(StatusCode::OK, &config_json(daemon, &rec)))
}

pub async fn delete(daemon: &Arc<Daemon>, name: &str, req: &Req) -> Result<Resp, LambdaError> {
    qualifier(req)?;
    let _admin = daemon.admin.lock().await;
    let f = existing(daemon, name)?;
    if !daemon
        .catalog
        .delete_provisioned(name)
        .map_err(catalog_err)?
    {
        return Err(not_configured(name));
    }
    daemon.instances.set_provisioned(&f, None).await;
    Ok(empty_response(StatusCode::NO_CONTENT))
}

/// `ListProvisionedConcurrencyConfigs` (`?List=ALL`).
pub fn list(daemon: &Arc<Daemon>, name: &str) -> Result<Resp, LambdaError> {
    let f = existing(daemon, name)?;
    let configs: Vec<_> = daemon
        .catalog
        .provisioned(name)
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
