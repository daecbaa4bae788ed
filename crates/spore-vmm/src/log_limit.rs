//! Per-call-site rate limit for log lines.
//!
//! Many warnings are triggered by the guest (junk on the signal port, a bad
//! virtio request, a register nobody has): a guest that repeats one in a loop
//! must not fill the host's disk through spore's log. Each call site may emit
//! [`BURST`] lines per [`PERIOD`]; the rest of that period's lines from the
//! site are dropped and counted. The first line the site emits in a later
//! period is preceded by one line saying how many were dropped, and every
//! drop is counted in the metrics (`logger.missed_log_count`), so nothing is
//! lost silently. (Firecracker's logger gives its guest-triggerable errors
//! the same treatment.)
//!
//! The limit is a [`Layer`] whose `event_enabled` decides for every output
//! at once (stderr and the `PUT /logger` file alike). `DEBUG` and `TRACE`
//! lines pass unlimited: they are only on when someone asked for them.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tracing::callsite::Identifier;
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

use crate::host::lock;

/// Lines one call site may emit per period.
pub const BURST: u32 = 10;
/// The length of a period.
pub const PERIOD: Duration = Duration::from_secs(5);

/// One call site's budget in the current period.
struct Site {
    period_start: Instant,
    emitted: u32,
    dropped: u64,
}

/// What the limiter decided for one event.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// Emit it; `dropped` lines of this site were dropped before it.
    Emit {
        dropped: u64,
    },
    Drop,
}

/// The budgets of every call site that has logged at a limited level.
#[derive(Default)]
struct Budgets {
    sites: HashMap<Identifier, Site>,
}

impl Budgets {
    fn judge(&mut self, site: Identifier, now: Instant) -> Verdict {
        let s = self.sites.entry(site).or_insert(Site {
            period_start: now,
            emitted: 0,
            dropped: 0,
        });
        if now.duration_since(s.period_start) >= PERIOD {
            s.period_start = now;
            s.emitted = 0;
        }
        if s.emitted < BURST {
            s.emitted += 1;
            Verdict::Emit {
                dropped: std::mem::take(&mut s.dropped),
            }
        } else {
            s.dropped += 1;
            Verdict::Drop
        }
    }
}

/// The rate-limiting layer; install it in the subscriber beside the outputs.
pub struct RateLimit {
    budgets: Mutex<Budgets>,
}

/// The layer, for `tracing_subscriber::registry().with(...)`.
pub fn layer() -> RateLimit {
    RateLimit {
        budgets: Mutex::new(Budgets::default()),
    }
}

impl<S: Subscriber> Layer<S> for RateLimit {
    fn event_enabled(&self, event: &Event<'_>, _ctx: Context<'_, S>) -> bool {
        let meta = event.metadata();
        if *meta.level() > Level::INFO {
            return true;
        }
        let verdict = lock(&self.budgets).judge(meta.callsite(), Instant::now());
        match verdict {
            Verdict::Emit { dropped: 0 } => true,
            Verdict::Emit { dropped } => {
                // Emitted with the lock released: this event goes through
                // the layer again (at a call site of its own).
                tracing::warn!(
                    "{dropped} log lines from {}:{} were dropped by the rate limit ({BURST} per {}s)",
                    meta.file().unwrap_or("?"),
                    meta.line().unwrap_or(0),
                    PERIOD.as_secs()
                );
                true
            }
            Verdict::Drop => {
                crate::metrics::METRICS.logger_missed.inc();
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Not zero-sized: two zero-sized statics may share an address, and a
    // call site's identity is its address.
    struct Here(#[allow(dead_code)] u8);
    impl tracing::Callsite for Here {
        fn set_interest(&self, _: tracing::subscriber::Interest) {}
        fn metadata(&self) -> &tracing::Metadata<'_> {
            unimplemented!("not called by the limiter")
        }
    }
    static A: Here = Here(0);
    static B: Here = Here(1);

    fn id(site: &'static Here) -> Identifier {
        Identifier(site)
    }

    #[test]
    fn a_site_gets_its_burst_then_drops_then_reports_what_it_dropped() {
        let mut b = Budgets::default();
        let t0 = Instant::now();
        for _ in 0..BURST {
            assert_eq!(b.judge(id(&A), t0), Verdict::Emit { dropped: 0 });
        }
        for _ in 0..1000 {
            assert_eq!(b.judge(id(&A), t0 + Duration::from_secs(1)), Verdict::Drop);
        }
        // Another site has a budget of its own.
        assert_eq!(b.judge(id(&B), t0), Verdict::Emit { dropped: 0 });
        // The next period: the first line says what was dropped.
        assert_eq!(
            b.judge(id(&A), t0 + PERIOD),
            Verdict::Emit { dropped: 1000 }
        );
        assert_eq!(b.judge(id(&A), t0 + PERIOD), Verdict::Emit { dropped: 0 });
    }
}
