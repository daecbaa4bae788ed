//! Snapshot integrity beyond checksums: an optional HMAC-SHA256 key that
//! signs and verifies state files, and an optional SHA-256 of a memory
//! file's contents.
//!
//! **Key.** `spore vmm --snapshot-key-file FILE` (and the snapshot
//! commands) load a key of at least 32 bytes once per process
//! ([`set_key`]): one VMM process serves one VM, so the key is process
//! configuration, like its API socket. With a key, every state file written
//! carries an HMAC-SHA256 over its magic, version, manifest and state (see
//! [`super::format`]), and every state file read must carry the right one.
//! Without a key, files are written without a MAC and a file that carries
//! one is refused: it was signed, so skipping its check silently would
//! defeat the point (give the key).
//!
//! **Memory hash.** `mem_sha256` in a layer's manifest: the SHA-256 over
//! every non-zero 4 KiB page of the memory file's guest-memory part, each
//! as its file offset (u64 LE) followed by its bytes, in offset order. Zero
//! pages and holes do not count, so copies that make holes of zero pages
//! (GNU `cp`) keep the hash; only data ranges are read, so it costs the
//! data, not the guest's memory size.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::OnceLock;

use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

use super::{LayerInfo, SnapshotError};
use crate::host_usize;
use crate::memory::pages::{data_ranges, PAGE};

/// Length of an HMAC-SHA256 tag.
pub const MAC_LEN: usize = 32;
/// The shortest key accepted.
pub const MIN_KEY_LEN: usize = 32;
/// The longest key file read (a key is a secret, not a data file).
const MAX_KEY_LEN: u64 = 4096;

/// A snapshot signing key.
#[derive(Clone)]
pub struct SnapshotKey(Vec<u8>);

impl std::fmt::Debug for SnapshotKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SnapshotKey({} bytes)", self.0.len())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("the snapshot key file {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the snapshot key file {path} holds {len} bytes: a key needs at least {MIN_KEY_LEN} (and at most {MAX_KEY_LEN})")]
    Length { path: String, len: u64 },
    #[error("a different snapshot key was already set in this process")]
    AlreadySet,
}

impl SnapshotKey {
    /// A key from bytes (at least [`MIN_KEY_LEN`]).
    pub fn new(bytes: &[u8]) -> Option<Self> {
        (bytes.len() >= MIN_KEY_LEN && bytes.len() as u64 <= MAX_KEY_LEN)
            .then(|| Self(bytes.to_vec()))
    }

    /// Reads a key file: its whole content (a regular file, 32 to 4096
    /// bytes) is the key.
    pub fn from_file(path: &Path) -> Result<Self, KeyError> {
        use std::io::Read;
        let name = path.display().to_string();
        let io = |source| KeyError::Io {
            path: name.clone(),
            source,
        };
        let file = crate::files::open_regular(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let mut bytes = Vec::new();
        file.take(MAX_KEY_LEN + 1)
            .read_to_end(&mut bytes)
            .map_err(io)?;
        Self::new(&bytes).ok_or(KeyError::Length { path: name, len })
    }

    /// HMAC-SHA256 of `data` under this key.
    pub fn mac(&self, data: &[u8]) -> [u8; MAC_LEN] {
        let mut out = [0u8; MAC_LEN];
        // Any key length is valid for HMAC; new_from_slice cannot fail.
        if let Ok(mut m) = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.0) {
            m.update(data);
            out.copy_from_slice(&m.finalize().into_bytes());
        }
        out
    }

    /// Whether `tag` is the HMAC of `data` (compared in constant time).
    pub fn verify(&self, data: &[u8], tag: &[u8]) -> bool {
        match <Hmac<Sha256> as KeyInit>::new_from_slice(&self.0) {
            Ok(mut m) => {
                m.update(data);
                m.verify_slice(tag).is_ok()
            }
            Err(_) => false,
        }
    }
}

static KEY: OnceLock<SnapshotKey> = OnceLock::new();

/// Sets this process's snapshot key (once; setting the same key again is
/// accepted).
pub fn set_key(key: SnapshotKey) -> Result<(), KeyError> {
    let set = KEY.get_or_init(|| key.clone());
    if set.0 == key.0 {
        Ok(())
    } else {
        Err(KeyError::AlreadySet)
    }
}

/// This process's snapshot key, if one was set.
pub fn key() -> Option<&'static SnapshotKey> {
    KEY.get()
}

