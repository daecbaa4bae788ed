//! Provisioned concurrency, which is HyperFork's throughput mode as a pool
//! setting: a function keeps N fresh clones of its zygote started and ready
//! (`PutProvisionedConcurrencyConfig`). An invocation takes one, the
//! instance serves that invocation only and is ended, and a new clone takes
//! its place in the background — so N clones stay ready, and none is ever
//! handed a second invocation.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{lock, Instances, Pool};
use crate::catalog::Function;

/// How many provisioned instances a function has and wants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProvisionedStatus {
    pub requested: u32,
    pub available: u32,
}

impl Instances {
    /// Sets (or with `None` removes) `f`'s provisioned concurrency and starts
    /// filling (or emptying) its pool of fresh instances.
    pub async fn set_provisioned(self: &Arc<Self>, f: &Function, n: Option<u32>) {
        match n {
            Some(n) => {
                lock(&self.provisioned).insert(f.name.clone(), n);
            }
            None => {
                lock(&self.provisioned).remove(&f.name);
            }
        }
        let pool = self.pool_for(f).await;
        let extra = {
            let mut fresh = lock(&pool.fresh);
            let keep = n.unwrap_or(0) as usize;
            let from = keep.min(fresh.len());
            fresh.split_off(from)
        };
        for inst in extra {
            self.end(inst.vmm).await;
        }
        self.refill(&pool);
    }

    /// What `f`'s provisioned pool holds now.
    pub fn provisioned_status(&self, name: &str) -> ProvisionedStatus {
        let requested = lock(&self.provisioned).get(name).copied().unwrap_or(0);
        let available = lock(&self.pools)
            .get(&(name.to_string(), None))
            .map_or(0, |p| {
                u32::try_from(lock(&p.fresh).len()).unwrap_or(u32::MAX)
            });
        ProvisionedStatus {
            requested,
            available,
        }
    }

    /// Starts fresh instances in the background until the pool holds its
    /// function's provisioned count (one refill at a time per pool).
    pub(super) fn refill(self: &Arc<Self>, pool: &Arc<Pool>) {
        if self.wanted(pool) == 0 || pool.refilling.swap(true, Ordering::AcqRel) {
            return;
        }
        let (me, pool) = (self.clone(), pool.clone());
        tokio::spawn(async move {
            let mut failures = 0;
            while lock(&pool.fresh).len() < me.wanted(&pool) && me.is_current(&pool) {
                match me.provision_one(&pool).await {
                    Ok(inst) => lock(&pool.fresh).push(inst),
                    Err(e) => {
                        failures += 1;
                        tracing::warn!(function = %pool.function.name,
                            "provisioned instance not started: {e}");
                        if failures >= 3 {
                            break;
                        }
                    }
                }
            }
            pool.refilling.store(false, Ordering::Release);
            // A retired pool's fresh instances must not outlive it.
            if !me.is_current(&pool) {
                let stale = std::mem::take(&mut *lock(&pool.fresh));
                for inst in stale {
                    me.end(inst.vmm).await;
                }
            }
        });
    }

    /// Tops up every provisioned pool (the reaper's tick): replacements
    /// that failed are tried again.
    pub fn refill_all(self: &Arc<Self>) {
        let pools: Vec<Arc<Pool>> = lock(&self.pools).values().cloned().collect();
        for p in pools {
            if lock(&p.fresh).len() < self.wanted(&p) {
                self.refill(&p);
            }
        }
    }

    fn wanted(&self, pool: &Pool) -> usize {
        // Provisioned concurrency is `$LATEST`'s.
        if pool.function.published.is_some() {
            return 0;
        }
        lock(&self.provisioned)
            .get(&pool.function.name)
            .copied()
            .unwrap_or(0) as usize
    }
}
