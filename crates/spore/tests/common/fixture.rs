//! Files the scenarios hand to VMs: disk and pmem images.

use std::os::unix::fs::FileExt;
use std::path::Path;

/// A sparse file of `len` bytes (its holes read as zeros) with each
/// `(offset, bytes)` of `data` written in: a disk image with a tag where
/// the guest looks for it, at the cost of only the tags on the host.
pub fn sparse_file(path: &Path, len: u64, data: &[(u64, &[u8])]) {
    let f =
        std::fs::File::create(path).unwrap_or_else(|e| panic!("create {}: {e}", path.display()));
    f.set_len(len).unwrap();
    for (offset, bytes) in data {
        f.write_all_at(bytes, *offset).unwrap();
    }
}
