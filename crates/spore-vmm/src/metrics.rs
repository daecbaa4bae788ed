//! Firecracker's metrics: JSON lines written to the file or FIFO that
//! `PUT /metrics` (or `firecracker --metrics-path`) names, every 60 s and on
//! `FlushMetrics`, in Firecracker's shape:
//!
//! ```text
//! {"utc_timestamp_ms":1795574836170,"api_server":{...},"get_api_requests":{...},
//!  "put_api_requests":{...},"patch_api_requests":{...},"vcpu":{...},"logger":{...}}
//! ```
//!
//! Only groups spore fills honestly are written: `api_server` (process
//! start-up times, from `--start-time-us`/`--start-time-cpu-us`/
//! `--parent-cpu-time-us`), the API request counts per resource and method
//! (`*_count`, and `*_fails` for answers ≥ 400), `vcpu` exits by kind,
//! `net` (every network interface together: frames and bytes each way,
//! frames dropped, malformed chains), and `logger` (lines and metric lines
//! that could not be written). Counters are,
//! as in Firecracker, the increase since the previous line; the start-up
//! times are absolute. Counting is one relaxed atomic add, so it runs always,
//! whether or not metrics are configured.

use std::fs::File;
use std::io::Write as _;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use serde_json::{json, Map, Value};

use crate::config::MetricsConfig;
use crate::host::lock;

/// How often metrics are written without being asked (Firecracker's period).
pub const FLUSH_PERIOD: Duration = Duration::from_secs(60);

/// A counter written as its increase since the previous flush.
#[derive(Default)]
pub struct Counter {
    total: AtomicU64,
    flushed: AtomicU64,
}

impl Counter {
    pub const fn new() -> Self {
        Self {
            total: AtomicU64::new(0),
            flushed: AtomicU64::new(0),
        }
    }

    pub fn inc(&self) {
        self.add(1);
    }

    pub fn add(&self, n: u64) {
        self.total.fetch_add(n, Ordering::Relaxed);
    }

    /// The increase since the last call.
    fn delta(&self) -> u64 {
        let now = self.total.load(Ordering::Relaxed);
        let before = self.flushed.swap(now, Ordering::Relaxed);
        now.wrapping_sub(before)
    }
}

/// Every counter spore keeps.
pub struct Metrics {
    pub logger_missed: Counter,
    pub metrics_missed: Counter,
    pub exit_io_in: Counter,
    pub exit_io_out: Counter,
    pub exit_mmio_read: Counter,
    pub exit_mmio_write: Counter,
    pub vcpu_failures: Counter,
    pub net: NetMetrics,
    startup_us: AtomicU64,
    startup_cpu_us: AtomicU64,
    api: [[Counter; 2]; API_KEYS.len()],
}

/// Firecracker's `net` group (its fields spore counts), all interfaces.
pub struct NetMetrics {
    pub rx_bytes: Counter,
    pub rx_packets: Counter,
    pub rx_fails: Counter,
    pub tx_bytes: Counter,
    pub tx_packets: Counter,
    pub tx_fails: Counter,
    pub tx_malformed_frames: Counter,
}

/// `(group, name)` of each API counter pair (`name_count`, `name_fails`).
const API_KEYS: [(&str, &str); 19] = [
    ("get_api_requests", "instance_info"),
    ("get_api_requests", "machine_cfg"),
    ("get_api_requests", "vmm_version"),
    ("get_api_requests", "vm_config"),
    ("get_api_requests", "balloon"),
    ("put_api_requests", "actions"),
    ("put_api_requests", "boot_source"),
    ("put_api_requests", "drive"),
    ("put_api_requests", "logger"),
    ("put_api_requests", "machine_cfg"),
    ("put_api_requests", "metrics"),
    ("put_api_requests", "vsock"),
    ("put_api_requests", "network"),
    ("put_api_requests", "balloon"),
    ("put_api_requests", "snapshot_create"),
    ("put_api_requests", "snapshot_load"),
    ("patch_api_requests", "machine_cfg"),
    ("patch_api_requests", "vm"),
    ("patch_api_requests", "network"),
];

