//! Placement and forwarding: which nodes a function's invocations run on,
//! and the hop to them.
//!
//! A function's owners are the first [`OWNERS`] live nodes by rendezvous
//! (highest-random-weight) hashing of the function's key with each node's
//! id: every node computes the same owners from the same membership, a
//! function's instances concentrate on them (and stay warm), and a node's
//! arrival or loss moves only the functions it ranks first for. An
//! invocation reaching another node is forwarded to the first owner (the
//! second if the first does not answer), over a kept-alive connection; if
//! no owner answers it runs where it arrived.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::{Response, StatusCode};
use hyper_util::rt::TokioIo;
use sha2::{Digest as _, Sha256};

use super::{Node, NodeRecord, INTERNAL_PREFIX, KEY_HEADER};
use crate::mutex::lock;

/// How many nodes own each function by default (`--replicas`): its
/// instances run there, and its code and a drained node's snapshots are
/// kept there.
pub const DEFAULT_REPLICAS: usize = 2;
/// The header a forwarded invocation carries: it is run, never forwarded
/// again.
pub const FORWARDED_HEADER: &str = "x-spore-forwarded-by";
/// The request headers of an Invoke that travel with it.
const INVOKE_HEADERS: &[&str] = &[
    "x-amz-invocation-type",
    "x-amz-log-type",
    "x-amz-client-context",
    "content-type",
];
/// The error kind of a forwarded invocation refused for its cluster key.
pub const REFUSED_KIND: &str = "ClusterKeyRefused";
/// Kept-alive connections per peer, at most.
const POOL_PER_PEER: usize = 32;
/// How long a node may take to accept a connection (a partitioned or
/// powered-off host never refuses one).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// What a forwarded invocation may take beyond the function's timeout (a
/// start on the other node, queueing there).
const FORWARD_MARGIN: Duration = Duration::from_secs(30);

/// Why an invocation was not answered by another node.
#[derive(Debug)]
pub enum ForwardError {
    /// No node took it (refused, unreachable, fenced, the key refused): it
    /// may run here.
    NotTaken(String),
    /// A node took it and gave no answer in time, or this node fenced
    /// itself meanwhile: it may be running there, so it must not run here
    /// too.
    Abandoned(String),
}

/// A node's weight for a function (rendezvous hashing): the first 8 bytes
/// of SHA-256(function key, 0, node id), the same on every node and build.
fn weight(function: &str, node_id: &str) -> u64 {
    let mut h = Sha256::new();
    h.update(function.as_bytes());
    h.update([0]);
    h.update(node_id.as_bytes());
    let d = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&d[..8]);
    u64::from_be_bytes(first)
}

/// The nodes by their weight for `function`, heaviest first; nodes being
/// drained only after every other (they own nothing while others live).
pub fn ranked<'a>(function: &str, nodes: &'a [NodeRecord]) -> Vec<&'a NodeRecord> {
    let mut by_weight: Vec<(bool, u64, &NodeRecord)> = nodes
        .iter()
        .map(|n| (!n.draining, weight(function, &n.node_id), n))
        .collect();
    by_weight.sort_by(|a, b| {
        (b.0, b.1)
            .cmp(&(a.0, a.1))
            .then_with(|| a.2.node_id.cmp(&b.2.node_id))
    });
    by_weight.into_iter().map(|(_, _, n)| n).collect()
}

/// Kept-alive HTTP/1.1 connections to other nodes, by address.
#[derive(Default)]
pub(super) struct Connections {
    idle: Mutex<HashMap<String, Vec<SendRequest<Full<Bytes>>>>>,
}

impl Connections {
    async fn take(&self, addr: &str) -> Result<SendRequest<Full<Bytes>>, String> {
        loop {
            let kept = lock(&self.idle).get_mut(addr).and_then(Vec::pop);
            match kept {
                Some(mut c) if !c.is_closed() => {
                    if c.ready().await.is_ok() {
                        return Ok(c);
                    }
                }
                Some(_) => {}
                None => break,
            }
        }
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(addr))
            .await
            .map_err(|_| format!("connecting to {addr}: no answer in {CONNECT_TIMEOUT:?}"))?
            .map_err(|e| format!("connecting to {addr}: {e}"))?;
        let _ = stream.set_nodelay(true);
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        Ok(sender)
    }

    fn give_back(&self, addr: &str, c: SendRequest<Full<Bytes>>) {
        let mut idle = lock(&self.idle);
        let kept = idle.entry(addr.to_string()).or_default();
        if kept.len() < POOL_PER_PEER && !c.is_closed() {
            kept.push(c);
        }
    }
}

impl Node {
    /// Whether this node is one of `function`'s owners (it keeps its code).
    pub fn is_owner(&self, function: &str) -> bool {
        let nodes = lock(&self.known_nodes);
        ranked(function, &nodes)
            .iter()
            .take(self.replicas)
            .any(|n| n.node_id == self.cluster.node_id)
    }

