//! The few libc helpers the jailer's steps share.

use std::ffi::CString;

/// A libc return value: negative is the error in errno.
pub fn check(r: libc::c_int) -> std::io::Result<()> {
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// A C string from bytes that must not hold a NUL.
pub fn cstr(b: &[u8]) -> anyhow::Result<CString> {
    CString::new(b).map_err(|_| anyhow::anyhow!("a path or argument holds a NUL byte"))
}

/// A clock's reading in microseconds.
pub fn clock_us(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    (ts.tv_sec as u64) * 1_000_000 + (ts.tv_nsec as u64) / 1_000
}
