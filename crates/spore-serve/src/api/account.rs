//! `GetAccountSettings` (`2016-08-19`): the limits this daemon enforces and
//! what is in use, in Lambda's shape. The figures are spore's own, not
//! Lambda's defaults: the code limits of [`crate::code`], the host's
//! `--max-concurrency`, and for total code storage the room the state
//! directory's file system has (used + free), which is what bounds it.

use std::sync::Arc;

use hyper::StatusCode;

use super::control::catalog_err;
use super::error::LambdaError;
use super::{json_response, Daemon, Resp};

pub fn get(daemon: &Arc<Daemon>) -> Result<Resp, LambdaError> {
    let functions = daemon.catalog.list().map_err(catalog_err)?;
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
    let max = daemon.instances.max_concurrency();
    let reserved: usize = functions
        .iter()
        .filter_map(|f| f.reserved_concurrency)
        .map(|n| n as usize)
        .sum();
    let storage =
        free_bytes(&daemon.state_dir).map_or(code_bytes, |free| code_bytes.saturating_add(free));
    Ok(json_response(
        StatusCode::OK,
        &serde_json::json!({
            "AccountLimit": {
                "TotalCodeSize": storage,
                "CodeSizeUnzipped": crate::code::MAX_UNPACKED_BYTES,
                "CodeSizeZipped": crate::code::MAX_ZIP_BYTES,
                "ConcurrentExecutions": max,
                "UnreservedConcurrentExecutions": max.saturating_sub(reserved),
            },
            "AccountUsage": {
                "TotalCodeSize": code_bytes,
                "FunctionCount": functions.len(),
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
