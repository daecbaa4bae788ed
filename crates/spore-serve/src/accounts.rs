//! Accounts (tenants): who owns a function, and what each owner may use.
//!
//! Every function, version, alias, URL, tag and metric belongs to one
//! account. The catalogue keys a function by its *key*: its name for the
//! default account (`000000000000`: the one account of a daemon without
//! `--auth`, and of keys that name none), `ACCOUNT:NAME` for any other.
//! A Lambda function name never holds a `:`, so the key splits back
//! unambiguously, and every table keyed by function (versions, aliases,
//! snapshots, pools, events) is scoped by account without a column of its
//! own. Requests name functions by plain name or ARN; [`crate::api`] turns
//! them into keys of the caller's account only, so another account's
//! functions cannot be named, let alone probed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

/// The account of a daemon without `--auth` and of keys that name none.
pub const DEFAULT_ACCOUNT: &str = "000000000000";

/// Lambda's default account concurrency.
pub const DEFAULT_CONCURRENCY: u32 = 1000;
/// Lambda's default total code storage per account (75 GB).
pub const DEFAULT_CODE_STORAGE: u64 = 75 * 1000 * 1000 * 1000;

/// What an account may use. `None`: bounded only by the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Invocations running at once across the account's functions.
    pub concurrency: u32,
    /// Memory (MemorySize) of the account's instances alive at once, bytes.
    pub memory: Option<u64>,
    /// Code (zips of functions and their versions), bytes.
    pub code_storage: u64,
    /// Functions the account may hold.
    pub functions: Option<u32>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            concurrency: DEFAULT_CONCURRENCY,
            memory: None,
            code_storage: DEFAULT_CODE_STORAGE,
            functions: None,
        }
    }
}

/// One account: its id and limits, and the invocations it runs now.
#[derive(Debug)]
pub struct Account {
    pub id: String,
    pub limits: Limits,
    running: AtomicU32,
    /// In a cluster, the account's concurrency is bounded on all nodes
    /// together: this node runs at most as many of its invocations as it
    /// holds of its slots in etcd (`crate::account_slots`).
    clustered: AtomicBool,
    held_slots: AtomicU32,
}

impl Account {
    pub fn new(id: &str, limits: Limits) -> Arc<Account> {
        Arc::new(Account {
            id: id.to_string(),
            limits,
            running: AtomicU32::new(0),
            clustered: AtomicBool::new(false),
            held_slots: AtomicU32::new(0),
        })
    }

    /// The default account with default limits.
    pub fn default_account() -> Arc<Account> {
        Account::new(DEFAULT_ACCOUNT, Limits::default())
    }

    /// The key of this account's function `name`.
    pub fn key(&self, name: &str) -> String {
        function_key(&self.id, name)
    }

    /// Whether a function key is this account's.
    pub fn owns(&self, key: &str) -> bool {
        split_key(key).0 == self.id
    }

    /// Takes one of the account's concurrency slots for an invocation, or
    /// `None` when all are taken (the caller answers 429; in a cluster, it
    /// first claims one more slot).
    pub fn start_invocation(self: &Arc<Self>) -> Option<Running> {
        let limit = if self.is_clustered() {
            self.held_slots.load(Ordering::Acquire)
        } else {
            self.limits.concurrency
        };
        self.start_within(limit)
    }

    /// [`Self::start_invocation`] bounded by the account's limit on this
    /// node alone (a cluster node that cannot reach etcd serves on).
    pub fn start_invocation_here(self: &Arc<Self>) -> Option<Running> {
        self.start_within(self.limits.concurrency)
    }

    fn start_within(self: &Arc<Self>, limit: u32) -> Option<Running> {
        self.running
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .ok()?;
        Some(Running {
            account: self.clone(),
        })
    }

    /// Invocations of the account running now.
    pub fn running(&self) -> u32 {
        self.running.load(Ordering::Acquire)
    }

