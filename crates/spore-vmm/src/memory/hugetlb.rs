//! Guest RAM on explicit 2 MiB hugetlbfs pages (`huge_pages: "2M"`).
//!
//! The memfd is created with `MFD_HUGETLB | MFD_HUGE_2MB` and mapped without
//! `MAP_NORESERVE`, so the kernel reserves every huge page of guest RAM at
//! map time: a host without enough free huge pages fails here, with a
//! message naming what is missing, instead of the guest dying of SIGBUS on
//! its first touch of an unreserved page.

use std::fs::File;
use std::os::fd::FromRawFd;

use super::MemoryError;

pub const HUGE_PAGE: u64 = 2 << 20;

/// A 2 MiB hugetlbfs memfd of `size` bytes (a multiple of 2 MiB).
pub fn create(size: u64) -> Result<File, MemoryError> {
    if !size.is_multiple_of(HUGE_PAGE) {
        return Err(MemoryError::HugePages(format!(
            "guest memory of {size} bytes is not a whole number of 2 MiB pages"
        )));
    }
    // SAFETY: a static NUL-terminated name; flags are plain bits.
    let fd = unsafe {
        libc::memfd_create(
            c"spore-guest-ram-2m".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_HUGETLB | libc::MFD_HUGE_2MB,
        )
    };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        return Err(MemoryError::HugePages(format!(
            "cannot create a 2 MiB hugetlbfs memory file ({e}); does the host kernel have hugetlbfs?"
        )));
    }
    // SAFETY: fd was just created and is owned by nobody else.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_len(size)
        .map_err(|source| MemoryError::Truncate { size, source })?;
    Ok(file)
}

/// What a failed reservation should say: how many pages were needed and
/// how many the host has free (`/proc/meminfo`).
pub fn shortage(size: u64, cause: &dyn std::fmt::Display) -> MemoryError {
    let need = size / HUGE_PAGE;
    let free = free_pages().map_or("an unknown number of".to_string(), |n| n.to_string());
    MemoryError::HugePages(format!(
        "not enough free 2 MiB huge pages for {} MiB of guest memory: {need} needed, \
         the host has {free} free (reserve more with /proc/sys/vm/nr_hugepages) ({cause})",
        size >> 20
    ))
}

/// `HugePages_Free` of `/proc/meminfo` (the default huge page size, 2 MiB on x86_64).
pub fn free_pages() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("HugePages_Free:"))
        .and_then(|v| v.trim().parse().ok())
}
