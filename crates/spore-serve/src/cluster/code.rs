//! Code between nodes: a node asked to start a function whose code it does
//! not hold (deployed through another node) fetches the zip from a node
//! that has it, checks it against the SHA-256 the catalogue names, and
//! stores it as a deploy would (the handler's image or the code disk).

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Response, StatusCode};
use sha2::{Digest as _, Sha256};

use super::{Node, INTERNAL_PREFIX};
use crate::code::{self, MAX_ZIP_BYTES};

/// How long one peer may take to send a zip.
const FETCH_TIMEOUT: Duration = Duration::from_secs(30);

fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Serves the node-to-node API to another node (403 without the cluster
/// key): `GET code/<sha256>` (the zip; 404 if this node does not hold it)
/// and `GET lease` (whether this node's lease is fresh).
pub fn serve_internal(
    node: &Node,
    state_dir: &Path,
    headers: &hyper::HeaderMap,
    path: &str,
) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, body: Vec<u8>| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = status;
        r
    };
    if !node.authorised(headers) {
        return reply(
            StatusCode::FORBIDDEN,
            b"cluster key missing or wrong".to_vec(),
        );
    }
    if path.strip_prefix(INTERNAL_PREFIX) == Some("lease") {
        let body = serde_json::json!({
            "node_id": node.cluster.node_id,
            "renewed_ms_ago": node.renewed_ms_ago(),
        });
        return reply(StatusCode::OK, body.to_string().into_bytes());
    }
    let Some(sha) = path
        .strip_prefix(INTERNAL_PREFIX)
        .and_then(|p| p.strip_prefix("code/"))
        .filter(|s| is_sha256_hex(s))
    else {
        return reply(StatusCode::NOT_FOUND, b"no such node API".to_vec());
    };
    match std::fs::read(code::dir(state_dir, sha).join("code.zip")) {
        Ok(zip) => reply(StatusCode::OK, zip),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            reply(StatusCode::NOT_FOUND, b"not held here".to_vec())
        }
        Err(e) => reply(
            StatusCode::INTERNAL_SERVER_ERROR,
            e.to_string().into_bytes(),
        ),
    }
}

/// Fetches code this node lacks from the first live node that has it and
/// stores it; an error names what each node answered.
pub async fn fetch_code(
    node: &Node,
    state_dir: &Path,
    sha256_hex: &str,
    runtime: &str,
    handler: &str,
) -> Result<(), String> {
    if !is_sha256_hex(sha256_hex) {
        return Err(format!("{sha256_hex:?} is no SHA-256"));
    }
    let nodes = node.nodes().await.map_err(|e| e.to_string())?;
    let mut tried = Vec::new();
    for peer in nodes.iter().filter(|n| n.node_id != node.cluster.node_id) {
        let got = tokio::time::timeout(FETCH_TIMEOUT, get_zip(node, &peer.advertise, sha256_hex))
            .await
            .unwrap_or_else(|_| Err("timed out".into()));
        let zip = match got {
            Ok(zip) => zip,
            Err(e) => {
                tried.push(format!("{}: {e}", peer.node_id));
                continue;
            }
        };
        let digest: String = Sha256::digest(&zip)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        if digest != sha256_hex {
            tried.push(format!("{}: sent code of another hash", peer.node_id));
            continue;
        }
        let (state, runtime, handler) = (
            state_dir.to_path_buf(),
            runtime.to_string(),
            handler.to_string(),
        );
        let stored = tokio::task::spawn_blocking(move || {
            let checked = code::check(&zip, &runtime, &handler).map_err(|e| e.to_string())?;
            code::store(&state, &zip, &checked, &handler).map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| e.to_string())?;
        return match stored {
            Ok(()) => {
                tracing::info!(code = sha256_hex, from = %peer.node_id, "code fetched from a peer");
                Ok(())
            }
            Err(e) => Err(format!("storing code fetched from {}: {e}", peer.node_id)),
        };
    }
    Err(if tried.is_empty() {
        "no other live node to fetch it from".into()
    } else {
        format!("no live node could send it ({})", tried.join("; "))
    })
}

async fn get_zip(node: &Node, addr: &str, sha256_hex: &str) -> Result<Vec<u8>, String> {
    let (status, body) =
        super::peer_http::get(node, addr, &format!("code/{sha256_hex}"), MAX_ZIP_BYTES + 1).await?;
    if status != StatusCode::OK {
        return Err(format!(
            "{status}: {}",
            String::from_utf8_lossy(&body[..body.len().min(200)])
        ));
    }
    Ok(body.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_sha256_names_code() {
        assert!(is_sha256_hex(&"a".repeat(64)));
        assert!(!is_sha256_hex(&"A".repeat(64)));
        assert!(!is_sha256_hex("../../etc/passwd"));
        assert!(!is_sha256_hex(&"a".repeat(63)));
    }
}
