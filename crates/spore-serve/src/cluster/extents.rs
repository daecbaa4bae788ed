//! A sparse file on the wire between nodes: only the ranges that hold data
//! (`SEEK_DATA`/`SEEK_HOLE`), each as its offset and length (u64, little
//! endian) followed by its bytes. A snapshot's memory file is mostly holes
//! (pages the guest never touched): sent this way, a 64 MiB unikernel's is
//! a few MiB, and it is as sparse on the node that receives it.

use std::fs::File;
use std::os::unix::fs::{FileExt as _, OpenOptionsExt as _};
use std::os::unix::io::AsRawFd as _;
use std::path::Path;

const HEADER: usize = 16;

/// The ranges of `file` (of `size` bytes) that hold data; the whole file
/// if the file system cannot say.
fn data_ranges(file: &File, size: u64) -> Vec<(u64, u64)> {
    let fd = file.as_raw_fd();
    let mut out = Vec::new();
    let mut pos: u64 = 0;
    while pos < size {
        let Ok(at) = i64::try_from(pos) else { break };
        // SAFETY: lseek on a descriptor this function borrows; checked.
        let start = unsafe { libc::lseek(fd, at, libc::SEEK_DATA) };
        if start < 0 {
            if pos == 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL) {
                return vec![(0, size)];
            }
            break; // ENXIO: no data past `pos`.
        }
        // SAFETY: as above.
        let end = unsafe { libc::lseek(fd, start, libc::SEEK_HOLE) };
        if end <= start {
            break;
        }
        let (start, end) = (start as u64, (end as u64).min(size));
        out.push((start, end - start));
        pos = end;
    }
    out
}

/// `(size, body)`: the file at `path` encoded.
pub fn encode(path: &Path) -> std::io::Result<(u64, Vec<u8>)> {
    let file = File::open(path)?;
    let size = file.metadata()?.len();
    let ranges = data_ranges(&file, size);
    let data: u64 = ranges.iter().map(|(_, len)| len).sum();
    let capacity = usize::try_from(data)
        .ok()
        .and_then(|d| d.checked_add(ranges.len() * HEADER))
        .ok_or_else(|| std::io::Error::other("file too large to send"))?;
    let mut body = Vec::with_capacity(capacity);
    for (offset, len) in ranges {
        body.extend_from_slice(&offset.to_le_bytes());
        body.extend_from_slice(&len.to_le_bytes());
        let at = body.len();
        let len = usize::try_from(len).map_err(std::io::Error::other)?;
        body.resize(at + len, 0);
        file.read_exact_at(&mut body[at..], offset)?;
    }
    Ok((size, body))
}

/// Writes `body` (from [`encode`] of a file of `size` bytes) as a new
/// file at `dest` (mode 0600, fsynced). Every range is checked against
/// `size`, ranges must come in order without overlap, and the body must end
/// with its last range: another node's bytes are input like any other.
pub fn decode(body: &[u8], size: u64, dest: &Path) -> Result<(), String> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(dest)
        .map_err(|e| format!("creating {}: {e}", dest.display()))?;
    file.set_len(size)
        .map_err(|e| format!("sizing {}: {e}", dest.display()))?;
    let mut rest = body;
    let mut next_free = 0u64;
    while !rest.is_empty() {
        let (header, after) = rest
            .split_at_checked(HEADER)
            .ok_or("a range header is cut short")?;
        let word = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&header[i..i + 8]);
            u64::from_le_bytes(b)
        };
        let (offset, len) = (word(0), word(8));
        let end = offset
            .checked_add(len)
            .filter(|&end| end <= size && offset >= next_free)
            .ok_or_else(|| format!("range {offset}+{len} is outside the file or out of order"))?;
        let len = usize::try_from(len).map_err(|e| e.to_string())?;
        let (data, after) = after
            .split_at_checked(len)
            .ok_or("a range's bytes are cut short")?;
        file.write_all_at(data, offset)
            .map_err(|e| format!("writing {}: {e}", dest.display()))?;
        next_free = end;
        rest = after;
    }
    file.sync_all()
        .map_err(|e| format!("syncing {}: {e}", dest.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("spore-extents-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_sparse_file_arrives_equal_and_sparse() {
        let dir = scratch("roundtrip");
        let src = dir.join("src");
        let f = File::create(&src).unwrap();
        f.set_len(64 << 20).unwrap();
        f.write_all_at(&[7u8; 8192], 1 << 20).unwrap();
        f.write_all_at(b"tail", (64 << 20) - 4).unwrap();
        drop(f);
        let (size, body) = encode(&src).unwrap();
        assert_eq!(size, 64 << 20);
        assert!(body.len() < 1 << 20, "holes are not sent: {}", body.len());
        let dest = dir.join("dest");
        decode(&body, size, &dest).unwrap();
        assert_eq!(std::fs::read(&src).unwrap(), std::fs::read(&dest).unwrap());
        assert!(crate::fs::disk_bytes(&dest) < 1 << 20, "the copy is sparse");
        // A file that exists already is never overwritten.
        assert!(decode(&body, size, &dest).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_hostile_body_is_refused() {
        let dir = scratch("hostile");
        let range = |offset: u64, len: u64, data: &[u8]| {
            let mut b = offset.to_le_bytes().to_vec();
            b.extend_from_slice(&len.to_le_bytes());
            b.extend_from_slice(data);
            b
        };
        let cases: [(&str, Vec<u8>); 5] = [
            ("past the end", range(4090, 10, &[1; 10])),
            ("overflowing", range(u64::MAX - 1, 4, &[1; 4])),
            ("cut short", range(0, 100, &[1; 10])),
            ("half a header", vec![0; 7]),
            (
                "overlapping",
                [range(0, 8, &[1; 8]), range(4, 2, &[2; 2])].concat(),
            ),
        ];
        for (i, (what, body)) in cases.iter().enumerate() {
            let dest = dir.join(format!("d{i}"));
            assert!(decode(body, 4096, &dest).is_err(), "{what} was accepted");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
