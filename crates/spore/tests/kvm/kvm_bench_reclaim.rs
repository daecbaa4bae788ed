//! Host-KVM tier: `spore bench reclaim --uk` runs the unikernel reclaim and
//! reports times and the host memory released (a small size, one run: the
//! benchmark's plumbing, not its figures).

use crate::common::*;

#[test]
fn kvm_bench_reclaim_unikernel_reports_released_memory() {
    require_kvm();
    // A benchmark measures the host: no other test runs VMs meanwhile.
    host::alone();
    let o = spore()
        .args(["bench", "reclaim", "--uk"])
        .arg(uk_image("memtest"))
        .args(["--sizes", "32", "--runs", "2", "--first-hog-mib", "16"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr_of(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout_of(&o)).unwrap();
    assert_eq!(v["benchmark"], "reclaim");
    assert_eq!(v["guest"], "unikernel");
    let r = &v["results"][0];
    assert_eq!(r["size_mib"], 32);
    assert_eq!(r["runs"], 2);
    let released = r["host_released_mib"]["median"].as_f64().unwrap();
    // The tenant's 32 MiB leave the VMM; the other tenant's 16 MiB stay.
    assert!(
        (28.0..=40.0).contains(&released),
        "released {released} MiB: {v:#}"
    );
    let ms = r["reclaim_ms"]["median"].as_f64().unwrap();
    assert!(ms > 0.0 && ms < 10_000.0, "{ms} ms");
    // Bad arguments are refused with one clear line.
    let o = spore()
        .args(["bench", "reclaim", "--sizes", "3"])
        .output()
        .unwrap();
    assert!(!o.status.success());
}
