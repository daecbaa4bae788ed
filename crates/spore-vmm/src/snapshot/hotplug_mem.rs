//! The virtio-mem hotplug region in the snapshot's memory file.
//!
//! The region follows boot RAM in the memory file (file offset = boot RAM
//! size) and is as long as the region; only plugged blocks are written, and
//! of those only pages that hold data, so unplugged blocks are holes and
//! cost no disk. Data is found as for boot RAM ([`super::memory`]): the
//! backing file's data ranges (`SEEK_DATA`), plus, for a region mapped
//! privately from an earlier snapshot, the pages resident in the mapping;
//! untouched holes are never read.

use std::fs::File;
use std::os::fd::AsRawFd;

use super::memory::{merge, resident_ranges, write_nonzero};
use crate::memory::hotplug::HotplugMemory;

/// Data ranges of `fd` within `[start, end)`, as (offset - start, len).
fn data_ranges_in(fd: &File, start: u64, end: u64) -> std::io::Result<Vec<(u64, u64)>> {
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

/// Writes the data of the `plugged` byte ranges (region offsets, sorted)
/// of `hp` into `out` at `file_offset` onward; the file is sized to
/// `file_offset + hp.size()` first. The guest must be paused and the device
/// quiesced. Returns the bytes written.
pub fn write_plugged(
    hp: &HotplugMemory,
    plugged: &[(u64, u64)],
    out: &File,
    file_offset: u64,
) -> std::io::Result<u64> {
    out.set_len(file_offset + hp.size())?;
    if plugged.is_empty() {
        return Ok(0);
    }
    let (file, start) = hp.file();
    let mut ranges = data_ranges_in(file, start, start + hp.size())?;
    if hp.is_private() {
        ranges.extend(resident_ranges(hp.host_addr(), hp.size() as usize)?);
        ranges = merge(ranges);
    }
    // SAFETY: the region's mapping lives as long as `hp`; the guest is
    // paused and the device's worker stopped, so nobody writes it now.
    let bytes = unsafe { std::slice::from_raw_parts(hp.host_addr(), hp.size() as usize) };
    let mut written = 0;
    let mut i = 0;
    for &(ps, pl) in plugged {
        let pe = ps + pl;
        // Both lists are sorted: skip data ranges wholly before this run.
        while i < ranges.len() && ranges[i].0 + ranges[i].1 <= ps {
            i += 1;
        }
        let mut j = i;
        while j < ranges.len() && ranges[j].0 < pe {
            let lo = ranges[j].0.max(ps);
            let hi = (ranges[j].0 + ranges[j].1).min(pe);
            if lo < hi {
                written += write_nonzero(&bytes[lo as usize..hi as usize], out, file_offset + lo)?;
            }
            j += 1;
        }
    }
    Ok(written)
}
