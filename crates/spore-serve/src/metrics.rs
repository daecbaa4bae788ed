//! Counters and latency histograms, rendered as Prometheus text at
//! `GET /metrics`. Written here rather than with a metrics crate because the
//! whole need is a few labelled counters and one histogram family, rendered in
//! one function; gauges (instances, memory) are read at scrape time.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

/// How an invocation got its instance, fastest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum StartPath {
    /// A provisioned instance: a clone started ahead, never invoked before
    /// (used once, then replaced).
    Provisioned,
    /// An idle instance of the same function and version.
    Warm,
    /// A new clone of the function's zygote.
    Clone,
    /// A restore of the version's snapshot (which also made the zygote,
    /// unless zygotes are off or demoted).
    Restore,
    /// A boot (which also made the snapshot and the zygote).
    Cold,
}

impl StartPath {
    pub fn as_str(self) -> &'static str {
        match self {
            StartPath::Provisioned => "provisioned",
            StartPath::Warm => "warm",
            StartPath::Clone => "clone",
            StartPath::Restore => "restore",
            StartPath::Cold => "cold",
        }
    }
}

/// Upper bounds (seconds) of the latency buckets.
const BUCKETS: [f64; 14] = [
    0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0,
];

#[derive(Default)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

#[derive(Default)]
struct Inner {
    /// (function, start path, outcome) → invocations.
    invocations: BTreeMap<(String, &'static str, &'static str), u64>,
    /// function → throttled requests.
    throttles: BTreeMap<String, u64>,
    /// start path → latency (request received → response ready).
    latency: BTreeMap<&'static str, Histogram>,
    /// base name (`<runtime>-<mib>`) → its runtime base snapshot.
    bases: BTreeMap<String, BaseStat>,
    /// function → its snapshot's layer over a base.
    diffs: BTreeMap<String, DiffStat>,
    /// function → snapshots written (full or diff) and recorded.
    snapshots_written: BTreeMap<String, u64>,
    /// function → snapshots fetched from another node of the cluster.
    snapshots_fetched: BTreeMap<String, u64>,
}

/// A runtime base snapshot: its id and size, and how often it was built and
/// reused (a function snapshot made on top of it).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BaseStat {
    pub id: String,
    pub disk_bytes: u64,
    pub builds: u64,
    pub reuses: u64,
}

/// A function snapshot that is a Diff on a base.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DiffStat {
    pub base: String,
    pub base_id: String,
    pub disk_bytes: u64,
}

/// Gauges read when `/metrics` is scraped.
pub struct Gauges {
    /// (function, state) → instances.
    pub instances: BTreeMap<(String, &'static str), u64>,
    /// Host memory (PSS) held by instances, and by zygotes (templates).
    pub instance_bytes: u64,
    pub template_bytes: u64,
    /// Every process under the daemon (what the memory budget bounds).
    pub all_bytes: u64,
}

#[derive(Default)]
pub struct Metrics {
    inner: Mutex<Inner>,
}

impl Metrics {
    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records one invocation: `outcome` is `success`, `function_error` or
    /// `timeout`.
    pub fn invoked(&self, function: &str, path: StartPath, outcome: &'static str, seconds: f64) {
        let mut m = self.inner();
        *m.invocations
            .entry((function.to_string(), path.as_str(), outcome))
            .or_default() += 1;
        let h = m.latency.entry(path.as_str()).or_default();
        h.count += 1;
        h.sum += seconds;
        for (i, le) in BUCKETS.iter().enumerate() {
            if seconds <= *le {
                h.counts[i] += 1;
            }
        }
    }

    pub fn throttled(&self, function: &str) {
        *self
            .inner()
            .throttles
            .entry(function.to_string())
            .or_default() += 1;
    }

    /// A base snapshot was built (`built`) or found and reused.
    pub fn base_used(&self, name: &str, id: &str, disk_bytes: u64, built: bool) {
        let mut m = self.inner();
        let b = m.bases.entry(name.to_string()).or_default();
        b.id = id.to_string();
        b.disk_bytes = disk_bytes;
        if built {
            b.builds += 1;
        } else {
            b.reuses += 1;
        }
    }

    /// A function's snapshot was written as a Diff on a base (and counted
    /// by [`Metrics::snapshot_written`]).
    pub fn diff_written(&self, function: &str, diff: DiffStat) {
        let mut m = self.inner();
        m.diffs.insert(function.to_string(), diff);
        *m.snapshots_written.entry(function.to_string()).or_default() += 1;
    }

