//! The daemon's side of a sandbox's envd: reached over the VMM's
//! hybrid-vsock socket (`CONNECT <port>` → `OK <port>`, as Firecracker's
//! vsock device answers), then plain HTTP/1.1. Used to wait for a sandbox's
//! envd to answer and to give it its settings (`/init`); the proxy
//! (`super::proxy`) opens its connections the same way.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

/// envd's port in the guest (E2B's, which the SDK names).
pub const ENVD_PORT: u16 = 49983;

/// The envd version spore-envd reports (the SDK enables features by it).
pub const ENVD_VERSION: &str = "0.5.7";

/// How long one connection attempt may take (a guest that does not accept
/// on the port leaves the handshake unanswered).
const CONNECT_LIMIT: Duration = Duration::from_secs(5);

/// A stream to `port` in the guest behind the VMM's vsock socket `uds`.
pub async fn connect(uds: &Path, port: u16) -> anyhow::Result<UnixStream> {
    tokio::time::timeout(CONNECT_LIMIT, handshake(uds, port))
        .await
        .map_err(|_| anyhow!("the guest did not accept a connection to port {port}"))?
}

async fn handshake(uds: &Path, port: u16) -> anyhow::Result<UnixStream> {
    let mut stream = UnixStream::connect(uds)
        .await
        .with_context(|| format!("connecting to {}", uds.display()))?;
    stream
        .write_all(format!("CONNECT {port}\n").as_bytes())
        .await?;
    // Byte by byte up to the newline: what follows it is the guest's.
    let mut line = Vec::with_capacity(16);
    loop {
        let b = stream.read_u8().await.context("vsock handshake")?;
        if b == b'\n' {
            break;
        }
        line.push(b);
        if line.len() > 64 {
            bail!("vsock handshake: an answer too long for the VMM's");
        }
    }
    if !line.starts_with(b"OK ") {
        bail!(
            "vsock handshake: {:?}",
            String::from_utf8_lossy(&line).trim()
        );
    }
    Ok(stream)
}

/// One request to envd; its status and body.
pub async fn request(
    uds: &Path,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&serde_json::Value>,
) -> anyhow::Result<(hyper::StatusCode, Bytes)> {
    let stream = connect(uds, ENVD_PORT).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "envd");
    if let Some(t) = token {
        req = req.header("x-access-token", t);
    }
    let payload = match body {
        Some(v) => {
            req = req.header("content-type", "application/json");
            Bytes::from(v.to_string())
        }
        None => Bytes::new(),
    };
    let resp = sender.send_request(req.body(Full::new(payload))?).await?;
    let status = resp.status();
    let bytes = resp.into_body().collect().await?.to_bytes();
    Ok((status, bytes))
}

/// Waits until envd answers `/health` (a booting or restored guest), up to
/// `limit`.
pub async fn wait_healthy(uds: &Path, limit: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        let last = match request(uds, "GET", "/health", None, None).await {
            Ok((s, _)) if s.is_success() => return Ok(()),
            Ok((s, _)) => format!("answered {s}"),
            Err(e) => format!("{e:#}"),
        };
        if Instant::now() >= deadline {
            bail!("envd did not answer within {limit:?} ({last})");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `POST /init`: `current` is the access token envd holds now (a clone
/// holds its source's), `settings` the fields to set.
pub async fn init(
    uds: &Path,
    current: Option<&str>,
    settings: &serde_json::Value,
) -> anyhow::Result<()> {
    let (status, body) = request(uds, "POST", "/init", current, Some(settings)).await?;
    if !status.is_success() {
        bail!(
            "envd refused /init: {status}: {}",
            String::from_utf8_lossy(&body)
        );
    }
    Ok(())
}
