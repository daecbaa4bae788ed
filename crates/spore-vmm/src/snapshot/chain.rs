//! Layered snapshots: walking a chain base ← diff ← … ← newest from the
//! newest state file, checking every link, and what a VM remembers to make
//! its next diff.
//!
//! A diff's manifest names its parent ([`ParentRef`]): the parent's id, the
//! SHA-256 of the parent's state file, and where the parent's files were
//! (relative to the diff's own directory when they lay below it, so a
//! directory of layers can be moved as a whole). A load may also name the
//! parents' files explicitly, nearest parent first, for layers moved apart.
//! Every link must hold: parent files present, parent id and state hash as
//! named, the same guest memory size and vCPU count, each memory file of the
//! right size and ending with a trailer naming its layer's id, and each diff's data exactly
//! the bytes its manifest says it wrote (a copy that filled or dropped holes
//! would change what the diff means).

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::format::{self, LayerKind, Manifest, ParentRef};
use super::{trailer, SnapshotError};
use crate::memory::layers::MemoryLayers;

/// Longest chain accepted (a crafted cycle of state files must not loop).
pub const MAX_LAYERS: usize = 256;

/// A layer's two files.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LayerPaths {
    pub state: PathBuf,
    pub mem: PathBuf,
}

/// One checked layer of a chain.
#[derive(Debug, Clone)]
pub struct LayerInfo {
    pub paths: LayerPaths,
    pub manifest: Manifest,
    /// [`format::state_digest`] of the state file.
    pub state_hash: String,
    /// Bytes the memory file occupies on disk (st_blocks).
    pub mem_disk_bytes: u64,
}

/// A checked chain: `layers` newest first, `files` base first (the order
/// [`MemoryLayers`] takes), and the newest layer's binary
/// state.
pub struct Chain {
    pub layers: Vec<LayerInfo>,
    pub files: Vec<File>,
    pub newest_state: Vec<u8>,
}

impl Chain {
    /// The chain's memory, each diff's recorded zero pages included (takes
    /// the files).
    pub fn memory_layers(&mut self, size: u64) -> MemoryLayers {
        let mut layers = MemoryLayers::new(std::mem::take(&mut self.files), size);
        // Every layer's region lies where the newest's does (`check_link`).
        if let Some(h) = self
            .layers
            .first()
            .and_then(|l| l.manifest.hotplug.as_ref())
        {
            layers = layers.with_region(h.file_offset, h.region_size_bytes);
        }
        // `self.layers` is newest first, the files base first.
        for (i, l) in self.layers.iter().rev().enumerate() {
            if let Some(z) = &l.manifest.layer.zero_runs {
                layers.add_ranges(i, z.iter().map(|r| (r[0], r[1])).collect());
            }
            if let Some(h) = &l.manifest.hotplug {
                layers.add_ranges(i, h.released_runs.iter().map(|r| (r[0], r[1])).collect());
            }
        }
        layers
    }
}

/// What a VM's next diff applies to: the snapshot it last wrote or was
/// restored from.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ChainHead {
    pub id: String,
    pub state_hash: String,
    /// Absolute paths, as they were when written or loaded.
    pub paths: LayerPaths,
    pub mem_size: u64,
    pub vcpu_count: u32,
}

impl ChainHead {
    pub fn of(layer: &LayerInfo) -> Self {
        Self {
            id: layer.manifest.layer.id.clone(),
            state_hash: layer.state_hash.clone(),
            paths: LayerPaths {
                state: absolute(&layer.paths.state),
                mem: absolute(&layer.paths.mem),
            },
            mem_size: layer.manifest.mem_size_bytes,
            vcpu_count: layer.manifest.vcpu_count,
        }
    }

    /// Refuses a diff whose files would replace this head's (its parent).
    pub fn check_diff_target(&self, state: &Path, mem: &Path) -> Result<(), SnapshotError> {
        for p in [state, mem] {
            let p = absolute(p);
            if p == self.paths.state || p == self.paths.mem {
                return Err(SnapshotError::DiffOverParent(p.display().to_string()));
            }
        }
        Ok(())
    }

