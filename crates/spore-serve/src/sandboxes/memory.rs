//! An account's memory limit (`memory` in the keys file) covers its
//! sandboxes as it does its function instances (`crate::sandbox_memory`):
//! a running sandbox holds its template's memory, a paused one nothing. A
//! create, fork or resume that would take the account past its limit is
//! refused with 429 (E2B's answer past a team's limits) before anything
//! starts; running sandboxes are never ended for it.

use super::{SandboxError, Sandboxes};
use crate::sandbox_memory::Starting;

impl Sandboxes {
    /// Room for `count` new running sandboxes of `mib` each of `account`'s,
    /// held until the guard drops (by then they run and are counted);
    /// `None` when the account has no memory limit.
    pub(super) async fn admit(
        &self,
        account: &str,
        mib: u32,
        count: u32,
    ) -> Result<Option<Starting>, SandboxError> {
        let Some(limit) = self.accounts.get(account).limits.memory else {
            return Ok(None);
        };
        let wanted = (u64::from(mib) << 20).saturating_mul(u64::from(count));
        // One start of the account's at a time looks and takes its room
        // (functions' starts too).
        let gate = self.instances.account_gate_of(account);
        let _gate = gate.lock().await;
        let used = self.instances.account_memory_in_use(account);
        if used.saturating_add(wanted) > limit {
            return Err(SandboxError::TooMany(format!(
                "account memory limit: {} MiB of {} MiB in use (sandboxes and function instances), {} MiB more asked",
                used >> 20,
                limit >> 20,
                wanted >> 20
            )));
        }
        Ok(Some(self.instances.sandbox_memory.start(account, wanted)))
    }

    /// Sandbox `id` runs no more (paused, killed): its memory is free.
    pub(super) fn stopped_running(&self, id: &str) {
        self.instances.sandbox_memory.stopped(id);
    }
}
