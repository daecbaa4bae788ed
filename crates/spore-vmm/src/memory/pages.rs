//! Page ranges of files and mappings, and writing only the pages that hold
//! data: what a snapshot's memory writers (boot RAM, the virtio-mem region)
//! share. Nothing here knows about snapshots or devices.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;

/// The page size every range here is counted in.
pub const PAGE: usize = 4096;

/// Data ranges of a shared memfd, as (offset, len), via SEEK_DATA/SEEK_HOLE.
pub fn data_ranges(fd: &File, size: u64) -> std::io::Result<Vec<(u64, u64)>> {
    let mut out = Vec::new();
    let mut pos: i64 = 0;
    let raw = fd.as_raw_fd();
    while (pos as u64) < size {
        // SAFETY: lseek on an fd we own; it only moves the file offset.
        let start = unsafe { libc::lseek(raw, pos, libc::SEEK_DATA) };
        if start < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ENXIO) {
                break; // no data past pos
            }
            return Err(e);
        }
        // SAFETY: as above.
        let end = unsafe { libc::lseek(raw, start, libc::SEEK_HOLE) };
        if end < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let end = (end as u64).min(size);
        if end > start as u64 {
            out.push((start as u64, end - start as u64));
        }
        pos = end as i64;
    }
    Ok(out)
}

/// Data ranges of `fd` within `[start, end)`, as (offset - start, len).
pub fn data_ranges_in(fd: &File, start: u64, end: u64) -> std::io::Result<Vec<(u64, u64)>> {
    let mut out = Vec::new();
    let mut pos = start;
    let raw = fd.as_raw_fd();
    while pos < end {
        // SAFETY: lseek on an fd we own; it only moves the file offset.
        let s = unsafe { libc::lseek(raw, pos as libc::off_t, libc::SEEK_DATA) };
        if s < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ENXIO) {
                break;
            }
            return Err(e);
        }
        let s = s as u64;
        if s >= end {
            break;
        }
        // SAFETY: as above.
        let e = unsafe { libc::lseek(raw, s as libc::off_t, libc::SEEK_HOLE) };
        if e < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let e = (e as u64).min(end);
        if e > s {
            out.push((s - start, e - s));
        }
        pos = e.max(s + 1);
    }
    Ok(out)
}

/// Page ranges of a mapping that are resident (written copy-on-write, or
/// read from the page cache), as (offset, len) within the mapping.
pub fn resident_ranges(ptr: *const u8, len: usize) -> std::io::Result<Vec<(u64, u64)>> {
    let pages = len.div_ceil(PAGE);
    let mut vec = vec![0u8; pages];
    // SAFETY: [ptr, ptr + len) is one page-aligned mapping owned by the
    // caller's GuestRam; mincore only fills `vec`, one byte per page.
    let r = unsafe { libc::mincore(ptr as *mut libc::c_void, len, vec.as_mut_ptr()) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut i = 0;
    while i < pages {
        if vec[i] & 1 == 0 {
            i += 1;
            continue;
        }
        let start = i;
        while i < pages && vec[i] & 1 != 0 {
            i += 1;
        }
        out.push(((start * PAGE) as u64, ((i - start) * PAGE) as u64));
    }
    Ok(out)
}

/// Sorts and merges overlapping or touching ranges.
pub fn merge(mut ranges: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    ranges.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (start, len) in ranges {
        match out.last_mut() {
            Some((s, l)) if start <= *s + *l => *l = (*l).max(start + len - *s),
            _ => out.push((start, len)),
        }
    }
    out
}

/// Writes runs of non-zero pages of `data` at `file_off` onward.
pub fn write_nonzero(data: &[u8], out: &File, file_off: u64) -> std::io::Result<u64> {
    let mut written = 0u64;
    let mut run_start: Option<usize> = None;
    let mut i = 0;
    while i < data.len() {
        let end = (i + PAGE).min(data.len());
        let zero = data[i..end].iter().all(|&b| b == 0);
        match (zero, run_start) {
            (false, None) => run_start = Some(i),
            (true, Some(s)) => {
                out.write_all_at(&data[s..i], file_off + s as u64)?;
                written += (i - s) as u64;
                run_start = None;
            }
            _ => {}
        }
        i = end;
    }
    if let Some(s) = run_start {
        out.write_all_at(&data[s..], file_off + s as u64)?;
        written += (data.len() - s) as u64;
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_merge() {
        assert_eq!(
            merge(vec![
                (8192, 4096),
                (0, 4096),
                (4096, 4096),
                (20480, 4096),
                (16384, 8192)
            ]),
            vec![(0, 12288), (16384, 8192)]
        );
    }
}
