//! What each account's sandboxes hold, for the account's memory limit
//! (`memory` in the keys file), which covers its sandboxes and its function
//! instances together: a running sandbox holds its template's memory (a
//! paused one nothing), and a start admitted but not running yet holds its
//! room until it runs or fails ([`Starting`]). The sandboxes keep it
//! (`crate::sandboxes`); function starts read it (`crate::instances`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::mutex::lock;

#[derive(Debug, Default)]
pub struct SandboxMemory {
    /// Running sandboxes: id → (account, bytes).
    running: Mutex<HashMap<String, (String, u64)>>,
    /// Starts admitted and not running yet: account → bytes.
    starting: Mutex<HashMap<String, u64>>,
}

impl SandboxMemory {
    /// Sandbox `id` of `account` runs, holding `bytes`.
    pub fn running(&self, id: &str, account: &str, bytes: u64) {
        lock(&self.running).insert(id.to_string(), (account.to_string(), bytes));
    }

    /// Sandbox `id` runs no more (paused, killed, its VMM ended).
    pub fn stopped(&self, id: &str) {
        lock(&self.running).remove(id);
    }

    /// Nothing runs any more (the daemon stops).
    pub fn clear(&self) {
        lock(&self.running).clear();
    }

    /// Bytes `account`'s sandboxes hold, and those its admitted starts will.
    pub fn of(&self, account: &str) -> u64 {
        let running: u64 = lock(&self.running)
            .values()
            .filter(|(a, _)| a == account)
            .map(|(_, b)| *b)
            .sum();
        let starting = lock(&self.starting).get(account).copied().unwrap_or(0);
        running.saturating_add(starting)
    }

    /// Holds `bytes` for a start of `account`'s until the guard drops (by
    /// then what started is counted as running).
    pub fn start(self: &Arc<Self>, account: &str, bytes: u64) -> Starting {
        *lock(&self.starting).entry(account.to_string()).or_default() += bytes;
        Starting {
            memory: self.clone(),
            account: account.to_string(),
            bytes,
        }
    }
}

/// Room held for sandboxes being started ([`SandboxMemory::start`]).
#[derive(Debug)]
pub struct Starting {
    memory: Arc<SandboxMemory>,
    account: String,
    bytes: u64,
}

impl Drop for Starting {
    fn drop(&mut self) {
        let mut starting = lock(&self.memory.starting);
        if let Some(b) = starting.get_mut(&self.account) {
            *b = b.saturating_sub(self.bytes);
            if *b == 0 {
                starting.remove(&self.account);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn running_and_starting_sandboxes_count_for_their_account_only() {
        let m = Arc::new(SandboxMemory::default());
        m.running("s1", "a", 512 << 20);
        m.running("s2", "b", 256 << 20);
        assert_eq!(m.of("a"), 512 << 20);
        let start = m.start("a", 1 << 30);
        assert_eq!(m.of("a"), (512 << 20) + (1 << 30));
        assert_eq!(m.of("b"), 256 << 20);
        drop(start);
        assert_eq!(m.of("a"), 512 << 20);
        m.stopped("s1");
        m.stopped("missing");
        assert_eq!(m.of("a"), 0);
        m.clear();
        assert_eq!(m.of("b"), 0);
    }
}
