//! The catalogue of a cluster member (`spore serve --cluster etcd://...`).
//!
//! etcd holds the catalogue as a log of changes ([`Change`]) under the
//! cluster's prefix: `<prefix>log/<index>` (20 digits, so that key order is
//! log order) and `<prefix>head` (the last index). A write appends one
//! entry in an etcd transaction that succeeds only if `head` did not move
//! since it was read, so the log has one order, agreed by Raft. Every
//! member applies the log, in that order, to its own SQLite copy (the same
//! tables a single daemon has), remembering the last index it applied in
//! the same SQLite transaction: reads never leave the node, a restarted
//! member resumes where it stopped, and a new one replays the log from the
//! start. Applying reads only the copy and the change, so every member
//! reaches the same state and the same outcome.
//!
//! A member follows the log with an etcd watch (another member's write is
//! applied here within one round trip); the writer itself applies up to its
//! own entry before answering, so what it reads next has it.
//!
//! Once the log is long, a member writes the catalogue as of an index as a
//! base in etcd and deletes the log before it ([`compaction`]): a new member
//! loads the base, then applies the log after it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, KeyValue, Txn, TxnOp,
    WatchOptions, WatchStream,
};
use rusqlite::{params, Connection, OptionalExtension};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};

use super::{CatalogError, Change, Outcome};
use crate::mutex::lock;

mod compaction;

/// How long a write waits for etcd (append and apply) before it is
/// reported as failed: long enough for a leader election (etcd's default
/// election timeout is 1 s), short enough for an API client's patience.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a member's start retries reading the log while etcd settles
/// (a member just started, an election) before it gives up.
const JOIN_RETRY: Duration = Duration::from_secs(8);
/// How long a member's start waits to reach etcd and replay the log.
const JOIN_TIMEOUT: Duration = Duration::from_secs(30);
/// A silent watch is backed by a range read this often.
const QUIET_CATCH_UP: Duration = Duration::from_secs(2);
/// Log entries read per range request while catching up.
const CATCH_UP_PAGE: i64 = 500;

/// Where the cluster's etcd is and who this node is in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterConfig {
    /// `http://host:port` of each etcd member.
    pub endpoints: Vec<String>,
    /// The key prefix everything of this cluster lives under, ending in `/`.
    pub prefix: String,
    /// This node's id (`--node-id`).
    pub node_id: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("--cluster {0}: {1}")]
    BadUrl(String, &'static str),
    #[error("--node-id {0:?}: 1 to 64 letters, digits, '-' or '_'")]
    BadNodeId(String),
}

impl ClusterConfig {
    /// `etcd://host:port[,host:port...][/prefix]`; the prefix defaults to
    /// `spore`.
    pub fn parse(url: &str, node_id: &str) -> Result<Self, ClusterError> {
        let bad = |why| ClusterError::BadUrl(url.to_string(), why);
        let rest = url
            .strip_prefix("etcd://")
            .ok_or_else(|| bad("must start with etcd://"))?;
        let (hosts, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let prefix = prefix.trim_matches('/');
        let prefix = if prefix.is_empty() { "spore" } else { prefix };
        if !prefix
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
        {
            return Err(bad(
                "the prefix takes letters, digits, '-', '_', '.' and '/'",
            ));
        }
        let mut endpoints = Vec::new();
        for host in hosts.split(',') {
            let ok = host
                .rsplit_once(':')
                .is_some_and(|(h, port)| !h.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0));
            if !ok {
                return Err(bad("each etcd member is host:port"));
            }
            endpoints.push(format!("http://{host}"));
        }
        let id_ok = !node_id.is_empty()
            && node_id.len() <= 64
            && node_id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !id_ok {
            return Err(ClusterError::BadNodeId(node_id.to_string()));
        }
        Ok(ClusterConfig {
            endpoints,
            prefix: format!("/{prefix}/"),
            node_id: node_id.to_string(),
        })
    }

    fn head_key(&self) -> String {
        format!("{}catalog/head", self.prefix)
    }