pub static METRICS: Metrics = Metrics {
    logger_missed: Counter::new(),
    metrics_missed: Counter::new(),
    exit_io_in: Counter::new(),
    exit_io_out: Counter::new(),
    exit_mmio_read: Counter::new(),
    exit_mmio_write: Counter::new(),
    vcpu_failures: Counter::new(),
    net: NetMetrics {
        rx_bytes: Counter::new(),
        rx_packets: Counter::new(),
        rx_fails: Counter::new(),
        tx_bytes: Counter::new(),
        tx_packets: Counter::new(),
        tx_fails: Counter::new(),
        tx_malformed_frames: Counter::new(),
    },
    startup_us: AtomicU64::new(0),
    startup_cpu_us: AtomicU64::new(0),
    api: [const { [Counter::new(), Counter::new()] }; API_KEYS.len()],
};

/// Counts one API request by method and path; `failed` for a 4xx/5xx.
/// Requests outside Firecracker's metric groups are not counted.
pub fn count_api(method: &str, path: &str, failed: bool) {
    let path = path.trim_end_matches('/');
    let name = match (method, path) {
        ("GET", "") => "instance_info",
        ("GET" | "PUT" | "PATCH", "/machine-config") => "machine_cfg",
        ("GET", "/version") => "vmm_version",
        ("GET", "/vm/config") => "vm_config",
        (_, "/balloon") => "balloon",
        (_, "/actions") => "actions",
        (_, "/boot-source") => "boot_source",
        (_, p) if p.starts_with("/drives") => "drive",
        (_, p) if p.starts_with("/network-interfaces") => "network",
        (_, "/logger") => "logger",
        (_, "/metrics") => "metrics",
        (_, "/vsock") => "vsock",
        (_, "/snapshot/create") => "snapshot_create",
        (_, "/snapshot/load") => "snapshot_load",
        (_, "/vm") => "vm",
        _ => return,
    };
    let group = match method {
        "GET" => "get_api_requests",
        "PUT" => "put_api_requests",
        "PATCH" => "patch_api_requests",
        _ => return,
    };
    if let Some(i) = API_KEYS.iter().position(|&k| k == (group, name)) {
        METRICS.api[i][0].inc();
        if failed {
            METRICS.api[i][1].inc();
        }
    }
}

/// Records how long the process took to serve its API, from the start
/// times Firecracker's jailer passes (`--start-time-us` wall clock and
/// `--start-time-cpu-us` process CPU time, plus `--parent-cpu-time-us`).
pub fn record_startup(start_us: Option<u64>, start_cpu_us: Option<u64>, parent_cpu_us: u64) {
    if let Some(start) = start_us {
        let now = u64::try_from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_micros(),
        )
        .unwrap_or(u64::MAX);
        METRICS
            .startup_us
            .store(now.saturating_sub(start), Ordering::Relaxed);
    }
    if let Some(start) = start_cpu_us {
        let cpu = process_cpu_us().saturating_sub(start);
        METRICS
            .startup_cpu_us
            .store(cpu.saturating_add(parent_cpu_us), Ordering::Relaxed);
    }
}

/// This process's CPU time so far, in microseconds.
pub fn process_cpu_us() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into `ts`, which lives here.
    if unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) } != 0 {
        return 0;
    }
    (ts.tv_sec as u64).saturating_mul(1_000_000) + ts.tv_nsec as u64 / 1000
}

struct Writer {
    file: File,
    id: Option<String>,
}

static WRITER: Mutex<Option<Writer>> = Mutex::new(None);

/// Opens the metrics path and starts the periodic flush. Like Firecracker,
/// metrics are configured once per process.
pub fn configure(c: &MetricsConfig, id: &str) -> Result<(), String> {
    let mut w = lock(&WRITER);
    if w.is_some() {
        return Err(
            "metrics are already configured: reinitialization of metrics is not allowed".into(),
        );
    }
    if c.metrics_path.is_empty() {
        return Err("metrics_path must not be empty".into());
    }
    let file = crate::files::open_log_target(Path::new(&c.metrics_path))
        .map_err(|e| format!("cannot open the metrics path {}: {e}", c.metrics_path))?;
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(|| loop {
            std::thread::sleep(FLUSH_PERIOD);
            flush();
        })
        .map_err(|e| format!("cannot start the metrics thread: {e}"))?;
    *w = Some(Writer {
        file,
        id: c.emit_id.unwrap_or(false).then(|| id.to_string()),
    });
    Ok(())
}

