//! `spore snapshot merge`: flattens a chain of layers into one full
//! snapshot (Firecracker's `rebase-snap`, built in), and `inspect`'s view
//! of a chain.
//!
//! The merged memory is, page by page, what [`crate::memory::layers::MemoryLayers::extents`]
//! resolves (newest layer wins), written sparsely: all-zero pages become
//! holes, which a full layer reads as zeros. The state is the newest
//! layer's, unchanged; the manifest becomes a full layer with a new id (a
//! diff made against the old chain does not apply to the merged snapshot,
//! which is a different file). A virtio-mem VM's hotplug region, after
//! boot RAM, is merged the same way. Both files are written under temporary
//! names and renamed into place only when complete and synced.

use std::os::unix::fs::FileExt;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

use super::chain::{self, LayerPaths};
use super::format::{self, LayerKind, ParentRef};
use super::{integrity, trailer, SnapshotError, SnapshotInfo};
use crate::host::random_id;
use crate::host_usize;

/// Bytes copied per read while merging.
const CHUNK: u64 = 1 << 20;

/// Writes the chain ending at `newest` (parents found as for a load) as
/// one full snapshot at `out`.
pub fn merge(
    newest: &LayerPaths,
    parents: &[LayerPaths],
    out: &LayerPaths,
) -> Result<SnapshotInfo, SnapshotError> {
    let mut chain = chain::walk(newest, parents)?;
    let mut manifest = chain.layers[0].manifest.clone();
    let size = manifest.mem_size_bytes;
    let file_size = manifest.layer.mem_file_size;
    let layers = chain.memory_layers(size);
    let mem_name = out.mem.display().to_string();
    let mem_err = |source| SnapshotError::MemoryWrite {
        path: mem_name.clone(),
        source,
    };
    let mem_pending = format::PendingFile::create(&out.mem)?;
    mem_pending.file.set_len(file_size).map_err(mem_err)?;
    let mut buf = vec![0u8; host_usize::from_u64(CHUNK)];
    let mut copy = |extents: Vec<crate::memory::layers::Extent>| -> std::io::Result<u64> {
        let mut written = 0;
        for e in extents {
            let src = &layers.files()[e.layer];
            let mut off = e.offset;
            let end = e.offset + e.len;
            while off < end {
                let n = (end - off).min(CHUNK) as usize;
                src.read_exact_at(&mut buf[..n], off)?;
                written += crate::memory::pages::write_nonzero(&buf[..n], &mem_pending.file, off)?;
                off += n as u64;
            }
        }
        Ok(written)
    };
    let ram_bytes = copy(layers.extents().map_err(mem_err)?).map_err(mem_err)?;
    // The hotplug region resolves like RAM: a block released in a newer
    // layer reads as zero there, so it becomes a hole here.
    let region_bytes = copy(layers.region_extents().map_err(mem_err)?).map_err(mem_err)?;
    if let Some(h) = manifest.hotplug.as_mut() {
        h.data_bytes = region_bytes;
        h.released_runs.clear();
    }
    let data_bytes = ram_bytes + region_bytes;
    let id = random_id();
    let mem_sha256 = match chain.layers[0].manifest.layer.mem_sha256 {
        // The newest layer was hashed: so is the merged memory.
        Some(_) => Some(integrity::memory_hash(&mem_pending.file, file_size).map_err(mem_err)?),
        None => None,
    };
    trailer::write(&mem_pending.file, &id, file_size).map_err(mem_err)?;
    mem_pending.sync()?;
    manifest.created_unix_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0);
    manifest.spore_version = env!("CARGO_PKG_VERSION").to_string();
    manifest.layer.id = id;
    manifest.layer.kind = LayerKind::Full;
    manifest.layer.parent = None;
    manifest.layer.mem_data_bytes = data_bytes;
    manifest.layer.zero_runs = None;
    manifest.layer.mem_sha256 = mem_sha256;
    let bytes =
        format::encode(&manifest, &chain.newest_state).map_err(|e| SnapshotError::Capture {
            what: "the manifest",
            detail: e.to_string(),
        })?;
    let state_pending = format::write_pending(&out.state, &bytes)?;
    mem_pending.commit()?;
    state_pending.commit()?;
    Ok(SnapshotInfo { manifest })
}

/// One layer as `spore snapshot inspect` shows it.
#[derive(Debug, Serialize)]
pub struct LayerSummary {
    pub id: String,
    pub kind: LayerKind,
    pub state_path: String,
    pub mem_path: String,
    pub state_hash: String,
    /// Bytes of data the layer wrote (a diff: its dirty pages).
    pub mem_data_bytes: u64,
    /// What the memory file occupies on disk.
    pub mem_disk_bytes: u64,
    pub created_unix_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<ParentRef>,
}

/// The checked chain ending at `newest`, newest layer first.
pub fn describe(
    newest: &LayerPaths,
    parents: &[LayerPaths],
) -> Result<Vec<LayerSummary>, SnapshotError> {
    let chain = chain::walk(newest, parents)?;
    Ok(chain
        .layers
        .into_iter()
        .map(|l| LayerSummary {
            id: l.manifest.layer.id,
            kind: l.manifest.layer.kind,
            state_path: l.paths.state.display().to_string(),
            mem_path: l.paths.mem.display().to_string(),
            state_hash: l.state_hash,
            mem_data_bytes: l.manifest.layer.mem_data_bytes,
            mem_disk_bytes: l.mem_disk_bytes,
            created_unix_ms: l.manifest.created_unix_ms,
            parent: l.manifest.layer.parent,
        })
        .collect())
}

/// What `spore snapshot inspect --verify` checked.
#[derive(Debug, Serialize)]
pub struct Verified {
    /// Layers whose memory file matched its recorded `mem_sha256`.
    pub memory_hashed_layers: usize,
    /// Layers without a recorded hash (their memory was only checked for
    /// size, trailer and, for a diff, data extent).
    pub memory_unhashed_layers: usize,
}

/// Checks the chain ending at `newest` as a load does, and every recorded
/// memory hash (which a lazy load does not read).
pub fn verify(newest: &LayerPaths, parents: &[LayerPaths]) -> Result<Verified, SnapshotError> {
    let chain = chain::walk(newest, parents)?;
    let n = integrity::verify_memory(&chain.layers, &chain.files)?;
    Ok(Verified {
        memory_hashed_layers: n,
        memory_unhashed_layers: chain.layers.len() - n,
    })
}