    /// The reference a diff written to `child_state` makes to this head.
    pub fn parent_ref(&self, child_state: &Path) -> ParentRef {
        let dir = absolute(child_state)
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        ParentRef {
            id: self.id.clone(),
            content_hash: Some(self.state_hash.clone()),
            state_path: Some(relative_to(&self.paths.state, &dir)),
            mem_path: Some(relative_to(&self.paths.mem, &dir)),
        }
    }
}

/// `p` made absolute (canonical when it exists) without failing.
pub fn absolute(p: &Path) -> PathBuf {
    if let Ok(c) = p.canonicalize() {
        return c;
    }
    if let (Some(dir), Some(name)) = (p.parent(), p.file_name()) {
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        if let Ok(d) = dir.canonicalize() {
            return d.join(name);
        }
    }
    std::env::current_dir()
        .map(|d| d.join(p))
        .unwrap_or_else(|_| p.to_path_buf())
}

fn relative_to(p: &Path, dir: &Path) -> String {
    match p.strip_prefix(dir) {
        Ok(rel) if !rel.as_os_str().is_empty() => rel.display().to_string(),
        _ => p.display().to_string(),
    }
}

/// Where a manifest's parent reference points, resolved against the
/// child's state file's directory.
fn resolve(child_state: &Path, named: Option<&String>) -> Option<PathBuf> {
    let named = Path::new(named?);
    if named.is_absolute() {
        return Some(named.to_path_buf());
    }
    let dir = child_state.parent().unwrap_or(Path::new("."));
    Some(dir.join(named))
}

/// Reads the layer at `paths` and checks it on its own: the state file's
/// format and checksum, then (after `check`, which sees the manifest and
/// state hash first, so that a wrong parent is reported as such rather
/// than as a memory file mismatch) the memory file's size and trailer, and a
/// diff's data.
fn read_layer(
    paths: &LayerPaths,
    check: impl FnOnce(&Manifest, &str) -> Result<(), SnapshotError>,
) -> Result<(LayerInfo, Vec<u8>, File), SnapshotError> {
    let (manifest, state, state_hash) = format::read_state_file_hashed(&paths.state)?;
    check(&manifest, &state_hash)?;
    let mem_name = paths.mem.display().to_string();
    let open_err = |source| SnapshotError::MemoryOpen {
        path: mem_name.clone(),
        source,
    };
    let file = crate::files::open_regular(&paths.mem).map_err(open_err)?;
    let md = file.metadata().map_err(open_err)?;
    // A virtio-mem region's memory follows boot RAM in the file.
    let file_size = check_runs(&mem_name, &manifest)?;
    // Sizes are checked before anything is mapped: the guest-memory part,
    // then the trailer naming the snapshot (see `trailer`).
    let with_trailer = file_size + trailer::TRAILER_LEN;
    if md.len() != with_trailer || manifest.layer.mem_file_size != file_size {
        return Err(SnapshotError::MemorySize {
            path: mem_name,
            expected: file_size,
            actual: md.len().saturating_sub(trailer::TRAILER_LEN),
        });
    }
    let t = trailer::read(&file).map_err(|e| SnapshotError::MemoryTrailer {
        path: mem_name.clone(),
        detail: e.to_string(),
    })?;
    if t.id != manifest.layer.id {
        return Err(SnapshotError::MemoryMismatch {
            path: mem_name,
            mem_id: t.id,
            state_id: manifest.layer.id,
        });
    }
    if manifest.layer.kind == LayerKind::Diff {
        // The file's data plus the recorded zero pages (a copy may have
        // made holes of them) must be exactly what the diff wrote.
        let mut ranges = crate::memory::pages::data_ranges(&file, file_size).map_err(open_err)?;
        if let Some(z) = &manifest.layer.zero_runs {
            ranges.extend(z.iter().map(|r| (r[0], r[1])));
        }
        let actual: u64 = crate::memory::pages::merge(ranges)
            .iter()
            .map(|r| r.1)
            .sum();
        if actual != manifest.layer.mem_data_bytes {
            return Err(SnapshotError::DiffData {
                path: mem_name,
                expected: manifest.layer.mem_data_bytes,
                actual,
            });
        }
    }
    let info = LayerInfo {
        paths: paths.clone(),
        manifest,
        state_hash,
        mem_disk_bytes: md.blocks() * 512,
    };
    Ok((info, state, file))
}

