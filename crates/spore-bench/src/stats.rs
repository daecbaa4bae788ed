//! Statistics over sample sets, for every benchmark and the integration
//! tests: percentiles by nearest rank, the median, and the summary object
//! each bench reports for a sample set (its shape is the same in every
//! bench's JSON, so `spore bench report` can read them all).
//!
//! Samples are `f64` in whatever unit the caller measures; NaN samples
//! (a measurement that did not happen) are left out of every figure.

use serde::Serialize;
use serde_json::{json, Value};

/// The `p` quantile (`p` in 0..=1, clamped) of the samples by nearest rank:
/// `percentile(v, 0.0)` is the minimum, `percentile(v, 1.0)` the maximum.
/// NaN when there is no sample.
pub fn percentile(samples: &[f64], p: f64) -> f64 {
    let mut s: Vec<f64> = samples.iter().copied().filter(|x| !x.is_nan()).collect();
    if s.is_empty() {
        return f64::NAN;
    }
    s.sort_by(f64::total_cmp);
    #[allow(
        clippy::cast_possible_truncation,
        reason = "(len - 1) * p for p in 0..=1, rounded, is an index in 0..len"
    )]
    let rank = ((s.len() - 1) as f64 * p.clamp(0.0, 1.0)).round() as usize;
    s[rank]
}

/// The median (the 0.5 quantile by nearest rank); NaN when there is no
/// sample.
pub fn median(samples: &[f64]) -> f64 {
    percentile(samples, 0.5)
}

/// The figures a bench reports for one sample set.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Summary {
    pub median: f64,
    /// The median again, under the name latency reports use.
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub min: f64,
    pub max: f64,
    pub mean: f64,
    /// How many samples (NaN ones not counted).
    pub n: usize,
}

impl Summary {
    /// The summary of the samples; `None` when there is no (non-NaN) sample.
    pub fn of(samples: &[f64]) -> Option<Summary> {
        let n = samples.iter().filter(|x| !x.is_nan()).count();
        if n == 0 {
            return None;
        }
        let mean = samples.iter().filter(|x| !x.is_nan()).sum::<f64>() / n as f64;
        Some(Summary {
            median: median(samples),
            p50: median(samples),
            p90: percentile(samples, 0.9),
            p99: percentile(samples, 0.99),
            min: percentile(samples, 0.0),
            max: percentile(samples, 1.0),
            mean,
            n,
        })
    }
}

/// [`Summary::of`] as the benches' JSON puts it:
/// `{"median", "p50", "p90", "p99", "min", "max", "mean", "n"}`, or `null`
/// when there is no sample.
pub fn summary(samples: &[f64]) -> Value {
    Summary::of(samples).map_or(Value::Null, |s| json!(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_and_summary() {
        let v = [5.0, 1.0, 3.0, 2.0, 4.0];
        assert_eq!(median(&v), 3.0);
        assert_eq!(percentile(&v, 0.0), 1.0);
        assert_eq!(percentile(&v, 1.0), 5.0);
        assert!(median(&[]).is_nan());
        let s = summary(&v);
        assert_eq!(s["p50"], 3.0);
        assert_eq!(s["median"], 3.0);
        assert_eq!(s["mean"], 3.0);
        assert_eq!(s["n"], 5);
        assert_eq!(summary(&[]), Value::Null);
        assert_eq!(summary(&[f64::NAN]), Value::Null);
        assert_eq!(summary(&[f64::NAN, 2.0])["n"], 1);
    }

    #[test]
    fn the_summary_object_has_every_figure() {
        let s = summary(&[1.0, 2.0]);
        let keys: Vec<&str> = s.as_object().unwrap().keys().map(String::as_str).collect();
        let mut want = ["median", "p50", "p90", "p99", "min", "max", "mean", "n"];
        let mut got = keys.clone();
        want.sort();
        got.sort();
        assert_eq!(got, want);
        assert_eq!(
            Summary::of(&[1.0, 2.0]).map(|s| (s.min, s.max, s.mean)),
            Some((1.0, 2.0, 1.5))
        );
    }
}
