//! Firecracker's logger: spore's `tracing` events written as text lines to a
//! file or FIFO that `PUT /logger` (or `firecracker --log-path`) names.
//!
//! One process-wide sink, because `tracing`'s subscriber is process-wide
//! too: the binary installs [`layer`] beside its stderr output once, and
//! [`configure`] points it at a path later. Lines look like Firecracker's:
//!
//! ```text
//! 2026-11-25T02:47:16.170508186 [my-vm:spore-api:INFO:crates/spore-vmm/src/api/server.rs:220] API request method=PUT
//! ```
//!
//! (the level with `show_level`, the origin with `show_log_origin`). Writes
//! never block: a FIFO nobody drains drops lines (counted in the metrics'
//! `logger.missed_log_count`) instead of stalling a vCPU.

use std::fmt::Write as _;
use std::fs::File;
use std::io::Write as _;
use std::path::Path;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

use crate::config::{LogLevel, LoggerConfig};
use crate::host::lock;

/// The configured level's rank (0: no sink, or Off); read on every event.
static MAX_RANK: AtomicU8 = AtomicU8::new(0);
static SINK: Mutex<Option<Sink>> = Mutex::new(None);

struct Sink {
    file: File,
    id: String,
    show_level: bool,
    show_origin: bool,
    module: Option<String>,
}

fn rank_of(level: &Level) -> u8 {
    match *level {
        Level::ERROR => LogLevel::Error.rank(),
        Level::WARN => LogLevel::Warning.rank(),
        Level::INFO => LogLevel::Info.rank(),
        Level::DEBUG => LogLevel::Debug.rank(),
        Level::TRACE => LogLevel::Trace.rank(),
    }
}

/// Whether an event at this callsite goes to the sink (cheap: one atomic).
fn wanted(meta: &Metadata<'_>) -> bool {
    rank_of(meta.level()) <= MAX_RANK.load(Ordering::Relaxed)
}

/// Points the logger at `c.log_path` with its level and options. A later
/// call replaces the earlier settings (and reopens the path). `id` names the
/// instance in every line. Errors say what is wrong with the path.
pub fn configure(c: &LoggerConfig, id: &str) -> Result<(), String> {
    let mut sink = lock(&SINK);
    let file = match (&c.log_path, sink.take()) {
        (Some(path), _) => crate::files::open_log_target(Path::new(path))
            .map_err(|e| format!("cannot open the log path {path}: {e}"))?,
        (None, Some(old)) => old.file,
        (None, None) => {
            return Err("log_path is missing: the logger has nowhere to write yet".into())
        }
    };
    let level = c.level.unwrap_or_default();
    *sink = Some(Sink {
        file,
        id: id.to_string(),
        show_level: c.show_level.unwrap_or(false),
        show_origin: c.show_log_origin.unwrap_or(false),
        module: c.module.clone().filter(|m| !m.is_empty()),
    });
    MAX_RANK.store(level.rank(), Ordering::Relaxed);
    Ok(())
}

/// Whether a log path is configured.
pub fn is_configured() -> bool {
    lock(&SINK).is_some()
}

/// The layer that feeds the sink; install it once, beside the other
/// output, without a global filter in front of it (it filters itself).
pub fn layer<S>() -> impl Layer<S>
where
    S: Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    use tracing_subscriber::Layer as _;
    // Dynamic: the level changes at run time, so no callsite's interest
    // may be cached as "never".
    SinkLayer.with_filter(tracing_subscriber::filter::dynamic_filter_fn(
        |meta, _cx| wanted(meta),
    ))
}

struct SinkLayer;

impl<S: Subscriber> Layer<S> for SinkLayer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let mut guard = lock(&SINK);
        let Some(sink) = guard.as_mut() else {
            return;
        };
        let meta = event.metadata();
        if let Some(m) = &sink.module {
            if !meta.target().starts_with(m.as_str()) {
                return;
            }
        }
        let line = format_line(sink, meta, event);
        // A full FIFO (EAGAIN) or a vanished reader: the line is dropped,
        // never waited for.
        if sink.file.write_all(line.as_bytes()).is_err() {
            crate::metrics::METRICS.logger_missed.inc();
        }
    }
}

fn format_line(sink: &Sink, meta: &Metadata<'_>, event: &Event<'_>) -> String {
    let mut line = utc_timestamp();
    let thread = std::thread::current();
    let _ = write!(line, " [{}:{}", sink.id, thread.name().unwrap_or("unnamed"));
    if sink.show_level {
        let _ = write!(line, ":{}", meta.level());
    }
    if sink.show_origin {
        let _ = write!(
            line,
            ":{}:{}",
            meta.file().unwrap_or("?"),
            meta.line().unwrap_or(0)
        );
    }
    line.push_str("] ");
    let mut v = LineVisitor(&mut line, false);
    event.record(&mut v);
    // One event, one line, whatever its message holds.
    let mut out: String = line
        .chars()
        .map(|c| if c == '\n' { ' ' } else { c })
        .collect();
    out.push('\n');
    out
}

/// The message first, then `key=value` for every other field.
struct LineVisitor<'a>(&'a mut String, bool);

impl Visit for LineVisitor<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.0, "{value:?}");
        } else {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
        self.1 = true;
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.0.push_str(value);
        } else {
            let _ = write!(self.0, " {}={value}", field.name());
        }
        self.1 = true;
    }
}

/// Now as `YYYY-MM-DDTHH:MM:SS.nnnnnnnnn` in UTC, as Firecracker stamps lines.
pub fn utc_timestamp() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    format_utc(now.as_secs(), now.subsec_nanos())
}

fn format_utc(secs: u64, nanos: u32) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{nanos:09}",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// Days since 1970-01-01 → (year, month, day), proleptic Gregorian
/// (Howard Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    // Day 1..=31 and month 1..=12: they fit.
    let d = u32::try_from(doy - (153 * mp + 2) / 5 + 1).unwrap_or(1);
    let m = u32::try_from(if mp < 10 { mp + 3 } else { mp - 9 }).unwrap_or(1);
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_utc_civil_dates() {
        assert_eq!(format_utc(0, 0), "1970-01-01T00:00:00.000000000");
        // 2026-11-25T02:47:16 UTC.
        assert_eq!(
            format_utc(1_795_574_836, 170_508_186),
            "2026-11-25T02:47:16.170508186"
        );
        assert_eq!(format_utc(951_782_400, 1), "2000-02-29T00:00:00.000000001");
    }

    #[test]
    fn a_logger_without_a_path_is_refused() {
        // Only meaningful before any test configured one; configure() with
        // a path is exercised end to end (crates/spore/tests/firecracker_cli.rs).
        if !is_configured() {
            assert!(configure(&LoggerConfig::default(), "x").is_err());
        }
    }
}
