//! This daemon as one node of a cluster (`spore serve --cluster`): its
//! membership (a lease in etcd holding its address and capacity; a node
//! that cannot renew it fences itself), the node-to-node API (authenticated
//! with the cluster key) and fetching code from the nodes that have it.
//! The catalogue itself is shared through `crate::catalog` (its etcd log).

mod code;
mod events;
mod extents;
mod forward;
mod holdings;
mod membership;
mod peer_http;
mod slots;
mod snapshots;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

pub use code::{fetch_code, serve_internal};
pub use events::{reconcile_events, spawn_takeover, EtcdEvents};
pub use forward::{ranked, ForwardError, DEFAULT_REPLICAS, FORWARDED_HEADER, REFUSED_KIND};
pub use holdings::{place, revision_key, Held, SNAPSHOT, WARM, ZYGOTE};
pub use membership::{set_draining, status, Capacity, NodeRecord, LEASE_TTL_S};
use sha2::{Digest as _, Sha256};
pub use snapshots::{fetch_snapshot, serve_snapshot, Fetched};

use crate::catalog::ClusterConfig;

/// The header a node's request to another carries: the cluster key.
pub const KEY_HEADER: &str = "x-spore-cluster-key";
/// The path prefix of the node-to-node API.
pub const INTERNAL_PREFIX: &str = "/spore-cluster/v1/";

/// What `spore serve --cluster` was given besides the catalogue's etcd.
#[derive(Clone)]
pub struct NodeOptions {
    pub cluster: ClusterConfig,
    /// Where other nodes reach this node's API.
    pub advertise: SocketAddr,
    /// `--cluster-key FILE`: the secret nodes' requests to each other carry.
    pub key_file: PathBuf,
    /// `--replicas`: how many nodes own each function.
    pub replicas: usize,
}

/// This node, while the daemon runs.
pub struct Node {
    pub cluster: ClusterConfig,
    pub advertise: SocketAddr,
    /// SHA-256 of the cluster key: requests are compared by digest, so the
    /// comparison's time says nothing about the key.
    key_digest: [u8; 32],
    key: String,
    client: etcd_client::Client,
    fenced: AtomicBool,
    /// etcd is down for the whole cluster as far as this node can tell: it
    /// serves on (said once per outage).
    degraded: AtomicBool,
    /// Told when this node fences itself (true) or is back (false).
    fence_tx: tokio::sync::watch::Sender<bool>,
    /// The lease this node's record lives under (0: none yet).
    lease_id: std::sync::atomic::AtomicI64,
    /// When the lease was last renewed (ms since the Unix epoch).
    renewed_unix_ms: std::sync::atomic::AtomicU64,
    /// The cluster's nodes as last read from etcd (asked when etcd is away).
    known_nodes: std::sync::Mutex<Vec<NodeRecord>>,
    /// This node's copy of the catalogue: brought up to date before a
    /// fenced node serves again.
    catalog: Arc<crate::catalog::Catalog>,
    /// Kept-alive connections to the nodes invocations are forwarded to.
    connections: forward::Connections,
    /// How many nodes own each function (`--replicas`).
    replicas: usize,
    /// Every node's holdings as last read (placement).
    known_held: std::sync::Mutex<std::collections::HashMap<String, Held>>,
    /// What this node last published of its own, when, under which lease.
    published_held: std::sync::Mutex<Option<(std::time::Instant, i64, Held)>>,
}

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("--cluster-key {0}: {1}")]
    Key(PathBuf, String),
    #[error("cluster: {0}")]
    Etcd(String),
}

impl Node {
    /// Reads the cluster key, connects to etcd and registers this node
    /// (its lease is kept alive from then on, by a task of the caller's
    /// runtime).
    pub async fn start(
        options: NodeOptions,
        capacity: membership::Capacity,
        catalog: Arc<crate::catalog::Catalog>,
    ) -> Result<Arc<Node>, NodeError> {
        let key = read_key(&options.key_file)?;
        let client = options
            .cluster
            .connect()
            .await
            .map_err(|e| NodeError::Etcd(e.to_string()))?;
        let (fence_tx, _) = tokio::sync::watch::channel(false);
        let node = Arc::new(Node {
            key_digest: Sha256::digest(key.as_bytes()).into(),
            key,
            cluster: options.cluster,
            advertise: options.advertise,
            client,
            fenced: AtomicBool::new(false),
            degraded: AtomicBool::new(false),
            fence_tx,
            renewed_unix_ms: std::sync::atomic::AtomicU64::new(crate::clock::unix_ms()),
            lease_id: std::sync::atomic::AtomicI64::new(0),
            known_nodes: std::sync::Mutex::new(Vec::new()),
            catalog,
            connections: forward::Connections::default(),
            replicas: options.replicas.max(1),
            known_held: Default::default(),
            published_held: Default::default(),
        });
        membership::start(node.clone(), capacity).await?;
        Ok(node)
    }

    /// Whether this node lost its lease: it takes no invocations then.
    pub fn is_fenced(&self) -> bool {
        self.fenced.load(Ordering::Acquire)
    }

