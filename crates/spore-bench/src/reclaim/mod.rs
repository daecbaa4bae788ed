//! `spore bench reclaim`: the seed's reclaim experiment (two memory hogs,
//! kill the second, give its size back to the host) for virtio-mem and the
//! balloon, on a Linux guest (`--linux-kernel`, in the nested harness) or on
//! the unikernel (`--uk`, host KVM).
//!
//! Each VM is a `spore vmm` process driven through its API; the host
//! memory actually released is the VMM's VmRSS before the reclaim minus
//! after it. The Linux side is in [`linux`]; this file has the unikernel
//! run and what both share.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use serde_json::{json, Value};

use crate::host::machine;
use crate::stats::median;
use crate::vmm::BenchVmm;

mod linux;

#[derive(Args, Debug)]
pub struct ReclaimArgs {
    /// The `memtest` unikernel (spore-uk): reclaim on host KVM.
    #[arg(long)]
    pub uk: Option<PathBuf>,
    /// A Linux kernel (the spore guest) whose initramfs runs
    /// `tests/nested/scenarios/guest/virtio-mem-snapshot.sh` (a shell
    /// command server on vsock port 5000).
    #[arg(long)]
    pub linux_kernel: Option<PathBuf>,
    #[arg(long)]
    pub linux_initrd: Option<PathBuf>,
    /// Sizes to reclaim, MiB.
    #[arg(long, value_delimiter = ',', default_value = "128,256,512,1024")]
    pub sizes: Vec<u64>,
    /// Mechanisms (Linux only): virtio-mem, balloon.
    #[arg(long, value_delimiter = ',', default_value = "virtio-mem,balloon")]
    pub mechanisms: Vec<String>,
    /// Reclaims per size (and mechanism).
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Size of the first hog, which stays (MiB). Linux: in a guest with
    /// 1 GiB of boot RAM; unikernel: a second tenant's blocks.
    #[arg(long, default_value_t = 768)]
    pub first_hog_mib: u64,
    #[arg(long, default_value_t = 2)]
    pub vcpus: u64,
}

pub fn run(a: ReclaimArgs) -> anyhow::Result<u8> {
    if a.runs == 0 || a.sizes.is_empty() || a.sizes.iter().any(|&s| s == 0 || s % 2 != 0) {
        bail!("--runs must be at least 1 and --sizes even numbers of MiB above 0");
    }
    let spore = std::env::current_exe().context("locating the spore binary")?;
    let scratch = std::env::temp_dir().join(format!("spore-bench-reclaim-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let result = match (&a.uk, &a.linux_kernel) {
        (Some(uk), None) => uk_bench(&spore, uk, &a, &scratch),
        (None, Some(k)) => linux::bench(&spore, k, &a, &scratch),
        _ => Err(anyhow::anyhow!(
            "give exactly one of --uk or --linux-kernel"
        )),
    };
    let _ = std::fs::remove_dir_all(&scratch);
    println!("{}", serde_json::to_string_pretty(&result?)?);
    Ok(0)
}

/// The largest power-of-two slot size (MiB, at most 128) dividing `size`,
/// so that a region of exactly `size` is a whole number of slots.
pub(crate) fn slot_mib(size: u64) -> u64 {
    let mut slot = 128;
    while slot > 2 && !size.is_multiple_of(slot) {
        slot /= 2;
    }
    slot
}

/// One size's results: times in ms, memory in MiB.
pub(crate) fn size_figures(
    size: u64,
    times_ms: &[f64],
    released_mib: &[f64],
    extra: Value,
) -> Value {
    let mut v = json!({
        "size_mib": size,
        "runs": times_ms.len(),
        "reclaim_ms": crate::stats::summary(times_ms),
        "host_released_mib": crate::stats::summary(released_mib),
    });
    if let (Value::Object(m), Value::Object(e)) = (&mut v, extra) {
        m.extend(e);
    }
    v
}

fn pair(line: &str, key: &str) -> Option<u64> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
}

/// The unikernel: tenant 2 holds `first_hog_mib` of blocks, tenant 1 gets
/// and fills the size, then is freed (its blocks unplugged at once).
fn uk_bench(spore: &Path, image: &Path, a: &ReclaimArgs, scratch: &Path) -> anyhow::Result<Value> {
    let mut results = Vec::new();
    for &size in &a.sizes {
        let (mut times, mut released, mut requests) = (vec![], vec![], vec![]);
        for run in 0..a.runs {
            let vm = BenchVmm::spawn(spore, &scratch.join("uk"))?;
            // The region is a whole number of 128 MiB slots.
            let region = (size + a.first_hog_mib).div_ceil(128) * 128;
            vm.api(
                "PUT",
                "/boot-source",
                &json!({
                    "kernel_image_path": image,
                    "boot_args": format!("mode=reclaim size={size} other={} hold_ms=500", a.first_hog_mib),
                })
                .to_string(),
            )?;
            vm.api(
                "PUT",
                "/machine-config",
                r#"{"vcpu_count": 1, "mem_size_mib": 64}"#,
            )?;
            vm.api(
                "PUT",
                "/hotplug/memory",
                &json!({"total_size_mib": region, "block_size_mib": 2, "slot_size_mib": 128})
                    .to_string(),
            )?;
            vm.api("PUT", "/actions", r#"{"action_type": "InstanceStart"}"#)?;
            vm.api(
                "PATCH",
                "/hotplug/memory",
                &json!({ "requested_size_mib": region }).to_string(),
            )?;
            let t = Duration::from_secs(120);
            vm.expect("memtest: filled", t)
                .with_context(|| format!("size {size} run {run}"))?;
            std::thread::sleep(Duration::from_millis(250));
            let before = vm.rss_kib()?;
            let line = vm.expect("memtest: reclaim bytes=", t)?;
            vm.expect("memtest: reclaimed", t)?;
            std::thread::sleep(Duration::from_millis(250));
            let after = vm.rss_kib()?;
            let status = vm.wait_exit(t)?;
            if !status.success() {
                bail!("memtest failed ({status}) at size {size}");
            }
            let us = pair(&line, "unplug_us").context("no unplug_us")?;
            times.push(us as f64 / 1e3);
            released.push(before.saturating_sub(after) as f64 / 1024.0);
            requests.push(pair(&line, "requests").unwrap_or(0) as f64);
        }
        eprintln!(
            "reclaim (unikernel) {size} MiB: median {:.2} ms, host released {:.0} MiB",
            median(&times),
            median(&released)
        );
        results.push(size_figures(
            size,
            &times,
            &released,
            json!({ "unplug_requests": median(&requests) }),
        ));
    }
    Ok(json!({
        "benchmark": "reclaim",
        "guest": "unikernel",
        "mechanism": "virtio-mem (whole-block tenants: no migration, no zeroing)",
        "first_hog_mib": a.first_hog_mib,
        "block_size_mib": 2,
        "timed": "guest TSC around the tenant's UNPLUG requests (each answered after the host released the blocks)",
        "machine": machine(),
        "results": results,
    }))
}
