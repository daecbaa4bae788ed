//! Membership: each node holds a lease in etcd (TTL [`LEASE_TTL_S`]) and,
//! under it, `<prefix>nodes/<node-id>`: its address and capacity. A node
//! whose lease lapses is out (etcd deletes its record).
//!
//! A node that cannot renew its lease asks the other nodes it last knew
//! whether theirs are fresh. If one is, etcd works for the others and this
//! node is cut off: it fences itself a second before its lease can lapse at
//! etcd (no invocations, its instances ended), so that it never serves what
//! the others may have changed meanwhile. If it reaches a majority of the
//! nodes and none has a fresh lease, etcd is down for the whole cluster: no
//! node can change anything, so this node keeps serving (writes fail with
//! 503 until etcd is back) rather than the whole cluster stopping. It comes
//! back with a new lease once etcd answers again.

use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Client, Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};
use serde::{Deserialize, Serialize};

use super::{Node, NodeError};
use crate::catalog::ClusterConfig;
use crate::mutex::lock;

/// A node's lease lasts this long without a renewal (s).
pub const LEASE_TTL_S: i64 = 5;
/// Renewals this often.
const RENEW_EVERY: Duration = Duration::from_secs(1);
/// A node fences itself this long after its last renewal: a second before
/// its lease can lapse at etcd (which counts from the renewal's arrival,
/// before its answer came back here).
const FENCE_AFTER: Duration = Duration::from_secs(LEASE_TTL_S as u64 - 1);
/// A peer whose last renewal is this much more recent than this node's
/// renewed while this node could not: etcd works for it. (When etcd is down
/// for all, their last renewals lie within about one renewal period.)
const RENEWED_SINCE_MS: u64 = 2_000;
/// How long a renewal (or a membership read) may go unanswered before the
/// stream is given up for a new connection.
const STREAM_PATIENCE: Duration = Duration::from_secs(2);
/// How long a peer may take to say whether its lease is fresh.
const PEER_ASK_TIMEOUT: Duration = Duration::from_millis(500);

/// What a node offers (its record in etcd).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Capacity {
    pub cpus: u32,
    /// `--memory-budget` (0: none).
    pub memory_budget_bytes: u64,
    /// The host's memory (`MemTotal`).
    pub memory_total_bytes: u64,
}

