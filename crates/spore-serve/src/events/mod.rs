//! Durable `Event` invocations. An accepted event is a file under
//! `<state>/events/`, written atomically and fsynced before the daemon
//! answers 202, and removed only once the event has an outcome: it ran, or
//! it was dropped (retries used up, too old, its function deleted) with a
//! log line naming its request id and a counter. A daemon killed at any
//! moment finds its events again at the next start and runs them, so an
//! accepted event runs at least once (Lambda's contract).
//!
//! Only each event's metadata is kept in memory; its payload is read from
//! its file when it runs. The queue is bounded (`max_queued`): beyond it
//! `Event` invocations get 429. This module keeps the queue; the API's
//! dispatcher (`api::events`) runs what it hands out.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

mod replica;
pub use replica::EventReplica;

use crate::fs::{create_private_dir, write_private};
use crate::mutex::lock;

/// Lambda's defaults for asynchronous invocation.
pub const DEFAULT_MAX_RETRIES: u32 = 2;
pub const DEFAULT_MAX_AGE: Duration = Duration::from_secs(6 * 3600);
/// Lambda waits about a minute before the first retry, two before the second.
pub const DEFAULT_RETRY_DELAY: Duration = Duration::from_secs(60);
/// Events kept at once before `Event` invocations get 429.
pub const DEFAULT_MAX_QUEUED: usize = 10_000;

/// An event file's name ends so; anything else in the directory is not one.
const SUFFIX: &str = ".event";
/// A file that cannot be read back as an event is renamed so (kept for the
/// operator, never run, never deleted).
const CORRUPT_SUFFIX: &str = ".corrupt";

/// How the queue retries and bounds events (`spore serve --event-*`).
#[derive(Clone, Debug)]
pub struct EventsConfig {
    pub max_queued: usize,
    /// Retries after a failed attempt (a function error, a crash, a start
    /// that failed); throttles are waited out, not counted.
    pub max_retries: u32,
    /// An event older than this is dropped as expired.
    pub max_age: Duration,
    /// The wait before the first retry, doubled for each further one.
    pub retry_delay: Duration,
}

impl Default for EventsConfig {
    fn default() -> Self {
        Self {
            max_queued: DEFAULT_MAX_QUEUED,
            max_retries: DEFAULT_MAX_RETRIES,
            max_age: DEFAULT_MAX_AGE,
            retry_delay: DEFAULT_RETRY_DELAY,
        }
    }
}

/// What an event file records besides the payload.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct EventMeta {
    pub request_id: String,
    pub function: String,
    /// The version or alias it was sent to (`None`: `$LATEST`); an alias is
    /// resolved when the event runs.
    #[serde(default)]
    pub qualifier: Option<String>,
    /// When the daemon accepted it (Unix ms): its age counts from here,
    /// across restarts.
    pub received_unix_ms: u64,
    /// Attempts that failed so far.
    pub attempts: u32,
    /// Destination hops that led to this event: 0 for an event a client
    /// sent, n for the record of an event of depth n - 1 (a loop of
    /// destinations stops at [`MAX_DESTINATION_DEPTH`]).
    #[serde(default)]
    pub depth: u32,
}

/// How many destination records in a row may follow one client event
/// (Lambda stops a recursive loop after 16 invocations too).
pub const MAX_DESTINATION_DEPTH: u32 = 16;

/// An event handed to the dispatcher: it is the dispatcher's until it gives
/// it back ([`EventQueue::retry_later`]) or ends it ([`EventQueue::done`],
/// [`EventQueue::drop_event`]).
#[derive(Debug)]
pub struct TakenEvent {
    pub meta: EventMeta,
    file: PathBuf,
    /// Throttled attempts in a row (not persisted: a restart starts over).
    throttles: u32,
}

