//! Firecracker's `--boot-timer`: log how long the guest took to boot.
//!
//! Firecracker attaches a boot-timer device that a Linux guest's init writes
//! a magic value to; spore's guests already report that moment through the
//! signal port's `MARK` (spore-uk's apps mark when their setup is done), so
//! with the timer armed the first `MARK` after `InstanceStart` logs
//! Firecracker's line, at Info:
//!
//! ```text
//! Guest-boot-time =   2650 us 2 ms,   1210 CPU us 1 CPU ms
//! ```
//!
//! (the CPU time is the VMM process's, as in Firecracker).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::host::monotonic_ns;
use crate::metrics::process_cpu_us;

static ARMED: AtomicBool = AtomicBool::new(false);
/// Monotonic ns of `InstanceStart`; 0 before it (or once logged).
static START_NS: AtomicU64 = AtomicU64::new(0);
static START_CPU_US: AtomicU64 = AtomicU64::new(0);

/// `--boot-timer`: time the next boot.
pub fn arm() {
    ARMED.store(true, Ordering::Relaxed);
}

/// Called when `InstanceStart` begins building the VM.
pub fn instance_start() {
    if ARMED.load(Ordering::Relaxed) {
        START_CPU_US.store(process_cpu_us(), Ordering::Relaxed);
        START_NS.store(monotonic_ns().max(1), Ordering::Relaxed);
    }
}

/// Called on every guest `MARK`; logs once, at the first after the start.
pub fn guest_mark() {
    let start = START_NS.swap(0, Ordering::Relaxed);
    if start == 0 {
        return;
    }
    let us = monotonic_ns().saturating_sub(start) / 1000;
    let cpu_us = process_cpu_us().saturating_sub(START_CPU_US.load(Ordering::Relaxed));
    tracing::info!(
        "Guest-boot-time = {us:>6} us {} ms, {cpu_us:>6} CPU us {} CPU ms",
        us / 1000,
        cpu_us / 1000
    );
}
