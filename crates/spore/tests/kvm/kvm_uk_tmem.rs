//! Host-KVM tier: the unikernel tmem client (`tmem-check`) against the
//! VMM's tmem device: round trips of 1 B, 4 KiB and 1 MiB, short gets,
//! invalidate, batches, stats and flush, then 10,000 random operations
//! checked against a model, all checked inside the guest.

use crate::common::*;

#[test]
fn kvm_unikernel_tmem_client_round_trips() {
    require_kvm();
    let out = spore()
        .args(["run", "--mem", "64M", "--kernel"])
        .arg(uk_image("tmem-check"))
        .output()
        .unwrap();
    let stdout = stdout_of(&out);
    assert!(
        stdout.contains("10000 random operations matched the model"),
        "stdout: {stdout}"
    );
    assert!(stdout.contains("tmem-check: passed"), "stdout: {stdout}");
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr_of(&out));
}
