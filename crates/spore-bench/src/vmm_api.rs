//! Requests to a VMM's REST API on its Unix socket, written and read on the
//! calling thread: the benches time requests such as `PUT /clone` and
//! `PUT /snapshot/load` from the host clock, so nothing (no runtime, no
//! connection task) sits between the clock read and the socket. The
//! request itself is spore-vmm's client ([`spore_vmm::api::client`], shared
//! with the `spore` command); this module adds what only the benches need.

use std::path::Path;

use anyhow::bail;
use spore_vmm::api::client::{self, request};
use spore_vmm::clone::CloneReport;

/// One request whose status must be below `fail_from`; the body.
pub(crate) fn call_below(
    socket: &Path,
    fail_from: u16,
    method: &str,
    path: &str,
    body: &str,
) -> anyhow::Result<String> {
    let (status, reply) = request(socket, method, path, body)?;
    if status >= fail_from {
        bail!("{method} {path}: HTTP {status}: {}", reply.trim());
    }
    Ok(reply)
}

/// One `PUT /clone` for `count` clones in the source's configured mode;
/// the API's fault message becomes the error.
pub(crate) fn put_clone(socket: &Path, count: u32) -> anyhow::Result<CloneReport> {
    let body = serde_json::json!({ "count": count }).to_string();
    Ok(client::put_clone(socket, &body)?)
}
