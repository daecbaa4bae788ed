//! What this node holds, as cluster placement reads it (published by
//! `crate::cluster`): per function revision its fastest start here, and
//! the memory instances may still take.

use super::Instances;
use crate::catalog::Function;
use crate::cluster::{revision_key, Held, SNAPSHOT, WARM, ZYGOTE};
use crate::mutex::lock;

/// `MemAvailable` of `/proc/meminfo`, in bytes (0 if unreadable).
fn mem_available() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            let line = m.lines().find(|l| l.starts_with("MemAvailable:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib << 10)
        })
        .unwrap_or(0)
}

impl Instances {
    /// This node's holdings: idle instances (warm), zygotes, and the
    /// snapshots recorded here, per revision; free memory is the budget
    /// left (the last census) or the host's available memory, whichever
    /// is less.
    pub async fn held(&self) -> Held {
        let mut functions = std::collections::BTreeMap::new();
        let mut snapshots = std::collections::BTreeSet::new();
        for r in self.catalog.snapshots().unwrap_or_default() {
            let key = revision_key(&r.function, r.version);
            functions.insert(key.clone(), SNAPSHOT);
            snapshots.insert(key);
        }
        let pools: Vec<_> = lock(&self.pools).values().cloned().collect();
        for pool in pools {
            let f = &pool.function;
            // A zygote lock held means one is being cloned or made.
            let zygote = pool.zygote.try_lock().map_or(true, |z| z.is_some());
            let level = if !lock(&pool.idle).is_empty() {
                WARM
            } else if zygote {
                ZYGOTE
            } else {
                continue;
            };
            let held = functions
                .entry(revision_key(&f.name, f.version))
                .or_insert(level);
            *held = (*held).max(level);
        }
        let mut free = mem_available();
        if self.cfg.memory_budget > 0 {
            free = free.min(
                self.cfg
                    .memory_budget
                    .saturating_sub(self.held_bytes().await),
            );
        }
        Held {
            free_memory_bytes: free,
            functions,
            snapshots,
        }
    }

    /// Fetches `f`'s snapshot from another node if this node has none (a
    /// drained node's snapshots kept by the functions' owners); whether it
    /// has one now.
    pub async fn keep_snapshot(&self, f: &Function) -> bool {
        if self.cfg.no_snapshots {
            return false;
        }
        self.snapshots.find(f).is_some() || self.snapshot_from_peers(f).await.is_some()
    }
}
