//! Host-KVM tier: `spore bench net` runs end to end on a short setting (its
//! own tap, the `httpd` unikernel with an echo port, every measurement
//! once), its JSON has every figure, and its tap is gone afterwards. No
//! timing thresholds: speed is the benchmark's business, not the tests'.
//! Needs root and /dev/net/tun, like the other virtio-net tests.

use serde_json::Value;

use crate::common::bench::positive;
use crate::common::net::require_tap;
use crate::common::*;

#[test]
fn kvm_bench_net_short_run_reports_every_figure_and_removes_its_tap() {
    require_kvm();
    // A benchmark measures the host: no other test runs VMs meanwhile.
    host::alone();
    require_tap();
    let image = uk_image("httpd");
    let out = spore()
        .args([
            "bench",
            "net",
            "--seconds",
            "1",
            "--pings",
            "200",
            "--runs",
            "1",
            "--uk",
        ])
        .arg(&image)
        .output()
        .unwrap();
    let stderr = stderr_of(&out);
    assert_eq!(out.status.code(), Some(0), "stderr: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "summary: {stderr}");
    assert!(stderr.starts_with("net (1 runs"), "summary: {stderr}");
    let j: Value = serde_json::from_str(&stdout_of(&out)).expect("JSON on stdout");
    assert_eq!(j["benchmark"], "net");
    assert!(!j["machine"]["cpu"].as_str().unwrap_or("").is_empty());
    for k in [
        "guest_to_host_mib_per_s",
        "host_to_guest_mib_per_s",
        "http_requests_per_s",
    ] {
        positive(&j[k]["median"], k);
        assert_eq!(j[k]["per_run"].as_array().map(Vec::len), Some(1), "{k}");
    }
    assert!(j["host_to_guest_posts_per_run"][0].as_u64().unwrap_or(0) >= 1);
    let ping = &j["ping_pong_us"];
    assert_eq!(ping["per_run"][0]["n"], 200);
    let p50 = positive(&ping["median_over_runs"]["p50"], "ping p50");
    assert!(positive(&ping["median_over_runs"]["p99"], "ping p99") >= p50);

    let tap = j["parameters"]["tap"].as_str().expect("the tap's name");
    let gone = std::process::Command::new("ip")
        .args(["link", "show", tap])
        .output()
        .unwrap();
    assert!(!gone.status.success(), "tap {tap} is still there");
}