    fn set_fenced(&self, fenced: bool) {
        if self.fenced.swap(fenced, Ordering::AcqRel) != fenced {
            let _ = self.fence_tx.send(fenced);
        }
    }

    /// How long ago this node last renewed its lease (ms).
    pub fn renewed_ms_ago(&self) -> u64 {
        let renewed = self.renewed_unix_ms.load(Ordering::Acquire);
        crate::clock::unix_ms().saturating_sub(renewed)
    }

    /// `spore_cluster_*` in Prometheus' text format: this node's id, its
    /// fence, and the nodes it knows.
    pub fn render_metrics(&self, out: &mut String) {
        use std::fmt::Write as _;
        let id = &self.cluster.node_id;
        let nodes = crate::mutex::lock(&self.known_nodes);
        let draining = nodes.iter().filter(|n| n.draining).count();
        let _ = write!(
            out,
            "# HELP spore_cluster_node_info This daemon's node id in its cluster.\n\
             # TYPE spore_cluster_node_info gauge\nspore_cluster_node_info{{node=\"{id}\"}} 1\n\
             # HELP spore_cluster_fenced 1 while this node is fenced (its lease not renewed).\n\
             # TYPE spore_cluster_fenced gauge\nspore_cluster_fenced{{node=\"{id}\"}} {}\n\
             # HELP spore_cluster_lease_renewed_ms_ago Time since this node last renewed its lease.\n\
             # TYPE spore_cluster_lease_renewed_ms_ago gauge\nspore_cluster_lease_renewed_ms_ago{{node=\"{id}\"}} {}\n\
             # HELP spore_cluster_nodes Live nodes this node knows, and of them those being drained.\n\
             # TYPE spore_cluster_nodes gauge\nspore_cluster_nodes{{node=\"{id}\",state=\"live\"}} {}\n\
             spore_cluster_nodes{{node=\"{id}\",state=\"draining\"}} {draining}\n",
            u8::from(self.is_fenced()),
            self.renewed_ms_ago(),
            nodes.len(),
        );
    }

    /// Changes of the fence (true: fenced).
    pub fn fence_changes(&self) -> tokio::sync::watch::Receiver<bool> {
        self.fence_tx.subscribe()
    }

    /// Leaves the cluster (a daemon's orderly stop): its lease is revoked,
    /// so its record goes at once and a restarted node takes its id again
    /// without waiting for the lease to lapse.
    pub async fn leave(&self) {
        let lease = self.lease_id.load(Ordering::Acquire);
        if lease != 0 {
            let mut client = self.client.clone();
            let revoked = tokio::time::timeout(
                std::time::Duration::from_secs(2),
                client.lease_revoke(lease),
            )
            .await;
            if !matches!(revoked, Ok(Ok(_))) {
                tracing::warn!(
                    "cluster: this node's lease could not be revoked: it lapses in {LEASE_TTL_S} s"
                );
            }
        }
    }

    /// Whether a node-to-node request carries the cluster key.
    pub fn authorised(&self, headers: &hyper::HeaderMap) -> bool {
        headers
            .get(KEY_HEADER)
            .is_some_and(|v| <[u8; 32]>::from(Sha256::digest(v.as_bytes())) == self.key_digest)
    }

    /// Every node whose lease is alive, this one included.
    pub async fn nodes(&self) -> Result<Vec<NodeRecord>, NodeError> {
        membership::nodes(&mut self.client.clone(), &self.cluster).await
    }
}

/// [`set_draining`] from outside any async runtime (`spore cluster drain`).
pub fn set_draining_blocking(
    cluster: &ClusterConfig,
    node_id: &str,
    draining: bool,
) -> Result<(), NodeError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| NodeError::Etcd(e.to_string()))?
        .block_on(set_draining(cluster, node_id, draining))
}

/// [`status`] from outside any async runtime (`spore cluster status`).
pub fn status_blocking(cluster: &ClusterConfig) -> Result<serde_json::Value, NodeError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| NodeError::Etcd(e.to_string()))?
        .block_on(status(cluster))
}

/// The key file: one line of at least 16 characters, readable by its
/// owner only (a key others can read is no secret).
fn read_key(path: &std::path::Path) -> Result<String, NodeError> {
    use std::os::unix::fs::PermissionsExt as _;
    let bad = |why: String| NodeError::Key(path.to_path_buf(), why);
    let meta = std::fs::metadata(path).map_err(|e| bad(e.to_string()))?;
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(bad(format!(
            "mode {:o}: others may read it (chmod 600)",
            meta.permissions().mode() & 0o777
        )));
    }
    let key = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let key = key.trim().to_string();
    if key.len() < 16 || !key.chars().all(|c| c.is_ascii_graphic()) {
        return Err(bad(
            "the key is one line of at least 16 printable characters".into(),
        ));
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_file_must_be_private_and_long_enough() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = std::env::temp_dir().join(format!("spore-cluster-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("key");
        std::fs::write(&path, "0123456789abcdef0123\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(read_key(&path)
            .unwrap_err()
            .to_string()
            .contains("chmod 600"));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read_key(&path).unwrap(), "0123456789abcdef0123");
        std::fs::write(&path, "short").unwrap();
        assert!(read_key(&path).is_err());
        assert!(read_key(&dir.join("missing")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