    pub fn is_clustered(&self) -> bool {
        self.clustered.load(Ordering::Acquire)
    }

    /// The key its concurrency slots are counted under in a cluster.
    pub fn slot_scope(&self) -> String {
        format!("account/{}", self.id)
    }

    /// Slots this node holds in the cluster.
    pub fn held_slots(&self) -> u32 {
        self.held_slots.load(Ordering::Acquire)
    }

    /// One more slot claimed in the cluster.
    pub fn add_slot(&self) {
        self.held_slots.fetch_add(1, Ordering::AcqRel);
    }

    /// Lowers the slots held to what `instances` (the account's instances
    /// on this node) and the invocations running need; returns how many to
    /// give back to the cluster.
    pub fn surplus_slots(&self, instances: u32) -> u32 {
        let keep = self.running().max(instances);
        match self
            .held_slots
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |h| {
                (h > keep).then_some(keep)
            }) {
            Ok(before) => before - keep,
            Err(_) => 0,
        }
    }

    /// The slots went with this node's lease (it fenced itself).
    pub fn forget_slots(&self) {
        self.held_slots.store(0, Ordering::Release);
    }
}

/// One running invocation's concurrency slot, given back on drop.
pub struct Running {
    account: Arc<Account>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.account.running.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Every account the daemon knows, by id: those of the keys file, and the
/// default one. An account met only through a stored function (a keys
/// file edited since) gets default limits.
#[derive(Debug)]
pub struct Accounts {
    by_id: Mutex<HashMap<String, Arc<Account>>>,
    /// A cluster node's: every account's concurrency is cluster-wide.
    clustered: AtomicBool,
}

impl Accounts {
    pub fn new(accounts: impl IntoIterator<Item = Arc<Account>>) -> Accounts {
        let mut by_id: HashMap<String, Arc<Account>> =
            accounts.into_iter().map(|a| (a.id.clone(), a)).collect();
        by_id
            .entry(DEFAULT_ACCOUNT.to_string())
            .or_insert_with(Account::default_account);
        Accounts {
            by_id: Mutex::new(by_id),
            clustered: AtomicBool::new(false),
        }
    }

    /// This daemon is a cluster node: every account's concurrency is
    /// counted in slots held in etcd (those known now and those met later).
    pub fn set_clustered(&self) {
        self.clustered.store(true, Ordering::Release);
        for a in crate::mutex::lock(&self.by_id).values() {
            a.clustered.store(true, Ordering::Release);
        }
    }

    /// Every account known so far.
    pub fn all(&self) -> Vec<Arc<Account>> {
        crate::mutex::lock(&self.by_id).values().cloned().collect()
    }

    /// The account of `id`.
    pub fn get(&self, id: &str) -> Arc<Account> {
        let mut by_id = crate::mutex::lock(&self.by_id);
        let clustered = self.clustered.load(Ordering::Acquire);
        by_id
            .entry(id.to_string())
            .or_insert_with(|| {
                let a = Account::new(id, Limits::default());
                a.clustered.store(clustered, Ordering::Release);
                a
            })
            .clone()
    }

    /// The account owning function key `key`.
    pub fn of_key(&self, key: &str) -> Arc<Account> {
        self.get(split_key(key).0)
    }