impl TakenEvent {
    /// How long ago the daemon accepted it.
    pub fn age(&self) -> Duration {
        Duration::from_millis(crate::clock::unix_ms().saturating_sub(self.meta.received_unix_ms))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AcceptError {
    #[error("the event queue is full ({0} events waiting)")]
    Full(usize),
    #[error("cannot keep the event: {0}")]
    Io(#[from] std::io::Error),
}

/// Why an event ended without running successfully.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum DropReason {
    /// Every attempt failed.
    RetriesExhausted,
    /// Older than the queue's `max_age`.
    Expired,
    /// Its function was deleted before it could run.
    FunctionDeleted,
    /// Its payload could no longer be read.
    Unreadable,
}

impl DropReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::RetriesExhausted => "retries_exhausted",
            DropReason::Expired => "expired",
            DropReason::FunctionDeleted => "function_deleted",
            DropReason::Unreadable => "unreadable",
        }
    }
}

struct Waiting {
    meta: EventMeta,
    file: PathBuf,
    throttles: u32,
}

#[derive(Default)]
struct Inner {
    /// (due, sequence) → event: the dispatcher takes the earliest due.
    waiting: BTreeMap<(Instant, u64), Waiting>,
    /// Events the dispatcher holds.
    running: usize,
    next_seq: u64,
    accepted: u64,
    succeeded: u64,
    retried: u64,
    /// (function, reason) → events dropped.
    dropped: BTreeMap<(String, DropReason), u64>,
    /// Destination records queued, by condition (`Success`, ...).
    records: BTreeMap<&'static str, u64>,
    /// Destination records that could not be queued.
    records_lost: u64,
}

impl Inner {
    fn queued(&self) -> usize {
        self.waiting.len() + self.running
    }

    fn push(&mut self, due: Instant, w: Waiting) {
        self.next_seq += 1;
        self.waiting.insert((due, self.next_seq), w);
    }
}

/// What [`EventQueue::open`] found from a previous daemon.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Recovered {
    /// Events queued again.
    pub events: usize,
    /// Half-written temporary files removed.
    pub temp_removed: usize,
    /// Files that were not readable events (renamed `*.corrupt`).
    pub corrupt: usize,
}

/// The durable queue of accepted `Event` invocations.
pub struct EventQueue {
    dir: PathBuf,
    cfg: EventsConfig,
    inner: Mutex<Inner>,
    wake: tokio::sync::Notify,
    /// In a cluster: where every accepted event is also kept, so that
    /// another node runs it if this one dies (`replica`).
    replica: std::sync::OnceLock<Box<dyn replica::EventReplica>>,
}

impl EventQueue {
    /// Opens (creating) `dir` and queues every event a previous daemon left
    /// in it, due now; removes half-written files.
    pub fn open(dir: &Path, cfg: EventsConfig) -> std::io::Result<(Self, Recovered)> {
        create_private_dir(dir)?;
        let mut found = Recovered::default();
        let mut inner = Inner::default();
        let now = Instant::now();
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        // Oldest first (names start with the time of acceptance).
        entries.sort();
        for path in entries {
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            if name.starts_with('.') && name.contains(".tmp-") {
                if std::fs::remove_file(&path).is_ok() {
                    found.temp_removed += 1;
                }
                continue;
            }
            if !name.ends_with(SUFFIX) {
                continue;
            }
            match read_meta(&path) {
                Ok(meta) => {
                    inner.push(
                        now,
                        Waiting {
                            meta,
                            file: path,
                            throttles: 0,
                        },
                    );
                    found.events += 1;
                }
                Err(e) => {
                    tracing::warn!(
                        "event file {} is unreadable, set aside: {e}",
                        path.display()
                    );
                    let aside = path.with_file_name(format!("{name}{CORRUPT_SUFFIX}"));
                    if std::fs::rename(&path, &aside).is_ok() {
                        found.corrupt += 1;
                    }
                }
            }
        }
        let queue = Self {
            dir: dir.to_path_buf(),
            cfg,
            inner: Mutex::new(inner),
            wake: tokio::sync::Notify::new(),
            replica: std::sync::OnceLock::new(),
        };
        Ok((queue, found))
    }

    pub fn config(&self) -> &EventsConfig {
        &self.cfg
    }

    /// Events accepted and not ended yet (waiting or running).
    pub fn queued(&self) -> usize {
        lock(&self.inner).queued()
    }

