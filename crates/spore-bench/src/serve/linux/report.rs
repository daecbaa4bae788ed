//! The JSON report of `spore bench serve --linux` (medians per function,
//! size, strategy and temperature; speedups against the targets) and its
//! human table.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{json, Value};

use super::page_cache::Dropper;
use super::strategy::{Strategy, Temperature};
use super::{Cell, LinuxBenchArgs};

/// The server and client times of the cell's samples at `temp` that took
/// its strategy's start path, and the other paths taken.
pub(super) fn median_of(cell: &Cell, temp: Temperature) -> (Vec<f64>, Vec<f64>, Vec<String>) {
    let (mut server, mut client, mut other) = (Vec::new(), Vec::new(), Vec::new());
    for s in cell.samples.iter().filter(|s| s.temperature == temp) {
        if s.path == cell.strategy.path() {
            server.push(s.server_ms);
            client.push(s.client_ms);
        } else {
            other.push(format!("{} ({:.1} ms)", s.path, s.server_ms));
        }
    }
    (server, client, other)
}

/// The seed's figures and the targets of issue 17, to compare against.
fn targets() -> Value {
    json!({
        "source": "seed 003 (SnapFaaS on ARM, NTUA 2024): up to 1.7x (cold) and 2.5x (lukewarm) faster end to end than Firecracker Full+Diff snapshots merged with rebase-snap; issue 17: clone >= 10x faster than the merged full snapshot",
        "layered_ws_over_merged_cold": 1.7,
        "layered_ws_over_merged_lukewarm": 2.5,
        "clone_over_merged": 10.0,
    })
}