/// Checks what a manifest says of its memory file's layout before anything
/// is read or mapped by it: the hotplug region right after boot RAM, every
/// recorded run inside the file (released runs inside the region, and only
/// in a diff), each page-aligned. Returns the file's size without trailer.
fn check_runs(path: &str, m: &Manifest) -> Result<u64, SnapshotError> {
    let bad = |detail: String| SnapshotError::MemoryTrailer {
        path: path.to_string(),
        detail: format!("the manifest's memory layout is invalid: {detail}"),
    };
    let ram = m.mem_size_bytes;
    let (region_start, region_end) = match &m.hotplug {
        None => (ram, ram),
        Some(h) => {
            if h.file_offset != ram {
                return Err(bad(format!(
                    "the hotplug region is at file offset {:#x}, not right after the {ram:#x} bytes of boot RAM",
                    h.file_offset
                )));
            }
            let end = ram
                .checked_add(h.region_size_bytes)
                .ok_or_else(|| bad("the hotplug region's size overflows".into()))?;
            (ram, end)
        }
    };
    let aligned = |o: u64, l: u64| o.is_multiple_of(4096) && l.is_multiple_of(4096);
    let inside = |r: &[u64; 2], lo: u64, hi: u64| {
        r[0] >= lo && r[0].checked_add(r[1]).is_some_and(|e| e <= hi) && aligned(r[0], r[1])
    };
    if let Some(r) = m
        .layer
        .zero_runs
        .iter()
        .flatten()
        .find(|r| !inside(r, 0, region_end))
    {
        return Err(bad(format!(
            "zero run {:#x}+{:#x} is not page-aligned inside the {region_end:#x}-byte file",
            r[0], r[1]
        )));
    }
    if let Some(h) = &m.hotplug {
        if !h.released_runs.is_empty() && m.layer.kind != LayerKind::Diff {
            return Err(bad("a full layer lists released runs".into()));
        }
        if let Some(r) = h
            .released_runs
            .iter()
            .find(|r| !inside(r, region_start, region_end))
        {
            return Err(bad(format!(
                "released run {:#x}+{:#x} is not page-aligned inside the hotplug region {region_start:#x}..{region_end:#x}",
                r[0], r[1]
            )));
        }
    }
    Ok(region_end)
}

/// Walks the chain ending at `newest`, checking every layer and link.
/// `parents` names the parents' files explicitly, nearest parent first;
/// beyond it, each diff's manifest says where its parent is.
pub fn walk(newest: &LayerPaths, parents: &[LayerPaths]) -> Result<Chain, SnapshotError> {
    let (info, newest_state, file) = read_layer(newest, |_, _| Ok(()))?;
    let mut layers = vec![info];
    let mut files = vec![file];
    loop {
        let child = layers.last().expect("the chain starts with one layer");
        let m = &child.manifest;
        if m.layer.kind == LayerKind::Full {
            break;
        }
        let child_name = child.paths.state.display().to_string();
        let parent = m
            .layer
            .parent
            .clone()
            .ok_or_else(|| SnapshotError::Decode {
                path: child_name.clone(),
                detail: "a diff layer without a parent reference".into(),
            })?;
        if layers.len() >= MAX_LAYERS {
            return Err(SnapshotError::ChainTooLong(MAX_LAYERS));
        }
        let depth = layers.len() - 1;
        let paths = match parents.get(depth) {
            Some(p) => p.clone(),
            None => LayerPaths {
                state: resolve(&child.paths.state, parent.state_path.as_ref()).ok_or_else(
                    || SnapshotError::ParentMissing {
                        child: child_name.clone(),
                        id: parent.id.clone(),
                        detail:
                            "the manifest does not say where it is; name it in the load request"
                                .into(),
                    },
                )?,
                mem: resolve(&child.paths.state, parent.mem_path.as_ref()).ok_or_else(|| {
                    SnapshotError::ParentMissing {
                        child: child_name.clone(),
                        id: parent.id.clone(),
                        detail: "the manifest does not say where its memory file is".into(),
                    }
                })?,
            },
        };
        for p in [&paths.state, &paths.mem] {
            if !p.exists() {
                return Err(SnapshotError::ParentMissing {
                    child: child_name.clone(),
                    id: parent.id.clone(),
                    detail: format!("{} does not exist", p.display()),
                });
            }
        }
        let (info, _, file) = read_layer(&paths, |pm, hash| {
            check_link(&child_name, m, &parent, &paths.state, pm, hash)
        })?;
        layers.push(info);
        files.push(file);
    }
    if parents.len() > layers.len() - 1 {
        return Err(SnapshotError::ExtraParents {
            given: parents.len(),
            chain: layers.len() - 1,
        });
    }
    files.reverse();
    Ok(Chain {
        layers,
        files,
        newest_state,
    })
}