    pub fn default_account(&self) -> Arc<Account> {
        self.get(DEFAULT_ACCOUNT)
    }
}

/// The catalogue key of `account`'s function `name`.
pub fn function_key(account: &str, name: &str) -> String {
    if account == DEFAULT_ACCOUNT {
        name.to_string()
    } else {
        format!("{account}:{name}")
    }
}

/// A function key's account and plain name.
pub fn split_key(key: &str) -> (&str, &str) {
    key.split_once(':').unwrap_or((DEFAULT_ACCOUNT, key))
}

/// The plain function name (what Lambda's `FunctionName` shows) of a key.
pub fn plain_name(key: &str) -> &str {
    split_key(key).1
}

/// Whether `id` is an account id: twelve decimal digits.
pub fn valid_account_id(id: &str) -> bool {
    id.len() == 12 && id.bytes().all(|b| b.is_ascii_digit())
}

/// A size as `1073741824`, `512M`, `4G`, `75GB` (binary K/M/G/T; a
/// trailing `B` allowed).
pub fn parse_size(s: &str) -> Option<u64> {
    let t = s.trim();
    let t = t.strip_suffix(['B', 'b']).unwrap_or(t);
    let (digits, shift) = match t.char_indices().last()? {
        (i, 'K' | 'k') => (&t[..i], 10),
        (i, 'M' | 'm') => (&t[..i], 20),
        (i, 'G' | 'g') => (&t[..i], 30),
        (i, 'T' | 't') => (&t[..i], 40),
        _ => (t, 0),
    };
    digits
        .trim()
        .parse::<u64>()
        .ok()?
        .checked_mul(1u64 << shift)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_split_back_into_account_and_name() {
        assert_eq!(function_key(DEFAULT_ACCOUNT, "echo"), "echo");
        assert_eq!(function_key("111111111111", "echo"), "111111111111:echo");
        assert_eq!(split_key("echo"), (DEFAULT_ACCOUNT, "echo"));
        assert_eq!(split_key("111111111111:echo"), ("111111111111", "echo"));
        assert_eq!(plain_name("111111111111:echo"), "echo");
        let a = Account::new("111111111111", Limits::default());
        assert!(a.owns("111111111111:echo"));
        assert!(!a.owns("echo"));
        assert!(!a.owns("222222222222:echo"));
    }

    #[test]
    fn account_ids_are_twelve_digits() {
        assert!(valid_account_id("123456789012"));
        assert!(!valid_account_id("12345678901"));
        assert!(!valid_account_id("12345678901a"));
        assert!(!valid_account_id("1234567890123"));
    }

    #[test]
    fn concurrency_slots_are_bounded_and_given_back() {
        let a = Account::new(
            "111111111111",
            Limits {
                concurrency: 2,
                ..Limits::default()
            },
        );
        let one = a.start_invocation().expect("first slot");
        let two = a.start_invocation().expect("second slot");
        assert!(a.start_invocation().is_none());
        drop(one);
        assert_eq!(a.running(), 1);
        assert!(a.start_invocation().is_some());
        drop(two);
        assert_eq!(a.running(), 0);
    }

    #[test]
    fn a_cluster_nodes_account_runs_as_many_as_it_holds_slots() {
        let accounts = Accounts::new([Account::new("111111111111", Limits::default())]);
        accounts.set_clustered();
        let (known, met_later) = (accounts.get("111111111111"), accounts.get("222222222222"));
        for a in [&known, &met_later] {
            assert!(a.is_clustered());
            assert!(a.start_invocation().is_none(), "no slot held yet");
        }
        known.add_slot();
        known.add_slot();
        let one = known.start_invocation().expect("a held slot");
        let two = known.start_invocation().expect("the other");
        assert!(known.start_invocation().is_none());
        // Two running: nothing to give back. One running on one of two
        // instances: nothing either. None running, one instance left: one
        // slot back.
        assert_eq!(known.surplus_slots(0), 0);
        drop(one);
        assert_eq!(known.surplus_slots(2), 0);
        drop(two);
        assert_eq!(known.surplus_slots(1), 1);
        assert_eq!(known.held_slots(), 1);
        known.forget_slots();
        assert!(known.start_invocation().is_none());
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("1024"), Some(1024));
        assert_eq!(parse_size("512M"), Some(512 << 20));
        assert_eq!(parse_size("4G"), Some(4 << 30));
        assert_eq!(parse_size("75GB"), Some(75 << 30));
        assert_eq!(parse_size("lots"), None);
        assert_eq!(parse_size("99999999999T"), None);
    }
}
