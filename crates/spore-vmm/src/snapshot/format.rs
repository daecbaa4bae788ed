//! The snapshot state file: a small JSON manifest a human can read, the
//! binary VM state (bincode), an optional HMAC and a CRC32 over all.
//!
//! ```text
//! "SPORESNP"                  8 bytes magic
//! format version              u32 LE (3)
//! manifest length M           u32 LE
//! manifest                    M bytes of JSON (Manifest)
//! state length S              u64 LE
//! state                       S bytes of bincode (MicrovmState)
//! MAC length A                u32 LE: 0, or 32 with a snapshot key
//! MAC                         A bytes: HMAC-SHA256 over every byte before
//!                             the MAC length (see `integrity`)
//! crc32                       u32 LE over every byte before it
//! ```
//!
//! Readers refuse another magic or version, a checksum mismatch and a
//! truncated or over-long file, each with its own message; with a key, a
//! missing or wrong MAC, and without one, a file that carries a MAC. Files
//! are written atomically ([`PendingFile`]): a crash leaves the previous
//! file in place.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::integrity::{SnapshotKey, MAC_LEN};
use crate::host_usize;

pub const MAGIC: &[u8; 8] = b"SPORESNP";
/// The state layout this spore writes and reads. 4: a drive's state holds
/// its rate limiter's buckets. 3: the memory file ends
/// with a trailer naming its snapshot (no xattr), the state file has a MAC
/// field. 2: device states keyed by device id (version 1 matched virtio
/// states to devices by attach order).
pub const FORMAT_VERSION: u32 = 4;
/// Manifests beyond this are not ours (keeps a hostile file from allocating).
const MAX_MANIFEST: u32 = 1 << 20;
// The binary state has no fixed limit: it holds the tmem pool, as large as
// the VM's quota, and a snapshot that could be taken must load. What bounds
// it is the file itself: every length the header announces is checked
// against the file's size before anything is read or allocated, and a file
// without the magic is refused after 8 bytes (a memory file given as a
// state file is never read through).

#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}: not a spore snapshot state file (bad magic)")]
    Magic(String),
    #[error("{path}: snapshot format version {found} is not supported (this spore reads version {FORMAT_VERSION} only; take the snapshot again with this spore)")]
    Version { path: String, found: u32 },
    #[error("{path}: the snapshot was taken on {found}; this spore runs on {} and cannot load another architecture's vCPU state", crate::arch::NAME)]
    Arch { path: String, found: String },
    #[error("{0}: the file is truncated")]
    Truncated(String),
    #[error("{0}: checksum mismatch: the file is corrupt")]
    Checksum(String),
    #[error("{0}: the state file has no MAC, but a snapshot key is configured: it was not written with the key (refused)")]
    MacMissing(String),
    #[error("{0}: MAC mismatch: the state file was altered, or written with another snapshot key (refused)")]
    MacMismatch(String),
    #[error("{0}: the state file carries a MAC (it was written with a snapshot key), but no key is configured: give it with --snapshot-key-file")]
    MacUnexpected(String),
    #[error("{path}: {detail}")]
    Invalid { path: String, detail: String },
}

/// What kind of memory a layer holds: a full layer stands alone, a diff
/// holds only the pages written since its parent and names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LayerKind {
    Full,
    Diff,
}

/// A reference to the layer a diff applies to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParentRef {
    pub id: String,
    /// `sha256:` and the hex SHA-256 of the parent's whole state file (see
    /// [`state_digest`]), checked before applying a diff. The state file
    /// names its memory file's id, and the memory file carries that id in
    /// its tag, so this pins the parent's memory too without hashing
    /// gigabytes at every restore.
    pub content_hash: Option<String>,
    /// Where the parent's state file was, relative to this state file's
    /// directory when it lies below it, else absolute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_path: Option<String>,
    /// Where the parent's memory file was, likewise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_path: Option<String>,
}