/// `sha256:` and 64 hex digits.
fn hex_digest(d: &[u8]) -> String {
    let mut s = String::with_capacity(7 + 64);
    s.push_str("sha256:");
    for b in d {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// The content hash of a memory file's first `size` bytes (see the module
/// docs): `sha256:<hex>`.
pub fn memory_hash(file: &File, size: u64) -> std::io::Result<String> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 256 * PAGE];
    // Pages below this were hashed (a range that ends mid-page is read to
    // the page's end; the next range must not hash that page again).
    let mut done = 0u64;
    for (start, len) in data_ranges(file, size)? {
        let mut off = (start - start % PAGE as u64).max(done);
        let end = start + len;
        while off < end {
            let n = host_usize::from_u64(end - off).min(buf.len());
            let n = n.div_ceil(PAGE) * PAGE;
            let n = n.min(host_usize::from_u64(size - off));
            let chunk = &mut buf[..n];
            file.read_exact_at(chunk, off)?;
            for (i, page) in chunk.chunks(PAGE).enumerate() {
                if page.iter().any(|&b| b != 0) {
                    h.update((off + (i * PAGE) as u64).to_le_bytes());
                    h.update(page);
                }
            }
            off += n as u64;
        }
        done = done.max(off);
    }
    Ok(hex_digest(&h.finalize()))
}

/// Checks every layer of a loaded chain that recorded `mem_sha256`
/// against its memory file; `chain` newest first, `files` base first (as
/// [`super::LoadedSnapshot`] holds them). Returns how many layers were
/// checked (layers without a recorded hash are skipped).
pub fn verify_memory(chain: &[LayerInfo], files: &[File]) -> Result<usize, SnapshotError> {
    let mut checked = 0;
    for (layer, file) in chain.iter().zip(files.iter().rev()) {
        let Some(expected) = &layer.manifest.layer.mem_sha256 else {
            continue;
        };
        let path = layer.paths.mem.display().to_string();
        let actual = memory_hash(file, layer.manifest.layer.mem_file_size).map_err(|source| {
            SnapshotError::MemoryOpen {
                path: path.clone(),
                source,
            }
        })?;
        if &actual != expected {
            return Err(SnapshotError::MemoryHash {
                path,
                expected: expected.clone(),
                actual,
            });
        }
        checked += 1;
    }
    Ok(checked)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_sign_and_verify() {
        assert!(SnapshotKey::new(&[1; 31]).is_none());
        let k = SnapshotKey::new(&[1; 32]).unwrap();
        let other = SnapshotKey::new(&[2; 32]).unwrap();
        let tag = k.mac(b"state");
        assert!(k.verify(b"state", &tag));
        assert!(!k.verify(b"statf", &tag));
        assert!(!other.verify(b"state", &tag));
        assert!(!k.verify(b"state", &tag[..31]));
        assert_eq!(format!("{k:?}"), "SnapshotKey(32 bytes)");
    }

    #[test]
    fn key_files_are_bounded() {
        let dir = std::env::temp_dir().join(format!("spore-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("k");
        std::fs::write(&p, [7u8; 16]).unwrap();
        let e = SnapshotKey::from_file(&p).unwrap_err();
        assert!(e.to_string().contains("16 bytes"), "{e}");
        std::fs::write(&p, [7u8; 40]).unwrap();
        assert!(SnapshotKey::from_file(&p).is_ok());
        assert!(SnapshotKey::from_file(Path::new("/dev/zero")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn memory_hash_ignores_holes_and_zero_pages_but_not_data() {
        let dir = std::env::temp_dir().join(format!("spore-memhash-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mk = |name: &str, zero_page_as_data: bool| {
            let f = File::options()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(dir.join(name))
                .unwrap();
            f.set_len(8 << 20).unwrap();
            f.write_all_at(&[5u8; 3 * PAGE], 1 << 20).unwrap();
            if zero_page_as_data {
                f.write_all_at(&[0u8; PAGE], 4 << 20).unwrap();
            }
            f
        };
        let a = mk("a", false);
        let b = mk("b", true);
        let ha = memory_hash(&a, 8 << 20).unwrap();
        assert!(ha.starts_with("sha256:") && ha.len() == 71, "{ha}");
        assert_eq!(ha, memory_hash(&b, 8 << 20).unwrap());
        b.write_all_at(&[6u8], (1 << 20) + 5000).unwrap();
        assert_ne!(ha, memory_hash(&b, 8 << 20).unwrap());
        // The same data at another offset is another memory.
        let c = mk("c", false);
        c.set_len(0).unwrap();
        c.set_len(8 << 20).unwrap();
        c.write_all_at(&[5u8; 3 * PAGE], 2 << 20).unwrap();
        assert_ne!(ha, memory_hash(&c, 8 << 20).unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
