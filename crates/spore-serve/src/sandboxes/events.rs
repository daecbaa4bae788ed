//! A sandbox's log (E2B's `GET /sandboxes/{id}/logs` and its v2): what
//! happened to it, as the daemon saw it — created, paused, resumed, forked,
//! its timeout or network changed, its envd stopped answering, with the
//! end of its VMM's log (its guest's console) when something failed. One
//! JSON line per event in `events.jsonl` in its directory (root's, 0600:
//! its jailed VMMs write beside it but cannot read or replace it), kept
//! across pauses and daemon restarts, gone with the sandbox.
//!
//! The file is appended to (one `write` of a whole line, so a crash loses
//! at most the line being written, and a torn last line is skipped when
//! read); past [`MAX_BYTES`] its older half is dropped, by an atomic
//! rewrite.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The log's size past which its older half goes.
pub const MAX_BYTES: u64 = 256 << 10;
/// The most entries one request returns (E2B's default limit).
pub const MAX_LIMIT: usize = 1000;

/// E2B's `LogLevel`, in increasing severity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Debug,
    Info,
    Warn,
    Error,
}

impl Level {
    pub fn parse(s: &str) -> Option<Level> {
        match s {
            "debug" => Some(Level::Debug),
            "info" => Some(Level::Info),
            "warn" => Some(Level::Warn),
            "error" => Some(Level::Error),
            _ => None,
        }
    }
}

/// One event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Unix time in milliseconds.
    pub at_ms: u64,
    pub level: Level,
    pub message: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub fields: BTreeMap<String, String>,
}

/// The log file of the sandbox whose directory is `dir`.
pub fn path(dir: &Path) -> PathBuf {
    dir.join("events.jsonl")
}

/// Appends an event now to the log in `dir`. Best effort: a log that
/// cannot be written is said on the daemon's log, and the sandbox goes on.
pub fn record(dir: &Path, level: Level, message: &str, fields: &[(&str, &str)]) {
    let event = Event {
        at_ms: crate::clock::unix_ms(),
        level,
        message: message.to_string(),
        fields: fields
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    };
    if let Err(e) = append(&path(dir), &event) {
        tracing::warn!("sandbox log {}: {e}", path(dir).display());
    }
}

fn append(file: &Path, event: &Event) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(event).map_err(std::io::Error::other)?;
    line.push(b'\n');
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(file)?;
    f.write_all(&line)?;
    if f.metadata()?.len() > MAX_BYTES {
        drop(f);
        let kept = read_file(file);
        let newer = &kept[kept.len() / 2..];
        let mut bytes = Vec::new();
        for e in newer {
            bytes.extend(serde_json::to_vec(e).map_err(std::io::Error::other)?);
            bytes.push(b'\n');
        }
        crate::fs::write_private(file, &bytes)?;
    }
    Ok(())
}

/// The events of the log in `dir`, oldest first (none if it has none).
pub fn read(dir: &Path) -> Vec<Event> {
    read_file(&path(dir))
}