#[allow(clippy::too_many_arguments)]
pub(super) fn report(
    a: &LinuxBenchArgs,
    strategies: &[Strategy],
    temps: &[Temperature],
    cells: &[Cell],
    disk: Value,
    drop: &Dropper,
    image: &Path,
    kernel: &Path,
) -> Value {
    let mut results = Vec::new();
    // (function, mib, temp) -> strategy -> median server ms
    let mut medians: BTreeMap<(String, u32, &'static str), BTreeMap<&'static str, f64>> =
        BTreeMap::new();
    for c in cells {
        for &t in temps {
            let (server, client, other) = median_of(c, t);
            let m = crate::stats::median(&server);
            if !m.is_nan() {
                medians
                    .entry((c.function.clone(), c.mib, t.key()))
                    .or_default()
                    .insert(c.strategy.key(), m);
            }
            results.push(json!({
                "function": c.function,
                "memory_mib": c.mib,
                "strategy": c.strategy.key(),
                "temperature": t.key(),
                "start_path": c.strategy.path(),
                "median_ms": if m.is_nan() { Value::Null } else { json!(m) },
                "server_ms": crate::stats::summary(&server),
                "client_ms": crate::stats::summary(&client),
                "samples_ms": server,
                "other_start_paths": other,
                "error": c.error,
            }));
        }
    }
    let mut speedups = Vec::new();
    let ratio = |m: &BTreeMap<&str, f64>, num: &str, den: &str| {
        m.get(num)
            .zip(m.get(den))
            .filter(|(_, d)| **d > 0.0)
            .map(|(n, d)| n / d)
    };
    let mut met: BTreeMap<&str, Vec<bool>> = BTreeMap::new();
    for ((f, mib, t), m) in &medians {
        let ws = ratio(m, "merged_full", "layered_ws");
        let clone = ratio(m, "merged_full", "clone");
        let want_ws = if *t == "cold" { 1.7 } else { 2.5 };
        if let Some(x) = ws {
            met.entry(if *t == "cold" {
                "layered_ws_over_merged_cold"
            } else {
                "layered_ws_over_merged_lukewarm"
            })
            .or_default()
            .push(x >= want_ws);
        }
        if let Some(x) = clone {
            met.entry("clone_over_merged").or_default().push(x >= 10.0);
        }
        speedups.push(json!({
            "function": f, "memory_mib": mib, "temperature": t,
            "merged_over_layered_ws": ws,
            "merged_over_layered": ratio(m, "merged_full", "layered"),
            "merged_over_clone": clone,
            "cold_boot_over_merged": ratio(m, "cold_boot", "merged_full"),
            "cold_boot_over_layered_ws": ratio(m, "cold_boot", "layered_ws"),
        }));
    }
    let mut t = targets();
    for (k, v) in met {
        t[format!("{k}_met")] = json!(format!(
            "{} of {}",
            v.iter().filter(|x| **x).count(),
            v.len()
        ));
    }
    json!({
        "bench": "serve-linux",
        "machine": crate::host::machine(),
        "config": {
            "functions": a.functions, "memory_mib": a.sizes, "rounds": a.rounds,
            "strategies": strategies.iter().map(|s| json!({"name": s.key(), "what": s.describe(), "start_path": s.path()})).collect::<Vec<_>>(),
            "temperatures": temps.iter().map(|t| t.key()).collect::<Vec<_>>(),
            "cold_drop": a.cold_drop,
            "cold_drop_notes": drop.notes(),
            "image": image.display().to_string(),
            "kernel": kernel.display().to_string(),
            "measure": "X-Spore-Duration-Us of spore serve (invoke received to response ready), medians in ms; every invocation a new instance (--keep-alive-ms 0)",
        },
        "results": results,
        "speedups": speedups,
        "targets": t,
        "disk": disk,
    })
}

/// The human table: median ms per function, size and temperature, one
/// column per strategy, then the speedups over the merged full snapshot.
pub(super) fn table(report: &Value) -> String {
    let cols = [
        "cold_boot",
        "merged_full",
        "layered",
        "layered_ws",
        "clone",
        "warm",
    ];
    let mut rows: BTreeMap<(String, u64, String), BTreeMap<String, String>> = BTreeMap::new();
    for r in report["results"].as_array().into_iter().flatten() {
        let key = (
            r["function"].as_str().unwrap_or("").to_string(),
            r["memory_mib"].as_u64().unwrap_or(0),
            r["temperature"].as_str().unwrap_or("").to_string(),
        );
        let cell = match (r["median_ms"].as_f64(), r["error"].as_str()) {
            (Some(m), _) => format!("{m:.0}"),
            (None, Some(_)) => "failed".to_string(),
            (None, None) => "n/a".to_string(),
        };
        rows.entry(key)
            .or_default()
            .insert(r["strategy"].as_str().unwrap_or("").to_string(), cell);
    }
    let mut s = String::from(
        "\nmedian end-to-end ms (X-Spore-Duration-Us)\nfunction   MiB  temp      cold_boot  merged_full  layered  layered_ws  clone   warm  ws:merged  clone:merged\n",
    );
    for ((f, mib, t), m) in &rows {
        let get = |c: &str| m.get(c).cloned().unwrap_or_else(|| "-".into());
        let sp = report["speedups"].as_array().and_then(|v| {
            v.iter().find(|x| {
                x["function"] == json!(f)
                    && x["memory_mib"] == json!(mib)
                    && x["temperature"] == json!(t)
            })
        });
        let x = |k: &str| {
            sp.and_then(|v| v[k].as_f64())
                .map_or("-".to_string(), |v| format!("{v:.2}x"))
        };
        s.push_str(&format!(
            "{f:<10} {mib:>4}  {t:<8} {:>10} {:>12} {:>8} {:>11} {:>6} {:>6} {:>10} {:>13}\n",
            get(cols[0]),
            get(cols[1]),
            get(cols[2]),
            get(cols[3]),
            get(cols[4]),
            get(cols[5]),
            x("merged_over_layered_ws"),
            x("merged_over_clone"),
        ));
    }
    for d in report["disk"].as_array().into_iter().flatten() {
        s.push_str(&format!(
            "disk {} MiB: base {} bytes (shared); per function:",
            d["memory_mib"], d["base_bytes"]
        ));
        for (f, e) in d["functions"].as_object().into_iter().flatten() {
            s.push_str(&format!(
                " {f} diff {} + ws {} / merged {};",
                e["layered_diff"], e["working_set"], e["merged_full"]
            ));
        }
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::super::Sample;
    use super::*;

    fn cell(strategy: Strategy, ms: &[(Temperature, f64, &str)]) -> Cell {
        Cell {
            function: "lorem".into(),
            mib: 256,
            strategy,
            samples: ms
                .iter()
                .map(|(t, v, p)| Sample {
                    temperature: *t,
                    server_ms: *v,
                    client_ms: *v + 1.0,
                    path: p.to_string(),
                })
                .collect(),
            error: None,
        }
    }

    #[test]
    fn medians_count_only_the_strategys_start_path_and_speedups_follow() {
        use Temperature::*;
        let cells = vec![
            cell(
                Strategy::Merged,
                &[
                    (Cold, 900.0, "restore"),
                    (Cold, 1000.0, "restore"),
                    (Cold, 1100.0, "restore"),
                    (Lukewarm, 500.0, "restore"),
                ],
            ),
            cell(
                Strategy::LayeredWs,
                &[
                    (Cold, 400.0, "restore"),
                    (Cold, 9000.0, "cold"),
                    (Lukewarm, 250.0, "restore"),
                ],
            ),
            cell(
                Strategy::Clone,
                &[(Cold, 50.0, "clone"), (Lukewarm, 40.0, "clone")],
            ),
        ];
        let (server, _, other) = median_of(&cells[1], Cold);
        assert_eq!(server, [400.0]);
        assert_eq!(other.len(), 1, "the cold boot is reported, not counted");
        let a = LinuxBenchArgs {
            linux: true,
            linux_kernel: None,
            image_cache: None,
            fixtures: None,
            functions: vec!["lorem".into()],
            sizes: vec![256],
            rounds: 3,
            strategies: vec![],
            temperatures: vec![],
            cold_drop: "fadvise".into(),
            state_dir: None,
            keep_state: false,
            ready_timeout_s: 1,
            working_set_record_ms: 1,
            daemon_log: None,
        };
        let dropper = Dropper::new("fadvise".into(), vec![]);
        let r = report(
            &a,
            &[Strategy::LayeredWs, Strategy::Merged, Strategy::Clone],
            &[Lukewarm, Cold],
            &cells,
            json!([]),
            &dropper,
            Path::new("/i"),
            Path::new("/k"),
        );
        let sp = r["speedups"].as_array().unwrap();
        let cold = sp.iter().find(|s| s["temperature"] == "cold").unwrap();
        assert_eq!(cold["merged_over_layered_ws"], json!(2.5));
        assert_eq!(cold["merged_over_clone"], json!(20.0));
        let warm = sp.iter().find(|s| s["temperature"] == "lukewarm").unwrap();
        assert_eq!(warm["merged_over_layered_ws"], json!(2.0));
        assert_eq!(r["targets"]["layered_ws_over_merged_cold_met"], "1 of 1");
        assert_eq!(
            r["targets"]["layered_ws_over_merged_lukewarm_met"],
            "0 of 1"
        );
        assert_eq!(r["targets"]["clone_over_merged_met"], "2 of 2");
        let text = table(&r);
        assert!(text.contains("lorem"), "{text}");
        assert!(text.contains("2.50x"), "{text}");
    }
}
