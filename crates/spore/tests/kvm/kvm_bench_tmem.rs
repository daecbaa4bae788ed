//! Host-KVM tier: `spore bench tmem --quick` runs end to end (in-process,
//! the `tmem-bench` unikernel, kvserver through `spore vsock forward`) and
//! its JSON has every field with sane values. No timing thresholds: speed
//! is the benchmark's business, not the tests'.

use serde_json::Value;

use crate::common::bench::{at, positive};
use crate::common::*;

/// The number at `path` in `v`, which must be above zero.
#[track_caller]
fn positive_at(v: &Value, path: &str) -> f64 {
    positive(at(v, path), path)
}

#[track_caller]
fn stats_positive(v: &Value, path: &str) {
    for s in ["median", "p90", "min", "max"] {
        positive_at(v, &format!("{path}.{s}"));
    }
    assert!(positive_at(v, &format!("{path}.min")) <= positive_at(v, &format!("{path}.max")));
}

#[test]
fn kvm_bench_tmem_quick_reports_every_field() {
    require_kvm();
    // A benchmark measures the host: no other test runs VMs meanwhile.
    host::alone();
    let image = uk_image("tmem-bench");
    uk_image("kvserver");
    let out = spore()
        .args(["bench", "tmem", "--quick", "--uk-dir"])
        .arg(image.parent().unwrap())
        .output()
        .unwrap();
    let stderr = stderr_of(&out);
    assert_eq!(out.status.code(), Some(0), "stderr: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "summary: {stderr}");
    assert!(
        stderr.starts_with("tmem: guest 1 MiB put"),
        "summary: {stderr}"
    );
    let j: Value = serde_json::from_str(&stdout_of(&out)).expect("JSON on stdout");

    assert_eq!(j["benchmark"], "tmem");
    assert_eq!(j["quick"], true);
    assert!(!j["machine"]["cpu"].as_str().unwrap_or("").is_empty());

    for c in ["none", "lz4"] {
        let p = format!("vmm_in_process.compression.{c}");
        stats_positive(&j, &format!("{p}.one_mib.put_us"));
        stats_positive(&j, &format!("{p}.one_mib.get_us"));
        positive_at(&j, &format!("{p}.put_4k_us_per_object.single"));
        positive_at(&j, &format!("{p}.put_4k_us_per_object.batched"));
    }

    for op in ["put", "get"] {
        let p = format!("guest.one_mib.{op}");
        stats_positive(&j, &format!("{p}.guest_total_us"));
        let vmm = positive_at(&j, &format!("{p}.vmm_handling_us"));
        let rest = positive_at(&j, &format!("{p}.exit_and_guest_us"));
        // Every guest-timed call contains the VMM's handling of it.
        let total = positive_at(&j, &format!("{p}.guest_total_us.median"));
        assert!((vmm + rest - total).abs() < 1e-6 * total.max(1.0));
        positive_at(&j, &format!("guest.one_mib.seed_i5_8250u_us.{op}.total"));
    }
    assert_eq!(at(&j, "guest.one_mib.runs"), 5);
    // Seccomp's cost: the same calls with the filters on and off.
    for side in ["on", "off"] {
        for op in ["put", "get"] {
            stats_positive(&j, &format!("guest.seccomp_1m.{side}.{op}_guest_total_us"));
            positive_at(&j, &format!("guest.seccomp_1m.{side}.{op}_vmm_handling_us"));
        }
    }
    for op in ["put", "get"] {
        let pct = j["guest"]["seccomp_1m"][format!("{op}_cost_pct")].as_f64();
        assert!(pct.is_some_and(f64::is_finite), "{op}_cost_pct: {pct:?}");
    }

    let b = &j["guest"]["batching_4k"];
    assert_eq!(b["objects"], 256);
    assert_eq!(b["batch"], 64);
    assert_eq!(b["single"]["exits"], 256);
    assert_eq!(b["batched"]["exits"], 4);
    assert_eq!(b["exits_saved"], 252);
    for way in ["single", "batched"] {
        stats_positive(b, &format!("{way}.objects_per_s"));
        positive_at(b, &format!("{way}.vmm_handling_us_per_call"));
    }
    positive_at(b, "speedup");

    let sizes = j["kvserver"]["sizes"].as_array().expect("kvserver.sizes");
    let got: Vec<u64> = sizes
        .iter()
        .filter_map(|s| s["value_bytes"].as_u64())
        .collect();
    assert_eq!(got, [512, 1024, 4096, 16384, 65536]);
    for s in sizes {
        stats_positive(s, "set_cmds_per_s");
        stats_positive(s, "tmemput_cmds_per_s");
        positive_at(s, "tmemput_over_set");
    }
    assert_eq!(j["kvserver"]["values_per_run"], 64);
    assert_eq!(j["kvserver"]["pipeline"], 16);
}
