//! Concurrency across the cluster. A function's reserved concurrency, and
//! an account's concurrency, bound invocations on all nodes together: each
//! node holds a number of the scope's slots in etcd
//! (`<prefix>slots/<scope>/<node-id>`, under the node's lease, so a dead
//! node's slots go with it; the scope is `fn/<function key>` or
//! `account/<id>`) and runs at most that many of its invocations at once. A
//! node claims one more slot when all of its own are busy, in a transaction
//! that succeeds only if no node claimed one since it counted
//! (`<prefix>slots/<scope>` is bumped by every claim), and gives slots back
//! once no instance of its holds them. A warm invocation on a node with a
//! free slot makes no etcd round trip.

use std::sync::atomic::Ordering;

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};

use super::Node;

fn guard_key(node: &Node, scope: &str) -> String {
    format!("{}slots/{scope}", node.cluster.prefix)
}

fn own_key(node: &Node, scope: &str) -> String {
    format!(
        "{}slots/{scope}/{}",
        node.cluster.prefix, node.cluster.node_id
    )
}

impl Node {
    /// Claims one more slot of `scope` (`fn/<key>`, `account/<id>`), whose
    /// limit is `limit` cluster-wide: false when every slot is held.
    pub async fn claim_slot(&self, scope: &str, limit: u32) -> Result<bool, String> {
        let lease = self.lease_id.load(Ordering::Acquire);
        let (guard, mine) = (guard_key(self, scope), own_key(self, scope));
        let mut client = self.client.clone();
        for _ in 0..20 {
            let held = client
                .get(format!("{guard}/"), Some(GetOptions::new().with_prefix()))
                .await
                .map_err(|e| e.to_string())?;
            let guard_rev = client
                .get(guard.as_str(), None)
                .await
                .map_err(|e| e.to_string())?
                .kvs()
                .first()
                .map_or(0, |kv| kv.mod_revision());
            let count = |v: &[u8]| -> u32 {
                std::str::from_utf8(v)
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0)
            };
            let total: u32 = held.kvs().iter().map(|kv| count(kv.value())).sum();
            if total >= limit {
                return Ok(false);
            }
            let own = held
                .kvs()
                .iter()
                .find(|kv| kv.key() == mine.as_bytes())
                .map_or(0, |kv| count(kv.value()));
            let txn = Txn::new()
                .when([Compare::mod_revision(
                    guard.as_str(),
                    CompareOp::Equal,
                    guard_rev,
                )])
                .and_then([
                    TxnOp::put(guard.as_str(), "", None),
                    TxnOp::put(
                        mine.as_str(),
                        (own + 1).to_string(),
                        Some(PutOptions::new().with_lease(lease)),
                    ),
                ]);
            if client
                .txn(txn)
                .await
                .map_err(|e| e.to_string())?
                .succeeded()
            {
                return Ok(true);
            }
        }
        Err("other nodes' claims kept winning".into())
    }

    /// Gives `n` of this node's slots of `scope` back.
    pub async fn release_slots(&self, scope: &str, n: u32) -> Result<(), String> {
        let lease = self.lease_id.load(Ordering::Acquire);
        let (guard, mine) = (guard_key(self, scope), own_key(self, scope));
        let mut client = self.client.clone();
        for _ in 0..20 {
            let own = client
                .get(mine.as_str(), None)
                .await
                .map_err(|e| e.to_string())?;
            let Some(kv) = own.kvs().first() else {
                return Ok(());
            };
            let have: u32 = kv
                .value_str()
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            let left = have.saturating_sub(n);
            let write = if left == 0 {
                TxnOp::delete(mine.as_str(), None)
            } else {
                TxnOp::put(
                    mine.as_str(),
                    left.to_string(),
                    Some(PutOptions::new().with_lease(lease)),
                )
            };
            let txn = Txn::new()
                .when([Compare::mod_revision(
                    mine.as_str(),
                    CompareOp::Equal,
                    kv.mod_revision(),
                )])
                .and_then([TxnOp::put(guard.as_str(), "", None), write]);
            if client
                .txn(txn)
                .await
                .map_err(|e| e.to_string())?
                .succeeded()
            {
                return Ok(());
            }
        }
        Err("the slot count kept changing".into())
    }
}
