//! `spore bench report DIR`: one self-contained HTML page from the JSON the
//! benches saved in DIR (`make bench` writes them), with plots drawn by
//! `plotters` (SVG, inlined): for every bench, each figure's distribution
//! (min–max line, p50 dot, p99 tick) on a log axis, grouped by unit; and a
//! table of the seeds' published figures beside spore's (`seed_figures.json`).
//! A file that is not valid JSON is named on the page and on stderr, never a
//! panic.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::Args;
use plotters::prelude::*;
use serde_json::Value;

#[derive(Args, Debug)]
pub struct ReportArgs {
    /// Directory of saved bench JSON files (`*.json`).
    pub dir: PathBuf,
    /// Where to write the page (default: DIR/report.html).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// The seeds' published figures, with where spore's counterpart is found.
const SEED_FIGURES: &str = include_str!("seed_figures.json");

/// One summary found in a bench's JSON.
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    pub label: String,
    pub unit: String,
    pub p50: f64,
    pub p99: Option<f64>,
    pub min: Option<f64>,
    pub max: Option<f64>,
}

pub fn run(a: ReportArgs) -> anyhow::Result<u8> {
    let out = a.out.clone().unwrap_or_else(|| a.dir.join("report.html"));
    let html = render(&a.dir)?;
    let tmp = out.with_extension("html.tmp");
    std::fs::write(&tmp, html).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &out)?;
    eprintln!("spore bench report: wrote {}", out.display());
    Ok(0)
}

/// The page for every `*.json` in `dir`.
pub fn render(dir: &Path) -> anyhow::Result<String> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    let mut body = String::new();
    let mut loaded: Vec<(String, Value)> = Vec::new();
    for path in &files {
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let parsed = std::fs::read_to_string(path)
            .map_err(|e| e.to_string())
            .and_then(|t| serde_json::from_str::<Value>(&t).map_err(|e| e.to_string()));
        match parsed {
            Ok(v) => loaded.push((name, v)),
            Err(e) => {
                eprintln!("spore bench report: skipping {}: {e}", path.display());
                body.push_str(&format!(
                    "<p class=bad>Skipped <code>{}</code>: {}</p>\n",
                    escape(&path.display().to_string()),
                    escape(&e)
                ));
            }
        }
    }
    body.push_str(&seed_table(&loaded));
    for (name, v) in &loaded {
        let mut figures = Vec::new();
        collect(v, "", &mut figures);
        body.push_str(&format!("<h2>{}</h2>\n", escape(name)));
        if let Some(m) = v.get("machine") {
            body.push_str(&format!(
                "<p class=machine>machine: <code>{}</code></p>\n",
                escape(&m.to_string())
            ));
        }
        if figures.is_empty() {
            body.push_str("<p>No summaries (p50/median) in this file.</p>\n");
            continue;
        }
        let mut units: Vec<String> = figures.iter().map(|f| f.unit.clone()).collect();
        units.sort();
        units.dedup();
        for unit in units {
            let group: Vec<&Figure> = figures.iter().filter(|f| f.unit == unit).collect();
            body.push_str(&plot(&format!("{name} ({unit})"), &unit, &group)?);
        }
    }
    Ok(format!(
        "<!doctype html><html><head><meta charset=utf-8><title>spore benchmarks</title><style>\
body{{font-family:sans-serif;max-width:1100px;margin:2em auto}}table{{border-collapse:collapse}}\
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:left}}.bad{{color:#b00}}.machine{{color:#555;font-size:90%}}\
</style></head><body><h1>spore benchmarks</h1>\
<p>From the bench JSON in <code>{}</code>. Each line spans min–max, the dot is the median (p50), the tick p99; log axis.</p>\n{body}</body></html>\n",
        escape(&dir.display().to_string())
    ))
}

/// Every summary object (one with `p50` or `median`) in `v`, labelled by
/// its path; the unit is guessed from the key suffix (`_ms`, `_us`, ...).
pub fn collect(v: &Value, path: &str, out: &mut Vec<Figure>) {
    match v {
        Value::Object(m) => {
            let num = |k: &str| m.get(k).and_then(Value::as_f64);
            if let Some(p50) = num("p50").or_else(|| num("median")) {
                out.push(Figure {
                    label: path.trim_start_matches('.').to_string(),
                    unit: unit_of(path),
                    p50,
                    p99: num("p99").or_else(|| num("p90")),
                    min: num("min"),
                    max: num("max"),
                });
                return;
            }
            for (k, child) in m {
                collect(child, &format!("{path}.{k}"), out);
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                // Label array items by a distinguishing field when they have one.
                let tag = [
                    "mem_mib",
                    "size_mib",
                    "mib",
                    "size",
                    "concurrency",
                    "start",
                    "path",
                    "mode",
                    "name",
                ]
                .iter()
                .find_map(|k| {
                    child
                        .get(*k)
                        .map(|v| format!("{k}={}", v.to_string().trim_matches('"')))
                })
                .unwrap_or_else(|| i.to_string());
                collect(child, &format!("{path}[{tag}]"), out);
            }
        }
        _ => {}
    }
}