impl Capacity {
    /// This host's CPUs and memory, with the daemon's budget.
    pub fn of_this_host(memory_budget_bytes: u64) -> Self {
        let cpus = std::thread::available_parallelism()
            .map_or(1, |n| u32::try_from(n.get()).unwrap_or(u32::MAX));
        let memory_total_bytes = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                m.lines()
                    .find_map(|l| l.strip_prefix("MemTotal:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            })
            .map_or(0, |kib| kib * 1024);
        Capacity {
            cpus,
            memory_budget_bytes,
            memory_total_bytes,
        }
    }
}

/// One live node, as `<prefix>nodes/<id>` holds it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct NodeRecord {
    pub node_id: String,
    /// Where its API is reached (`--advertise`).
    pub advertise: String,
    pub capacity: Capacity,
    pub started_unix_ms: u64,
    /// The etcd lease the record lives under.
    pub lease_id: i64,
    /// `spore cluster drain`: no function is placed here (not stored in
    /// the record: read from `<prefix>drain/<node-id>`).
    #[serde(default)]
    pub draining: bool,
}

fn node_key(cluster: &ClusterConfig, id: &str) -> String {
    format!("{}nodes/{id}", cluster.prefix)
}

/// Registers the node (waiting out the lease of a predecessor with the same
/// id that was killed, at most one TTL), then keeps its lease alive.
pub(super) async fn start(node: Arc<Node>, capacity: Capacity) -> Result<(), NodeError> {
    let started_unix_ms = crate::clock::unix_ms();
    let mut client = node.client.clone();
    let deadline = Instant::now() + Duration::from_secs(LEASE_TTL_S as u64 + 2);
    let lease = loop {
        match register(&mut client, &node, &capacity, started_unix_ms, None).await {
            Ok(lease) => break lease,
            Err(Registration::Taken(other)) if Instant::now() < deadline => {
                tracing::info!(
                    "cluster: node id {} is still held by {other}; waiting for its lease",
                    node.cluster.node_id
                );
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(Registration::Taken(other)) => {
                return Err(NodeError::Etcd(format!(
                "node id {} is in use by a live node at {other}: give each node its own --node-id",
                node.cluster.node_id
            )))
            }
            Err(Registration::Etcd(e)) => return Err(NodeError::Etcd(e)),
        }
    };
    tokio::spawn(fence_watch(node.clone()));
    tokio::spawn(read_membership(node.clone()));
    tokio::spawn(keep_alive(node, capacity, started_unix_ms, lease));
    Ok(())
}

enum Registration {
    /// Another live lease holds the id: that node's address.
    Taken(String),
    Etcd(String),
}

async fn register(
    client: &mut Client,
    node: &Node,
    capacity: &Capacity,
    started_unix_ms: u64,
    previous: Option<i64>,
) -> Result<i64, Registration> {
    let etcd = |e: etcd_client::Error| Registration::Etcd(e.to_string());
    let lease = client
        .lease_grant(LEASE_TTL_S, None)
        .await
        .map_err(etcd)?
        .id();
    let record = NodeRecord {
        node_id: node.cluster.node_id.clone(),
        advertise: node.advertise.to_string(),
        capacity: capacity.clone(),
        started_unix_ms,
        lease_id: lease,
        draining: false,
    };
    let json = serde_json::to_vec(&record).map_err(|e| Registration::Etcd(e.to_string()))?;
    let key = node_key(&node.cluster, &node.cluster.node_id);
    let txn = Txn::new()
        .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
        .and_then([TxnOp::put(
            key.as_str(),
            json,
            Some(PutOptions::new().with_lease(lease)),
        )])
        .or_else([TxnOp::get(key.as_str(), None)]);
    let resp = client.txn(txn).await.map_err(etcd)?;
    if resp.succeeded() {
        node.lease_id
            .store(lease, std::sync::atomic::Ordering::Release);
        return Ok(lease);
    }
    let _ = client.lease_revoke(lease).await;
    let holder = client.get(key.as_str(), None).await.ok().and_then(|r| {
        r.kvs()
            .first()
            .and_then(|kv| serde_json::from_slice::<NodeRecord>(kv.value()).ok())
    });
    match holder {
        // Still this node's record, under the lease it had (etcd keeps
        // leases across its own restarts): that lease goes on.
        Some(h) if Some(h.lease_id) == previous => Ok(h.lease_id),
        Some(h) => Err(Registration::Taken(h.advertise)),
        None => Err(Registration::Taken("an unknown address".into())),
    }
}

/// Renews the lease every second; fences the node when renewals stop
/// arriving, and registers it again (a new lease) once etcd answers.
async fn keep_alive(node: Arc<Node>, capacity: Capacity, started_unix_ms: u64, mut lease: i64) {
    let mut client = node.client.clone();
    let mut renewed = Instant::now();
    loop {
        let mut lapsed = false;
        if let Ok((mut keeper, mut stream)) = client.lease_keep_alive(lease).await {
            loop {
                if keeper.keep_alive().await.is_err() {
                    break;
                }
                match tokio::time::timeout(STREAM_PATIENCE, stream.message()).await {
                    Ok(Ok(Some(r))) if r.ttl() > 0 => {
                        renewed = Instant::now();
                        renewal(&node).await;
                    }
                    // etcd says the lease is gone: a new one is needed.
                    Ok(Ok(Some(_))) => {
                        lapsed = true;
                        break;
                    }
                    Ok(Ok(None)) | Ok(Err(_)) => break,
                    // No answer: the member this stream goes to may be cut
                    // off; a new connection tries the others.
                    Err(_) => break,
                }
                tokio::time::sleep(RENEW_EVERY).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        // A fresh connection: its channel picks the members that answer.
        if let Ok(c) = node.cluster.connect().await {
            client = c;
        }
        if lapsed || renewed.elapsed() >= Duration::from_secs(LEASE_TTL_S as u64) {
            match register(&mut client, &node, &capacity, started_unix_ms, Some(lease)).await {
                Ok(l) => {
                    tracing::info!("cluster: registered again with a new lease");
                    lease = l;
                    renewed = Instant::now();
                    renewal(&node).await;
                }
                Err(Registration::Taken(other)) => {
                    tracing::error!(
                        "cluster: node id {} was taken by {other} while this node was away",
                        node.cluster.node_id
                    );
                }
                Err(Registration::Etcd(_)) => {}
            }
        }
    }
}

/// The lease was renewed: the node serves (again; a fenced node first
/// applies what the catalogue's log gained meanwhile, so that it serves
/// nothing the others changed while it was away).
async fn renewal(node: &Node) {
    node.renewed_unix_ms.store(
        crate::clock::unix_ms(),
        std::sync::atomic::Ordering::Release,
    );
    node.degraded
        .store(false, std::sync::atomic::Ordering::Release);
    if !node.is_fenced() {
        return;
    }
    let catalog = node.catalog.clone();
    match tokio::task::spawn_blocking(move || catalog.sync()).await {
        Ok(Ok(())) => {
            tracing::info!(
                "cluster: the lease is renewed and the catalogue caught up: serving again"
            );
            node.set_fenced(false);
        }
        Ok(Err(e)) => tracing::warn!("cluster: still fenced: catching up the catalogue: {e}"),
        Err(e) => tracing::warn!("cluster: still fenced: {e}"),
    }
}

/// Reads the membership every second, apart from the renewals (which a
/// slow member can hold up): where functions are placed, and whom the fence
/// asks.
async fn read_membership(node: Arc<Node>) {
    let mut client = node.client.clone();
    loop {
        match tokio::time::timeout(STREAM_PATIENCE, nodes(&mut client, &node.cluster)).await {
            Ok(Ok(all)) => *lock(&node.known_nodes) = all,
            Ok(Err(e)) => tracing::debug!("cluster: reading the membership: {e}"),
            Err(_) => tracing::debug!("cluster: reading the membership: no answer in time"),
        }
        match tokio::time::timeout(
            STREAM_PATIENCE,
            super::holdings::read_held(&mut client, &node),
        )
        .await
        {
            Ok(Ok(held)) => *lock(&node.known_held) = held,
            Ok(Err(e)) => tracing::debug!("cluster: reading what nodes hold: {e}"),
            Err(_) => tracing::debug!("cluster: reading what nodes hold: no answer in time"),
        }
        tokio::time::sleep(RENEW_EVERY).await;
    }
}

/// Checks the lease's age four times a second, whatever the renewals are
/// waiting on (a member that does not answer holds them for seconds).
async fn fence_watch(node: Arc<Node>) {
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        on_stale(&node).await;
    }
}

/// The lease was not renewed for a while: fence the node, unless etcd is
/// down for the whole cluster (module doc).
async fn on_stale(node: &Arc<Node>) {
    let since = Duration::from_millis(node.renewed_ms_ago());
    if since < FENCE_AFTER || node.is_fenced() {
        return;
    }
    let (reached, fresh, of) = ask_peers(node, node.renewed_ms_ago()).await;
    if fresh == 0 && 2 * (reached + 1) > of + 1 {
        if node
            .degraded
            .swap(true, std::sync::atomic::Ordering::AcqRel)
        {
            return;
        }
        tracing::warn!(
            "cluster: no lease renewed for {} ms, and {reached} of the {of} other nodes reached have none either: etcd is down for the whole cluster; serving on (writes get 503)",
            since.as_millis()
        );
        return;
    }
    tracing::warn!(
        "cluster: the lease was not renewed for {} ms while {fresh} of the {of} other nodes renewed theirs since ({reached} reached): fenced (no invocations taken, instances ended) until etcd answers",
        since.as_millis()
    );
    node.set_fenced(true);
}

/// Asks every other node last known, side by side, when it last renewed
/// its lease: (nodes that answered, of them those that renewed since this
/// node could not, nodes asked).
async fn ask_peers(node: &Arc<Node>, my_ago_ms: u64) -> (usize, usize, usize) {
    let peers: Vec<NodeRecord> = lock(&node.known_nodes)
        .iter()
        .filter(|n| n.node_id != node.cluster.node_id)
        .cloned()
        .collect();
    let mut asks = tokio::task::JoinSet::new();
    for peer in &peers {
        let (node, addr) = (node.clone(), peer.advertise.clone());
        asks.spawn(async move {
            let got = tokio::time::timeout(
                PEER_ASK_TIMEOUT,
                super::peer_http::get(&node, &addr, "lease", 4096),
            )
            .await;
            match got {
                Ok(Ok((hyper::StatusCode::OK, body))) => Some(
                    serde_json::from_slice::<serde_json::Value>(&body)
                        .ok()
                        .and_then(|v| v["renewed_ms_ago"].as_u64())
                        .is_some_and(|ago| ago.saturating_add(RENEWED_SINCE_MS) < my_ago_ms),
                ),
                _ => None,
            }
        });
    }
    let (mut reached, mut fresh) = (0, 0);
    while let Some(answer) = asks.join_next().await {
        if let Ok(Some(f)) = answer {
            reached += 1;
            fresh += usize::from(f);
        }
    }
    (reached, fresh, peers.len())
}

/// Every node registered under the cluster's prefix (their leases alive),
/// with whether it is being drained.
pub(crate) async fn nodes(
    client: &mut Client,
    cluster: &ClusterConfig,
) -> Result<Vec<NodeRecord>, NodeError> {
    let etcd = |e: etcd_client::Error| NodeError::Etcd(format!("listing nodes: {e}"));
    let prefixed = || Some(GetOptions::new().with_prefix());
    let resp = client
        .get(format!("{}nodes/", cluster.prefix), prefixed())
        .await
        .map_err(etcd)?;
    let drain_dir = format!("{}drain/", cluster.prefix);
    let drained = client
        .get(
            drain_dir.as_str(),
            Some(GetOptions::new().with_prefix().with_keys_only()),
        )
        .await
        .map_err(etcd)?;
    let draining: Vec<&str> = drained
        .kvs()
        .iter()
        .filter_map(|kv| kv.key_str().ok()?.strip_prefix(&drain_dir))
        .collect();
    Ok(resp
        .kvs()
        .iter()
        .filter_map(|kv| serde_json::from_slice::<NodeRecord>(kv.value()).ok())
        .map(|mut n| {
            n.draining = draining.contains(&n.node_id.as_str());
            n
        })
        .collect())
}

/// `spore cluster drain` (or, `false`, `undrain`): no function is placed on
/// the node from the next membership read of every node (a second); its
/// warm instances finish and end when idle.
pub async fn set_draining(
    cluster: &ClusterConfig,
    node_id: &str,
    draining: bool,
) -> Result<(), NodeError> {
    let mut client = cluster
        .connect()
        .await
        .map_err(|e| NodeError::Etcd(e.to_string()))?;
    let key = format!("{}drain/{node_id}", cluster.prefix);
    let done = if draining {
        client.put(key, "1", None).await.map(drop)
    } else {
        client.delete(key, None).await.map(drop)
    };
    done.map_err(|e| NodeError::Etcd(format!("marking {node_id}: {e}")))
}

/// `spore cluster status`: every live node with the seconds left on its
/// lease and what it holds, and the catalogue log's length.
pub async fn status(cluster: &ClusterConfig) -> Result<serde_json::Value, NodeError> {
    let mut client = cluster
        .connect()
        .await
        .map_err(|e| NodeError::Etcd(e.to_string()))?;
    let mut nodes = Vec::new();
    for record in self::nodes(&mut client, cluster).await? {
        let ttl = client
            .lease_time_to_live(record.lease_id, None)
            .await
            .map_or(-1, |r| r.ttl());
        let held = client
            .get(format!("{}held/{}", cluster.prefix, record.node_id), None)
            .await
            .ok()
            .and_then(|r| serde_json::from_slice(r.kvs().first()?.value()).ok())
            .unwrap_or_default();
        let mut v = serde_json::to_value(&record).unwrap_or_default();
        v["lease_ttl_remaining_s"] = ttl.into();
        v["holds"] = super::holdings::summary(&held);
        nodes.push(v);
    }
    let head = client
        .get(format!("{}catalog/head", cluster.prefix), None)
        .await
        .map_err(|e| NodeError::Etcd(format!("reading the catalogue's log: {e}")))?;
    let log_head: u64 = head
        .kvs()
        .first()
        .and_then(|kv| kv.value_str().ok()?.parse().ok())
        .unwrap_or(0);
    // The log before the base is compacted away.
    let base = client
        .get(format!("{}catalog/base", cluster.prefix), None)
        .await
        .map_err(|e| NodeError::Etcd(format!("reading the catalogue's base: {e}")))?;
    let base_index = base
        .kvs()
        .first()
        .and_then(|kv| serde_json::from_slice::<serde_json::Value>(kv.value()).ok())
        .and_then(|b| b["index"].as_u64())
        .unwrap_or(0);
    Ok(serde_json::json!({
        "prefix": cluster.prefix,
        "nodes": nodes,
        "catalog_log_head": log_head,
        "catalog_base_index": base_index,
        "catalog_log_entries": log_head.saturating_sub(base_index),
    }))
}