/// Whether a metrics path is configured.
pub fn is_configured() -> bool {
    lock(&WRITER).is_some()
}

/// Writes one line now (nothing if no path is configured).
pub fn flush() {
    let mut guard = lock(&WRITER);
    let Some(w) = guard.as_mut() else {
        return;
    };
    let mut line = snapshot(w.id.as_deref()).to_string();
    line.push('\n');
    if w.file.write_all(line.as_bytes()).is_err() {
        METRICS.metrics_missed.inc();
    }
}

/// The current line as JSON (counters reset to their increase).
fn snapshot(id: Option<&str>) -> Value {
    let m = &METRICS;
    let now_ms = u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis(),
    )
    .unwrap_or(u64::MAX);
    let mut root = Map::new();
    if let Some(id) = id {
        root.insert("id".into(), json!(id));
    }
    root.insert("utc_timestamp_ms".into(), json!(now_ms));
    root.insert(
        "api_server".into(),
        json!({
            "process_startup_time_us": m.startup_us.load(Ordering::Relaxed),
            "process_startup_time_cpu_us": m.startup_cpu_us.load(Ordering::Relaxed),
        }),
    );
    for (i, (group, name)) in API_KEYS.iter().enumerate() {
        let g = root
            .entry(group.to_string())
            .or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(g) = g {
            g.insert(format!("{name}_count"), json!(m.api[i][0].delta()));
            g.insert(format!("{name}_fails"), json!(m.api[i][1].delta()));
        }
    }
    root.insert(
        "vcpu".into(),
        json!({
            "exit_io_in": m.exit_io_in.delta(),
            "exit_io_out": m.exit_io_out.delta(),
            "exit_mmio_read": m.exit_mmio_read.delta(),
            "exit_mmio_write": m.exit_mmio_write.delta(),
            "failures": m.vcpu_failures.delta(),
        }),
    );
    let n = &m.net;
    root.insert(
        "net".into(),
        json!({
            "rx_bytes_count": n.rx_bytes.delta(),
            "rx_packets_count": n.rx_packets.delta(),
            "rx_fails": n.rx_fails.delta(),
            "tx_bytes_count": n.tx_bytes.delta(),
            "tx_packets_count": n.tx_packets.delta(),
            "tx_fails": n.tx_fails.delta(),
            "tx_malformed_frames": n.tx_malformed_frames.delta(),
        }),
    );
    root.insert(
        "logger".into(),
        json!({
            "missed_log_count": m.logger_missed.delta(),
            "missed_metrics_count": m.metrics_missed.delta(),
        }),
    );
    Value::Object(root)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_have_firecrackers_groups_and_count_increases() {
        count_api("PUT", "/boot-source", false);
        count_api("PUT", "/boot-source/", true);
        count_api("GET", "/version", false);
        count_api("DELETE", "/boot-source", false);
        let v = snapshot(Some("vm1"));
        assert_eq!(v["id"], "vm1");
        assert!(v["utc_timestamp_ms"].as_u64().unwrap() > 1_700_000_000_000);
        // Other tests in this process may count too: at least ours.
        assert!(v["put_api_requests"]["boot_source_count"].as_u64().unwrap() >= 2);
        assert!(v["put_api_requests"]["boot_source_fails"].as_u64().unwrap() >= 1);
        assert!(v["get_api_requests"]["vmm_version_count"].as_u64().unwrap() >= 1);
        assert!(v["vcpu"]["exit_io_out"].is_u64());
        assert!(v["net"]["tx_malformed_frames"].is_u64());
        assert!(v["put_api_requests"]["network_count"].is_u64());
        assert!(v["api_server"]["process_startup_time_us"].is_u64());
        // Increases: a second line starts from zero again.
        let c = Counter::new();
        c.inc();
        c.inc();
        assert_eq!(c.delta(), 2);
        assert_eq!(c.delta(), 0);
    }
}