/// The content hash of a state file, as a diff names its parent:
/// `sha256:<64 hex digits>`.
pub fn state_digest(bytes: &[u8]) -> String {
    use sha2::Digest;
    let d = sha2::Sha256::digest(bytes);
    let mut s = String::with_capacity(7 + 64);
    s.push_str("sha256:");
    for b in d.iter() {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layer {
    /// Random id of this snapshot.
    pub id: String,
    pub kind: LayerKind,
    pub parent: Option<ParentRef>,
    /// Size of the memory file (the guest RAM size for a full layer).
    pub mem_file_size: u64,
    /// Bytes of the memory file that hold data (the rest are holes).
    pub mem_data_bytes: u64,
    /// The SHA-256 of the memory file's contents
    /// ([`super::integrity::memory_hash`]), when asked for at creation
    /// (`hash_memory`): checked by an eager restore and `inspect --verify`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_sha256: Option<String>,
    /// A diff's dirty pages that were all zero, as `[offset, len]` runs:
    /// part of the layer although a copy may have turned them into holes
    /// (GNU cp does). Absent when not recorded (too many runs): then only
    /// the file's data ranges count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zero_runs: Option<Vec<[u64; 2]>>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceInfo {
    #[serde(rename = "type")]
    pub kind: String,
    pub detail: String,
}

/// Where the virtio-mem hotplug region lies in the memory file: right after
/// boot RAM, as long as the region, plugged blocks as data and unplugged
/// blocks as holes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HotplugRegionInfo {
    pub guest_addr: u64,
    pub file_offset: u64,
    pub region_size_bytes: u64,
    pub block_size_bytes: u64,
    pub plugged_bytes: u64,
    pub requested_bytes: u64,
    /// Bytes of the region written to the memory file.
    pub data_bytes: u64,
    /// A diff's ranges of the region released (blocks unplugged) since its
    /// parent, as `[file offset, len]`: they belong to the diff, reading as
    /// zero wherever it wrote nothing, so no older layer's data there comes
    /// back. Empty in a full layer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub released_runs: Vec<[u64; 2]>,
}

/// The human-readable part of a state file (`spore snapshot inspect`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format_version: u32,
    pub spore_version: String,
    /// The host architecture the snapshot was taken on (`crate::arch::NAME`);
    /// its vCPU and interrupt-controller state only loads there. Files
    /// written before spore ran elsewhere are x86_64's.
    #[serde(default = "x86_64_arch")]
    pub arch: String,
    pub created_unix_ms: u64,
    pub guest: String,
    pub vcpu_count: u32,
    pub mem_size_bytes: u64,
    pub devices: Vec<DeviceInfo>,
    pub layer: Layer,
    pub state_bytes: u64,
    /// The virtio-mem region's place in the memory file, if the VM has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hotplug: Option<HotplugRegionInfo>,
}

/// Serializes manifest + state into the on-disk layout, with a MAC under
/// this process's snapshot key if one is set.
pub fn encode(manifest: &Manifest, state: &[u8]) -> Result<Vec<u8>, serde_json::Error> {
    encode_with(manifest, state, super::integrity::key())
}

/// [`encode`] with an explicit key (or none).
pub fn encode_with(
    manifest: &Manifest,
    state: &[u8],
    key: Option<&SnapshotKey>,
) -> Result<Vec<u8>, serde_json::Error> {
    let json = serde_json::to_vec_pretty(manifest)?;
    let mut out = Vec::with_capacity(json.len() + state.len() + 32);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    let json_len = u32::try_from(json.len()).map_err(|_| {
        <serde_json::Error as serde::ser::Error>::custom("snapshot manifest over 4 GiB")
    })?;
    out.extend_from_slice(&json_len.to_le_bytes());
    out.extend_from_slice(&json);
    out.extend_from_slice(&(state.len() as u64).to_le_bytes());
    out.extend_from_slice(state);
    match key {
        Some(k) => {
            let mac = k.mac(&out);
            #[allow(clippy::cast_possible_truncation, reason = "MAC_LEN is 32")]
            let mac_len = MAC_LEN as u32;
            out.extend_from_slice(&mac_len.to_le_bytes());
            out.extend_from_slice(&mac);
        }
        None => out.extend_from_slice(&0u32.to_le_bytes()),
    }
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    Ok(out)
}

/// Checks and splits a state file under this process's snapshot key;
/// `path` only names it in errors.
pub fn decode<'a>(path: &str, bytes: &'a [u8]) -> Result<(Manifest, &'a [u8]), FormatError> {
    decode_with(path, bytes, super::integrity::key())
}

