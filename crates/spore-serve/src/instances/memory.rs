//! Giving memory back: idle instances end after the keep-alive, zygotes
//! after theirs (the function scales to zero: its next start restores its
//! snapshot); over the host memory budget the least recently used idle
//! instances end first, then zygotes are demoted to their on-disk
//! snapshots (their function's next starts restore instead of cloning,
//! until memory is free again). Memory is measured, never assumed: the PSS
//! of every process under the daemon (instances, zygotes, their clone
//! factories and the clones they start ahead), its guardian left out.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{lock, Instances, Pool, Zygote};
use crate::clock::unix_ms;
use crate::metrics::Gauges;
use crate::vmm::{descendants, proc_pss_bytes, tree_pss_bytes};

/// How long a census of the daemon's processes stays current: measuring
/// reads every process's `smaps_rollup`, too much for every reaper tick.
const CENSUS_PERIOD: Duration = Duration::from_secs(1);

/// What every process under the daemon held when last measured.
#[derive(Default)]
pub(super) struct Census {
    at: Option<Instant>,
    bytes: u64,
}

/// Why a zygote is ended by the reaper.
enum ZygoteEnd {
    KeepAlive,
    Budget,
}

/// Takes the least recently used idle instance of any of `pools` out of
/// its pool. The pool's list is searched again under its lock, so an
/// instance taken meanwhile by an invocation is never taken twice.
pub(super) fn take_lru_idle(pools: &[Arc<Pool>]) -> Option<super::Instance> {
    let oldest_in = |p: &Pool| lock(&p.idle).iter().map(|i| i.last_used).min();
    let pool = pools
        .iter()
        .filter_map(|p| Some((oldest_in(p)?, p)))
        .min_by_key(|(t, _)| *t)?
        .1;
    let mut idle = lock(&pool.idle);
    let (i, _) = idle.iter().enumerate().min_by_key(|(_, i)| i.last_used)?;
    Some(idle.remove(i))
}

impl Instances {
    /// Leaves the daemon's guardian (pid) out of the memory census.
    pub fn census_skip(&self, pid: u32) {
        if let Ok(pid) = i32::try_from(pid) {
            self.census_skip.store(pid, Ordering::Relaxed);
        }
    }

    /// PSS of every process under the daemon but its guardian, in bytes,
    /// measured at most [`CENSUS_PERIOD`] ago.
    pub async fn held_bytes(&self) -> u64 {
        self.census_within(CENSUS_PERIOD).await
    }

    /// The census, measured again if older than `period`.
    async fn census_within(&self, period: Duration) -> u64 {
        {
            let c = lock(&self.census);
            if c.at.is_some_and(|at| at.elapsed() < period) {
                return c.bytes;
            }
        }
        let skip = self.census_skip.load(Ordering::Relaxed);
        let bytes = tokio::task::spawn_blocking(move || {
            let me = i32::try_from(std::process::id()).unwrap_or(i32::MAX);
            descendants(me, &[skip])
                .into_iter()
                .map(proc_pss_bytes)
                .sum::<u64>()
        })
        .await
        .unwrap_or(0);
        *lock(&self.census) = Census {
            at: Some(Instant::now()),
            bytes,
        };
        bytes
    }

