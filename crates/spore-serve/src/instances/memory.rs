//! Giving memory back: idle instances end after the keep-alive; over the
//! host memory budget the least recently used idle instances end first,
//! then zygotes are demoted to their on-disk snapshots (their function's
//! next starts restore instead of cloning, until memory is free again).
//! Memory is measured from the VMM processes (PSS), never assumed.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::{lock, Instances, Pool, Zygote};
use crate::metrics::Gauges;

impl Instances {
    /// Ends idle instances unused for longer than the keep-alive, then, over
    /// the memory budget, the least recently used idle ones, then the least
    /// recently used zygotes that have a snapshot to restore from. Returns
    /// how many instances and zygotes were ended.
    pub async fn reap_idle(&self) -> usize {
        let pools: Vec<Arc<Pool>> = lock(&self.pools).values().cloned().collect();
        let now = Instant::now();
        let mut ended = Vec::new();
        for pool in &pools {
            let mut idle = lock(&pool.idle);
            let (old, keep): (Vec<_>, Vec<_>) = idle
                .drain(..)
                .partition(|i| now.duration_since(i.last_used) >= self.cfg.keep_alive);
            *idle = keep;
            ended.extend(old);
        }
        let mut demoted: Vec<Zygote> = Vec::new();
        if self.cfg.memory_budget > 0 {
            // Idle instances first, against the budget on their own: a warm
            // instance is the fastest start there is.
            let mut held = self.idle_bytes(&pools);
            while held > self.cfg.memory_budget {
                // The least recently used idle instance of any pool.
                let victim = pools
                    .iter()
                    .filter_map(|p| {
                        let idle = lock(&p.idle);
                        let (i, inst) = idle.iter().enumerate().min_by_key(|(_, i)| i.last_used)?;
                        Some((inst.last_used, p.clone(), i))
                    })
                    .min_by_key(|(t, _, _)| *t);
                let Some((_, pool, i)) = victim else { break };
                let inst = lock(&pool.idle).remove(i);
                held = held.saturating_sub(inst.vmm.pss_bytes());
                ended.push(inst);
            }
            // Then zygotes, least recently invoked first, counting what they
            // hold too; only those whose function can be restored from a
            // snapshot instead.
            held = held.saturating_add(self.zygote_bytes(&pools));
            let mut by_age: Vec<&Arc<Pool>> = pools.iter().collect();
            by_age.sort_by_key(|p| p.last_used_ms.load(Ordering::Relaxed));
            for pool in by_age {
                if held <= self.cfg.memory_budget {
                    break;
                }
                // A zygote's memory is its clones' template: while one of
                // them lives, ending the zygote frees next to nothing.
                let clones_alive =
                    !lock(&pool.idle).is_empty() || pool.busy.load(Ordering::Relaxed) > 0;
                if clones_alive || self.usable_snapshot_of(pool).is_none() {
                    continue;
                }
                let Ok(mut z) = pool.zygote.try_lock() else {
                    continue;
                };
                if let Some(zygote) = z.take() {
                    let bytes = zygote.vmm.pss_bytes();
                    pool.demoted_bytes.store(bytes.max(1), Ordering::Relaxed);
                    held = held.saturating_sub(bytes);
                    demoted.push(zygote);
                }
            }
            // A demoted function may make a zygote again once one fits.
            for p in &pools {
                let wanted = p.demoted_bytes.load(Ordering::Relaxed);
                if wanted > 0 && held.saturating_add(wanted) <= self.cfg.memory_budget {
                    p.demoted_bytes.store(0, Ordering::Relaxed);
                    held += wanted;
                }
            }
        }
        let n = ended.len() + demoted.len();
        for inst in ended {
            tracing::info!(
                pid = inst.vmm.pid,
                "idle instance ended (keep-alive or memory budget)"
            );
            self.end(inst.vmm).await;
        }
        for z in demoted {
            tracing::info!(
                pid = z.vmm.pid,
                "zygote demoted to its snapshot (memory budget)"
            );
            self.end_zygote(z).await;
        }
        n
    }

    fn usable_snapshot_of(&self, pool: &Pool) -> Option<crate::snapshots::FunctionSnapshot> {
        if self.cfg.no_snapshots {
            return None;
        }
        self.snapshots.find(&pool.function)
    }

    /// Memory (PSS) held by idle instances.
    fn idle_bytes(&self, pools: &[Arc<Pool>]) -> u64 {
        pools
            .iter()
            .map(|p| lock(&p.idle).iter().map(|i| i.vmm.pss_bytes()).sum::<u64>())
            .sum()
    }

    /// Memory (PSS) held by zygotes (not busy making a clone).
    fn zygote_bytes(&self, pools: &[Arc<Pool>]) -> u64 {
        pools
            .iter()
            .filter_map(|p| Some(p.zygote.try_lock().ok()?.as_ref()?.vmm.pss_bytes()))
            .sum()
    }

    /// Instance counts and memory, for `/metrics`.
    pub async fn gauges(&self) -> Gauges {
        let pools: Vec<Arc<Pool>> = lock(&self.pools).values().cloned().collect();
        let mut instances = BTreeMap::new();
        let mut instance_bytes = 0;
        let mut template_bytes = 0;
        for p in &pools {
            let name = p.function.name.clone();
            let idle = lock(&p.idle);
            instances.insert((name.clone(), "idle"), idle.len() as u64);
            instance_bytes += idle.iter().map(|i| i.vmm.pss_bytes()).sum::<u64>();
            drop(idle);
            instances.insert((name.clone(), "busy"), p.busy.load(Ordering::Relaxed));
            let fresh = lock(&p.fresh);
            instances.insert((name.clone(), "provisioned"), fresh.len() as u64);
            instance_bytes += fresh.iter().map(|i| i.vmm.pss_bytes()).sum::<u64>();
            drop(fresh);
            if let Ok(z) = p.zygote.try_lock() {
                if let Some(z) = z.as_ref() {
                    instances.insert((name, "zygote"), 1);
                    template_bytes += z.vmm.pss_bytes();
                }
            }
        }
        Gauges {
            instances,
            instance_bytes,
            template_bytes,
        }
    }
}