    /// Keeps an event on disk (fsynced) and queues it. Blocking: call it off
    /// the async threads. When it returns `Ok` the event survives a crash.
    pub fn accept(
        &self,
        function: &str,
        qualifier: Option<&str>,
        request_id: &str,
        payload: &[u8],
    ) -> Result<(), AcceptError> {
        {
            let g = lock(&self.inner);
            if g.queued() >= self.cfg.max_queued {
                return Err(AcceptError::Full(g.queued()));
            }
        }
        self.keep(function, qualifier, request_id, payload, 0)
    }

    /// Queues the destination record of `source` (an event that ended) for
    /// the function `destination`, durably, before the caller ends
    /// `source`: a crash in between delivers the record twice at worst,
    /// never not at all. Not held to the queue's bound: `source` leaves the
    /// queue right after, so the count does not grow. False (logged and
    /// counted) when the record cannot be kept or the chain is too long.
    pub fn accept_record(
        &self,
        source: &TakenEvent,
        destination: &str,
        condition: &'static str,
        record_id: &str,
        record: &[u8],
    ) -> bool {
        let src = &source.meta;
        let depth = src.depth + 1;
        if depth > MAX_DESTINATION_DEPTH {
            tracing::warn!(
                function = %src.function, request_id = %src.request_id,
                "destination record to {destination} not sent: {MAX_DESTINATION_DEPTH} destinations in a row (a loop?)"
            );
            lock(&self.inner).records_lost += 1;
            return false;
        }
        match self.keep(destination, None, record_id, record, depth) {
            Ok(()) => {
                tracing::info!(
                    function = %src.function, request_id = %src.request_id,
                    "{condition} record queued for {destination} as event {record_id}"
                );
                *lock(&self.inner).records.entry(condition).or_default() += 1;
                true
            }
            Err(e) => {
                tracing::warn!(
                    function = %src.function, request_id = %src.request_id,
                    "{condition} record for {destination} lost: {e}"
                );
                lock(&self.inner).records_lost += 1;
                false
            }
        }
    }

    fn keep(
        &self,
        function: &str,
        qualifier: Option<&str>,
        request_id: &str,
        payload: &[u8],
        depth: u32,
    ) -> Result<(), AcceptError> {
        let meta = EventMeta {
            request_id: request_id.to_string(),
            function: function.to_string(),
            qualifier: qualifier.map(str::to_string),
            received_unix_ms: crate::clock::unix_ms(),
            attempts: 0,
            depth,
        };
        let name = format!(
            "{:016x}-{}{SUFFIX}",
            meta.received_unix_ms,
            file_safe(request_id)
        );
        let file = self.dir.join(&name);
        let bytes = encode(&meta, payload);
        // Replicated first: an event a dead node accepted is in etcd.
        if let Some(r) = self.replica.get() {
            r.keep(&name, &bytes)?;
        }
        write_private(&file, &bytes)?;
        self.enqueue(meta, file);
        Ok(())
    }

    /// Queues an accepted event whose file is written, and wakes the
    /// dispatcher.
    pub(super) fn enqueue(&self, meta: EventMeta, file: PathBuf) {
        let mut g = lock(&self.inner);
        g.accepted += 1;
        g.push(
            Instant::now(),
            Waiting {
                meta,
                file,
                throttles: 0,
            },
        );
        drop(g);
        self.wake.notify_one();
    }