    /// A function's snapshot (full) was written and recorded: from now on
    /// it survives a restart of the daemon.
    pub fn snapshot_written(&self, function: &str) {
        *self
            .inner()
            .snapshots_written
            .entry(function.to_string())
            .or_default() += 1;
    }

    /// A function's snapshot was fetched from another node and recorded.
    pub fn snapshot_fetched(&self, function: &str) {
        *self
            .inner()
            .snapshots_fetched
            .entry(function.to_string())
            .or_default() += 1;
    }

    /// Bases and function diffs so far (for tests).
    pub fn layers(&self) -> (BTreeMap<String, BaseStat>, BTreeMap<String, DiffStat>) {
        let m = self.inner();
        (m.bases.clone(), m.diffs.clone())
    }

    /// Invocations so far by start path (for tests and `spore fn stats`).
    pub fn by_path(&self) -> BTreeMap<&'static str, u64> {
        let mut out = BTreeMap::new();
        for ((_, path, _), n) in &self.inner().invocations {
            *out.entry(*path).or_default() += n;
        }
        out
    }

    /// Everything in Prometheus's text format: the counters and histograms
    /// kept here, then `gauges` (read from the instances at scrape time).
    pub fn render(&self, gauges: &Gauges) -> String {
        let m = self.inner();
        let mut out = String::new();
        render_invocations(&m, &mut out);
        render_snapshots(&m, &mut out);
        render_gauges(gauges, &mut out);
        out
    }
}

/// Invocations, errors, throttles and the latency histograms.
fn render_invocations(m: &Inner, out: &mut String) {
    out.push_str(
        "# HELP spore_invocations_total Invocations by function, start path and outcome.\n",
    );
    out.push_str("# TYPE spore_invocations_total counter\n");
    for ((f, path, outcome), n) in &m.invocations {
        let _ = writeln!(
                out,
                "spore_invocations_total{{function=\"{}\",start_path=\"{path}\",outcome=\"{outcome}\"}} {n}",
                escape(f)
            );
    }
    out.push_str(
        "# HELP spore_errors_total Invocations that ended in a function error or a timeout.\n",
    );
    out.push_str("# TYPE spore_errors_total counter\n");
    let mut errors: BTreeMap<&str, u64> = BTreeMap::new();
    for ((f, _, outcome), n) in &m.invocations {
        if *outcome != "success" {
            *errors.entry(f).or_default() += n;
        }
    }
    for (f, n) in errors {
        let _ = writeln!(out, "spore_errors_total{{function=\"{}\"}} {n}", escape(f));
    }
    per_function_counter(
        out,
        "spore_throttles_total",
        "Requests refused with 429.",
        &m.throttles,
    );
    out.push_str(
        "# HELP spore_invoke_duration_seconds Request received to response ready, by start path.\n",
    );
    out.push_str("# TYPE spore_invoke_duration_seconds histogram\n");
    for (path, h) in &m.latency {
        for (i, le) in BUCKETS.iter().enumerate() {
            let _ = writeln!(
                out,
                "spore_invoke_duration_seconds_bucket{{start_path=\"{path}\",le=\"{le}\"}} {}",
                h.counts[i]
            );
        }
        let _ = writeln!(
            out,
            "spore_invoke_duration_seconds_bucket{{start_path=\"{path}\",le=\"+Inf\"}} {}",
            h.count
        );
        let _ = writeln!(
            out,
            "spore_invoke_duration_seconds_sum{{start_path=\"{path}\"}} {}",
            h.sum
        );
        let _ = writeln!(
            out,
            "spore_invoke_duration_seconds_count{{start_path=\"{path}\"}} {}",
            h.count
        );
    }
}

