//! A sandbox's metrics history (E2B's `get_metrics(start, end)`): envd's
//! `/metrics` sampled every [`SAMPLE_EVERY`] while the sandbox runs, kept in
//! the daemon's memory for the last [`KEEP`] samples (an hour), across its
//! pauses but not across a daemon restart.

use std::collections::VecDeque;
use std::path::Path;
use std::time::Duration;

use super::envd;

/// How often running sandboxes' metrics are sampled (E2B's interval).
pub const SAMPLE_EVERY: Duration = Duration::from_secs(5);
/// How many sandboxes are asked at once.
pub const SAMPLE_AT_ONCE: usize = 16;
/// The samples kept per sandbox: an hour's.
const KEEP: usize = 720;

/// One sandbox's samples, oldest first, each E2B's `SandboxMetric`.
#[derive(Default)]
pub struct History {
    samples: VecDeque<(u64, serde_json::Value)>,
}

impl History {
    /// Adds a sample (taken at its `timestampUnix`), the oldest going
    /// beyond [`KEEP`].
    pub fn push(&mut self, sample: serde_json::Value) {
        let at = sample["timestampUnix"].as_u64().unwrap_or(0);
        if self.samples.len() == KEEP {
            self.samples.pop_front();
        }
        self.samples.push_back((at, sample));
    }

    /// The samples taken in `start..=end` (Unix seconds; open ends when
    /// `None`).
    pub fn between(&self, start: Option<u64>, end: Option<u64>) -> Vec<serde_json::Value> {
        self.samples
            .iter()
            .filter(|(at, _)| start.is_none_or(|s| s <= *at) && end.is_none_or(|e| *at <= e))
            .map(|(_, m)| m.clone())
            .collect()
    }
}

/// How long envd may take to answer `/metrics` (a guest that accepts and
/// never answers must not hold up every sandbox's sampling).
const SAMPLE_LIMIT: Duration = Duration::from_secs(5);

/// A sample of a running sandbox now, from its envd.
pub async fn sample(uds: &Path, token: &str) -> anyhow::Result<serde_json::Value> {
    let asked = envd::request(uds, "GET", "/metrics", Some(token), None);
    let (status, body) = tokio::time::timeout(SAMPLE_LIMIT, asked)
        .await
        .map_err(|_| anyhow::anyhow!("envd's /metrics did not answer within {SAMPLE_LIMIT:?}"))??;
    if !status.is_success() {
        anyhow::bail!("envd's /metrics answered {status}");
    }
    let m: serde_json::Value =
        serde_json::from_slice(&body).map_err(|e| anyhow::anyhow!("envd's /metrics: {e}"))?;
    Ok(metric_json(&m, crate::clock::unix_ms()))
}

/// E2B's `SandboxMetric` from envd's `/metrics` sample taken at `now_ms`.
fn metric_json(m: &serde_json::Value, now_ms: u64) -> serde_json::Value {
    let n = |k: &str| m[k].as_u64().unwrap_or(0);
    serde_json::json!({
        "timestamp": crate::clock::iso_ms(now_ms),
        "timestampUnix": now_ms / 1000,
        "cpuCount": n("cpu_count"),
        "cpuUsedPct": m["cpu_used_pct"].as_f64().unwrap_or(0.0),
        "memUsed": n("mem_used"),
        "memTotal": n("mem_total"),
        "memCache": n("mem_cache"),
        "diskUsed": n("disk_used"),
        "diskTotal": n("disk_total"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envds_sample_becomes_e2bs_metric() {
        let m = serde_json::json!({
            "ts": 1, "cpu_count": 2, "cpu_used_pct": 12.5, "mem_total": 536_870_912u64,
            "mem_used": 100, "mem_cache": 7, "disk_total": 2048, "disk_used": 1024,
        });
        let e = metric_json(&m, 1_700_000_000_123);
        assert_eq!(e["timestampUnix"], 1_700_000_000);
        assert_eq!(e["timestamp"], "2023-11-14T22:13:20.123Z");
        assert_eq!(
            (e["cpuCount"].as_u64(), e["cpuUsedPct"].as_f64()),
            (Some(2), Some(12.5))
        );
        assert_eq!(e["memTotal"], 536_870_912u64);
        assert_eq!(
            (e["diskUsed"].as_u64(), e["diskTotal"].as_u64()),
            (Some(1024), Some(2048))
        );
        // A field envd left out reads as zero, never a failure.
        assert_eq!(metric_json(&serde_json::json!({}), 0)["memCache"], 0);
    }

    #[test]
    fn the_history_keeps_an_hour_and_answers_a_window() {
        let mut h = History::default();
        for at in 0..(KEEP as u64 + 10) {
            h.push(serde_json::json!({ "timestampUnix": 1000 + at * 5 }));
        }
        let all = h.between(None, None);
        assert_eq!(all.len(), KEEP);
        assert_eq!(all[0]["timestampUnix"], 1000 + 10 * 5);
        let window = h.between(Some(1100), Some(1110));
        let at: Vec<u64> = window
            .iter()
            .filter_map(|m| m["timestampUnix"].as_u64())
            .collect();
        assert_eq!(at, [1100, 1105, 1110]);
        assert!(h.between(Some(0), Some(999)).is_empty());
    }
}