    fn log_dir(&self) -> String {
        format!("{}catalog/log/", self.prefix)
    }

    fn log_key(&self, index: u64) -> String {
        format!("{}{index:020}", self.log_dir())
    }

    /// The first key after every log key (`/` + 1 is `0`).
    fn log_end(&self) -> String {
        format!("{}catalog/log0", self.prefix)
    }

    /// Connects to etcd (bounded: a member that cannot reach etcd says so).
    pub async fn connect(&self) -> Result<Client, CatalogError> {
        let options = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(3))
            .with_timeout(Duration::from_secs(5))
            // A member cut off (no RST: packets dropped) is noticed within
            // about 4 s, and requests go to the others.
            .with_keep_alive(Duration::from_secs(2), Duration::from_secs(2))
            .with_keep_alive_while_idle(true);
        Client::connect(&self.endpoints, Some(options))
            .await
            .map_err(|e| cluster_err(&format!("reaching etcd at {}", self.endpoints.join(",")), e))
    }
}

fn cluster_err(what: &str, e: impl std::fmt::Display) -> CatalogError {
    CatalogError::Cluster(format!("{what}: {e}"))
}

/// What this node's copy is a copy of, and how far it is applied.
const COPY_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS cluster_copy (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);";

fn copy_value(db: &Connection, key: &str) -> Result<Option<String>, CatalogError> {
    Ok(db
        .query_row(
            "SELECT value FROM cluster_copy WHERE key = ?1",
            [key],
            |r| r.get(0),
        )
        .optional()?)
}

/// A single daemon's catalogue must not be a cluster's copy: its functions
/// would be a stale view of the cluster's, never written.
pub(super) fn refuse_member_copy(db: &Connection) -> Result<(), CatalogError> {
    db.execute_batch(COPY_SCHEMA)?;
    match copy_value(db, "prefix")? {
        Some(prefix) => Err(CatalogError::Cluster(format!(
            "this state directory holds a copy of the cluster catalogue under {prefix}: \
             start it with --cluster, or use another --state-dir"
        ))),
        None => Ok(()),
    }
}

/// Marks the copy as this cluster's; refuses one that is a single
/// daemon's catalogue (functions of its own) or another cluster's.
pub(super) fn claim_copy(db: &Connection, cluster: &ClusterConfig) -> Result<(), CatalogError> {
    db.execute_batch(COPY_SCHEMA)?;
    match copy_value(db, "prefix")? {
        Some(prefix) if prefix == cluster.prefix => Ok(()),
        Some(prefix) => Err(CatalogError::Cluster(format!(
            "this state directory holds a copy of the cluster catalogue under {prefix}, not {}: \
             use another --state-dir",
            cluster.prefix
        ))),
        None => {
            let own: i64 = db.query_row(
                "SELECT (SELECT COUNT(*) FROM functions) + (SELECT COUNT(*) FROM versions)",
                [],
                |r| r.get(0),
            )?;
            if own > 0 {
                return Err(CatalogError::Cluster(format!(
                    "this state directory holds a single daemon's catalogue ({own} functions and \
                     versions): a cluster member needs a state directory of its own"
                )));
            }
            db.execute(
                "INSERT INTO cluster_copy (key, value) VALUES ('prefix', ?1)",
                [&cluster.prefix],
            )?;
            Ok(())
        }
    }
}

/// One log entry: a change and who wrote it (so that the writer, and only
/// it, takes the outcome when it applies the entry).
#[derive(Serialize, Deserialize)]
struct Entry {
    /// `<node id>/<nonce of the writing process>`.
    writer: String,
    id: u64,
    change: Change,
}

type Answer = Result<Outcome, String>;

