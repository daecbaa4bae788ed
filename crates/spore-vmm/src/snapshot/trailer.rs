//! The memory file's trailer: one page after the guest-memory part that
//! names the snapshot the file belongs to, so that a state file is paired
//! with its own memory file by content, not by an extended attribute a copy
//! may drop.
//!
//! ```text
//! offset G = guest-memory bytes (boot RAM, then the virtio-mem region)
//! G + 0    "SPOREMEM"                 8 bytes magic
//! G + 8    trailer layout version     u32 LE (1)
//! G + 12   id length N                u32 LE (at most 64)
//! G + 16   guest-memory bytes G       u64 LE
//! G + 24   id                         N bytes (ASCII)
//! G + 24+N crc32                      u32 LE over the bytes before it
//! ...      zeros up to G + 4096 (the end of the file)
//! ```
//!
//! Every offset below G is guest-physical memory as before (restore paths
//! map and serve `[0, G)` only; the external userfaultfd handler receives
//! offsets in it), so the trailer changes no mapping. The file is exactly
//! `G + TRAILER_LEN` bytes; readers check that before mapping anything.

use std::fs::File;
use std::os::unix::fs::FileExt;

use crate::host_usize;

/// The trailer's size: one page, so the guest-memory part stays
/// page-aligned and the trailer never shares a page with guest data.
pub const TRAILER_LEN: u64 = 4096;
const MAGIC: &[u8; 8] = b"SPOREMEM";
const VERSION: u32 = 1;
const MAX_ID: usize = 64;

/// What a memory file's trailer says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trailer {
    /// The snapshot (layer) id, as its state file's manifest names it.
    pub id: String,
    /// Bytes of guest memory before the trailer.
    pub mem_bytes: u64,
}

/// Why a memory file's trailer is not usable.
#[derive(Debug, thiserror::Error)]
pub enum TrailerError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("it has no spore memory-file trailer (truncated, not a memory file, or written by a spore before snapshot format 3)")]
    Missing,
    #[error("its trailer is corrupt")]
    Corrupt,
    #[error("its trailer says {said} bytes of guest memory, but the file has {actual} bytes before the trailer (truncated or extended)")]
    Size { said: u64, actual: u64 },
}

/// Encodes a trailer page.
pub fn encode(t: &Trailer) -> Vec<u8> {
    let mut page = vec![0u8; host_usize::from_u64(TRAILER_LEN)];
    let id = &t.id.as_bytes()[..t.id.len().min(MAX_ID)];
    let mut head = Vec::with_capacity(24 + id.len());
    head.extend_from_slice(MAGIC);
    head.extend_from_slice(&VERSION.to_le_bytes());
    #[allow(
        clippy::cast_possible_truncation,
        reason = "at most MAX_ID bytes (cut above)"
    )]
    let id_len = id.len() as u32;
    head.extend_from_slice(&id_len.to_le_bytes());
    head.extend_from_slice(&t.mem_bytes.to_le_bytes());
    head.extend_from_slice(id);
    let crc = crc32fast::hash(&head);
    page[..head.len()].copy_from_slice(&head);
    page[head.len()..head.len() + 4].copy_from_slice(&crc.to_le_bytes());
    page
}

/// Decodes a trailer page (no size check against a file).
pub fn decode(page: &[u8]) -> Result<Trailer, TrailerError> {
    let field = |at: usize, n: usize| page.get(at..at + n).ok_or(TrailerError::Missing);
    if field(0, 8)? != MAGIC {
        return Err(TrailerError::Missing);
    }
    let le32 = |b: &[u8]| b.try_into().map(u32::from_le_bytes).ok();
    let version = le32(field(8, 4)?).ok_or(TrailerError::Corrupt)?;
    let n = le32(field(12, 4)?).ok_or(TrailerError::Corrupt)? as usize;
    if version != VERSION || n > MAX_ID {
        return Err(TrailerError::Corrupt);
    }
    let mem_bytes = field(16, 8)?
        .try_into()
        .map(u64::from_le_bytes)
        .map_err(|_| TrailerError::Corrupt)?;
    let id = field(24, n)?;
    let crc = le32(field(24 + n, 4)?).ok_or(TrailerError::Corrupt)?;
    if crc32fast::hash(field(0, 24 + n)?) != crc {
        return Err(TrailerError::Corrupt);
    }
    let id = String::from_utf8(id.to_vec()).map_err(|_| TrailerError::Corrupt)?;
    Ok(Trailer { id, mem_bytes })
}

/// Appends the trailer at `mem_bytes` (the end of the guest-memory part;
/// the file grows to `mem_bytes + TRAILER_LEN`).
pub fn write(file: &File, id: &str, mem_bytes: u64) -> std::io::Result<()> {
    let page = encode(&Trailer {
        id: id.to_string(),
        mem_bytes,
    });
    file.set_len(mem_bytes)?;
    file.write_all_at(&page, mem_bytes)
}

/// Reads the trailer at the end of `file` and checks that the file is
/// exactly the guest memory it announces plus the trailer.
pub fn read(file: &File) -> Result<Trailer, TrailerError> {
    let len = file.metadata()?.len();
    if len < TRAILER_LEN || len % TRAILER_LEN != 0 {
        return Err(TrailerError::Missing);
    }
    let mut page = vec![0u8; host_usize::from_u64(TRAILER_LEN)];
    file.read_exact_at(&mut page, len - TRAILER_LEN)?;
    let t = decode(&page)?;
    if t.mem_bytes != len - TRAILER_LEN {
        return Err(TrailerError::Size {
            said: t.mem_bytes,
            actual: len - TRAILER_LEN,
        });
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_every_flip_is_refused() {
        let t = Trailer {
            id: "0123456789abcdef0123456789abcdef".into(),
            mem_bytes: 64 << 20,
        };
        let page = encode(&t);
        assert_eq!(page.len() as u64, TRAILER_LEN);
        assert_eq!(decode(&page).unwrap(), t);
        for i in 0..(24 + t.id.len() + 4) {
            let mut p = page.clone();
            p[i] ^= 0x10;
            assert!(decode(&p).is_err(), "flip at {i} accepted");
        }
        assert!(matches!(decode(&[0; 8]), Err(TrailerError::Missing)));
    }

    #[test]
    fn file_size_must_match_the_trailer() {
        let dir = std::env::temp_dir().join(format!("spore-trailer-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("mem");
        let f = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&p)
            .unwrap();
        f.set_len(1 << 20).unwrap();
        write(&f, "abc", 1 << 20).unwrap();
        assert_eq!(f.metadata().unwrap().len(), (1 << 20) + TRAILER_LEN);
        assert_eq!(read(&f).unwrap().id, "abc");
        // Truncated by one page: the trailer is gone.
        f.set_len(1 << 20).unwrap();
        assert!(matches!(read(&f), Err(TrailerError::Missing)));
        // A trailer moved to another size is refused.
        write(&f, "abc", 1 << 20).unwrap();
        let page = {
            let mut b = vec![0u8; host_usize::from_u64(TRAILER_LEN)];
            f.read_exact_at(&mut b, 1 << 20).unwrap();
            b
        };
        f.set_len(2 << 20).unwrap();
        f.write_all_at(&page, 2 << 20).unwrap();
        assert!(matches!(read(&f), Err(TrailerError::Size { .. })));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
