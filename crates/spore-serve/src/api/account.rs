//! `GetAccountSettings` (`2016-08-19`) for the caller's account, and the
//! account limits the control plane checks: `functions` and
//! `code_storage` (see [`crate::accounts`]). Total code storage is also
//! bounded by the room the state directory's file system has.

use std::sync::Arc;

use hyper::StatusCode;

use super::error::{catalog_err, LambdaError};
use super::{json_response, Daemon, Resp};
use crate::accounts::Account;

/// What an account holds: its functions, and the code of them and of
/// their published versions.
pub struct Usage {
    pub functions: u64,
    pub code_bytes: u64,
    pub reserved_concurrency: u64,
}

pub fn usage(daemon: &Daemon, account: &Account) -> Result<Usage, LambdaError> {
    let functions: Vec<_> = daemon
        .catalog
        .list()
        .map_err(catalog_err)?
        .into_iter()
        .filter(|f| account.owns(&f.name))
        .collect();
    let mut code_bytes: u64 = functions.iter().map(|f| f.code_size).sum();
    for f in &functions {
        code_bytes = code_bytes.saturating_add(
            daemon
                .catalog
                .versions(&f.name)
                .map_err(catalog_err)?
                .iter()
                .map(|v| v.code_size)
                .sum(),
        );
    }
    Ok(Usage {
        functions: functions.len() as u64,
        code_bytes,
        reserved_concurrency: functions
            .iter()
            .filter_map(|f| f.reserved_concurrency)
            .map(u64::from)
            .sum(),
    })
}

/// The size of a base64 zip once decoded (within two bytes).
pub fn zip_len(zip_b64: Option<&str>) -> u64 {
    zip_b64.map_or(0, |z| (z.trim().len() as u64) / 4 * 3)
}

/// Refuses a change that would take `account` past its `functions` limit
/// (`new_functions` more) or its `code_storage` (`more_code` bytes more).
pub fn check_room(
    daemon: &Daemon,
    account: &Account,
    new_functions: u64,
    more_code: u64,
) -> Result<(), LambdaError> {
    let u = usage(daemon, account)?;
    if let Some(max) = account.limits.functions {
        if new_functions > 0 && u.functions + new_functions > u64::from(max) {
            return Err(LambdaError::new(
                StatusCode::BAD_REQUEST,
                "ServiceQuotaExceededException",
                format!(
                    "The account's limit of {max} functions is reached ({} exist)",
                    u.functions
                ),
            ));
        }
    }
    let limit = account.limits.code_storage;
    if u.code_bytes.saturating_add(more_code) > limit {
        return Err(LambdaError::new(
            StatusCode::BAD_REQUEST,
            "CodeStorageExceededException",
            format!(
                "Code storage limit exceeded: the account holds {} of its {limit} bytes of code and this adds {more_code}",
                u.code_bytes
            ),
        ));
    }
    Ok(())
}

pub fn get(daemon: &Arc<Daemon>, caller: &Account) -> Result<Resp, LambdaError> {
    let u = usage(daemon, caller)?;
    let host = daemon.instances.max_concurrency() as u64;
    let max = host.min(u64::from(caller.limits.concurrency));
    let storage = free_bytes(&daemon.state_dir)
        .map_or(u.code_bytes, |free| u.code_bytes.saturating_add(free))
        .min(caller.limits.code_storage);
    Ok(json_response(
        StatusCode::OK,
        &serde_json::json!({
            "AccountLimit": {
                "TotalCodeSize": storage,
                "CodeSizeUnzipped": crate::code::MAX_UNPACKED_BYTES,
                "CodeSizeZipped": crate::code::MAX_ZIP_BYTES,
                "ConcurrentExecutions": max,
                "UnreservedConcurrentExecutions": max.saturating_sub(u.reserved_concurrency),
            },
            "AccountUsage": {
                "TotalCodeSize": u.code_bytes,
                "FunctionCount": u.functions,
            },
        }),
    ))
}

/// Bytes an unprivileged writer may still use on `dir`'s file system.
fn free_bytes(dir: &std::path::Path) -> Option<u64> {
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: a plain C struct of integers, valid all zero.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a valid output struct.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some(st.f_bavail.saturating_mul(st.f_frsize))
}