/// Runtime bases, function diffs and snapshots written.
fn render_snapshots(m: &Inner, out: &mut String) {
    out.push_str("# HELP spore_base_snapshot_bytes Runtime base snapshots: memory file bytes on disk, by base and snapshot id.\n");
    out.push_str("# TYPE spore_base_snapshot_bytes gauge\n");
    for (name, b) in &m.bases {
        let _ = writeln!(
            out,
            "spore_base_snapshot_bytes{{base=\"{}\",id=\"{}\"}} {}",
            escape(name),
            escape(&b.id),
            b.disk_bytes
        );
    }
    out.push_str("# HELP spore_base_snapshot_uses_total Function snapshots started from a runtime base: built for it, or reused.\n");
    out.push_str("# TYPE spore_base_snapshot_uses_total counter\n");
    for (name, b) in &m.bases {
        for (how, n) in [("built", b.builds), ("reused", b.reuses)] {
            let _ = writeln!(
                out,
                "spore_base_snapshot_uses_total{{base=\"{}\",id=\"{}\",how=\"{how}\"}} {n}",
                escape(name),
                escape(&b.id)
            );
        }
    }
    out.push_str("# HELP spore_function_diff_bytes Function snapshots that are a diff on a base: memory file bytes on disk.\n");
    out.push_str("# TYPE spore_function_diff_bytes gauge\n");
    for (f, d) in &m.diffs {
        let _ = writeln!(
            out,
            "spore_function_diff_bytes{{function=\"{}\",base=\"{}\",base_id=\"{}\"}} {}",
            escape(f),
            escape(&d.base),
            escape(&d.base_id),
            d.disk_bytes
        );
    }
    per_function_counter(
        out,
        "spore_snapshots_written_total",
        "Function snapshots written and recorded (they survive a daemon restart).",
        &m.snapshots_written,
    );
    // Only a cluster node fetches: a single daemon's text goes without it.
    if !m.snapshots_fetched.is_empty() {
        per_function_counter(
            out,
            "spore_snapshots_fetched_total",
            "Function snapshots fetched from another node of the cluster.",
            &m.snapshots_fetched,
        );
    }
}

/// A counter labelled by function: its HELP and TYPE lines and a sample
/// per function.
fn per_function_counter(out: &mut String, name: &str, help: &str, counts: &BTreeMap<String, u64>) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
    for (f, n) in counts {
        let _ = writeln!(out, "{name}{{function=\"{}\"}} {n}", escape(f));
    }
}

