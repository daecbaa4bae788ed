//! An account's concurrency on a cluster node: bounded on all nodes
//! together through slots in etcd (`crate::cluster`'s slots, scope
//! `account/<id>`). A node runs as many of the account's invocations at
//! once as it holds slots; when all are busy it claims one more, and it
//! gives back those that neither a running invocation nor an instance of
//! the account here still needs (so that a warm invocation makes no etcd
//! round trip).

use std::sync::Arc;
use std::time::Duration;

use crate::accounts::{Account, Accounts, Running};
use crate::cluster::Node;
use crate::instances::Instances;

/// How long an invocation waits for etcd to grant a slot.
const CLAIM_PATIENCE: Duration = Duration::from_secs(2);

/// One of the account's concurrency slots for an invocation: one this node
/// holds, else (in a cluster) one more claimed; if etcd cannot be reached,
/// the account's limit on this node alone. `None`: the account is at its
/// limit (429).
pub async fn start_invocation(node: Option<&Node>, account: &Arc<Account>) -> Option<Running> {
    if let Some(running) = account.start_invocation() {
        return Some(running);
    }
    let node = node.filter(|_| account.is_clustered())?;
    let scope = account.slot_scope();
    let claim = node.claim_slot(&scope, account.limits.concurrency);
    let claimed = tokio::time::timeout(CLAIM_PATIENCE, claim)
        .await
        .unwrap_or_else(|_| Err(format!("no answer from etcd in {CLAIM_PATIENCE:?}")));
    match claimed {
        Ok(true) => {
            account.add_slot();
            account.start_invocation()
        }
        Ok(false) => None,
        // etcd out of reach: the node serves on (as it does for warm and
        // cold starts), bounding the account by its limit here alone.
        Err(e) => {
            tracing::warn!(account = %account.id,
                "claiming a concurrency slot ({e}): bounded on this node alone");
            account.start_invocation_here()
        }
    }
}

/// The reaper's part: slots no invocation or instance here needs go back.
pub async fn release_idle(node: &Node, accounts: &Accounts, instances: &Instances) {
    for account in accounts.all() {
        if account.held_slots() == 0 {
            continue;
        }
        let surplus = account.surplus_slots(instances.account_instances(&account.id));
        if surplus == 0 {
            continue;
        }
        if let Err(e) = node.release_slots(&account.slot_scope(), surplus).await {
            tracing::warn!(account = %account.id, "giving back concurrency slots: {e}");
        }
    }
}

/// A fenced node's slots went with its lease: every account starts over.
pub fn spawn_fence_follower(node: &Node, accounts: Arc<Accounts>) {
    let mut fence = node.fence_changes();
    tokio::spawn(async move {
        while fence.changed().await.is_ok() {
            if *fence.borrow_and_update() {
                for a in accounts.all() {
                    a.forget_slots();
                }
            }
        }
    });
}