    /// Waits until an event is due and hands it out.
    pub async fn next_due(&self) -> TakenEvent {
        loop {
            // Registered before looking, so a push between the look and the
            // wait is not missed.
            let notified = self.wake.notified();
            let wait = {
                let mut g = lock(&self.inner);
                let now = Instant::now();
                match g.waiting.first_key_value().map(|(k, _)| *k) {
                    Some(key) if key.0 <= now => {
                        if let Some(w) = g.waiting.remove(&key) {
                            g.running += 1;
                            return TakenEvent {
                                meta: w.meta,
                                file: w.file,
                                throttles: w.throttles,
                            };
                        }
                        Duration::ZERO
                    }
                    Some(key) => key.0 - now,
                    None => Duration::from_secs(3600),
                }
            };
            tokio::select! {
                () = notified => {}
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Reads the payload of `ev` from its file.
    pub fn payload(&self, ev: &TakenEvent) -> std::io::Result<Vec<u8>> {
        let bytes = std::fs::read(&ev.file)?;
        decode(&bytes)
            .map(|(_, payload)| payload.to_vec())
            .map_err(std::io::Error::other)
    }

    /// `ev` ran: its file goes.
    pub fn done(&self, ev: TakenEvent) {
        self.forget_replica(&ev.file);
        remove_event_file(&ev.file);
        let mut g = lock(&self.inner);
        g.running = g.running.saturating_sub(1);
        g.succeeded += 1;
    }

    /// `ev` was throttled: it waits (doubling from 0.5 s to 30 s) and is
    /// tried again; the attempt is not counted.
    pub fn throttled(&self, mut ev: TakenEvent) {
        ev.throttles = ev.throttles.saturating_add(1);
        let wait = Duration::from_millis(500)
            .saturating_mul(1 << ev.throttles.min(7).saturating_sub(1))
            .min(Duration::from_secs(30));
        self.give_back(ev, wait);
    }

    /// An attempt of `ev` failed: it is retried after the configured delay
    /// (doubled for each further retry), or dropped once `max_retries` (the
    /// function's, else the queue's) are used up. Returns the reason when it
    /// was dropped.
    pub fn failed(
        &self,
        mut ev: TakenEvent,
        why: &str,
        max_retries: Option<u32>,
    ) -> Option<DropReason> {
        ev.meta.attempts = ev.meta.attempts.saturating_add(1);
        if ev.meta.attempts > max_retries.unwrap_or(self.cfg.max_retries) {
            tracing::warn!(
                function = %ev.meta.function, request_id = %ev.meta.request_id,
                "event dropped after {} attempts: {why}", ev.meta.attempts
            );
            self.drop_event(ev, DropReason::RetriesExhausted);
            return Some(DropReason::RetriesExhausted);
        }
        // The count survives a restart: rewrite the file with it.
        let kept = std::fs::read(&ev.file)
            .map_err(|e| e.to_string())
            .and_then(|b| decode(&b).map(|(_, p)| encode(&ev.meta, p)))
            .and_then(|b| write_private(&ev.file, &b).map_err(|e| e.to_string()));
        if let Err(e) = kept {
            tracing::warn!(
                function = %ev.meta.function, request_id = %ev.meta.request_id,
                "event's attempt count not kept on disk (a restart retries it afresh): {e}"
            );
        }
        let wait = self
            .cfg
            .retry_delay
            .saturating_mul(1 << (ev.meta.attempts - 1).min(16));
        tracing::info!(
            function = %ev.meta.function, request_id = %ev.meta.request_id,
            "event attempt {} failed ({why}); retried in {wait:?}", ev.meta.attempts
        );
        lock(&self.inner).retried += 1;
        self.give_back(ev, wait);
        None
    }

    /// `ev` will not run: its file goes, and the drop is counted (the
    /// caller logs why, with its request id).
    pub fn drop_event(&self, ev: TakenEvent, reason: DropReason) {
        self.forget_replica(&ev.file);
        remove_event_file(&ev.file);
        let mut g = lock(&self.inner);
        g.running = g.running.saturating_sub(1);
        *g.dropped.entry((ev.meta.function, reason)).or_default() += 1;
    }

    fn give_back(&self, ev: TakenEvent, after: Duration) {
        let mut g = lock(&self.inner);
        g.running = g.running.saturating_sub(1);
        g.push(
            Instant::now() + after,
            Waiting {
                meta: ev.meta,
                file: ev.file,
                throttles: ev.throttles,
            },
        );
        drop(g);
        self.wake.notify_one();
    }

    /// `spore_events_*` in Prometheus' text format.
    pub fn render_metrics(&self, out: &mut String) {
        let g = lock(&self.inner);
        out.push_str("# HELP spore_events_queued Event invocations accepted and not ended yet.\n");
        out.push_str("# TYPE spore_events_queued gauge\n");
        let _ = writeln!(out, "spore_events_queued {}", g.queued());
        for (name, help, v) in [
            (
                "accepted",
                "Event invocations accepted (answered 202).",
                g.accepted,
            ),
            (
                "succeeded",
                "Event invocations that ran without an error.",
                g.succeeded,
            ),
            (
                "retried",
                "Failed Event attempts given another try.",
                g.retried,
            ),
        ] {
            let _ = writeln!(out, "# HELP spore_events_{name}_total {help}");
            let _ = writeln!(out, "# TYPE spore_events_{name}_total counter");
            let _ = writeln!(out, "spore_events_{name}_total {v}");
        }
        out.push_str("# HELP spore_events_dropped_total Event invocations that ended without running successfully, by reason.\n");
        out.push_str("# TYPE spore_events_dropped_total counter\n");
        out.push_str(
            "# HELP spore_events_expired_total Event invocations dropped for their age.\n",
        );
        out.push_str("# TYPE spore_events_expired_total counter\n");
        out.push_str("# HELP spore_events_destination_records_total Destination records queued (DestinationConfig), by condition.\n");
        out.push_str("# TYPE spore_events_destination_records_total counter\n");
        for (condition, n) in &g.records {
            let _ = writeln!(
                out,
                "spore_events_destination_records_total{{condition=\"{condition}\"}} {n}"
            );
        }
        out.push_str("# HELP spore_events_destination_records_lost_total Destination records that could not be queued (logged with the event's request id).\n");
        out.push_str("# TYPE spore_events_destination_records_lost_total counter\n");
        let _ = writeln!(
            out,
            "spore_events_destination_records_lost_total {}",
            g.records_lost
        );
        for ((f, reason), n) in &g.dropped {
            let f = f.replace('\\', "\\\\").replace('"', "\\\"");
            let _ = writeln!(
                out,
                "spore_events_dropped_total{{function=\"{f}\",reason=\"{}\"}} {n}",
                reason.as_str()
            );
            if *reason == DropReason::Expired {
                let _ = writeln!(out, "spore_events_expired_total{{function=\"{f}\"}} {n}");
            }
        }
    }
}

/// A request id as part of a file name (they are UUIDs; anything else is
/// made harmless).
fn file_safe(id: &str) -> String {
    id.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect()
}

fn remove_event_file(file: &Path) {
    match std::fs::remove_file(file) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        // Left behind it would run again after a restart: at least once
        // still holds, but say so.
        Err(e) => tracing::warn!("cannot remove the event file {}: {e}", file.display()),
    }
}

/// An event file: its metadata as one line of JSON, then the payload.
fn encode(meta: &EventMeta, payload: &[u8]) -> Vec<u8> {
    let mut out = serde_json::to_vec(meta).unwrap_or_default();
    out.push(b'\n');
    out.extend_from_slice(payload);
    out
}

fn decode(bytes: &[u8]) -> Result<(EventMeta, &[u8]), String> {
    let nl = bytes
        .iter()
        .position(|&b| b == b'\n')
        .ok_or("no metadata line")?;
    let meta: EventMeta =
        serde_json::from_slice(&bytes[..nl]).map_err(|e| format!("metadata: {e}"))?;
    Ok((meta, &bytes[nl + 1..]))
}

fn read_meta(path: &Path) -> Result<EventMeta, String> {
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    decode(&bytes).map(|(meta, _)| meta)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("spore-events-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn quick() -> EventsConfig {
        EventsConfig {
            max_queued: 3,
            max_retries: 2,
            max_age: Duration::from_secs(60),
            retry_delay: Duration::from_millis(10),
        }
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn accepted_events_survive_a_reopen_with_their_payloads() {
        let dir = scratch("reopen");
        let (q, found) = EventQueue::open(&dir, quick()).unwrap();
        assert_eq!(found, Recovered::default());
        q.accept("f", None, "id-1", b"{\"a\":1}").unwrap();
        q.accept("g", None, "id-2", b"\n\nbinary\0").unwrap();
        // A half-written file of a crashed write, and a damaged event.
        std::fs::write(dir.join(".x.event.tmp-1-2"), b"half").unwrap();
        std::fs::write(dir.join("0-bad.event"), b"not json").unwrap();
        drop(q);
        let (q, found) = EventQueue::open(&dir, quick()).unwrap();
        assert_eq!(
            found,
            Recovered {
                events: 2,
                temp_removed: 1,
                corrupt: 1
            }
        );
        assert!(dir.join("0-bad.event.corrupt").exists());
        let rt = rt();
        let a = rt.block_on(q.next_due());
        let b = rt.block_on(q.next_due());
        let mut got = vec![
            (a.meta.request_id.clone(), q.payload(&a).unwrap()),
            (b.meta.request_id.clone(), q.payload(&b).unwrap()),
        ];
        got.sort();
        assert_eq!(
            got,
            vec![
                ("id-1".to_string(), b"{\"a\":1}".to_vec()),
                ("id-2".to_string(), b"\n\nbinary\0".to_vec())
            ]
        );
        q.done(a);
        q.done(b);
        assert_eq!(q.queued(), 0);
        drop(q);
        let (_, found) = EventQueue::open(&dir, quick()).unwrap();
        assert_eq!(found.events, 0, "ended events are gone from disk");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_queue_is_bounded_and_running_events_count() {
        let dir = scratch("bound");
        let (q, _) = EventQueue::open(&dir, quick()).unwrap();
        for i in 0..3 {
            q.accept("f", None, &format!("id-{i}"), b"{}").unwrap();
        }
        assert!(matches!(
            q.accept("f", None, "id-3", b"{}"),
            Err(AcceptError::Full(3))
        ));
        let ev = rt().block_on(q.next_due());
        assert!(matches!(
            q.accept("f", None, "id-3", b"{}"),
            Err(AcceptError::Full(3))
        ));
        q.done(ev);
        q.accept("f", None, "id-3", b"{}").unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn failed_attempts_are_retried_then_dropped_and_the_count_persists() {
        let dir = scratch("retry");
        let (q, _) = EventQueue::open(&dir, quick()).unwrap();
        q.accept("f", None, "id-r", b"{}").unwrap();
        let rt = rt();
        let ev = rt.block_on(q.next_due());
        assert_eq!(q.failed(ev, "boom", None), None);
        // The retry waits its delay.
        let t = Instant::now();
        let ev = rt.block_on(q.next_due());
        assert!(t.elapsed() >= Duration::from_millis(5));
        assert_eq!(ev.meta.attempts, 1);
        drop(ev);
        // A restart keeps the count.
        drop(q);
        let (q, _) = EventQueue::open(&dir, quick()).unwrap();
        let ev = rt.block_on(q.next_due());
        assert_eq!(ev.meta.attempts, 1);
        assert_eq!(q.failed(ev, "boom", None), None);
        let ev = rt.block_on(q.next_due());
        assert_eq!(
            q.failed(ev, "boom", None),
            Some(DropReason::RetriesExhausted)
        );
        assert_eq!(q.queued(), 0);
        let mut m = String::new();
        q.render_metrics(&mut m);
        assert!(
            m.contains("spore_events_dropped_total{function=\"f\",reason=\"retries_exhausted\"} 1"),
            "{m}"
        );
        assert!(m.contains("spore_events_queued 0"), "{m}");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn throttled_events_wait_and_are_not_counted_as_attempts() {
        let dir = scratch("throttle");
        let (q, _) = EventQueue::open(&dir, quick()).unwrap();
        q.accept("f", None, "id-t", b"{}").unwrap();
        let rt = rt();
        let ev = rt.block_on(q.next_due());
        q.throttled(ev);
        let t = Instant::now();
        let ev = rt.block_on(q.next_due());
        assert!(
            t.elapsed() >= Duration::from_millis(400),
            "{:?}",
            t.elapsed()
        );
        assert_eq!(ev.meta.attempts, 0);
        q.drop_event(ev, DropReason::Expired);
        let mut m = String::new();
        q.render_metrics(&mut m);
        assert!(
            m.contains("spore_events_expired_total{function=\"f\"} 1"),
            "{m}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