/// [`decode`] with an explicit key (or none).
pub fn decode_with<'a>(
    path: &str,
    bytes: &'a [u8],
    key: Option<&SnapshotKey>,
) -> Result<(Manifest, &'a [u8]), FormatError> {
    let truncated = || FormatError::Truncated(path.to_string());
    if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
        return Err(FormatError::Magic(path.to_string()));
    }
    let mut r = Reader {
        bytes,
        pos: MAGIC.len(),
    };
    let version = u32::from_le_bytes(
        r.take(4)
            .ok_or_else(truncated)?
            .try_into()
            .map_err(|_| truncated())?,
    );
    if version != FORMAT_VERSION {
        return Err(FormatError::Version {
            path: path.to_string(),
            found: version,
        });
    }
    let mlen = r.u32().ok_or_else(truncated)?;
    if mlen > MAX_MANIFEST {
        return Err(FormatError::Checksum(path.to_string()));
    }
    let manifest_bytes = r.take(mlen as usize).ok_or_else(truncated)?;
    let slen = r.u64().ok_or_else(truncated)?;
    // Longer than the bytes there are: `take` refuses it.
    let state = r
        .take(usize::try_from(slen).map_err(|_| truncated())?)
        .ok_or_else(truncated)?;
    let signed_end = r.pos;
    let alen = r.u32().ok_or_else(truncated)?;
    if alen != 0 && alen as usize != MAC_LEN {
        return Err(FormatError::Checksum(path.to_string()));
    }
    let mac = r.take(alen as usize).ok_or_else(truncated)?;
    let body_end = r.pos;
    let crc = r.u32().ok_or_else(truncated)?;
    if r.pos != bytes.len() {
        return Err(FormatError::Invalid {
            path: path.to_string(),
            detail: format!("{} bytes of trailing garbage", bytes.len() - r.pos),
        });
    }
    if crc32fast::hash(&bytes[..body_end]) != crc {
        return Err(FormatError::Checksum(path.to_string()));
    }
    // The MAC before anything is parsed: a keyed reader trusts no byte of
    // an unsigned or wrongly signed file.
    match (key, mac.is_empty()) {
        (Some(_), true) => return Err(FormatError::MacMissing(path.to_string())),
        (Some(k), false) if !k.verify(&bytes[..signed_end], mac) => {
            return Err(FormatError::MacMismatch(path.to_string()))
        }
        (None, false) => return Err(FormatError::MacUnexpected(path.to_string())),
        _ => {}
    }
    let manifest: Manifest =
        serde_json::from_slice(manifest_bytes).map_err(|e| FormatError::Invalid {
            path: path.to_string(),
            detail: format!("bad manifest: {e}"),
        })?;
    if manifest.state_bytes != slen {
        return Err(FormatError::Invalid {
            path: path.to_string(),
            detail: "the manifest's state size does not match the file".into(),
        });
    }
    if manifest.arch != crate::arch::NAME {
        return Err(FormatError::Arch {
            path: path.to_string(),
            found: manifest.arch,
        });
    }
    Ok((manifest, state))
}

fn x86_64_arch() -> String {
    "x86_64".into()
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let s = self.bytes.get(self.pos..end)?;
        self.pos = end;
        Some(s)
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
}

/// Reads and checks a state file.
pub fn read_state_file(path: &Path) -> Result<(Manifest, Vec<u8>), FormatError> {
    read_state_file_hashed(path).map(|(m, s, _)| (m, s))
}

