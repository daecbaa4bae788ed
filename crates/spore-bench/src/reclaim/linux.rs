//! `spore bench reclaim --linux-kernel`: the seed's §5.2 experiment on a
//! Linux guest (run it in the nested harness: `tests/nested/scenarios/
//! bench-reclaim.sh`).
//!
//! - virtio-mem: 1 GiB of boot RAM and a hotplug region of the size to
//!   reclaim, plugged at boot; balloon: 1 GiB plus the size, balloon empty.
//! - Two hogs: tmpfs files written with `dd` (shmem pages: movable and
//!   migratable like memhog's anonymous pages, and freed at once by `rm`,
//!   where killing a process would race its exit). The first holds
//!   `--first-hog-mib`, the second the size; both are written afresh each
//!   run, then the second is removed and its size reclaimed: virtio-mem target to 0,
//!   or balloon target to the size. Linux places the hogs' pages anywhere
//!   (the plugged memory is movable and used first), so unplugging migrates
//!   the first hog's pages: what the seed measured.
//! - Time: from the PATCH to the device reporting the target reached
//!   (virtio-mem `plugged_size_mib`; balloon `actual_mib`), polled every
//!   10 ms as the peer figures were. Host memory released: VMM VmRSS before
//!   minus after.
//!   Between runs the memory is given back to the guest (plug again, or
//!   deflate).

