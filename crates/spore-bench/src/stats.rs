//! The one statistics helper of every benchmark: percentiles over a sample
//! set, and the summary object each bench reports for one (its shape is the
//! same in every bench's JSON, so `spore bench report` can read them all).

use serde_json::{json, Value};

/// The `p` quantile (0..=1) by nearest rank; NaN for no samples.
pub fn percentile(v: &[f64], p: f64) -> f64 {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| !x.is_nan()).collect();
    if s.is_empty() {
        return f64::NAN;
    }
    s.sort_by(f64::total_cmp);
    s[((s.len() - 1) as f64 * p.clamp(0.0, 1.0)).round() as usize]
}

pub fn median(v: &[f64]) -> f64 {
    percentile(v, 0.5)
}

/// `{"median", "p50", "p90", "p99", "min", "max", "mean", "n"}` of the
/// samples; `null` for none.
pub fn summary(v: &[f64]) -> Value {
    if v.iter().all(|x| x.is_nan()) {
        return Value::Null;
    }
    let n = v.iter().filter(|x| !x.is_nan()).count();
    let mean = v.iter().filter(|x| !x.is_nan()).sum::<f64>() / n as f64;
    json!({
        "median": median(v),
        "p50": median(v),
        "p90": percentile(v, 0.9),
        "p99": percentile(v, 0.99),
        "min": percentile(v, 0.0),
        "max": percentile(v, 1.0),
        "mean": mean,
        "n": n,
    })
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
        assert_eq!(summary(&[f64::NAN, 2.0])["n"], 1);
    }
}
