//! An account's memory limit (`memory` in the keys file): the memory
//! (MemorySize) of the account's live VMs (instances busy, idle or
//! provisioned, and zygotes, and its running sandboxes:
//! `crate::sandbox_memory`) stays within it. A start that would pass it
//! first ends the account's least recently used idle instances; when none
//! is left, the invocation is throttled. Other accounts' instances are never
//! ended for it: one tenant's burst does not evict another's warm instances.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{lock, AcquireError, Instances, Pool};
use crate::accounts::split_key;
use crate::catalog::Function;

impl Instances {
    /// The gate serialising starts of the account owning function `key`.
    pub(super) fn account_gate(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.account_gate_of(split_key(key).0)
    }

    /// The gate serialising `account`'s starts (its sandboxes' too).
    pub(crate) fn account_gate_of(&self, account: &str) -> Arc<tokio::sync::Mutex<()>> {
        lock(&self.account_gates)
            .entry(account.to_string())
            .or_default()
            .clone()
    }

    /// Memory (MemorySize) of `account`'s live function VMs and its
    /// sandboxes, in bytes.
    pub(crate) fn account_memory_in_use(&self, account: &str) -> u64 {
        let functions: u64 = lock(&self.pools)
            .values()
            .filter(|p| split_key(&p.function.name).0 == account)
            .map(|p| pool_memory(p))
            .sum();
        functions.saturating_add(self.sandbox_memory.of(account))
    }

    /// Makes room under `limit` (bytes) for one more instance of `f`, in
    /// `pool`; nothing to do when the pool has an idle instance to reuse.
    pub(super) async fn room_in_account(
        &self,
        f: &Function,
        pool: &Pool,
        limit: Option<u64>,
    ) -> Result<(), AcquireError> {
        let Some(limit) = limit else {
            return Ok(());
        };
        if !lock(&pool.idle).is_empty() {
            return Ok(());
        }
        let account = split_key(&f.name).0;
        let wanted = mib_bytes(f.memory_mib);
        loop {
            let pools: Vec<Arc<Pool>> = lock(&self.pools)
                .values()
                .filter(|p| split_key(&p.function.name).0 == account)
                .cloned()
                .collect();
            let used: u64 =
                pools.iter().map(|p| pool_memory(p)).sum::<u64>() + self.sandbox_memory.of(account);
            if used.saturating_add(wanted) <= limit {
                return Ok(());
            }
            let Some(inst) = super::memory::take_lru_idle(&pools) else {
                self.metrics.throttled(&f.name);
                return Err(AcquireError::AccountMemory { limit });
            };
            tracing::info!(
                pid = inst.vmm.pid,
                account,
                "idle instance ended: its account's memory limit needs the room"
            );
            self.end(inst.vmm).await;
        }
    }
}

/// MemorySize of a pool's live VMs, in bytes.
fn pool_memory(p: &Pool) -> u64 {
    let zygote = u64::from(p.zygote.try_lock().map_or(true, |z| z.is_some()));
    let vms = p.busy.load(Ordering::Relaxed)
        + lock(&p.idle).len() as u64
        + lock(&p.fresh).len() as u64
        + zygote;
    vms.saturating_mul(mib_bytes(p.function.memory_mib))
}

fn mib_bytes(mib: u32) -> u64 {
    u64::from(mib) << 20
}
