//! Provisioned concurrency, which is HyperFork's throughput mode as a pool
//! setting: a function keeps N fresh clones of its zygote started and ready
//! (`PutProvisionedConcurrencyConfig`). An invocation takes one, the
//! instance serves that invocation only and is ended, and a new clone takes
//! its place in the background — so N clones stay ready, and none is ever
//! handed a second invocation.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{lock, pool_key, Instances, Pool};
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
                lock(&self.provisioned).insert(pool_key(f), n);
            }
            None => {
                lock(&self.provisioned).remove(&pool_key(f));
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

    /// Provisions function `name`'s versions as its catalogue records say:
    /// each record's version (an alias's, for an alias), counts of records
    /// reaching one version added up; versions no record reaches any more
    /// are emptied. Called after every change of records or aliases.
    pub async fn sync_provisioned(self: &Arc<Self>, name: &str) {
        let records = self.catalog.provisioned_of(name).unwrap_or_default();
        let mut wanted: HashMap<Option<u32>, u32> = HashMap::new();
        for r in &records {
            let Some(v) = self.provisioned_target(name, &r.qualifier) else {
                continue;
            };
            let n = wanted.entry(v).or_default();
            *n = n.saturating_add(r.count);
        }
        for gone in self.provisioned_versions(name) {
            if !wanted.contains_key(&gone) {
                if let Some(f) = self.version_of(name, gone) {
                    self.set_provisioned(&f, None).await;
                }
            }
        }
        for (v, count) in wanted {
            if let Some(f) = self.version_of(name, v) {
                self.set_provisioned(&f, Some(count)).await;
            }
        }
    }

    /// The version a provisioned record's qualifier reaches: a version
    /// number, the version an alias points to (its primary one), or `None`
    /// for `$LATEST`; nothing for a qualifier that no longer exists.
    pub fn provisioned_target(&self, name: &str, qualifier: &str) -> Option<Option<u32>> {
        if qualifier == "$LATEST" {
            return Some(None);
        }
        let version = match qualifier.parse::<u32>() {
            Ok(n) => n,
            Err(_) => self
                .catalog
                .alias(name, qualifier)
                .ok()??
                .version
                .parse::<u32>()
                .ok()?,
        };
        self.catalog.version(name, version).ok()??;
        Some(Some(version))
    }

    fn version_of(&self, name: &str, v: Option<u32>) -> Option<Function> {
        match v {
            None => self.catalog.get(name).ok()?,
            Some(n) => self.catalog.version(name, n).ok()?,
        }
    }

    /// The versions of function `name` kept provisioned now (`None`:
    /// `$LATEST`, as an older daemon's catalogue may hold).
    pub fn provisioned_versions(&self, name: &str) -> Vec<Option<u32>> {
        lock(&self.provisioned)
            .keys()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| *v)
            .collect()
    }

    /// What the provisioned pool of function `name`'s version `published`
    /// holds now.
    pub fn provisioned_status(&self, name: &str, published: Option<u32>) -> ProvisionedStatus {
        let key = (name.to_string(), published);
        let requested = lock(&self.provisioned).get(&key).copied().unwrap_or(0);
        let available = lock(&self.pools).get(&key).map_or(0, |p| {
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
                    Ok(inst) => {
                        // The count may have dropped while it started (an
                        // alias moved, a smaller setting): not kept then.
                        let extra = {
                            let mut fresh = lock(&pool.fresh);
                            if fresh.len() < me.wanted(&pool) {
                                fresh.push(inst);
                                None
                            } else {
                                Some(inst)
                            }
                        };
                        if let Some(inst) = extra {
                            me.end(inst.vmm).await;
                        }
                    }
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
        lock(&self.provisioned)
            .get(&pool_key(&pool.function))
            .copied()
            .unwrap_or(0) as usize
    }
}
