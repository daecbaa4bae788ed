//! Eager restore: every data extent of the snapshot is brought into the
//! VM's private mapping before the guest runs, so it takes no file faults.
//!
//! Three ways, chosen with `SPORE_EAGER_METHOD` (a tuning knob for
//! `spore bench snapshot`; the default is the fastest measured here):
//! - `populate_read` (default): `MADV_POPULATE_READ` maps the page-cache
//!   pages read-only; they stay shared with other VMs of the same file, and
//!   a guest write later copies only the page it writes;
//! - `populate_write`: `MADV_POPULATE_WRITE` copies every page up front
//!   (no faults at all afterwards, private memory for all of it);
//! - `read`: `pread` from the layer file into the mapping.

use std::os::unix::fs::FileExt;

use crate::host_usize;
use crate::memory::layers::MemoryLayers;
use crate::memory::GuestRam;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EagerMethod {
    PopulateRead,
    PopulateWrite,
    Read,
}

impl EagerMethod {
    pub fn from_env() -> Self {
        match std::env::var("SPORE_EAGER_METHOD").as_deref() {
            Ok("populate_write") => Self::PopulateWrite,
            Ok("read") => Self::Read,
            _ => Self::PopulateRead,
        }
    }
}

/// Populates every data extent of `layers` in `ram`; returns the pages.
pub fn populate(ram: &GuestRam, layers: &MemoryLayers) -> std::io::Result<u64> {
    populate_with(ram, layers, EagerMethod::from_env())
}

pub fn populate_with(
    ram: &GuestRam,
    layers: &MemoryLayers,
    method: EagerMethod,
) -> std::io::Result<u64> {
    let spans = super::spans(ram);
    let mut bytes = 0u64;
    for e in layers.extents()? {
        for &(span_off, ptr, span_len) in &spans {
            let lo = e.offset.max(span_off);
            let hi = (e.offset + e.len).min(span_off + span_len as u64);
            if lo >= hi {
                continue;
            }
            // Extents are page granular in practice (SEEK_DATA on page
            // files); round outward to whole pages for madvise.
            let start = (lo - span_off) & !4095;
            let end = ((hi - span_off + 4095) & !4095).min(span_len as u64);
            // SAFETY: [ptr + start, ptr + end) lies in one live mapping of
            // guest RAM owned by `ram`; the guest is not running yet.
            let addr = unsafe { ptr.add(host_usize::from_u64(start)) };
            let len = host_usize::from_u64(end - start);
            match method {
                EagerMethod::PopulateRead | EagerMethod::PopulateWrite => {
                    let advice = if method == EagerMethod::PopulateRead {
                        libc::MADV_POPULATE_READ
                    } else {
                        libc::MADV_POPULATE_WRITE
                    };
                    // SAFETY: madvise on a range of our own mapping.
                    let r = unsafe { libc::madvise(addr.cast::<libc::c_void>(), len, advice) };
                    if r != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                EagerMethod::Read => {
                    // SAFETY: as above; the slice is only written by pread.
                    let buf = unsafe { std::slice::from_raw_parts_mut(addr, len) };
                    layers.files()[e.layer].read_exact_at(buf, span_off + start)?;
                }
            }
            bytes += len as u64;
        }
    }
    Ok(bytes / 4096)
}

#[cfg(test)]
mod tests {
    use std::fs::File;

    use vm_memory::{Bytes, GuestAddress};

    use super::*;

    #[test]
    fn every_method_restores_the_data_and_maps_it() {
        let size = 16u64 << 20;
        let path = std::env::temp_dir().join(format!("spore-eager-{}", std::process::id()));
        let f = File::create(&path).unwrap();
        f.set_len(size).unwrap();
        f.write_all_at(&[7u8; 8192], 0x10_0000).unwrap();
        f.write_all_at(&[9u8; 4096], 0xF0_0000).unwrap();
        for method in [
            EagerMethod::PopulateRead,
            EagerMethod::PopulateWrite,
            EagerMethod::Read,
        ] {
            let layers = MemoryLayers::single(File::open(&path).unwrap(), size);
            let ram = GuestRam::from_snapshot_file(File::open(&path).unwrap(), size).unwrap();
            let pages = populate_with(&ram, &layers, method).unwrap();
            assert!(pages >= 3, "{method:?}: {pages}");
            // The pages are resident before anyone touched them.
            let (_, ptr, _) = super::super::spans(&ram)[0];
            let mut v = [0u8; 1];
            // SAFETY: probing one page of the mapping.
            let r = unsafe { libc::mincore(ptr.add(0x10_0000).cast(), 4096, v.as_mut_ptr()) };
            assert_eq!(r, 0);
            assert_eq!(v[0] & 1, 1, "{method:?}: page not resident");
            let x: u8 = ram.memory().read_obj(GuestAddress(0x10_1000)).unwrap();
            assert_eq!(x, 7);
            let x: u8 = ram.memory().read_obj(GuestAddress(0xF0_0000)).unwrap();
            assert_eq!(x, 9);
        }
        std::fs::remove_file(&path).unwrap();
    }
}