/// Reads and checks a state file; also returns its [`state_digest`].
pub fn read_state_file_hashed(path: &Path) -> Result<(Manifest, Vec<u8>, String), FormatError> {
    let name = path.display().to_string();
    let io = |source| FormatError::Io {
        path: name.clone(),
        source,
    };
    // Never blocks (a FIFO) and never reads without end (a device): only a
    // regular file, read up to the length it had when opened.
    let file = crate::files::open_regular(path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    let mut bytes = read_bounded(&name, file, len)?;
    let digest = state_digest(&bytes);
    let (m, state) = decode(&name, &bytes)?;
    // The state is most of the file (a large tmem pool): cut the file's
    // buffer down to it rather than copy it.
    let start = state.as_ptr() as usize - bytes.as_ptr() as usize;
    let end = start + state.len();
    bytes.truncate(end);
    bytes.drain(..start);
    Ok((m, bytes, digest))
}

/// Reads a state file of `len` bytes (its size when opened), checking the
/// lengths its header announces against `len` before reading the state:
/// a truncated or over-long file is refused without reading its body, and
/// nothing past `len` is ever read.
fn read_bounded(path: &str, file: File, len: u64) -> Result<Vec<u8>, FormatError> {
    use std::io::Read;
    let io = |source| FormatError::Io {
        path: path.to_string(),
        source,
    };
    let mut r = file.take(len);
    let mut bytes = Vec::with_capacity(len.min(1 << 20) as usize);
    let mut fill = |bytes: &mut Vec<u8>, upto: u64| -> Result<(), FormatError> {
        let want = upto.saturating_sub(bytes.len() as u64);
        (&mut r).take(want).read_to_end(bytes).map_err(io)?;
        Ok(())
    };
    // Magic, version, manifest length; then the manifest and state length.
    let head = MAGIC.len() as u64 + 8;
    fill(&mut bytes, head)?;
    if bytes.get(..MAGIC.len()) != Some(&MAGIC[..]) {
        return Err(FormatError::Magic(path.to_string()));
    }
    let le32 = |b: &[u8], at: usize| b.get(at..at + 4).and_then(|s| s.try_into().ok());
    if let Some(m) = le32(&bytes, MAGIC.len() + 4).map(u32::from_le_bytes) {
        if m > MAX_MANIFEST {
            return Err(FormatError::Checksum(path.to_string()));
        }
        let slen_end = head + u64::from(m) + 8;
        if slen_end > len {
            return Err(FormatError::Truncated(path.to_string()));
        }
        fill(&mut bytes, slen_end)?;
        let at = host_usize::from_u64(slen_end - 8);
        let slen = bytes
            .get(at..at + 8)
            .and_then(|s| s.try_into().ok())
            .map_or(0, u64::from_le_bytes);
        // The MAC length follows the state.
        let alen_end = slen_end.saturating_add(slen).saturating_add(4);
        if alen_end > len {
            return Err(FormatError::Truncated(path.to_string()));
        }
        fill(&mut bytes, alen_end)?;
        let at = host_usize::from_u64(alen_end - 4);
        let alen = le32(&bytes, at).map_or(0, u32::from_le_bytes);
        let total = alen_end + u64::from(alen) + 4;
        if total > len {
            return Err(FormatError::Truncated(path.to_string()));
        }
        if total < len {
            return Err(FormatError::Invalid {
                path: path.to_string(),
                detail: format!("{} bytes of trailing garbage", len - total),
            });
        }
    }
    // Every length checked against the file: read the rest (a file too
    // short for its header is decode's to refuse), into one allocation.
    bytes.reserve_exact(host_usize::from_u64(len).saturating_sub(bytes.len()));
    fill(&mut bytes, len)?;
    Ok(bytes)
}

/// A file being written under a temporary name in its final directory;
/// [`PendingFile::commit`] makes it durable and renames it into place.
/// Dropped uncommitted, it removes itself.
pub struct PendingFile {
    pub file: File,
    tmp: PathBuf,
    dest: PathBuf,
    committed: bool,
}

impl PendingFile {
    /// Starts writing `dest`, which may be a new file or an existing regular
    /// file only (a device node, FIFO, socket or directory is refused). The
    /// temporary file is private (0600) and named with this process's pid;
    /// stale ones that dead processes left in the directory go first.
    pub fn create(dest: &Path) -> Result<Self, FormatError> {
        let io = |source| FormatError::Io {
            path: dest.display().to_string(),
            source,
        };
        crate::files::check_target(dest).map_err(io)?;
        let tmp = crate::files::temp_path(dest).map_err(io)?;
        crate::files::remove_stale_temps(crate::files::dir_of(dest));
        // Our own leftover (an earlier failed write) is replaced; the new file
        // is made with O_EXCL and O_NOFOLLOW, never through a planted link.
        let _ = std::fs::remove_file(&tmp);
        let file = crate::files::create_new_private(&tmp).map_err(io)?;
        Ok(Self {
            file,
            tmp,
            dest: dest.to_path_buf(),
            committed: false,
        })
    }

    /// fsyncs the data (a rename must never expose unwritten blocks).
    pub fn sync(&self) -> Result<(), FormatError> {
        self.file.sync_all().map_err(|source| FormatError::Io {
            path: self.tmp.display().to_string(),
            source,
        })
    }

    /// Renames into place and fsyncs the directory.
    pub fn commit(mut self) -> Result<(), FormatError> {
        let io = |source| FormatError::Io {
            path: self.dest.display().to_string(),
            source,
        };
        std::fs::rename(&self.tmp, &self.dest).map_err(io)?;
        self.committed = true;
        File::open(crate::files::dir_of(&self.dest))
            .and_then(|d| d.sync_all())
            .map_err(io)
    }
}

impl Drop for PendingFile {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Writes `bytes` to a pending file and syncs it (commit is the caller's).
pub fn write_pending(dest: &Path, bytes: &[u8]) -> Result<PendingFile, FormatError> {
    let mut p = PendingFile::create(dest)?;
    p.file.write_all(bytes).map_err(|source| FormatError::Io {
        path: dest.display().to_string(),
        source,
    })?;
    p.sync()?;
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(state_bytes: u64) -> Manifest {
        Manifest {
            format_version: FORMAT_VERSION,
            arch: crate::arch::NAME.into(),
            spore_version: "test".into(),
            created_unix_ms: 1,
            guest: "unikernel".into(),
            vcpu_count: 1,
            mem_size_bytes: 128 << 20,
            devices: vec![DeviceInfo {
                kind: "rng".into(),
                detail: String::new(),
            }],
            layer: Layer {
                id: "abc".into(),
                kind: LayerKind::Full,
                parent: None,
                mem_file_size: 128 << 20,
                mem_data_bytes: 4096,
                mem_sha256: None,
                zero_runs: None,
            },
            state_bytes,
            hotplug: None,
        }
    }

    #[test]
    fn round_trip() {
        let state = b"binary state".to_vec();
        let bytes = encode(&manifest(state.len() as u64), &state).unwrap();
        let (m, s) = decode("f", &bytes).unwrap();
        assert_eq!(m, manifest(state.len() as u64));
        assert_eq!(s, state);
    }

    #[test]
    fn every_flipped_byte_is_refused() {
        let state = vec![7u8; 100];
        let bytes = encode(&manifest(100), &state).unwrap();
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x40;
            assert!(decode("f", &b).is_err(), "flip at {i} accepted");
        }
    }

    #[test]
    fn bad_version_truncation_and_garbage_are_refused() {
        let bytes = encode(&manifest(3), b"abc").unwrap();
        let mut v = bytes.clone();
        v[8] = 9;
        assert!(matches!(
            decode("f", &v),
            Err(FormatError::Version { found: 9, .. })
        ));
        for n in 0..bytes.len() {
            assert!(
                decode("f", &bytes[..n]).is_err(),
                "truncated to {n} accepted"
            );
        }
        assert!(matches!(
            decode("f", &bytes[..bytes.len() - 1]),
            Err(FormatError::Truncated(_))
        ));
        let mut g = bytes.clone();
        g.push(0);
        assert!(decode("f", &g).is_err());
        assert!(matches!(decode("f", b"ELF..."), Err(FormatError::Magic(_))));
    }

    #[test]
    fn another_architectures_snapshot_is_refused_naming_both() {
        let other = if crate::arch::NAME == "x86_64" {
            "aarch64"
        } else {
            "x86_64"
        };
        let mut m = manifest(3);
        m.arch = other.into();
        let bytes = encode(&m, b"abc").unwrap();
        let e = decode("arm.state", &bytes).err().unwrap();
        assert!(matches!(e, FormatError::Arch { .. }), "{e}");
        let message = e.to_string();
        assert!(message.contains(other), "{message}");
        assert!(message.contains(crate::arch::NAME), "{message}");
        // A manifest written before the field existed is x86_64's.
        let json = serde_json::to_value(manifest(3)).unwrap();
        let mut old = json.as_object().unwrap().clone();
        old.remove("arch");
        let back: Manifest = serde_json::from_value(old.into()).unwrap();
        assert_eq!(back.arch, "x86_64");
    }

    #[test]
    fn an_older_format_is_refused_naming_both_versions() {
        let mut bytes = encode(&manifest(3), b"abc").unwrap();
        bytes[8..12].copy_from_slice(&1u32.to_le_bytes());
        let e = decode("old.state", &bytes).err().unwrap();
        assert!(matches!(e, FormatError::Version { found: 1, .. }), "{e}");
        let message = e.to_string();
        assert!(message.contains("version 1 "), "{message}");
        assert!(
            message.contains(&format!("version {FORMAT_VERSION} ")),
            "{message}"
        );
        const { assert!(FORMAT_VERSION > 1) };
    }

    /// `bytes` with its trailing CRC recomputed (what an attacker editing
    /// the file can always do).
    fn recrc(mut bytes: Vec<u8>) -> Vec<u8> {
        let n = bytes.len() - 4;
        let crc = crc32fast::hash(&bytes[..n]);
        bytes[n..].copy_from_slice(&crc.to_le_bytes());
        bytes
    }

    #[test]
    fn a_key_signs_and_every_edit_is_refused() {
        let key = SnapshotKey::new(&[0x5a; 32]).unwrap();
        let other = SnapshotKey::new(&[0xa5; 40]).unwrap();
        let k = Some(&key);
        let state = vec![7u8; 100];
        let signed = encode_with(&manifest(100), &state, k).unwrap();
        let (m, s) = decode_with("f", &signed, k).unwrap();
        assert_eq!((m, s), (manifest(100), &state[..]));
        // Every flipped byte, even with the CRC fixed up, is refused.
        for i in 0..signed.len() - 4 {
            let mut b = signed.clone();
            b[i] ^= 0x01;
            assert!(decode_with("f", &recrc(b), k).is_err(), "flip at {i}");
        }
        // An edited manifest with a recomputed CRC: the MAC does not match.
        let text = String::from_utf8_lossy(&signed).into_owned();
        let at = text.find("\"vcpu_count\": 1").unwrap() + "\"vcpu_count\": ".len();
        let mut edited = signed.clone();
        edited[at] = b'2';
        let e = decode_with("f", &recrc(edited), k).unwrap_err();
        assert!(matches!(e, FormatError::MacMismatch(_)), "{e}");
        // Another key; no key; an unsigned file under a key.
        let e = decode_with("f", &signed, Some(&other)).unwrap_err();
        assert!(matches!(e, FormatError::MacMismatch(_)), "{e}");
        let e = decode_with("f", &signed, None).unwrap_err();
        assert!(matches!(e, FormatError::MacUnexpected(_)), "{e}");
        assert!(e.to_string().contains("--snapshot-key-file"), "{e}");
        let unsigned = encode_with(&manifest(100), &state, None).unwrap();
        let e = decode_with("f", &unsigned, k).unwrap_err();
        assert!(matches!(e, FormatError::MacMissing(_)), "{e}");
        // A signed file with its MAC stripped (and the CRC fixed up).
        let mut stripped = signed[..signed.len() - 4 - 4 - MAC_LEN].to_vec();
        stripped.extend_from_slice(&0u32.to_le_bytes());
        stripped.extend_from_slice(&[0; 4]);
        let e = decode_with("f", &recrc(stripped), k).unwrap_err();
        assert!(matches!(e, FormatError::MacMissing(_)), "{e}");
    }

    #[test]
    fn pending_file_is_atomic() {
        let dir = std::env::temp_dir().join(format!("spore-fmt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let dest = dir.join("state");
        std::fs::write(&dest, b"old").unwrap();
        // Abandoned: the old file stays, no temp file is left.
        drop(write_pending(&dest, b"new").unwrap());
        assert_eq!(std::fs::read(&dest).unwrap(), b"old");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        write_pending(&dest, b"new").unwrap().commit().unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), b"new");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn pending_files_are_private_and_replace_regular_files_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("spore-fmt-mode-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let dest = dir.join("state");
        // A temp file a killed process left goes; another name stays.
        let stale = dir.join(".old.mem.spore-tmp-4194305");
        let other = dir.join(".old.mem.tmp-4194305");
        std::fs::write(&stale, b"x").unwrap();
        std::fs::write(&other, b"x").unwrap();
        write_pending(&dest, b"new").unwrap().commit().unwrap();
        let mode = std::fs::metadata(&dest).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert!(!stale.exists() && other.exists());
        let e = PendingFile::create(Path::new("/dev/null")).err().unwrap();
        assert!(e.to_string().contains("character device"), "{e}");
        let e = PendingFile::create(&dir).err().unwrap();
        assert!(e.to_string().contains("directory"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn state_files_that_are_devices_or_lie_about_their_length_are_refused() {
        let e = read_state_file(Path::new("/dev/zero")).err().unwrap();
        assert!(e.to_string().contains("character device"), "{e}");
        let dir = std::env::temp_dir().join(format!("spore-fmt-len-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("state");
        let mut bytes = encode(&manifest(3), b"abc").unwrap();
        // The header announces a state longer than the file.
        let at = MAGIC.len() + 8 + u32::from_le_bytes(bytes[12..16].try_into().unwrap()) as usize;
        bytes[at..at + 8].copy_from_slice(&1000u64.to_le_bytes());
        std::fs::write(&p, &bytes).unwrap();
        assert!(matches!(
            read_state_file(&p),
            Err(FormatError::Truncated(_))
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
