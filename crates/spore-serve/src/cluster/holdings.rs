//! What each node holds, for placement: per function revision its best
//! start (a warm instance, a zygote to clone, a snapshot to restore) and
//! the node's free memory. Each node publishes its own under its lease
//! (`<prefix>held/<node-id>`, gone with the node), when it changed and at
//! least every [`REFRESH`]; every node reads all of them with the
//! membership, once a second.
//!
//! Placement ([`place`]): an invocation goes to the node holding the
//! fastest start of its revision (warm, then zygote, then snapshot; ties
//! by rendezvous rank), else to the one of the function's two owners with
//! clearly more free memory (best of two, the two chosen by rendezvous
//! hashing so that a function's instances concentrate; the first when
//! they are alike). Holdings are a second old at
//! most; a node that no longer holds what it said just starts the
//! instance itself.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use etcd_client::{GetOptions, PutOptions};

use super::forward::ranked;
use super::{Node, NodeRecord};
use crate::mutex::lock;

/// A start of the revision is a restore of its snapshot here.
pub const SNAPSHOT: u8 = 1;
/// A clone of its zygote.
pub const ZYGOTE: u8 = 2;
/// An idle instance.
pub const WARM: u8 = 3;

/// Published even when nothing changed, this often (free memory drifts).
const REFRESH: Duration = Duration::from_secs(10);
/// Free memory moving by more than this is published at once.
const MEMORY_STEP: u64 = 64 << 20;
/// The least difference in free memory that makes the second owner the
/// better of the two.
const CLEARLY_MORE: u64 = 256 << 20;

/// One node's holdings.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Held {
    /// Memory this node can still give instances (bytes): its budget left,
    /// or the host's available memory, whichever is less.
    pub free_memory_bytes: u64,
    /// `<function>:<revision>` → [`WARM`], [`ZYGOTE`] or [`SNAPSHOT`].
    pub functions: BTreeMap<String, u8>,
    /// The revisions this node has a snapshot of (whatever else it holds).
    #[serde(default)]
    pub snapshots: std::collections::BTreeSet<String>,
}

/// The key a revision is held under.
pub fn revision_key(function: &str, version: i64) -> String {
    format!("{function}:{version}")
}

fn held_prefix(node: &Node) -> String {
    format!("{}held/", node.cluster.prefix)
}

/// Where an invocation of `function`'s revision `key` should run: the
/// candidate nodes, best first (the holders, then the `replicas` owners).
pub fn place<'a>(
    function: &str,
    key: &str,
    nodes: &'a [NodeRecord],
    held: &HashMap<String, Held>,
    replicas: usize,
) -> Vec<&'a NodeRecord> {
    let ranked = ranked(function, nodes);
    let level = |n: &NodeRecord| {
        held.get(&n.node_id)
            .and_then(|h| h.functions.get(key).copied())
            .unwrap_or(0)
    };
    let mut holders: Vec<(usize, &NodeRecord)> = ranked
        .iter()
        .enumerate()
        .filter(|(_, n)| !n.draining && level(n) > 0)
        .map(|(rank, n)| (rank, *n))
        .collect();
    // Fastest start first; the stable sort keeps rendezvous order within.
    holders.sort_by_key(|(_, n)| std::cmp::Reverse(level(n)));
    let free = |n: &NodeRecord| held.get(&n.node_id).map_or(0, |h| h.free_memory_bytes);
    let mut owners: Vec<&NodeRecord> = ranked.iter().take(replicas.max(1)).copied().collect();
    // Best of two: the second owner first if it has clearly more free
    // memory (a quarter more, at least [`CLEARLY_MORE`]: nodes sharing a
    // host, or alike, must not flip on noise); never a drained one.
    if let [first, second, ..] = owners[..] {
        let margin = (free(first) / 4).max(CLEARLY_MORE);
        if !second.draining && free(second) > free(first).saturating_add(margin) {
            owners.swap(0, 1);
        }
    }
    let mut out: Vec<&NodeRecord> = Vec::new();
    for n in holders.into_iter().map(|(_, n)| n).chain(owners) {
        if !out.iter().any(|o| o.node_id == n.node_id) {
            out.push(n);
        }
    }
    out
}

impl Node {
    /// Publishes this node's holdings if they changed (or [`REFRESH`]
    /// passed) since the last call that published.
    pub async fn publish_held(&self, held: Held) {
        let lease = self.lease_id.load(std::sync::atomic::Ordering::Acquire);
        if lease == 0 {
            return;
        }
        {
            let last = lock(&self.published_held);
            if let Some((at, last_lease, last)) = last.as_ref() {
                let same = *last_lease == lease
                    && last.functions == held.functions
                    && last.free_memory_bytes.abs_diff(held.free_memory_bytes) < MEMORY_STEP;
                if same && at.elapsed() < REFRESH {
                    return;
                }
            }
        }
        let Ok(json) = serde_json::to_vec(&held) else {
            return;
        };
        let key = format!("{}{}", held_prefix(self), self.cluster.node_id);
        let put = self
            .client
            .clone()
            .put(key, json, Some(PutOptions::new().with_lease(lease)))
            .await;
        match put {
            Ok(_) => *lock(&self.published_held) = Some((Instant::now(), lease, held)),
            Err(e) => tracing::debug!("cluster: publishing what this node holds: {e}"),
        }
    }

