//! Start-up phases, logged at debug level (`SPORE_LOG=debug`, or the
//! logger's `Debug` level) with the host's `CLOCK_MONOTONIC`: a harness
//! lines them up with its own timestamps taken on that clock (the nested
//! peers scenario does, to see where a boot's time goes before the guest
//! runs). Costs nothing when debug logging is off.

/// Logs that start-up reached `what`.
pub fn mark(what: impl std::fmt::Display) {
    if !tracing::enabled!(target: "spore::phase", tracing::Level::DEBUG) {
        return;
    }
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes only the timespec it is given.
    if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) } != 0 {
        return;
    }
    let ns = ts.tv_sec as u128 * 1_000_000_000 + ts.tv_nsec as u128;
    tracing::debug!(target: "spore::phase", "phase {what} at monotonic {ns} ns");
}