/// What the writer's thread and the member's etcd thread share.
struct Shared {
    db: Arc<Mutex<Connection>>,
    cluster: ClusterConfig,
    writer: String,
    next_id: AtomicU64,
    /// The last log index applied to the copy.
    applied: AtomicU64,
    /// The index of the base in etcd, as last read (0: none).
    base_index: AtomicU64,
    waiters: Mutex<HashMap<u64, std::sync::mpsc::SyncSender<Answer>>>,
    remote_tx: UnboundedSender<String>,
    remote_rx: Mutex<Option<UnboundedReceiver<String>>>,
}

/// What the etcd thread is asked for.
enum Request {
    /// Append this entry (a write with this id).
    Append { id: u64, entry: Vec<u8> },
    /// Apply everything etcd has now, then answer this id.
    Sync { id: u64 },
    /// Write a base now and compact the log before it (tests).
    #[cfg(test)]
    Compact { id: u64 },
}

/// This node's part in the cluster's catalogue: the thread that appends
/// its writes to the log and applies everyone's.
pub(super) struct Member {
    shared: Arc<Shared>,
    appends: UnboundedSender<Request>,
}

impl Member {
    /// Connects, replays what the copy lacks, and follows the log from then
    /// on. Fails if etcd cannot be reached within [`JOIN_TIMEOUT`].
    pub(super) fn join(
        db: Arc<Mutex<Connection>>,
        cluster: &ClusterConfig,
    ) -> Result<Self, CatalogError> {
        let applied = copy_value(&lock(&db), "applied")?
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let mut nonce = [0u8; 8];
        getrandom::fill(&mut nonce).map_err(|e| cluster_err("random nonce", e))?;
        let (remote_tx, remote_rx) = tokio::sync::mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            db,
            cluster: cluster.clone(),
            writer: format!("{}/{:016x}", cluster.node_id, u64::from_le_bytes(nonce)),
            next_id: AtomicU64::new(1),
            applied: AtomicU64::new(applied),
            base_index: AtomicU64::new(0),
            waiters: Mutex::new(HashMap::new()),
            remote_tx,
            remote_rx: Mutex::new(Some(remote_rx)),
        });
        let (appends, append_rx) = tokio::sync::mpsc::unbounded_channel();
        let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel(1);
        let thread_shared = shared.clone();
        std::thread::Builder::new()
            .name("spore-etcd".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(r) => r,
                    Err(e) => {
                        let _ = ready_tx.send(Err(cluster_err("etcd thread", e)));
                        return;
                    }
                };
                runtime.block_on(follow(thread_shared, append_rx, ready_tx));
            })
            .map_err(|e| cluster_err("starting the etcd thread", e))?;
        match wait(&ready_rx, JOIN_TIMEOUT) {
            Some(Ok(())) => Ok(Member { shared, appends }),
            Some(Err(e)) => Err(e),
            None => Err(CatalogError::Cluster(format!(
                "etcd at {} did not answer within {} s",
                cluster.endpoints.join(","),
                JOIN_TIMEOUT.as_secs()
            ))),
        }
    }

    /// Appends a change to the log and returns its outcome once applied
    /// here.
    pub(super) fn write(&self, change: Change) -> Result<Outcome, CatalogError> {
        let s = &self.shared;
        let id = s.next_id.fetch_add(1, Ordering::Relaxed);
        let entry = serde_json::to_vec(&Entry {
            writer: s.writer.clone(),
            id,
            change,
        })
        .map_err(|e| cluster_err("encoding a change", e))?;
        self.ask(Request::Append { id, entry }, id)
    }

    /// Applies everything etcd holds now (a node back from a partition
    /// reads nothing stale).
    pub(super) fn sync(&self) -> Result<(), CatalogError> {
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        self.ask(Request::Sync { id }, id).map(drop)
    }

    /// Compacts the log now (whatever its length): whether a base was
    /// written.
    #[cfg(test)]
    pub(super) fn compact(&self) -> Result<bool, CatalogError> {
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        Ok(matches!(
            self.ask(Request::Compact { id }, id)?,
            Outcome::Changed(true)
        ))
    }

    fn ask(&self, request: Request, id: u64) -> Result<Outcome, CatalogError> {
        let s = &self.shared;
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        lock(&s.waiters).insert(id, tx);
        if self.appends.send(request).is_err() {
            lock(&s.waiters).remove(&id);
            return Err(CatalogError::Cluster("the etcd thread has ended".into()));
        }
        let answer = wait(&rx, WRITE_TIMEOUT);
        lock(&s.waiters).remove(&id);
        match answer {
            Some(Ok(outcome)) => Ok(outcome),
            Some(Err(e)) => Err(CatalogError::Cluster(e)),
            None => Err(CatalogError::Cluster(format!(
                "the cluster did not confirm the write within {} s (it may still be applied)",
                WRITE_TIMEOUT.as_secs()
            ))),
        }
    }

    pub(super) fn take_remote_changes(&self) -> Option<UnboundedReceiver<String>> {
        lock(&self.shared.remote_rx).take()
    }
}

