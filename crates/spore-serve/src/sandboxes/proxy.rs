//! The sandbox proxy: a request for a sandbox's port goes to that port in
//! the guest over the VMM's vsock socket (no guest network needed), as
//! HTTP/1.1; the answer streams back as it comes (a command's output, a
//! file download). An upgrade (WebSocket) is answered by the guest, then
//! both connections are joined byte for byte.

use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

use super::reply::{error, Body};
use super::{envd, Sandboxes};

/// Request headers that are the proxy's, not the guest's.
const OWN_HEADERS: [&str; 2] = ["e2b-sandbox-id", "e2b-sandbox-port"];

pub async fn forward(
    sandboxes: &Sandboxes,
    id: &str,
    port: u16,
    mut req: Request<Incoming>,
) -> Response<Body> {
    let vsock = match sandboxes.vsock_for_request(id).await {
        Ok(v) => v,
        Err(e) => {
            return error(
                if e.status() == 409 { 502 } else { e.status() },
                &e.to_string(),
            )
        }
    };
    let stream = match envd::connect(&vsock, port).await {
        Ok(s) => s,
        Err(e) => {
            if port == envd::ENVD_PORT {
                // envd always listens: its guest is stuck or envd died.
                // What the guest's console said is the operator's clue.
                let what = format!(
                    "envd does not answer ({e:#}); its VMM's log ends: {}",
                    sandboxes.vmm_log_lines(id, 20).await.unwrap_or_default()
                );
                tracing::warn!(sandbox = %id, "{what}");
                sandboxes.note(id, super::events::Level::Warn, &what);
            }
            return error(
                502,
                &format!("sandbox {id}: nothing answers on port {port}: {e:#}"),
            );
        }
    };
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await
    {
        Ok(pair) => pair,
        Err(e) => return error(502, &format!("sandbox {id}: {e}")),
    };
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!("sandbox proxy connection: {e}");
        }
    });
    for h in OWN_HEADERS {
        req.headers_mut().remove(h);
    }
    // Origin form: the guest sees the path, as from any client.
    let path = req
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    if let Ok(uri) = path.parse() {
        *req.uri_mut() = uri;
    }
    let client_upgrade = is_upgrade(&req).then(|| hyper::upgrade::on(&mut req));
    let mut resp = match sender.send_request(req).await {
        Ok(r) => r,
        Err(e) => return error(502, &format!("sandbox {id}: port {port}: {e}")),
    };
    if resp.status() == hyper::StatusCode::SWITCHING_PROTOCOLS {
        if let Some(client_upgrade) = client_upgrade {
            let guest_upgrade = hyper::upgrade::on(&mut resp);
            tokio::spawn(async move {
                if let (Ok(client), Ok(guest)) = (client_upgrade.await, guest_upgrade.await) {
                    let (mut client, mut guest) = (TokioIo::new(client), TokioIo::new(guest));
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut guest).await;
                }
            });
        }
    }
    resp.map(Body::Right)
}

fn is_upgrade(req: &Request<Incoming>) -> bool {
    req.headers()
        .get(hyper::header::CONNECTION)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.to_ascii_lowercase().contains("upgrade"))
}