fn unit_of(path: &str) -> String {
    let last = path
        .rsplit(['.', '['])
        .find(|s| !s.is_empty())
        .unwrap_or("");
    for (suffix, unit) in [
        ("_ms", "ms"),
        ("_us", "µs"),
        ("_ns", "ns"),
        ("_kib", "KiB"),
        ("_mib", "MiB"),
        ("_per_s", "per s"),
    ] {
        if last.ends_with(suffix) {
            return unit.to_string();
        }
    }
    // A path segment naming the unit (e.g. `server_ms.p50` lives under it).
    for seg in path.rsplit(['.', '[']) {
        for (suffix, unit) in [
            ("_ms", "ms"),
            ("_us", "µs"),
            ("_kib", "KiB"),
            ("_mib", "MiB"),
        ] {
            if seg.ends_with(suffix) {
                return unit.to_string();
            }
        }
    }
    "value".to_string()
}

/// One SVG plot of a group of figures of the same unit.
fn plot(title: &str, unit: &str, figures: &[&Figure]) -> anyhow::Result<String> {
    let positive = |x: f64| x.is_finite() && x > 0.0;
    let values: Vec<f64> = figures
        .iter()
        .flat_map(|f| [Some(f.p50), f.p99, f.min, f.max])
        .flatten()
        .filter(|x| positive(*x))
        .collect();
    if values.is_empty() {
        return Ok(String::new());
    }
    let lo = values.iter().copied().fold(f64::MAX, f64::min) / 1.5;
    let hi = values.iter().copied().fold(0.0, f64::max) * 1.5;
    let rows = u16::try_from(figures.len()).context("too many figures for one plot")?;
    let height = 60 + 22 * u32::from(rows);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1000, height)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e}"))?;
        let n = i32::from(rows);
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 16))
            .margin(8)
            .x_label_area_size(28)
            .y_label_area_size(420)
            .build_cartesian_2d((lo..hi).log_scale(), 0..n)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let labels: Vec<String> = figures.iter().map(|f| f.label.clone()).collect();
        chart
            .configure_mesh()
            .y_labels(figures.len())
            .y_label_formatter(&|i| labels.get(*i as usize).cloned().unwrap_or_default())
            .x_desc(unit)
            .draw()
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        for (y, f) in (0..n).zip(figures) {
            if let (Some(a), Some(b)) = (f.min, f.max) {
                if positive(a) && positive(b) {
                    chart
                        .draw_series(LineSeries::new([(a, y), (b, y)], BLUE.stroke_width(2)))
                        .map_err(|e| anyhow::anyhow!("{e}"))?;
                }
            }
            if positive(f.p50) {
                chart
                    .draw_series([Circle::new((f.p50, y), 4, RED.filled())])
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
            }
            if let Some(p99) = f.p99.filter(|x| positive(*x)) {
                chart
                    .draw_series([Cross::new((p99, y), 4, BLACK.stroke_width(2))])
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
            }
        }
        root.present().map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    Ok(format!("<div>{svg}</div>\n"))
}

/// The seeds' figures beside spore's, where a saved bench has the figure.
fn seed_table(loaded: &[(String, Value)]) -> String {
    let Ok(seeds) = serde_json::from_str::<Value>(SEED_FIGURES) else {
        return String::new();
    };
    let mut rows = String::new();
    for s in seeds.as_array().into_iter().flatten() {
        let text = |k: &str| s.get(k).and_then(Value::as_str).unwrap_or("");
        let spore = loaded
            .iter()
            .find(|(name, _)| name == text("bench"))
            .and_then(|(_, v)| v.pointer(text("pointer")))
            .and_then(Value::as_f64)
            .map(|x| format!("{x:.3}"))
            .unwrap_or_else(|| "—".into());
        rows.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n",
            escape(text("seed")),
            escape(text("figure")),
            s.get("value").map(|v| v.to_string()).unwrap_or_default(),
            spore,
            escape(text("unit"))
        ));
    }
    format!(
        "<h2>Beside the seeds' published figures</h2>\n<p>Seed figures are from their papers' hardware, not measured here; compare shapes, not absolutes.</p>\n<table><tr><th>seed</th><th>figure</th><th>seed</th><th>spore</th><th>unit</th></tr>\n{rows}</table>\n"
    )
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_summaries_and_units() {
        let v = serde_json::json!({
            "echo": {"warm": {"server_ms": {"p50": 0.2, "p99": 0.5, "min": 0.1, "max": 0.9}}},
            "sizes": [{"size_mib": 128, "first_instruction_ms": {"median": 3.0}}],
            "count": 4,
        });
        let mut f = Vec::new();
        collect(&v, "", &mut f);
        assert_eq!(f.len(), 2);
        assert_eq!(f[0].label, "echo.warm.server_ms");
        assert_eq!(f[0].unit, "ms");
        assert_eq!(f[1].label, "sizes[size_mib=128].first_instruction_ms");
        assert_eq!(f[1].p50, 3.0);
    }

    #[test]
    fn renders_plots_and_names_bad_files() {
        let dir = std::env::temp_dir().join(format!("spore-report-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("serve.json"),
            r#"{"echo":{"clone":{"server_ms":{"p50":3.1,"p99":6.8,"min":2.0,"max":9.0,"n":200}}}}"#,
        )
        .unwrap();
        std::fs::write(dir.join("broken.json"), "{not json").unwrap();
        let html = render(&dir).unwrap();
        assert!(html.contains("<svg"), "a plot");
        assert!(html.contains("echo.clone.server_ms"));
        assert!(
            html.contains("Skipped") && html.contains("broken.json"),
            "the bad file is named"
        );
        assert!(html.contains("HyperFork"), "the seed table");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