    /// Forwards an Invoke of `function` (its key) at `qualifier`, whose
    /// timeout is `timeout`, to the first of `nodes` that takes it.
    pub async fn forward_invoke(
        &self,
        nodes: &[String],
        function: &str,
        qualifier: &str,
        timeout: Duration,
        headers: &hyper::HeaderMap,
        body: Bytes,
    ) -> Result<Response<Full<Bytes>>, ForwardError> {
        let mut failures = Vec::new();
        for addr in nodes {
            let sent = self.forward_to(addr, function, qualifier, headers, body.clone());
            let mut fence = self.fence_changes();
            let fenced = async move {
                let _ = fence.wait_for(|fenced| *fenced).await;
            };
            let outcome = tokio::select! {
                r = tokio::time::timeout(timeout + FORWARD_MARGIN, sent) => r,
                () = fenced => {
                    return Err(ForwardError::Abandoned(
                        "this node fenced itself while another ran the invocation".into(),
                    ))
                }
            };
            match outcome {
                Ok(Ok(resp)) => return Ok(resp),
                Ok(Err(Handover::NotTaken(e))) => failures.push(format!("{addr}: {e}")),
                Ok(Err(Handover::Lost(e))) => {
                    return Err(ForwardError::Abandoned(format!("{addr}: {e}")))
                }
                Err(_) => {
                    return Err(ForwardError::Abandoned(format!(
                        "{addr}: no answer within the function's timeout and {FORWARD_MARGIN:?}"
                    )))
                }
            }
        }
        Err(ForwardError::NotTaken(failures.join("; ")))
    }

    async fn forward_to(
        &self,
        addr: &str,
        function: &str,
        qualifier: &str,
        headers: &hyper::HeaderMap,
        body: Bytes,
    ) -> Result<Response<Full<Bytes>>, Handover> {
        let q: String = qualifier
            .bytes()
            .map(|b| match b {
                b'$' => "%24".to_string(),
                b => char::from(b).to_string(),
            })
            .collect();
        let mut req =
            hyper::Request::post(format!("{INTERNAL_PREFIX}invoke/{function}?Qualifier={q}"))
                .header(hyper::header::HOST, addr)
                .header(KEY_HEADER, self.key.as_str())
                .header(FORWARDED_HEADER, self.cluster.node_id.as_str());
        for name in INVOKE_HEADERS {
            if let Some(v) = headers.get(*name) {
                req = req.header(*name, v);
            }
        }
        let not_taken = |e: String| Handover::NotTaken(e);
        let req = req
            .body(Full::new(body))
            .map_err(|e| not_taken(e.to_string()))?;
        let mut conn = self.connections.take(addr).await.map_err(not_taken)?;
        // A connection that breaks now lost the request with the node (a
        // killed node runs nothing more): it may run elsewhere.
        let resp = conn
            .send_request(req)
            .await
            .map_err(|e| not_taken(e.to_string()))?;
        let (parts, incoming) = resp.into_parts();
        let body = incoming
            .collect()
            .await
            .map_err(|e| Handover::Lost(format!("its answer broke off: {e}")))?
            .to_bytes();
        self.connections.give_back(addr, conn);
        let refused = parts
            .headers
            .get("x-amzn-errortype")
            .is_some_and(|v| v == REFUSED_KIND);
        if refused {
            return Err(not_taken("the node refused the cluster key".into()));
        }
        // A fenced node (or one without room): the next one, or here.
        if parts.status == StatusCode::SERVICE_UNAVAILABLE {
            return Err(not_taken("the node is fenced".into()));
        }
        Ok(Response::from_parts(parts, Full::new(body)))
    }
}

/// How handing an invocation to one node failed.
enum Handover {
    NotTaken(String),
    /// It was taken and its answer lost.
    Lost(String),
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A live node `id` at `id:1` (for placement tests).
    pub(in crate::cluster) fn record(id: &str) -> NodeRecord {
        NodeRecord {
            node_id: id.into(),
            advertise: format!("{id}:1"),
            capacity: super::super::Capacity {
                cpus: 1,
                memory_budget_bytes: 0,
                memory_total_bytes: 0,
            },
            started_unix_ms: 0,
            lease_id: 0,
            draining: false,
        }
    }

    #[test]
    fn rendezvous_moves_only_what_a_lost_node_ranked_first() {
        let all: Vec<_> = (0..10).map(|i| record(&format!("n{i}"))).collect();
        let without: Vec<_> = all.iter().filter(|n| n.node_id != "n3").cloned().collect();
        let mut moved = 0;
        for f in 0..1000 {
            let name = format!("f{f}");
            let before = ranked(&name, &all)[0].node_id.clone();
            let after = ranked(&name, &without)[0].node_id.clone();
            if before != after {
                assert_eq!(before, "n3", "{name} moved off a node that is still there");
                moved += 1;
            }
        }
        // About a tenth of the functions ranked n3 first.
        assert!((50..=150).contains(&moved), "{moved}");
        // A drained node owns nothing while others live.
        let mut drained = all.clone();
        let first = ranked("x", &all)[0].node_id.clone();
        drained
            .iter_mut()
            .for_each(|n| n.draining = n.node_id == first);
        assert_ne!(ranked("x", &drained)[0].node_id, first);
        assert_eq!(ranked("x", &drained).last().unwrap().node_id, first);
        // The same order on every call (and every node).
        assert_eq!(
            ranked("x", &all)
                .iter()
                .map(|n| &n.node_id)
                .collect::<Vec<_>>(),
            ranked("x", &all)
                .iter()
                .map(|n| &n.node_id)
                .collect::<Vec<_>>()
        );
    }
}
