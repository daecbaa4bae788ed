//! Host-KVM tier: `spore bench snapshot` runs end to end on a small guest
//! (every restore path, the working-set recording run included) and its JSON
//! has every field with sane values. No timing thresholds: speed is the
//! benchmark's business, not the tests'.

use serde_json::Value;

use crate::common::bench::positive;
use crate::common::*;

#[test]
fn kvm_bench_snapshot_small_reports_every_path() {
    require_kvm();
    // A benchmark measures the host: no other test runs VMs meanwhile.
    host::alone();
    let image = uk_image("snapbench");
    let s = Scratch::new("bench-snapshot");
    let out = spore()
        .args(["bench", "snapshot", "--uk"])
        .arg(&image)
        .args(["--sizes", "64M", "--runs", "1", "--create-runs", "1"])
        .arg("--dir")
        .arg(s.path("snaps"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    let v: Value = serde_json::from_str(&stdout_of(&out)).unwrap();
    let size = &v["sizes"][0];
    assert_eq!(size["mem_bytes"], 64u64 << 20);
    assert_eq!(size["touched_pages"], (64u64 << 20) / 4096 / 10);
    let full = &size["create"]["full"];
    positive(&full["ms"]["median"], "create ms");
    // Half the guest filled: the sparse file holds about that much.
    let disk = positive(&full["mem_file_on_disk_bytes"], "on-disk bytes");
    assert!(
        disk >= (32u64 << 20) as f64 && disk < (48u64 << 20) as f64,
        "{disk}"
    );
    for mode in ["lazy", "eager", "working_set", "uffd"] {
        let r = &size["restore"][mode];
        let first = positive(&r["to_first_instruction_ms"]["median"], mode);
        let end = positive(&r["to_workload_end_ms"]["median"], mode);
        assert!(first <= end, "{mode}: {first} > {end}");
        positive(&r["load_request_ms"]["median"], mode);
    }
    let rec = &size["restore"]["working_set"]["recording_run"];
    // The set holds at least the touched pages' data.
    assert!(
        positive(&rec["working_set_bytes"], "ws bytes") >= (1638 * 4096) as f64,
        "{rec}"
    );
    positive(&size["working_set_speedup_over_lazy"], "speedup");
}