use std::io::{Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::{json, Value};
use spore_vmm::devices::virtio::vsock::host_connect::connect;

use super::{size_figures, slot_mib, ReclaimArgs};
use crate::host::machine;
use crate::stats::median;
use crate::vmm::BenchVmm;

const CMDLINE: &str =
    "console=ttyS0 quiet reboot=k panic=1 pci=off i8042.noaux i8042.nomux i8042.dumbkbd";
const BOOT_MIB: u64 = 1024;

/// The vsock port of the guest's command server.
const GUEST_SHELL_PORT: u32 = 5000;

/// How long the guest's shell may take to accept a connection.
const HANDSHAKE_TIMEOUT_SECS: u64 = 5;

/// Runs `cmd` in the guest's shell over vsock port 5000; returns its output.
fn guest(uds: &Path, cmd: &str, timeout: Duration) -> anyhow::Result<String> {
    let deadline = Instant::now() + timeout;
    loop {
        let attempt = (|| -> anyhow::Result<String> {
            let mut s = connect(uds, GUEST_SHELL_PORT, HANDSHAKE_TIMEOUT_SECS)?;
            s.write_all(format!("{cmd}\nexit\n").as_bytes())?;
            s.set_read_timeout(Some(deadline.saturating_duration_since(Instant::now())))?;
            let mut out = String::new();
            s.read_to_string(&mut out)?;
            Ok(out)
        })();
        match attempt {
            Ok(out) if !out.trim().is_empty() => return Ok(out),
            _ if Instant::now() >= deadline => {
                bail!("the guest did not run {cmd:?} within {timeout:?}")
            }
            _ => std::thread::sleep(Duration::from_millis(500)),
        }
    }
}

/// Polls `path` every 10 ms until `done` holds; the elapsed time in ms.
fn until(
    vm: &BenchVmm,
    path: &str,
    start: Instant,
    timeout: Duration,
    done: impl Fn(&Value) -> bool,
) -> anyhow::Result<f64> {
    loop {
        let v = vm.get(path)?;
        if done(&v) {
            return Ok(start.elapsed().as_secs_f64() * 1e3);
        }
        if start.elapsed() > timeout {
            bail!("GET {path} did not reach the target within {timeout:?}: {v}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn num(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or(u64::MAX)
}

pub fn bench(
    spore: &Path,
    kernel: &Path,
    a: &ReclaimArgs,
    scratch: &Path,
) -> anyhow::Result<Value> {
    let initrd = a
        .linux_initrd
        .as_ref()
        .context("--linux-initrd is required with --linux-kernel")?;
    let mut out = serde_json::Map::new();
    for mech in &a.mechanisms {
        if mech != "virtio-mem" && mech != "balloon" {
            bail!("unknown mechanism {mech:?} (virtio-mem, balloon)");
        }
        let mut results = Vec::new();
        for &size in &a.sizes {
            let r = one_size(spore, kernel, initrd, a, scratch, mech, size)
                .with_context(|| format!("{mech}, {size} MiB"))?;
            results.push(r);
        }
        out.insert(mech.clone(), Value::Array(results));
    }
    Ok(json!({
        "benchmark": "reclaim",
        "guest": "linux",
        "boot_ram_mib": BOOT_MIB,
        "first_hog_mib": a.first_hog_mib,
        "vcpus": a.vcpus,
        "hogs": "tmpfs files written with dd; the second removed before the reclaim",
        "timed": "PATCH of the target to the device reporting it reached, polled every 10 ms",
        "machine": machine(),
        "results": Value::Object(out),
    }))
}

/// One size under one mechanism: boots the guest with the memory plugged
/// (or the balloon empty), then `--runs` reclaims.
fn one_size(
    spore: &Path,
    kernel: &Path,
    initrd: &Path,
    a: &ReclaimArgs,
    scratch: &Path,
    mech: &str,
    size: u64,
) -> anyhow::Result<Value> {
    let vm = BenchVmm::spawn(spore, &scratch.join("linux"))?;
    let uds = vm.vsock_uds().to_path_buf();
    let balloon = mech == "balloon";
    boot(&vm, kernel, initrd, a.vcpus, balloon, size, &uds)?;
    guest(&uds, "echo up", Duration::from_secs(300)).context("the guest never answered")?;
    give_back(&vm, balloon, size)?;
    // Let the guest online what was plugged before the hogs start.
    std::thread::sleep(Duration::from_secs(2));
    let tmpfs = BOOT_MIB + size + 256;
    guest(
        &uds,
        &format!("mkdir -p /mnt/hog && mount -t tmpfs -o size={tmpfs}m tmpfs /mnt/hog && echo ok"),
        LONG,
    )?;
    let (mut times, mut released, mut vmm_ms) = (vec![], vec![], vec![]);
    for run in 0..a.runs {
        if run > 0 {
            give_back(&vm, balloon, size)?;
            std::thread::sleep(Duration::from_secs(1));
        }
        write_hogs(&uds, a.first_hog_mib, size)?;
        std::thread::sleep(Duration::from_millis(500));
        let before = vm.rss_kib()?;
        guest(&uds, "rm /mnt/hog/second && echo removed", LONG)?;
        let (ms, vmm) = reclaim(&vm, balloon, size)?;
        vmm_ms.extend(vmm);
        std::thread::sleep(Duration::from_millis(500));
        let after = vm.rss_kib()?;
        times.push(ms);
        released.push(before.saturating_sub(after) as f64 / 1024.0);
        eprintln!(
            "reclaim ({mech}) {size} MiB run {run}: {ms:.0} ms, VmRSS {} -> {} MiB",
            before / 1024,
            after / 1024
        );
    }
    eprintln!(
        "reclaim ({mech}) {size} MiB: median {:.0} ms, host released {:.0} MiB",
        median(&times),
        median(&released)
    );
    let extra = if balloon {
        json!({ "vmm_timed_ms": crate::stats::summary(&vmm_ms) })
    } else {
        json!({})
    };
    Ok(size_figures(size, &times, &released, extra))
}

/// How long a guest command or a reclaim may take.
const LONG: Duration = Duration::from_secs(600);

/// Configures and starts the VM: boot RAM and the hotplug region of `size`
/// (virtio-mem), or boot RAM plus `size` with an empty balloon; vsock on `uds`.
fn boot(
    vm: &BenchVmm,
    kernel: &Path,
    initrd: &Path,
    vcpus: u64,
    balloon: bool,
    size: u64,
    uds: &Path,
) -> anyhow::Result<()> {
    vm.api(
        "PUT",
        "/boot-source",
        &json!({"kernel_image_path": kernel, "initrd_path": initrd, "boot_args": CMDLINE})
            .to_string(),
    )?;
    let mem = if balloon { BOOT_MIB + size } else { BOOT_MIB };
    vm.api(
        "PUT",
        "/machine-config",
        &json!({"vcpu_count": vcpus, "mem_size_mib": mem}).to_string(),
    )?;
    if balloon {
        vm.api(
            "PUT",
            "/balloon",
            r#"{"amount_mib": 0, "deflate_on_oom": false}"#,
        )?;
    } else {
        vm.api(
            "PUT",
            "/hotplug/memory",
            &json!({"total_size_mib": size, "block_size_mib": 2, "slot_size_mib": slot_mib(size)})
                .to_string(),
        )?;
    }
    vm.api(
        "PUT",
        "/vsock",
        &json!({"guest_cid": 3, "uds_path": uds}).to_string(),
    )?;
    vm.api("PUT", "/actions", r#"{"action_type": "InstanceStart"}"#)?;
    Ok(())
}

/// Gives the guest its `size` back (plug it again, or deflate) and waits
/// until the device reports it.
fn give_back(vm: &BenchVmm, balloon: bool, size: u64) -> anyhow::Result<()> {
    if balloon {
        vm.api("PATCH", "/balloon", r#"{"amount_mib": 0}"#)?;
        until(vm, "/balloon", Instant::now(), LONG, |v| {
            num(v, "actual_mib") == 0
        })?;
    } else {
        vm.api(
            "PATCH",
            "/hotplug/memory",
            &json!({ "requested_size_mib": size }).to_string(),
        )?;
        until(vm, "/hotplug/memory", Instant::now(), LONG, |v| {
            num(v, "plugged_size_mib") == size
        })?;
    }
    Ok(())
}

/// Writes both hogs afresh: every run, after the memory came back, as in
/// a new VM the first lands partly in plugged memory (Linux fills the
/// movable zone first) and unplugging must migrate it. Kept from an
/// earlier run, it would sit in boot RAM already.
fn write_hogs(uds: &Path, first_mib: u64, size: u64) -> anyhow::Result<()> {
    guest(
        uds,
        &format!(
            "rm -f /mnt/hog/first && dd if=/dev/zero of=/mnt/hog/first bs=1M count={first_mib} 2>/dev/null && echo ok"
        ),
        LONG,
    )?;
    let r = guest(
        uds,
        &format!(
            "dd if=/dev/zero of=/mnt/hog/second bs=1M count={size} 2>&1 | tail -n 1; echo written"
        ),
        LONG,
    )?;
    if !r.contains("written") || r.contains("No space") {
        bail!("the second hog failed: {}", r.trim());
    }
    Ok(())
}

/// Takes `size` from the guest (virtio-mem target to 0, or the balloon to
/// `size`): ms until the device reported it, and for the balloon the VMM's
/// own time between the target and the size reached.
fn reclaim(vm: &BenchVmm, balloon: bool, size: u64) -> anyhow::Result<(f64, Option<f64>)> {
    let start = Instant::now();
    if balloon {
        vm.api(
            "PATCH",
            "/balloon",
            &json!({ "amount_mib": size }).to_string(),
        )?;
        let ms = until(vm, "/balloon", start, LONG, |v| {
            num(v, "actual_mib") == size
        })?;
        let st = vm.get("/balloon")?;
        let vmm_ms =
            num(&st, "actual_updated_ms").saturating_sub(num(&st, "target_updated_ms")) as f64;
        Ok((ms, Some(vmm_ms)))
    } else {
        vm.api("PATCH", "/hotplug/memory", r#"{"requested_size_mib": 0}"#)?;
        let ms = until(vm, "/hotplug/memory", start, LONG, |v| {
            num(v, "plugged_size_mib") == 0
        })?;
        Ok((ms, None))
    }
}
