//! A function's reserved concurrency. On a single daemon it is a semaphore
//! of that many permits. In a cluster it bounds the function on all nodes
//! together: this node's permits are the slots it holds in etcd
//! (`crate::cluster`'s slots), one claimed when all of its own are busy,
//! and given back when no instance of its holds it any more (the reaper):
//! slots follow instances' lifetimes, so a warm invocation costs no etcd
//! round trip.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::Instances;
use crate::mutex::lock;

/// The slot scope of a function's reserved concurrency.
fn reserved_scope(function_key: &str) -> String {
    format!("fn/{function_key}")
}

/// A function's reserved concurrency, as this node enforces it.
#[derive(Clone)]
pub(super) struct Reserved {
    limit: u32,
    sem: Arc<Semaphore>,
    /// In a cluster: the slots this node holds in etcd (its permits).
    claimed: Arc<AtomicU32>,
    cluster: bool,
}

impl Reserved {
    pub(super) fn new(limit: u32, cluster: bool) -> Self {
        let permits = if cluster { 0 } else { limit as usize };
        Reserved {
            limit,
            sem: Arc::new(Semaphore::new(permits)),
            claimed: Arc::new(AtomicU32::new(0)),
            cluster,
        }
    }
}

impl Instances {
    /// A permit of the function's reserved concurrency; in a cluster, a
    /// slot claimed first when every permit here is taken.
    pub(super) async fn take_reserved(
        &self,
        name: &str,
        r: &Reserved,
    ) -> Option<OwnedSemaphorePermit> {
        if let Ok(p) = r.sem.clone().try_acquire_owned() {
            return Some(p);
        }
        if let (true, Some(node)) = (r.cluster, self.cluster.get()) {
            match node.claim_slot(&reserved_scope(name), r.limit).await {
                Ok(true) => {
                    r.claimed.fetch_add(1, Ordering::AcqRel);
                    r.sem.add_permits(1);
                }
                Ok(false) => {}
                Err(e) => tracing::warn!(function = %name, "claiming a concurrency slot: {e}"),
            }
        }
        self.take(r.sem.clone()).await
    }

    /// Gives back every slot `r` held (its reserved concurrency changed).
    pub(super) fn give_back_slots(&self, name: &str, r: &Reserved) {
        let n = r.claimed.swap(0, Ordering::AcqRel);
        if let (true, Some(node)) = (n > 0, self.cluster.get()) {
            let (node, name) = (node.clone(), name.to_string());
            tokio::spawn(async move {
                if let Err(e) = node.release_slots(&reserved_scope(&name), n).await {
                    tracing::warn!(function = %name, "giving back concurrency slots: {e}");
                }
            });
        }
    }

    /// The reaper's part: slots no instance here holds go back to the
    /// cluster.
    pub async fn release_idle_slots(&self) {
        let Some(node) = self.cluster.get() else {
            return;
        };
        let held: Vec<(String, Reserved)> = lock(&self.reserved)
            .iter()
            .filter(|(_, r)| r.cluster && r.claimed.load(Ordering::Acquire) > 0)
            .map(|(n, r)| (n.clone(), r.clone()))
            .collect();
        for (name, r) in held {
            let instances = self.instance_count(&name);
            let claimed = r.claimed.load(Ordering::Acquire);
            let free = u32::try_from(r.sem.available_permits()).unwrap_or(u32::MAX);
            let surplus = claimed
                .saturating_sub(u32::try_from(instances).unwrap_or(u32::MAX))
                .min(free);
            if surplus == 0 {
                continue;
            }
            r.sem.forget_permits(surplus as usize);
            r.claimed.fetch_sub(surplus, Ordering::AcqRel);
            if let Err(e) = node.release_slots(&reserved_scope(&name), surplus).await {
                tracing::warn!(function = %name, "giving back concurrency slots: {e}");
            }
        }
    }

    /// A fenced node's slots went with its lease: its permits start over.
    pub(super) fn forget_slots(&self) {
        for r in lock(&self.reserved).values_mut() {
            if r.cluster {
                *r = Reserved::new(r.limit, true);
            }
        }
    }

    /// Instances here of `account`'s functions, busy or idle.
    pub fn account_instances(&self, account: &str) -> u32 {
        let n: u64 = lock(&self.pools)
            .iter()
            .filter(|((key, _), _)| crate::accounts::split_key(key).0 == account)
            .map(|(_, p)| p.busy.load(Ordering::Acquire) + lock(&p.idle).len() as u64)
            .sum();
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// Instances of a function here, busy or idle, over all its versions.
    fn instance_count(&self, name: &str) -> usize {
        lock(&self.pools)
            .iter()
            .filter(|((n, _), _)| n == name)
            .map(|(_, p)| {
                usize::try_from(p.busy.load(Ordering::Acquire)).unwrap_or(usize::MAX)
                    + lock(&p.idle).len()
            })
            .sum()
    }
}