    /// Whether a node being drained holds a snapshot of revision `key`:
    /// the function's owners then keep a copy of it.
    pub fn snapshot_on_a_draining_node(&self, key: &str) -> bool {
        let nodes = lock(&self.known_nodes);
        let held = lock(&self.known_held);
        nodes.iter().any(|n| {
            n.draining
                && n.node_id != self.cluster.node_id
                && held
                    .get(&n.node_id)
                    .is_some_and(|h| h.snapshots.contains(key))
        })
    }

    /// Where an invocation of `function`'s revision `version` arriving here
    /// should run: `None` here (this node is the best place, or the
    /// membership is not known yet), else the nodes to try, in order.
    pub fn placement(&self, function: &str, version: i64) -> Option<Vec<String>> {
        let nodes = lock(&self.known_nodes);
        let held = lock(&self.known_held);
        let candidates = place(
            function,
            &revision_key(function, version),
            &nodes,
            &held,
            self.replicas,
        );
        let first = candidates.first()?;
        if first.node_id == self.cluster.node_id {
            return None;
        }
        Some(candidates.iter().map(|n| n.advertise.clone()).collect())
    }
}

/// Every node's published holdings, by node id.
pub(super) async fn read_held(
    client: &mut etcd_client::Client,
    node: &Node,
) -> Result<HashMap<String, Held>, etcd_client::Error> {
    let prefix = held_prefix(node);
    let resp = client
        .get(prefix.as_str(), Some(GetOptions::new().with_prefix()))
        .await?;
    Ok(resp
        .kvs()
        .iter()
        .filter_map(|kv| {
            let id = kv.key_str().ok()?.strip_prefix(&prefix)?.to_string();
            Some((id, serde_json::from_slice(kv.value()).ok()?))
        })
        .collect())
}

/// A count of what a node holds, for `spore cluster status`.
pub fn summary(held: &Held) -> serde_json::Value {
    let count = |level: u8| held.functions.values().filter(|&&l| l == level).count();
    serde_json::json!({
        "free_memory_bytes": held.free_memory_bytes,
        "warm": count(WARM),
        "zygotes": count(ZYGOTE),
        "snapshots": count(SNAPSHOT),
        "functions": held.functions,
    })
}

#[cfg(test)]
mod tests {
    use super::super::forward::tests::record;
    use super::*;

    fn holding(free_mib: u64, pairs: &[(&str, u8)]) -> Held {
        Held {
            free_memory_bytes: free_mib << 20,
            functions: pairs.iter().map(|(k, l)| (k.to_string(), *l)).collect(),
            snapshots: Default::default(),
        }
    }

    fn ids(v: &[&NodeRecord]) -> Vec<String> {
        v.iter().map(|n| n.node_id.clone()).collect()
    }

    #[test]
    fn the_fastest_start_wins_then_the_owner_with_more_memory() {
        let nodes: Vec<_> = ["a", "b", "c", "d"].iter().map(|i| record(i)).collect();
        let rank = ids(&ranked("f", &nodes));
        let (first, second, outsider) = (rank[0].as_str(), rank[1].as_str(), rank[3].as_str());
        let mut held = HashMap::new();
        // Nobody holds anything: the owners, more free memory first.
        held.insert(first.to_string(), holding(100, &[]));
        held.insert(second.to_string(), holding(900, &[]));
        assert_eq!(ids(&place("f", "f:1", &nodes, &held, 2)), [second, first]);
        // Alike (less than a quarter and 256 MiB apart): rendezvous order.
        held.insert(second.to_string(), holding(300, &[]));
        assert_eq!(ids(&place("f", "f:1", &nodes, &held, 2)), [first, second]);
        // A snapshot on the outsider beats owners holding nothing.
        held.insert(outsider.to_string(), holding(10, &[("f:1", SNAPSHOT)]));
        assert_eq!(ids(&place("f", "f:1", &nodes, &held, 2))[0], outsider);
        // A warm instance beats a zygote beats a snapshot.
        held.insert(first.to_string(), holding(10, &[("f:1", ZYGOTE)]));
        held.insert(second.to_string(), holding(10, &[("f:1", WARM)]));
        assert_eq!(
            ids(&place("f", "f:1", &nodes, &held, 2)),
            [second, first, outsider]
        );
        // One replica: no second owner to choose.
        held.insert(second.to_string(), holding(900, &[]));
        held.insert(first.to_string(), holding(10, &[]));
        assert_eq!(ids(&place("f", "f:9", &nodes, &held, 1)), [first]);
        assert_eq!(ids(&place("f", "f:9", &nodes, &held, 3)).len(), 3);
        held.insert(first.to_string(), holding(10, &[("f:1", ZYGOTE)]));
        held.insert(second.to_string(), holding(10, &[("f:1", WARM)]));
        // Another revision's holdings do not count.
        assert_eq!(ids(&place("f", "f:2", &nodes, &held, 2)), [first, second]);
        // A drained holder is not chosen for what it holds.
        let mut drained = nodes.clone();
        for n in &mut drained {
            n.draining = n.node_id == second;
        }
        assert_eq!(ids(&place("f", "f:1", &drained, &held, 2))[0], first);
    }
}
