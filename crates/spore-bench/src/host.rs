//! What the benchmarks say about the host they ran on (CPU, kernel, KVM
//! module, load), and where they find the unikernel images.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

/// The directory of the unikernel images: `--uk-dir`, else `SPORE_UK_DIR`,
/// else this source tree's spore-uk build directory.
pub(crate) fn uk_dir(flag: &Option<PathBuf>) -> PathBuf {
    flag.clone()
        .or_else(|| std::env::var_os("SPORE_UK_DIR").map(PathBuf::from))
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../spore-uk/target/x86_64-unknown-none/release")
        })
}

/// The `machine` object of a bench's JSON: CPU model, cores, host kernel
/// and which KVM module serves `/dev/kvm`.
pub(crate) fn machine() -> Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let kvm = if Path::new("/sys/module/kvm_pvm").exists() {
        "kvm_pvm"
    } else if Path::new("/sys/module/kvm_amd").exists() {
        "kvm_amd"
    } else if Path::new("/sys/module/kvm_intel").exists() {
        "kvm_intel"
    } else {
        "unknown"
    };
    json!({
        "cpu": cpu,
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "host_kernel": kernel,
        "kvm": kvm,
    })
}

/// The host's 1-minute load average (timings on a busy host are inflated:
/// the benches say how busy it was).
pub(crate) fn loadavg() -> Value {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(Value::Null, |x| json!(x))
}