fn read_file(file: &Path) -> Vec<Event> {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Which events a request wants (E2B's v2 query: `cursor`, `limit`,
/// `direction`, `level`, `search`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Query {
    /// Forward: events at or after it (ms); backward: at or before it.
    pub cursor: Option<u64>,
    pub limit: usize,
    /// Oldest first from the cursor (E2B's default), else newest first.
    pub forward: bool,
    /// The least severe level wanted.
    pub level: Option<Level>,
    /// Events whose message contains it (ignoring case).
    pub search: Option<String>,
}

impl Default for Query {
    fn default() -> Self {
        Query {
            cursor: None,
            limit: MAX_LIMIT,
            forward: true,
            level: None,
            search: None,
        }
    }
}

impl Query {
    /// From a request's query, its pairs decoded; a value it cannot take
    /// is an error naming it.
    pub fn from_pairs(pairs: Vec<(String, String)>) -> Result<Query, String> {
        let mut q = Query::default();
        for (k, v) in pairs {
            match k.as_str() {
                "cursor" | "start" => {
                    q.cursor = Some(v.parse().map_err(|_| format!("{k}: not a number: {v:?}"))?)
                }
                "limit" => {
                    let n: usize = v
                        .parse()
                        .map_err(|_| format!("limit: not a number: {v:?}"))?;
                    q.limit = n.min(MAX_LIMIT);
                }
                "direction" => {
                    q.forward = match v.as_str() {
                        "forward" => true,
                        "backward" => false,
                        _ => return Err(format!("direction: {v:?}, not forward or backward")),
                    }
                }
                "level" => {
                    q.level = Some(Level::parse(&v).ok_or_else(|| {
                        format!("level: {v:?}, not one of debug, info, warn, error")
                    })?)
                }
                "search" if !v.is_empty() => q.search = Some(v.to_lowercase()),
                _ => {}
            }
        }
        Ok(q)
    }

    /// The events of `all` (oldest first) it selects, in its order.
    pub fn select(&self, all: Vec<Event>) -> Vec<Event> {
        let wanted = |e: &Event| {
            self.level.is_none_or(|l| e.level >= l)
                && self
                    .search
                    .as_deref()
                    .is_none_or(|s| e.message.to_lowercase().contains(s))
                && match (self.cursor, self.forward) {
                    (None, _) => true,
                    (Some(c), true) => e.at_ms >= c,
                    (Some(c), false) => e.at_ms <= c,
                }
        };
        let matching = all.into_iter().filter(wanted);
        if self.forward {
            matching.take(self.limit).collect()
        } else {
            let mut newest_first: Vec<Event> = matching.collect();
            newest_first.reverse();
            newest_first.truncate(self.limit);
            newest_first
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch() -> PathBuf {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("spore-events-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// `a=b&c=d` as pairs (the tests need no decoding).
    fn parse(query: &str) -> Result<Query, String> {
        let pairs = query
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|p| {
                let (k, v) = p.split_once('=').unwrap_or((p, ""));
                (k.to_string(), v.to_string())
            })
            .collect();
        Query::from_pairs(pairs)
    }

    fn event(at_ms: u64, level: Level, message: &str) -> Event {
        Event {
            at_ms,
            level,
            message: message.into(),
            fields: BTreeMap::new(),
        }
    }

    #[test]
    fn events_are_appended_and_read_back_a_torn_line_skipped() {
        let dir = scratch();
        record(&dir, Level::Info, "created", &[("template", "base")]);
        record(&dir, Level::Warn, "envd does not answer", &[]);
        // A crash in the middle of a line.
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(path(&dir))
            .unwrap();
        f.write_all(b"{\"at_ms\":1,\"lev").unwrap();
        let got = read(&dir);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].message, "created");
        assert_eq!(got[0].fields["template"], "base");
        assert_eq!(got[1].level, Level::Warn);
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(path(&dir)).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_full_log_drops_its_older_half() {
        let dir = scratch();
        let long = "x".repeat(1000);
        for i in 0..300 {
            record(&dir, Level::Info, &format!("{i} {long}"), &[]);
        }
        let size = std::fs::metadata(path(&dir)).unwrap().len();
        assert!(size <= MAX_BYTES + 2000, "{size}");
        let got = read(&dir);
        assert!(got.len() < 300 && got.len() > 100, "{}", got.len());
        assert!(got.last().unwrap().message.starts_with("299 "));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn queries_select_by_time_level_and_text_either_way() {
        let all = vec![
            event(10, Level::Info, "sandbox created"),
            event(20, Level::Warn, "envd does not answer"),
            event(30, Level::Info, "sandbox paused"),
            event(40, Level::Error, "VMM ended"),
        ];
        let q = |s: &str| parse(s).unwrap().select(all.clone());
        let at = |v: Vec<Event>| v.iter().map(|e| e.at_ms).collect::<Vec<_>>();
        assert_eq!(at(q("")), vec![10, 20, 30, 40]);
        assert_eq!(at(q("cursor=20&limit=2")), vec![20, 30]);
        assert_eq!(at(q("direction=backward")), vec![40, 30, 20, 10]);
        assert_eq!(at(q("direction=backward&cursor=30&limit=2")), vec![30, 20]);
        assert_eq!(at(q("level=warn")), vec![20, 40]);
        assert_eq!(at(q("search=SANDBOX")), vec![10, 30]);
        assert_eq!(at(q("start=25")), vec![30, 40]);
        assert_eq!(parse("limit=100000").unwrap().limit, MAX_LIMIT);
        for bad in ["cursor=x", "limit=-1", "direction=up", "level=loud"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
