//! `spore api SOCK METHOD PATH [BODY]`: one request to a VMM's API socket
//! (what `curl --unix-socket` does), for scripts and hosts without curl.
//! Prints the response body; exits 1 on an HTTP error status.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;

#[derive(Args, Debug)]
pub struct ApiArgs {
    /// The VMM's API socket.
    pub socket: PathBuf,
    /// GET, PUT or PATCH.
    pub method: String,
    /// e.g. /machine-config
    pub path: String,
    /// JSON body.
    pub body: Option<String>,
}

pub fn run(a: ApiArgs) -> anyhow::Result<u8> {
    let method = a.method.to_ascii_uppercase();
    if !matches!(method.as_str(), "GET" | "PUT" | "PATCH" | "DELETE" | "POST") {
        bail!("unknown HTTP method {:?}", a.method);
    }
    if !a.path.starts_with('/') || a.path.contains(char::is_whitespace) {
        bail!(
            "the path must start with / and contain no spaces: {:?}",
            a.path
        );
    }
    let body = a.body.unwrap_or_default();
    let (status, body) = request(&a.socket, &method, &a.path, &body)?;
    if !body.is_empty() {
        println!("{body}");
    }
    if status >= 400 {
        bail!("{method} {} -> HTTP {status}", a.path);
    }
    Ok(0)
}

/// Sends one request; returns the HTTP status and the response body.
pub fn request(
    socket: &Path,
    method: &str,
    path: &str,
    body: &str,
) -> anyhow::Result<(u16, String)> {
    let mut s = UnixStream::connect(socket)
        .with_context(|| format!("connecting to {}", socket.display()))?;
    s.set_read_timeout(Some(Duration::from_secs(600)))?;
    // One write: a request written piece by piece (as `write!` on the
    // socket would) wakes the server for each piece.
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
