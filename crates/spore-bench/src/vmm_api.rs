//! Requests to a VMM's REST API on its Unix socket, written and read on the
//! calling thread: the benches time requests such as `PUT /clone` and
//! `PUT /snapshot/load` from the host clock, so nothing (no runtime, no
//! connection task) sits between the clock read and the socket.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context};
use spore_vmm::clone::CloneReport;

/// Sends one request; returns the HTTP status and the response body.
pub(crate) fn request(
    socket: &Path,
    method: &str,
    path: &str,
    body: &str,
) -> anyhow::Result<(u16, String)> {
    let mut s = UnixStream::connect(socket)
        .with_context(|| format!("connecting to {}", socket.display()))?;
    s.set_read_timeout(Some(Duration::from_secs(600)))?;
    // One write: a request written piece by piece wakes the server for
    // each piece.
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nAccept: application/json\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(request.as_bytes())?;
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).context("reading the response")?;
    let resp = String::from_utf8_lossy(&resp);
    let (head, body) = resp.split_once("\r\n\r\n").unwrap_or((&resp, ""));
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("malformed HTTP response")?;
    Ok((status, body.to_string()))
}

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
    let (status, reply) = request(socket, "PUT", "/clone", &body)?;
    if status >= 400 {
        let msg = serde_json::from_str::<serde_json::Value>(&reply)
            .ok()
            .and_then(|v| v["fault_message"].as_str().map(str::to_string))
            .unwrap_or(reply);
        bail!("clone refused (HTTP {status}): {}", msg.trim());
    }
    serde_json::from_str(&reply).context("the VMM's clone report does not parse")
}
