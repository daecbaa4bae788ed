//! What every module takes from the host, in one place: a mutex lock that
//! survives poisoning, the monotonic clock shared across processes, and
//! random ids. Small on purpose; it depends on nothing else in the crate.

use std::sync::{Mutex, MutexGuard};

/// Locks a mutex, recovering from a poisoned lock: the state behind spore's
/// locks is plain data, and one panicked thread must not wedge every vCPU
/// behind it.
pub fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Host CLOCK_MONOTONIC in nanoseconds (comparable across processes).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// 16 hex digits from the OS's random source (the clock if it fails): ids of
/// snapshot layers and clone templates.
pub fn random_id() -> String {
    let mut b = [0u8; 8];
    if getrandom::fill(&mut b).is_err() {
        b = monotonic_ns().to_le_bytes();
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Oldest kernel Firecracker accepts `io_engine: "Async"` (io_uring) on.
pub const ASYNC_IO_MIN_KERNEL: (u32, u32) = (5, 10);

/// Whether the running kernel is at least `min` (major, minor); `Err`
/// names the kernel it is.
pub fn kernel_at_least(min: (u32, u32)) -> Result<(), String> {
    // SAFETY: an all-zero utsname is valid; uname fills it.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: a valid utsname to fill.
    if unsafe { libc::uname(&mut u) } != 0 {
        return Err("the host kernel's version cannot be read".into());
    }
    // SAFETY: uname NUL-terminates release.
    let release = unsafe { std::ffi::CStr::from_ptr(u.release.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(major), Some(minor)) if (major, minor) >= min => Ok(()),
        _ => Err(format!(
            "the host kernel is {release}, {}.{} or newer is needed",
            min.0, min.1
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_clock() {
        let (a, b) = (random_id(), random_id());
        assert_eq!(a.len(), 16);
        assert_ne!(a, b);
        let t = monotonic_ns();
        assert!(monotonic_ns() >= t);
        let m = Mutex::new(1);
        *lock(&m) += 1;
        assert_eq!(*lock(&m), 2);
    }

    #[test]
    fn kernel_version_check() {
        // This host runs a kernel newer than 2.6 and older than 999.0.
        assert!(kernel_at_least((2, 6)).is_ok());
        let e = kernel_at_least((999, 0)).unwrap_err();
        assert!(e.contains("999.0 or newer"), "{e}");
    }
}