/// Waits on a channel without stalling the daemon's async runtime: a
/// worker of a multi-threaded runtime hands its other tasks away first.
fn wait<T>(rx: &std::sync::mpsc::Receiver<T>, timeout: Duration) -> Option<T> {
    use tokio::runtime::{Handle, RuntimeFlavor};
    let blocking = || rx.recv_timeout(timeout).ok();
    match Handle::try_current() {
        Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(blocking)
        }
        _ => blocking(),
    }
}

/// The etcd thread: connects, catches up, then appends this node's writes
/// and applies the log as the watch delivers it. When the watch breaks (a
/// lost connection, a compacted revision), it catches up by range reads and
/// watches again.
async fn follow(
    shared: Arc<Shared>,
    mut appends: UnboundedReceiver<Request>,
    ready: std::sync::mpsc::SyncSender<Result<(), CatalogError>>,
) {
    let cluster = &shared.cluster;
    let mut client = match cluster.connect().await {
        Ok(c) => c,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    // Retried while etcd settles (a member starting, an election), within
    // the joiner's patience.
    let started = std::time::Instant::now();
    let mut revision = loop {
        match catch_up(&mut client, &shared).await {
            Ok(r) => break r,
            Err(e) if started.elapsed() < JOIN_RETRY => {
                tracing::debug!("cluster catalogue: catching up, again: {e}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => {
                let _ = ready.send(Err(e));
                return;
            }
        }
    };
    let _ = ready.send(Ok(()));
    let mut watch: Option<WatchStream> = None;
    loop {
        if watch.is_none() {
            watch = start_watch(&mut client, cluster, revision + 1).await;
        }
        tokio::select! {
            request = appends.recv() => {
                let (id, entry) = match request {
                    None => return,
                    Some(Request::Append { id, entry }) => (id, entry),
                    Some(Request::Sync { id }) => {
                        match catch_up(&mut client, &shared).await {
                            Ok(r) => {
                                revision = revision.max(r);
                                shared.answer(id, Ok(Outcome::Done));
                            }
                            Err(e) => shared.answer(id, Err(e.to_string())),
                        }
                        continue;
                    }
                    #[cfg(test)]
                    Some(Request::Compact { id }) => {
                        let done = compaction::compact(&mut client, &shared).await;
                        shared.answer(id, done.map(|i| Outcome::Changed(i.is_some())).map_err(|e| e.to_string()));
                        continue;
                    }
                };
                match append_entry(&mut client, cluster, entry).await {
                    Ok(()) => {
                        // Apply up to (at least) the new entry now, rather than
                        // waiting for the watch to bring it.
                        match catch_up(&mut client, &shared).await {
                            Ok(r) => revision = revision.max(r),
                            Err(e) => shared.answer(id, Err(e.to_string())),
                        }
                    }
                    Err(e) => shared.answer(id, Err(e.to_string())),
                }
            }
            () = tokio::time::sleep(QUIET_CATCH_UP) => {
                // Nothing from the watch for a while: it may be held by a
                // member that was cut off; a range read catches up anyway.
                if let Ok(r) = catch_up(&mut client, &shared).await {
                    revision = revision.max(r);
                }
                let behind = shared.applied.load(Ordering::Acquire)
                    .saturating_sub(shared.base_index.load(Ordering::Acquire));
                if behind >= compaction::COMPACT_AFTER {
                    if let Err(e) = compaction::compact(&mut client, &shared).await {
                        tracing::warn!("cluster catalogue: compacting the log: {e}");
                    }
                }
            }
            message = next_message(&mut watch) => {
                let gap = match message {
                    Some(resp) => {
                        if let Some(h) = resp.header() {
                            revision = revision.max(h.revision());
                        }
                        let broken = resp.canceled() || resp.compact_revision() > 0;
                        let mut gap = broken;
                        for ev in resp.events() {
                            if ev.event_type() != EventType::Put {
                                continue;
                            }
                            if let Some(kv) = ev.kv() {
                                revision = revision.max(kv.mod_revision());
                                if !shared.apply_kv(kv) {
                                    gap = true;
                                }
                            }
                        }
                        if broken {
                            watch = None;
                        }
                        gap
                    }
                    None => {
                        watch = None;
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        true
                    }
                };
                if gap {
                    if let Ok(r) = catch_up(&mut client, &shared).await {
                        revision = revision.max(r);
                    }
                }
            }
        }
    }
}

/// The next watch response, or `None` when the watch ended or failed (a
/// missing watch is `None` too, after a pause).
async fn next_message(watch: &mut Option<WatchStream>) -> Option<etcd_client::WatchResponse> {
    match watch {
        Some(w) => w.message().await.ok().flatten(),
        None => {
            tokio::time::sleep(Duration::from_millis(500)).await;
            None
        }
    }
}

async fn start_watch(
    client: &mut Client,
    cluster: &ClusterConfig,
    from_revision: i64,
) -> Option<WatchStream> {
    let options = WatchOptions::new()
        .with_prefix()
        .with_start_revision(from_revision);
    match client.watch(cluster.log_dir(), Some(options)).await {
        Ok((_watcher, stream)) => Some(stream),
        Err(e) => {
            // Once a second while etcd is away: the membership's fence
            // says it louder.
            tracing::debug!("cluster catalogue: watching the log in etcd: {e}");
            None
        }
    }
}

/// Appends one entry after the current head, retrying while other members'
/// appends move the head first.
async fn append_entry(
    client: &mut Client,
    cluster: &ClusterConfig,
    entry: Vec<u8>,
) -> Result<(), CatalogError> {
    let head = cluster.head_key();
    for _ in 0..100 {
        let resp = client
            .get(head.as_str(), None)
            .await
            .map_err(|e| cluster_err("reading the log's head in etcd", e))?;
        let (last, head_revision) = match resp.kvs().first() {
            Some(kv) => {
                let last: u64 = kv
                    .value_str()
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .ok_or_else(|| {
                        CatalogError::Cluster(format!("{head} in etcd is not a number"))
                    })?;
                (last, kv.mod_revision())
            }
            None => (0, 0),
        };
        let index = last + 1;
        let txn = Txn::new()
            .when([Compare::mod_revision(
                head.as_str(),
                CompareOp::Equal,
                head_revision,
            )])
            .and_then([
                TxnOp::put(head.as_str(), index.to_string(), None),
                TxnOp::put(cluster.log_key(index), entry.clone(), None),
            ]);
        let done = client
            .txn(txn)
            .await
            .map_err(|e| cluster_err("appending to the log in etcd", e))?;
        if done.succeeded() {
            return Ok(());
        }
    }
    Err(CatalogError::Cluster(
        "the log's head kept moving: 100 appends lost the race".into(),
    ))
}

/// Applies every entry after the last applied one, by range reads (first
/// the base, if the copy is behind it); the etcd revision it read at.
async fn catch_up(client: &mut Client, shared: &Shared) -> Result<i64, CatalogError> {
    let cluster = &shared.cluster;
    let mut revision = 0;
    compaction::load_if_behind(client, shared).await?;
    let mut bases_loaded = 0;
    loop {
        let from = cluster.log_key(shared.applied.load(Ordering::Acquire) + 1);
        let options = GetOptions::new()
            .with_range(cluster.log_end())
            .with_limit(CATCH_UP_PAGE);
        let resp = client
            .get(from, Some(options))
            .await
            .map_err(|e| cluster_err("reading the log in etcd", e))?;
        if let Some(h) = resp.header() {
            revision = h.revision();
        }
        let mut gap = None;
        for kv in resp.kvs() {
            if !shared.apply_kv(kv) {
                gap = Some(kv.key_str().unwrap_or("?").to_string());
                break;
            }
        }
        if let Some(at) = gap {
            // Compacted meanwhile: a newer base holds what is missing.
            if bases_loaded < 3 && compaction::load_if_behind(client, shared).await? {
                bases_loaded += 1;
                continue;
            }
            return Err(CatalogError::Cluster(format!(
                "the log in etcd has a gap before {at}"
            )));
        }
        if !resp.more() {
            return Ok(revision);
        }
    }
}

impl Shared {
    fn answer(&self, id: u64, answer: Answer) {
        if let Some(tx) = lock(&self.waiters).remove(&id) {
            let _ = tx.try_send(answer);
        }
    }

    /// Applies one log entry if it is the next; false on a gap (an entry
    /// after the next: the caller reads the log again).
    fn apply_kv(&self, kv: &KeyValue) -> bool {
        let Some(index) = kv
            .key_str()
            .ok()
            .and_then(|k| k.strip_prefix(&self.cluster.log_dir()))
            .and_then(|i| i.parse::<u64>().ok())
        else {
            return true;
        };
        let applied = self.applied.load(Ordering::Acquire);
        if index <= applied {
            return true;
        }
        if index != applied + 1 {
            return false;
        }
        let entry: Result<Entry, _> = serde_json::from_slice(kv.value());
        let (writer, id, result, function) = match entry {
            Ok(e) => {
                let result = self.apply_change(index, &e.change);
                (
                    e.writer,
                    e.id,
                    result,
                    Some(e.change.function().to_string()),
                )
            }
            Err(e) => {
                // Not ours to judge further: every member skips it alike.
                tracing::error!("cluster catalogue: log entry {index} is unreadable, skipped: {e}");
                let _ = self.record_applied(index);
                (
                    String::new(),
                    0,
                    Err(format!("unreadable log entry: {e}")),
                    None,
                )
            }
        };
        self.applied.store(index, Ordering::Release);
        if writer == self.writer {
            self.answer(id, result);
        } else if let (Some(name), Ok(_)) = (function, &result) {
            let _ = self.remote_tx.send(name);
        }
        true
    }

    /// Applies a change and records its index in one SQLite transaction; a
    /// change that fails (every member fails it alike) is rolled back and
    /// its index recorded alone.
    fn apply_change(&self, index: u64, change: &Change) -> Answer {
        let mut db = lock(&self.db);
        let attempt = (|| -> Result<Outcome, CatalogError> {
            let tx = db.transaction()?;
            let outcome = change.apply(&tx)?;
            set_applied(&tx, index)?;
            tx.commit()?;
            Ok(outcome)
        })();
        match attempt {
            Ok(outcome) => Ok(outcome),
            Err(e) => {
                if let Err(e) = set_applied(&db, index) {
                    tracing::error!("cluster catalogue: recording log index {index}: {e}");
                }
                Err(e.to_string())
            }
        }
    }

    fn record_applied(&self, index: u64) -> Result<(), CatalogError> {
        set_applied(&lock(&self.db), index)
    }
}

fn set_applied(db: &Connection, index: u64) -> Result<(), CatalogError> {
    db.execute(
        "INSERT OR REPLACE INTO cluster_copy (key, value) VALUES ('applied', ?1)",
        params![index.to_string()],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests;