    /// Ends idle instances unused for longer than the keep-alive and
    /// zygotes unused for longer than theirs; then, over the memory budget,
    /// the least recently used idle instances, then the least recently
    /// used zygotes that have a snapshot to restore from. Returns how many
    /// instances and zygotes were ended.
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
        let mut demoted: Vec<(Zygote, ZygoteEnd)> = Vec::new();
        if !self.cfg.zygote_keep_alive.is_zero() {
            let limit_ms =
                u64::try_from(self.cfg.zygote_keep_alive.as_millis()).unwrap_or(u64::MAX);
            let now_ms = unix_ms();
            for pool in &pools {
                let unused_ms = now_ms.saturating_sub(pool.last_used_ms.load(Ordering::Relaxed));
                if unused_ms < limit_ms || self.zygote_needed(pool) {
                    continue;
                }
                if let Ok(mut z) = pool.zygote.try_lock() {
                    if let Some(zygote) = z.take() {
                        demoted.push((zygote, ZygoteEnd::KeepAlive));
                    }
                }
            }
        }
        if self.cfg.memory_budget > 0 {
            // Everything measured; then idle instances end first, against
            // the budget on their own: a warm instance is the fastest
            // start there is, but the one most easily made again.
            let mut held = self.held_bytes().await;
            if held > self.cfg.memory_budget && self.anything_to_end(&pools) {
                // Nothing is ended on an old figure (one taken while
                // instances were busy, say): measured again first. Only
                // when something could be ended: while busy instances alone
                // hold more than the budget, every tick would measure.
                held = self.census_within(Duration::ZERO).await;
            }
            while held > self.cfg.memory_budget {
                let Some(inst) = take_lru_idle(&pools) else {
                    break;
                };
                held = held.saturating_sub(inst.vmm.pss_bytes());
                ended.push(inst);
            }
            // Then zygotes, least recently invoked first, each with its
            // clone factory and the clones it started ahead; only those
            // whose function can be restored from a snapshot instead.
            let mut by_age: Vec<&Arc<Pool>> = pools.iter().collect();
            by_age.sort_by_key(|p| p.last_used_ms.load(Ordering::Relaxed));
            for pool in by_age {
                if held <= self.cfg.memory_budget {
                    break;
                }
                if self.zygote_needed(pool) {
                    continue;
                }
                let Ok(mut z) = pool.zygote.try_lock() else {
                    continue;
                };
                if let Some(zygote) = z.take() {
                    let bytes = tree_pss_bytes(zygote.vmm.pid);
                    pool.demoted_bytes.store(bytes.max(1), Ordering::Relaxed);
                    held = held.saturating_sub(bytes);
                    demoted.push((zygote, ZygoteEnd::Budget));
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
        if n > 0 {
            // What was ended is measured again, not assumed gone.
            lock(&self.census).at = None;
        }
        for inst in ended {
            tracing::info!(
                pid = inst.vmm.pid,
                "idle instance ended (keep-alive or memory budget)"
            );
            self.end(inst.vmm).await;
        }
        for (z, why) in demoted {
            match why {
                ZygoteEnd::KeepAlive => tracing::info!(
                    pid = z.vmm.pid,
                    "zygote ended after its keep-alive: the function holds no memory until its next start (a restore)"
                ),
                ZygoteEnd::Budget => tracing::info!(
                    pid = z.vmm.pid,
                    "zygote demoted to its snapshot (memory budget)"
                ),
            }
            self.end_zygote(z).await;
        }
        n
    }

    /// Whether the budget could end anything: an idle instance, or a
    /// zygote not needed.
    fn anything_to_end(&self, pools: &[Arc<Pool>]) -> bool {
        pools.iter().any(|p| {
            !lock(&p.idle).is_empty()
                || (p.zygote.try_lock().is_ok_and(|z| z.is_some()) && !self.zygote_needed(p))
        })
    }

    /// Whether a pool's zygote must stay: one of its clones lives (the
    /// zygote's memory is their template: ending it frees next to
    /// nothing), its function keeps provisioned instances, or it has no
    /// snapshot to restore from instead.
    fn zygote_needed(&self, pool: &Pool) -> bool {
        let clones_alive = !lock(&pool.idle).is_empty()
            || !lock(&pool.fresh).is_empty()
            || pool.busy.load(Ordering::Relaxed) > 0;
        clones_alive
            || lock(&self.provisioned).contains_key(&super::pool_key(&pool.function))
            || self.usable_snapshot_of(pool).is_none()
    }

    fn usable_snapshot_of(&self, pool: &Pool) -> Option<crate::snapshots::FunctionSnapshot> {
        if self.cfg.no_snapshots {
            return None;
        }
        self.snapshots.find(&pool.function)
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
            // A function's versions each have a pool: their counts add up.
            *instances.entry((name.clone(), "idle")).or_default() += idle.len() as u64;
            instance_bytes += idle.iter().map(|i| i.vmm.pss_bytes()).sum::<u64>();
            drop(idle);
            *instances.entry((name.clone(), "busy")).or_default() += p.busy.load(Ordering::Relaxed);
            let fresh = lock(&p.fresh);
            *instances.entry((name.clone(), "provisioned")).or_default() += fresh.len() as u64;
            instance_bytes += fresh.iter().map(|i| i.vmm.pss_bytes()).sum::<u64>();
            drop(fresh);
            if let Ok(z) = p.zygote.try_lock() {
                if let Some(z) = z.as_ref() {
                    *instances.entry((name, "zygote")).or_default() += 1;
                    // Its whole tree (the factory, the clones started
                    // ahead) but the clones counted as instances above.
                    let clones: u64 = lock(&p.idle)
                        .iter()
                        .chain(lock(&p.fresh).iter())
                        .filter(|i| i.vmm.is_clone())
                        .map(|i| i.vmm.pss_bytes())
                        .sum();
                    template_bytes += tree_pss_bytes(z.vmm.pid).saturating_sub(clones);
                }
            }
        }
        Gauges {
            instances,
            instance_bytes,
            template_bytes,
            all_bytes: self.held_bytes().await,
        }
    }
}