/// Instances by state and the memory they hold.
fn render_gauges(gauges: &Gauges, out: &mut String) {
    out.push_str("# HELP spore_instances Function instances by state.\n");
    out.push_str("# TYPE spore_instances gauge\n");
    for ((f, state), n) in &gauges.instances {
        let _ = writeln!(
            out,
            "spore_instances{{function=\"{}\",state=\"{state}\"}} {n}",
            escape(f)
        );
    }
    out.push_str("# HELP spore_memory_bytes Host memory (PSS) held by VMM processes.\n");
    out.push_str("# TYPE spore_memory_bytes gauge\n");
    let _ = writeln!(
        out,
        "spore_memory_bytes{{held_by=\"instances\"}} {}",
        gauges.instance_bytes
    );
    let _ = writeln!(
        out,
        "spore_memory_bytes{{held_by=\"templates\"}} {}",
        gauges.template_bytes
    );
    let _ = writeln!(
        out,
        "spore_memory_bytes{{held_by=\"all\"}} {}",
        gauges.all_bytes
    );
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Every sample of `text` labelled `node="ID"`: a cluster node's series,
/// which one scrape of all nodes must tell apart. Samples that name their
/// node already (`spore_cluster_*`) are left as they are.
pub fn with_node(text: &str, node: &str) -> String {
    let label = format!("node=\"{}\"", escape(node));
    let mut out = String::with_capacity(text.len() + text.len() / 4);
    for line in text.lines() {
        let labelled = match (line.starts_with('#') || line.is_empty(), line.find('{')) {
            (true, _) => None,
            (false, Some(open)) => {
                let labels =
                    &line[open + 1..line[open..].find('}').map_or(line.len(), |c| open + c)];
                let comma = if labels.is_empty() { "" } else { "," };
                (!labels.split(',').any(|l| l.starts_with("node=\"")))
                    .then(|| format!("{}{{{label}{comma}{}", &line[..open], &line[open + 1..]))
            }
            (false, None) => line
                .split_once(' ')
                .map(|(name, value)| format!("{name}{{{label}}} {value}")),
        };
        out.push_str(labelled.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

/// The lines of a rendered `/metrics` text that `caller` may see: the
/// series of its own functions (labelled with their plain names), and for
/// the default account (the operator's) the host-wide ones too. Comments
/// are kept.
pub fn for_account(text: &str, caller: &crate::accounts::Account) -> String {
    const LABEL: &str = "function=\"";
    let operator = caller.id == crate::accounts::DEFAULT_ACCOUNT;
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        if line.starts_with('#') {
            out.push_str(line);
        } else if let Some(at) = line.find(LABEL) {
            let start = at + LABEL.len();
            let Some(len) = line[start..].find('"') else {
                continue;
            };
            let key = &line[start..start + len];
            if !caller.owns(key) {
                continue;
            }
            out.push_str(&line[..start]);
            out.push_str(crate::accounts::plain_name(key));
            out.push_str(&line[start + len..]);
        } else if operator {
            out.push_str(line);
        } else {
            continue;
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_nodes_samples_carry_its_id() {
        let text = "# HELP a A.\n# TYPE a gauge\na 1\nb{function=\"f\"} 2\nc{} 3\n\
                    spore_cluster_fenced{node=\"n1\"} 0\n";
        assert_eq!(
            with_node(text, "n1"),
            "# HELP a A.\n# TYPE a gauge\na{node=\"n1\"} 1\nb{node=\"n1\",function=\"f\"} 2\n\
             c{node=\"n1\"} 3\nspore_cluster_fenced{node=\"n1\"} 0\n"
        );
    }

    #[test]
    fn renders_counters_and_histograms() {
        let m = Metrics::default();
        m.invoked("f", StartPath::Cold, "success", 0.004);
        m.invoked("f", StartPath::Warm, "success", 0.0003);
        m.invoked("f", StartPath::Warm, "function_error", 0.0004);
        m.throttled("f");
        let text = m.render(&Gauges {
            instances: BTreeMap::from([(("f".to_string(), "idle"), 2)]),
            instance_bytes: 10,
            template_bytes: 20,
            all_bytes: 40,
        });
        assert!(text.contains(
            "spore_invocations_total{function=\"f\",start_path=\"warm\",outcome=\"success\"} 1"
        ));
        assert!(text.contains("spore_errors_total{function=\"f\"} 1"));
        assert!(text.contains("spore_throttles_total{function=\"f\"} 1"));
        assert!(text
            .contains("spore_invoke_duration_seconds_bucket{start_path=\"warm\",le=\"0.0005\"} 2"));
        assert!(text
            .contains("spore_invoke_duration_seconds_bucket{start_path=\"cold\",le=\"0.002\"} 0"));
        assert!(text.contains("spore_instances{function=\"f\",state=\"idle\"} 2"));
        assert_eq!(m.by_path().get("warm"), Some(&2));
    }

    #[test]
    fn renders_bases_and_diffs() {
        let m = Metrics::default();
        m.base_used("python3-256", "abc", 40 << 20, true);
        m.base_used("python3-256", "abc", 40 << 20, false);
        m.diff_written(
            "hello",
            DiffStat {
                base: "python3-256".into(),
                base_id: "abc".into(),
                disk_bytes: 3 << 20,
            },
        );
        let text = m.render(&Gauges {
            instances: BTreeMap::new(),
            instance_bytes: 0,
            template_bytes: 0,
            all_bytes: 0,
        });
        assert!(text.contains(&format!(
            "spore_base_snapshot_bytes{{base=\"python3-256\",id=\"abc\"}} {}",
            40 << 20
        )));
        assert!(text.contains(
            "spore_base_snapshot_uses_total{base=\"python3-256\",id=\"abc\",how=\"built\"} 1"
        ));
        assert!(text.contains(
            "spore_base_snapshot_uses_total{base=\"python3-256\",id=\"abc\",how=\"reused\"} 1"
        ));
        assert!(text.contains(&format!(
            "spore_function_diff_bytes{{function=\"hello\",base=\"python3-256\",base_id=\"abc\"}} {}",
            3 << 20
        )));
    }

    #[test]
    fn accounts_see_their_own_series_only() {
        use crate::accounts::{Account, Limits};
        let text = "# HELP x y\nspore_memory_bytes{held_by=\"all\"} 5\nspore_errors_total{function=\"echo\"} 1\nspore_errors_total{function=\"111111111111:echo\"} 2\n";
        let op = for_account(text, &Account::default_account());
        assert_eq!(
            op,
            "# HELP x y\nspore_memory_bytes{held_by=\"all\"} 5\nspore_errors_total{function=\"echo\"} 1\n"
        );
        let a = for_account(text, &Account::new("111111111111", Limits::default()));
        assert_eq!(a, "# HELP x y\nspore_errors_total{function=\"echo\"} 2\n");
    }
}