/// Checks that `parent` is the layer `child` (named `child_name`) names.
fn check_link(
    child_name: &str,
    child: &Manifest,
    want: &ParentRef,
    parent_state: &Path,
    pm: &Manifest,
    parent_hash: &str,
) -> Result<(), SnapshotError> {
    let mismatch = |detail: String| SnapshotError::ParentMismatch {
        child: child_name.to_string(),
        parent: parent_state.display().to_string(),
        detail,
    };
    if pm.layer.id != want.id {
        return Err(mismatch(format!(
            "the diff applies to snapshot {}, this is snapshot {}",
            want.id, pm.layer.id
        )));
    }
    if let Some(h) = &want.content_hash {
        if h != parent_hash {
            return Err(mismatch(format!(
                "its content hash is {parent_hash}, the diff expects {h} (the file was rewritten or altered)"
            )));
        }
    }
    let region = |m: &Manifest| {
        m.hotplug
            .as_ref()
            .map(|h| (h.guest_addr, h.region_size_bytes, h.block_size_bytes))
    };
    if region(child) != region(pm) {
        return Err(mismatch(format!(
            "the hotplug memory region differs: {:?} in the diff, {:?} in the parent (address, size, block size)",
            region(child),
            region(pm)
        )));
    }
    for (field, c, p) in [
        ("guest memory size", child.mem_size_bytes, pm.mem_size_bytes),
        (
            "vCPU count",
            u64::from(child.vcpu_count),
            u64::from(pm.vcpu_count),
        ),
    ] {
        if c != p {
            return Err(mismatch(format!(
                "the {field} differs: {c} in the diff, {p} in the parent (a snapshot of another VM)"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::FileExt;

    use super::*;
    use crate::snapshot::format::{encode, Layer, FORMAT_VERSION};

    struct Dir(PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn dir(name: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("spore-chain-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }

    const SIZE: u64 = 1 << 20;

    /// Writes a layer named `name` with data pages `pages`; returns its
    /// paths and head.
    fn layer(
        d: &Path,
        name: &str,
        parent: Option<&ChainHead>,
        pages: &[u64],
        mem_size: u64,
        vcpus: u32,
    ) -> (LayerPaths, ChainHead) {
        let paths = LayerPaths {
            state: d.join(format!("{name}.state")),
            mem: d.join(format!("{name}.mem")),
        };
        let f = File::create(&paths.mem).unwrap();
        f.set_len(mem_size).unwrap();
        for &p in pages {
            f.write_all_at(&[0x11u8; 4096], p * 4096).unwrap();
        }
        let id = format!("id-{name}");
        trailer::write(&f, &id, mem_size).unwrap();
        let manifest = Manifest {
            format_version: FORMAT_VERSION,
            arch: crate::arch::NAME.into(),
            spore_version: "test".into(),
            created_unix_ms: 0,
            guest: "unikernel".into(),
            vcpu_count: vcpus,
            mem_size_bytes: mem_size,
            devices: Vec::new(),
            layer: Layer {
                id,
                kind: if parent.is_some() {
                    LayerKind::Diff
                } else {
                    LayerKind::Full
                },
                parent: parent.map(|h| h.parent_ref(&paths.state)),
                mem_file_size: mem_size,
                mem_data_bytes: pages.len() as u64 * 4096,
                mem_sha256: None,
                zero_runs: None,
            },
            state_bytes: 3,
            hotplug: None,
        };
        std::fs::write(&paths.state, encode(&manifest, b"abc").unwrap()).unwrap();
        let (info, _, _) = read_layer(&paths, |_, _| Ok(())).unwrap();
        (paths, ChainHead::of(&info))
    }

    #[test]
    fn a_three_layer_chain_walks_to_its_base() {
        let d = dir("walk");
        let (_, base) = layer(&d.0, "base", None, &[0, 1, 2], SIZE, 1);
        let (_, d1) = layer(&d.0, "d1", Some(&base), &[1], SIZE, 1);
        let (p2, _) = layer(&d.0, "d2", Some(&d1), &[2, 3], SIZE, 1);
        let chain = walk(&p2, &[]).unwrap();
        let ids: Vec<_> = chain
            .layers
            .iter()
            .map(|l| l.manifest.layer.id.as_str())
            .collect();
        assert_eq!(ids, ["id-d2", "id-d1", "id-base"]);
        assert_eq!(chain.files.len(), 3);
        assert_eq!(chain.newest_state, b"abc");
        // Parents are named relative to the child's directory.
        let r = chain.layers[0].manifest.layer.parent.as_ref().unwrap();
        assert_eq!(r.state_path.as_deref(), Some("d1.state"));
        assert!(r.content_hash.as_ref().unwrap().starts_with("sha256:"));
    }

    #[test]
    fn a_diff_may_not_replace_its_parent() {
        let d = dir("over");
        let (p, base) = layer(&d.0, "base", None, &[0], SIZE, 1);
        let e = base
            .check_diff_target(&p.state, &d.0.join("x.mem"))
            .err()
            .unwrap();
        assert!(matches!(e, SnapshotError::DiffOverParent(_)), "{e}");
        // Through another spelling of the same path, and for the memory file.
        let other = d.0.join(".").join("base.mem");
        assert!(base
            .check_diff_target(&d.0.join("x.state"), &other)
            .is_err());
        assert!(base
            .check_diff_target(&d.0.join("x.state"), &d.0.join("x.mem"))
            .is_ok());
    }

    #[test]
    fn moved_directories_and_explicit_parents() {
        let d = dir("moved");
        let (_, base) = layer(&d.0, "base", None, &[0], SIZE, 1);
        let (p1, _) = layer(&d.0, "d1", Some(&base), &[1], SIZE, 1);
        // Moving the whole directory keeps relative references working.
        let moved = d.0.with_extension("moved");
        let _ = std::fs::remove_dir_all(&moved);
        std::fs::rename(&d.0, &moved).unwrap();
        std::fs::create_dir_all(&d.0).unwrap();
        let _m = Dir(moved.clone());
        let at = |n: &str| LayerPaths {
            state: moved.join(format!("{n}.state")),
            mem: moved.join(format!("{n}.mem")),
        };
        assert_eq!(walk(&at("d1"), &[]).unwrap().layers.len(), 2);
        // The base moved elsewhere: missing, unless named explicitly.
        let elsewhere = d.0.join("b");
        std::fs::create_dir_all(&elsewhere).unwrap();
        let base_at = LayerPaths {
            state: elsewhere.join("base.state"),
            mem: elsewhere.join("base.mem"),
        };
        std::fs::rename(&at("base").state, &base_at.state).unwrap();
        std::fs::rename(&at("base").mem, &base_at.mem).unwrap();
        let e = walk(&at("d1"), &[]).err().unwrap();
        assert!(matches!(e, SnapshotError::ParentMissing { .. }), "{e}");
        assert!(e.to_string().contains("id-base"), "{e}");
        assert_eq!(
            walk(&at("d1"), std::slice::from_ref(&base_at))
                .unwrap()
                .layers
                .len(),
            2
        );
        let e = walk(&at("d1"), &[base_at.clone(), base_at]).err().unwrap();
        assert!(matches!(e, SnapshotError::ExtraParents { .. }), "{e}");
        drop(p1);
    }

    #[test]
    fn a_different_parent_is_refused() {
        let d = dir("different");
        let (pb, base) = layer(&d.0, "base", None, &[0], SIZE, 1);
        let (p1, _) = layer(&d.0, "d1", Some(&base), &[1], SIZE, 1);
        // Another base in the parent's place.
        let (other, _) = layer(&d.0, "other", None, &[0], SIZE, 1);
        let e = walk(&p1, std::slice::from_ref(&other)).err().unwrap();
        assert!(e.to_string().contains("applies to snapshot id-base"), "{e}");
        // The parent rewritten under the same id: its hash differs.
        let (m, s) = format::read_state_file(&pb.state).unwrap();
        let mut m2 = m.clone();
        m2.created_unix_ms = 99;
        std::fs::write(&pb.state, encode(&m2, &s).unwrap()).unwrap();
        let e = walk(&p1, &[]).err().unwrap();
        assert!(e.to_string().contains("content hash"), "{e}");
    }

    #[test]
    fn parents_of_another_size_or_vcpu_count_are_refused() {
        for (mem, vcpus, what) in [(SIZE * 2, 1, "memory size"), (SIZE, 2, "vCPU count")] {
            let d = dir(&format!("shape-{vcpus}-{mem}"));
            let (_, base) = layer(&d.0, "base", None, &[0], mem, vcpus);
            let (p1, _) = layer(&d.0, "d1", Some(&base), &[1], SIZE, 1);
            let e = walk(&p1, &[]).err().unwrap();
            assert!(e.to_string().contains(what), "{e}");
        }
    }

    /// A diff's zeroed pages survive a copy that turns them into holes
    /// (GNU cp does): the manifest lists them, and they still override the
    /// parent.
    #[test]
    fn recorded_zero_pages_survive_becoming_holes() {
        let d = dir("zeros");
        let (_, base) = layer(&d.0, "base", None, &[0, 1, 2], SIZE, 1);
        let (p1, _) = layer(&d.0, "d1", Some(&base), &[1], SIZE, 1);
        // Page 2 zeroed in the diff: data, listed in zero_runs.
        let (mut m, s) = format::read_state_file(&p1.state).unwrap();
        let f = File::options().write(true).open(&p1.mem).unwrap();
        f.write_all_at(&[0u8; 4096], 2 * 4096).unwrap();
        m.layer.mem_data_bytes += 4096;
        m.layer.zero_runs = Some(vec![[2 * 4096, 4096]]);
        std::fs::write(&p1.state, encode(&m, &s).unwrap()).unwrap();
        let owners = |p: &LayerPaths| {
            let ext = walk(p, &[]).unwrap().memory_layers(SIZE).extents().unwrap();
            (0..4u64)
                .map(|pg| {
                    ext.iter()
                        .find(|e| e.offset <= pg * 4096 && pg * 4096 < e.offset + e.len)
                        .map(|e| e.layer)
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(owners(&p1), [Some(0), Some(1), Some(1), None]);
        // A copy made a hole of it: same chain, same owners.
        // SAFETY: a valid fd we own; punching a hole only changes the file.
        let r = unsafe {
            libc::fallocate(
                std::os::fd::AsRawFd::as_raw_fd(&f),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                2 * 4096,
                4096,
            )
        };
        assert_eq!(r, 0);
        assert_eq!(owners(&p1), [Some(0), Some(1), Some(1), None]);
        // But a hole at a page that held data is still refused.
        // SAFETY: as above.
        let r = unsafe {
            libc::fallocate(
                std::os::fd::AsRawFd::as_raw_fd(&f),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                4096,
                4096,
            )
        };
        assert_eq!(r, 0);
        let e = walk(&p1, &[]).err().unwrap();
        assert!(matches!(e, SnapshotError::DiffData { .. }), "{e}");
    }

    /// Every run a manifest records is checked before it is used: inside
    /// the file, page-aligned, released runs inside the hotplug region and
    /// only in a diff, the region right after boot RAM; and a diff's parent
    /// has the same region.
    #[test]
    fn recorded_runs_out_of_bounds_are_refused() {
        use crate::snapshot::format::{HotplugRegionInfo, Layer};
        let region = 8 * SIZE;
        let manifest = |kind, zero: Vec<[u64; 2]>, released: Vec<[u64; 2]>, offset| Manifest {
            format_version: FORMAT_VERSION,
            arch: crate::arch::NAME.into(),
            spore_version: "test".into(),
            created_unix_ms: 0,
            guest: "unikernel".into(),
            vcpu_count: 1,
            mem_size_bytes: SIZE,
            devices: Vec::new(),
            layer: Layer {
                id: "x".into(),
                kind,
                parent: None,
                mem_file_size: SIZE + region,
                mem_data_bytes: 0,
                mem_sha256: None,
                zero_runs: Some(zero),
            },
            state_bytes: 0,
            hotplug: Some(HotplugRegionInfo {
                guest_addr: 4 << 30,
                file_offset: offset,
                region_size_bytes: region,
                block_size_bytes: 2 << 20,
                plugged_bytes: 0,
                requested_bytes: 0,
                data_bytes: 0,
                released_runs: released,
            }),
        };
        // A parent with another hotplug region (or none) is another VM's.
        let parent = manifest(LayerKind::Full, vec![], vec![], SIZE);
        let want = ParentRef {
            id: "x".into(),
            content_hash: None,
            state_path: None,
            mem_path: None,
        };
        let child = manifest(LayerKind::Diff, vec![], vec![], SIZE);
        let p = Path::new("p");
        assert!(check_link("c", &child, &want, p, &parent, "h").is_ok());
        let mut other = parent.clone();
        if let Some(h) = other.hotplug.as_mut() {
            h.region_size_bytes *= 2;
        }
        let e = check_link("c", &child, &want, p, &other, "h").err();
        assert!(e.is_some_and(|e| e.to_string().contains("hotplug")));
        other.hotplug = None;
        assert!(check_link("c", &child, &want, p, &other, "h").is_err());

        let ok = manifest(
            LayerKind::Diff,
            vec![[0, 4096], [SIZE + region - 4096, 4096]],
            vec![[SIZE, region]],
            SIZE,
        );
        assert_eq!(check_runs("m", &ok).unwrap(), SIZE + region);
        for (what, m) in [
            (
                "zero run past the file",
                manifest(LayerKind::Diff, vec![[SIZE + region, 4096]], vec![], SIZE),
            ),
            (
                "zero run overflowing",
                manifest(LayerKind::Diff, vec![[4096, u64::MAX]], vec![], SIZE),
            ),
            (
                "unaligned zero run",
                manifest(LayerKind::Diff, vec![[100, 4096]], vec![], SIZE),
            ),
            (
                "released run in RAM",
                manifest(LayerKind::Diff, vec![], vec![[0, 4096]], SIZE),
            ),
            (
                "released run past the region",
                manifest(LayerKind::Diff, vec![], vec![[SIZE, region + 4096]], SIZE),
            ),
            (
                "released run in a full layer",
                manifest(LayerKind::Full, vec![], vec![[SIZE, 4096]], SIZE),
            ),
            (
                "region elsewhere",
                manifest(LayerKind::Full, vec![], vec![], SIZE + 4096),
            ),
        ] {
            let e = check_runs("m", &m).err();
            assert!(e.is_some(), "{what} accepted");
            assert!(e.unwrap().to_string().contains("layout"), "{what}");
        }
    }

    #[test]
    fn damaged_diff_memory_is_refused() {
        let d = dir("damaged");
        let (_, base) = layer(&d.0, "base", None, &[0], SIZE, 1);
        let (p1, _) = layer(&d.0, "d1", Some(&base), &[1, 5], SIZE, 1);
        // A hole punched (or a copy that dropped zero pages).
        let f = File::options().write(true).open(&p1.mem).unwrap();
        // SAFETY: a valid fd we own; punching a hole only changes the file.
        let r = unsafe {
            libc::fallocate(
                std::os::fd::AsRawFd::as_raw_fd(&f),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                5 * 4096,
                4096,
            )
        };
        assert_eq!(r, 0);
        let e = walk(&p1, &[]).err().unwrap();
        assert!(matches!(e, SnapshotError::DiffData { .. }), "{e}");
        // Truncated.
        f.set_len(SIZE - 4096).unwrap();
        let e = walk(&p1, &[]).err().unwrap();
        assert!(matches!(e, SnapshotError::MemorySize { .. }), "{e}");
    }
}
