//! A monotonic clock from the TSC, scaled by the frequency the VMM reported.
//!
//! `rdtsc` runs natively at CPL 3 (CR4.TSD is clear), so reading the clock
//! costs no VM exit.

use core::sync::atomic::{AtomicU64, Ordering};

static TSC_KHZ: AtomicU64 = AtomicU64::new(0);
/// The TSC when the runtime started (the guest's TSC need not start at 0).
static START_TSC: AtomicU64 = AtomicU64::new(0);

pub(crate) fn init(tsc_khz: u64) {
    TSC_KHZ.store(tsc_khz, Ordering::Relaxed);
    START_TSC.store(rdtsc(), Ordering::Relaxed);
}

/// Microseconds since the runtime started (0 without a TSC frequency).
pub fn since_start_us() -> u64 {
    tsc_khz().map_or(0, |khz| {
        ticks_to_us(rdtsc().wrapping_sub(START_TSC.load(Ordering::Relaxed)), khz)
    })
}

/// The raw time-stamp counter.
#[inline]
pub fn rdtsc() -> u64 {
    // SAFETY: rdtsc has no memory effects and is allowed at CPL 3.
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// TSC frequency in kHz, None if the VMM did not know it.
pub fn tsc_khz() -> Option<u64> {
    match TSC_KHZ.load(Ordering::Relaxed) {
        0 => None,
        khz => Some(khz),
    }
}

/// Converts TSC ticks to microseconds at `khz`.
pub fn ticks_to_us(ticks: u64, khz: u64) -> u64 {
    if khz == 0 {
        return 0;
    }
    // u128: ticks * 1000 overflows u64 after ~200 days at 1 GHz.
    (ticks as u128 * 1000 / khz as u128).min(u64::MAX as u128) as u64
}

/// A point in time, for measuring elapsed time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Instant(u64);

impl Instant {
    pub fn now() -> Self {
        Self(rdtsc())
    }

    /// Microseconds since `self`, None if the TSC frequency is unknown.
    pub fn elapsed_us(&self) -> Option<u64> {
        let khz = tsc_khz()?;
        Some(ticks_to_us(rdtsc().saturating_sub(self.0), khz))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_ticks() {
        assert_eq!(ticks_to_us(3_000_000, 3_000_000), 1_000);
        assert_eq!(ticks_to_us(u64::MAX, 1), u64::MAX);
        assert_eq!(ticks_to_us(5, 0), 0);
    }
}
