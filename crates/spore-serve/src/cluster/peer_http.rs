//! The node-to-node API's client side: a GET to another node, carrying the
//! cluster key, its body bounded.

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::StatusCode;
use hyper_util::rt::TokioIo;

use super::{Node, INTERNAL_PREFIX, KEY_HEADER};

/// `GET <INTERNAL_PREFIX><path>` on the node at `addr`: its status and body
/// (at most `limit` bytes).
pub(super) async fn get(
    node: &Node,
    addr: &str,
    path: &str,
    limit: usize,
) -> Result<(StatusCode, Bytes), String> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connecting to {addr}: {e}"))?;
    let _ = stream.set_nodelay(true);
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    let driver = tokio::spawn(conn);
    let req = hyper::Request::get(format!("{INTERNAL_PREFIX}{path}"))
        .header(hyper::header::HOST, addr)
        .header(KEY_HEADER, node.key.as_str())
        .body(Full::new(Bytes::new()))
        .map_err(|e| e.to_string())?;
    let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status();
    let body = Limited::new(resp.into_body(), limit)
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    driver.abort();
    Ok((status, body))
}
