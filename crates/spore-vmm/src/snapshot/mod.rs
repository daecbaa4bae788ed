//! Snapshots: capture a paused VM's complete state into a state file and a
//! sparse memory file, and check them before a restore.
//!
//! Each component owns its state type and save/restore (vCPUs in
//! the architecture's `VcpuState`, VM-wide irqchip/timer state in its `VmState`,
//! every device through [`crate::persist::Persist`], gathered by id in
//! [`crate::device_manager`], which also writes the virtio-mem region);
//! this module only composes them into [`MicrovmState`], writes the files
//! and reads them back. The builder ([`crate::builder::build_from_state`])
//! rebuilds a VM from them.

pub mod chain;
pub mod describe;
pub mod dirty;
pub mod format;
pub mod integrity;
pub mod memory;
pub mod merge;
pub mod params;
pub mod restore;
pub mod trailer;

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

pub use chain::{ChainHead, LayerInfo, LayerPaths};
pub use dirty::DirtyPages;
use format::{
    FormatError, HotplugRegionInfo, Layer, LayerKind, Manifest, ParentRef, FORMAT_VERSION,
};
use serde::{Deserialize, Serialize};

use crate::arch::{self, GuestKind, VcpuState, VmState};
use crate::config::VmConfig;
use crate::device_manager::{DeviceStates, PausedDevices};
use crate::host::{lock, random_id};
use crate::memory::layers::MemoryLayers;
use crate::vm::{RunState, Vm};

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("the microVM must be paused to snapshot it (it is {0:?})")]
    NotPaused(RunState),
    #[error("cannot capture {what}: {detail}")]
    Capture { what: &'static str, detail: String },
    #[error(transparent)]
    Format(#[from] FormatError),
    #[error("cannot write the memory file {path}: {source}")]
    MemoryWrite {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot open the memory file {path}: {source}")]
    MemoryOpen {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the memory file {path} has {actual} bytes but the snapshot's guest has {expected} (truncated, or from another snapshot; sizes of guest memory, without the file's {}-byte trailer)", trailer::TRAILER_LEN)]
    MemorySize {
        path: String,
        expected: u64,
        actual: u64,
    },
    #[error("the memory file {path} belongs to snapshot {mem_id}, the state file to snapshot {state_id}: they are from different snapshots (or a snapshot write was interrupted)")]
    MemoryMismatch {
        path: String,
        mem_id: String,
        state_id: String,
    },
    #[error("the memory file {path}: {detail}")]
    MemoryTrailer { path: String, detail: String },
    #[error("the memory file {path} does not hold what its snapshot recorded: its SHA-256 is {actual}, the manifest says {expected} (the file was altered or corrupted)")]
    MemoryHash {
        path: String,
        expected: String,
        actual: String,
    },
    #[error("{path}: the snapshot state does not decode: {detail}")]
    Decode { path: String, detail: String },
    #[error("a Diff snapshot needs dirty page tracking: set track_dirty_pages in /machine-config before InstanceStart (or in /snapshot/load)")]
    DiffNeedsTracking,
    #[error("a Diff snapshot needs a previous snapshot of this microVM to apply to: create a Full snapshot first (or restore from one)")]
    DiffNoParent,
    #[error("cannot read the dirty page logs: {0}")]
    Dirty(#[from] dirty::DirtyError),
    #[error("{path}: the diff's memory file holds {actual} bytes of data, its manifest says {expected}: it was altered, or copied by a tool or onto a file system that does not keep holes (in a diff, a hole means \"unchanged\")")]
    DiffData {
        path: String,
        expected: u64,
        actual: u64,
    },
    #[error("{child}: its parent snapshot {id} is missing: {detail}")]
    ParentMissing {
        child: String,
        id: String,
        detail: String,
    },
    #[error("{child}: {parent} is not its parent: {detail}")]
    ParentMismatch {
        child: String,
        parent: String,
        detail: String,
    },
    #[error("{0} is where this microVM's last snapshot is: a Diff written there would replace its own parent (write it elsewhere)")]
    DiffOverParent(String),
    #[error("the snapshot chain is longer than {0} layers (merge it, or it loops)")]
    ChainTooLong(usize),
    #[error("{given} parent layers were named, but the chain has only {chain} parents")]
    ExtraParents { given: usize, chain: usize },
    #[error("{path}: the manifest says {field} is {manifest}, the state says {state}")]
    Inconsistent {
        path: String,
        field: &'static str,
        manifest: u64,
        state: u64,
    },
}

/// Everything needed to rebuild a VM besides its memory.
#[derive(Debug, Serialize, Deserialize)]
pub struct MicrovmState {
    /// The VM's configuration, as JSON (its serde shape uses attributes a
    /// binary format cannot carry).
    pub config_json: String,
    pub kind: GuestKind,
    pub mem_size: u64,
    pub vm: VmState,
    pub vcpus: Vec<VcpuState>,
    /// Every device's own state (the tmem pool too: it lives in VMM
    /// memory), keyed by device id.
    pub devices: DeviceStates,
    /// The clone generation (`spore_abi::signal`), 0 for a booted VM.
    pub generation: u64,
    /// Each vCPU's signal-port result register (what its next `in` reads).
    pub signal_results: Vec<u32>,
}

impl MicrovmState {
    pub fn config(&self) -> Result<VmConfig, serde_json::Error> {
        serde_json::from_str(&self.config_json)
    }

    /// Size of the memory file: boot RAM, then the hotplug region if any.
    pub fn mem_file_size(&self) -> u64 {
        self.mem_size + self.devices.virtio_mem().map_or(0, |m| m.region_size)
    }
}

/// Most released runs a diff's manifest lists (with [`memory::MAX_ZERO_RUNS`]
/// zero runs, it stays under the manifest size limit).
const MAX_RELEASED_RUNS: usize = 2048;

/// What a created snapshot holds, for the caller's report.
#[derive(Debug, Clone, Serialize)]
pub struct SnapshotInfo {
    pub manifest: Manifest,
}

fn capture(what: &'static str) -> impl Fn(String) -> SnapshotError {
    move |detail| SnapshotError::Capture { what, detail }
}

/// What a VM remembers between snapshots to write its next diff: the
/// snapshot it last wrote or was restored from, and the pages collected
/// from the dirty logs that are not yet in a snapshot on disk. A clone
/// starts with its template's (its memory is the template's), so that its
/// first diff applies to the snapshot its source last wrote.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct ChainState {
    pub head: Option<ChainHead>,
    pub pending: DirtyPages,
}

impl ChainState {
    /// The state of a VM just restored from `head`: nothing changed yet.
    pub fn restored_from(head: ChainHead) -> Self {
        Self {
            head: Some(head),
            pending: DirtyPages::new(),
        }
    }

    /// What a clone of this paused VM starts with: its head and every page
    /// changed since (collected now, and kept here as well, so that this
    /// VM's own next diff still holds them). Nothing where no diff could
    /// follow: no dirty tracking, no head, or a hotplug region (whose
    /// released ranges a clone does not inherit).
    pub fn for_clone(&mut self, vm: &Vm, config: &VmConfig) -> Result<ChainState, SnapshotError> {
        if !config.machine.track_dirty_pages
            || config.memory_hotplug.is_some()
            || self.head.is_none()
        {
            return Ok(ChainState::default());
        }
        let dirty = dirty::collect(vm.vm_fd(), vm.ram())?;
        self.pending.merge(&dirty);
        Ok(self.clone())
    }
}

/// Writes a snapshot of a paused VM: a full one, or a diff holding only
/// the pages changed since `chain.head`. Device workers are stopped for the
/// capture and restarted afterwards, whatever the outcome. With dirty page
/// tracking on, every snapshot (full or diff) resets the tracking, so the
/// next diff is relative to it; on success `chain.head` becomes this
/// snapshot. A failed write keeps the collected pages in `chain.pending`.
/// With `hash_memory`, the manifest records the memory file's SHA-256
/// ([`integrity::memory_hash`]).
pub fn create(
    vm: &Vm,
    config: &VmConfig,
    kind: LayerKind,
    state_path: &Path,
    mem_path: &Path,
    hash_memory: bool,
    chain: &mut ChainState,
) -> Result<SnapshotInfo, SnapshotError> {
    match vm.state() {
        RunState::Paused => {}
        s => return Err(SnapshotError::NotPaused(s)),
    }
    // An in-memory overlay's blocks would be lost: a restore makes a new, empty one.
    if let Some(d) = config
        .drives
        .iter()
        .find(|d| d.cow_overlay.as_ref().is_some_and(|o| o.in_memory))
    {
        return Err(capture("drive")(format!(
            "{} has an in-memory copy-on-write overlay, which a snapshot cannot carry; give it a file path",
            d.drive_id
        )));
    }
    let tracking = config.machine.track_dirty_pages;
    if kind == LayerKind::Diff {
        if !tracking {
            return Err(SnapshotError::DiffNeedsTracking);
        }
        match &chain.head {
            None => return Err(SnapshotError::DiffNoParent),
            Some(head) => head.check_diff_target(state_path, mem_path)?,
        }
    }
    // Device workers stop here and restart when `paused` is dropped.
    let paused =
        PausedDevices::new(vm.devices()).map_err(|e| capture("virtio device")(e.to_string()))?;
    if tracking {
        // Devices are quiesced and vCPUs paused: nothing writes now.
        let dirty = dirty::collect(vm.vm_fd(), vm.ram())?;
        chain.pending.merge(&dirty);
        if let Some(c) = paused.take_device_dirty() {
            chain.pending.merge_hotplug(&c.written, &c.released);
            chain.pending.bound_released(MAX_RELEASED_RUNS);
        }
    }
    let mem = match (kind, &chain.head) {
        (LayerKind::Diff, Some(head)) => MemoryContent::Diff {
            dirty: &chain.pending,
            parent: head.parent_ref(state_path),
        },
        _ => MemoryContent::Full,
    };
    let out = write_snapshot(
        vm,
        config,
        &paused,
        (state_path, mem_path),
        mem,
        hash_memory,
    );
    drop(paused);
    let (info, head) = out?;
    chain.pending.clear();
    chain.head = Some(head);
    Ok(info)
}

/// Captures a paused VM's vCPU, VM-wide and device state (not memory),
/// its devices stopped by `devices`. Snapshots write it out; clones hand
/// it to a new process.
pub fn capture_state(
    vm: &Vm,
    config: &VmConfig,
    devices: &PausedDevices<'_>,
) -> Result<MicrovmState, SnapshotError> {
    let guards: Vec<_> = vm.vcpu_fds().iter().map(|fd| lock(fd)).collect();
    let fds: Vec<&kvm_ioctls::VcpuFd> = guards.iter().map(|g| &**g).collect();
    let (vcpus, vm_state) = arch::save_state(vm.kvm(), vm.vm_fd(), vm.irqchip(), vm.kind(), &fds)
        .map_err(|e| capture("CPU state")(e.to_string()))?;
    drop(fds);
    drop(guards);
    // A clone's configuration names its source's vsock CID, its device
    // another: the state carries the device's, so that a restore of a
    // clone's snapshot (a paused sandbox) finds the two agree.
    let mut config = config.clone();
    if let (Some(v), Some(dev)) = (config.vsock.as_mut(), vm.vsock()) {
        v.guest_cid = u32::try_from(dev.guest_cid()).unwrap_or(v.guest_cid);
    }
    Ok(MicrovmState {
        config_json: serde_json::to_string(&config)
            .map_err(|e| capture("the configuration")(e.to_string()))?,
        kind: vm.kind(),
        mem_size: vm.ram().size(),
        vm: vm_state,
        vcpus,
        devices: devices
            .save_states()
            .map_err(|e| capture("device state")(e.to_string()))?,
        generation: vm.generation(),
        signal_results: vm.signal_results(),
    })
}

/// What a snapshot's memory file holds.
enum MemoryContent<'a> {
    /// Every non-zero page.
    Full,
    /// Exactly the dirty pages, on top of `parent`.
    Diff {
        dirty: &'a DirtyPages,
        parent: ParentRef,
    },
}

fn write_snapshot(
    vm: &Vm,
    config: &VmConfig,
    devices: &PausedDevices<'_>,
    (state_path, mem_path): (&Path, &Path),
    content: MemoryContent<'_>,
    hash_memory: bool,
) -> Result<(SnapshotInfo, ChainHead), SnapshotError> {
    let state = capture_state(vm, config, devices)?;
    let state_bytes =
        bincode::serialize(&state).map_err(|e| capture("the state")(e.to_string()))?;

    // Memory first, both under temporary names; renamed only when both are
    // complete and on disk.
    let mem_pending = format::PendingFile::create(mem_path)?;
    let mem_err = |source| SnapshotError::MemoryWrite {
        path: mem_path.display().to_string(),
        source,
    };
    let (kind, parent, mut data_bytes, mut zero_runs) = match &content {
        MemoryContent::Full => (
            LayerKind::Full,
            None,
            memory::write_sparse(vm.ram(), &mem_pending.file).map_err(mem_err)?,
            None,
        ),
        MemoryContent::Diff { dirty, parent } => {
            let (n, zeros) =
                memory::write_dirty(vm.ram(), dirty, &mem_pending.file).map_err(mem_err)?;
            (LayerKind::Diff, Some(parent.clone()), n, zeros)
        }
    };
    // The virtio-mem region follows boot RAM in the memory file: all its
    // plugged data in a full layer, its dirty pages and released ranges in
    // a diff.
    let (written, released) = match content {
        MemoryContent::Full => (
            devices
                .write_device_memory(&mem_pending.file, state.mem_size)
                .map_err(mem_err)?
                .map(|w| (w.data_bytes, w.plugged_bytes)),
            Vec::new(),
        ),
        MemoryContent::Diff { dirty, .. } => {
            let w = devices
                .write_device_diff(&mem_pending.file, state.mem_size, dirty.hotplug())
                .map_err(mem_err)?;
            let w = w.map(|(diff, plugged)| {
                zero_runs = match zero_runs.take() {
                    Some(mut z) if z.len() + diff.zero_runs.len() <= memory::MAX_ZERO_RUNS => {
                        z.extend(diff.zero_runs);
                        Some(z)
                    }
                    _ => None,
                };
                (diff.data_bytes, plugged)
            });
            let released = dirty
                .released()
                .iter()
                .map(|&(o, l)| [state.mem_size + o, l])
                .collect();
            (w, released)
        }
    };
    let hotplug = match (written, state.devices.virtio_mem()) {
        (Some((w_data, plugged_bytes)), Some(m)) => {
            data_bytes += w_data;
            Some(HotplugRegionInfo {
                guest_addr: m.addr,
                file_offset: state.mem_size,
                region_size_bytes: m.region_size,
                block_size_bytes: m.block_size,
                plugged_bytes,
                requested_bytes: m.requested_size,
                data_bytes: w_data,
                released_runs: released,
            })
        }
        _ => None,
    };
    let id = random_id();
    let mem_sha256 = match hash_memory {
        true => Some(
            integrity::memory_hash(&mem_pending.file, state.mem_file_size()).map_err(mem_err)?,
        ),
        false => None,
    };
    // The trailer names this snapshot: the state file is paired with this
    // memory file by its content (see `trailer`).
    trailer::write(&mem_pending.file, &id, state.mem_file_size()).map_err(mem_err)?;
    mem_pending.sync()?;

    let manifest = Manifest {
        format_version: FORMAT_VERSION,
        arch: crate::arch::NAME.into(),
        spore_version: env!("CARGO_PKG_VERSION").to_string(),
        created_unix_ms: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0),
        guest: format!("{:?}", state.kind).to_lowercase(),
        vcpu_count: u32::try_from(state.vcpus.len()).unwrap_or(u32::MAX),
        mem_size_bytes: state.mem_size,
        devices: describe::devices(config, &state),
        layer: Layer {
            id,
            kind,
            parent,
            mem_file_size: state.mem_file_size(),
            mem_data_bytes: data_bytes,
            mem_sha256,
            zero_runs,
        },
        state_bytes: state_bytes.len() as u64,
        hotplug,
    };
    let bytes = format::encode(&manifest, &state_bytes)
        .map_err(|e| capture("the manifest")(e.to_string()))?;
    let state_pending = format::write_pending(state_path, &bytes)?;
    mem_pending.commit()?;
    state_pending.commit()?;
    let head = ChainHead {
        id: manifest.layer.id.clone(),
        state_hash: format::state_digest(&bytes),
        paths: LayerPaths {
            state: chain::absolute(state_path),
            mem: chain::absolute(mem_path),
        },
        mem_size: manifest.mem_size_bytes,
        vcpu_count: manifest.vcpu_count,
    };
    Ok((SnapshotInfo { manifest }, head))
}

/// A snapshot read from disk and checked, with every layer of its chain.
pub struct LoadedSnapshot {
    /// The newest layer's manifest.
    pub manifest: Manifest,
    pub state: MicrovmState,
    pub config: VmConfig,
    /// The memory: the chain's files, base first (one file for a full
    /// snapshot), opened read-only (the VM maps them copy-on-write).
    pub layers: MemoryLayers,
    /// The checked layers, newest first.
    pub chain: Vec<LayerInfo>,
}

impl LoadedSnapshot {
    /// What a VM restored from this snapshot makes its next diff against.
    pub fn head(&self) -> ChainHead {
        ChainHead::of(&self.chain[0])
    }
}

/// Reads a snapshot (a full one, or a diff with its parents found through
/// its manifest) and checks it; see [`load_chain`].
pub fn load(state_path: &Path, mem_path: &Path) -> Result<LoadedSnapshot, SnapshotError> {
    load_chain(state_path, mem_path, &[])
}

/// Reads the state file, walks and checks the chain down to its full base
/// (`parents` names parent files explicitly, nearest first, for layers
/// moved away from where their child's manifest says), and opens every
/// memory file.
pub fn load_chain(
    state_path: &Path,
    mem_path: &Path,
    parents: &[LayerPaths],
) -> Result<LoadedSnapshot, SnapshotError> {
    let name = state_path.display().to_string();
    let newest = LayerPaths {
        state: state_path.to_path_buf(),
        mem: mem_path.to_path_buf(),
    };
    let mut chain = chain::walk(&newest, parents)?;
    let manifest = chain.layers[0].manifest.clone();
    let (state, config) = decode_state(&name, &manifest, &chain.newest_state)?;
    let layers = chain.memory_layers(manifest.mem_size_bytes);
    Ok(LoadedSnapshot {
        layers,
        manifest,
        state,
        config,
        chain: chain.layers,
    })
}

/// Reads and checks a state file alone (a restore whose memory an external
/// userfaultfd handler serves never opens the memory files).
pub fn load_state(state_path: &Path) -> Result<(Manifest, MicrovmState, VmConfig), SnapshotError> {
    let name = state_path.display().to_string();
    let (manifest, bytes) = format::read_state_file(state_path)?;
    let (state, config) = decode_state(&name, &manifest, &bytes)?;
    Ok((manifest, state, config))
}

/// Decodes a state and checks it against its manifest and configuration.
pub(crate) fn decode_state(
    name: &str,
    manifest: &Manifest,
    bytes: &[u8],
) -> Result<(MicrovmState, VmConfig), SnapshotError> {
    let state: MicrovmState = bincode::deserialize(bytes).map_err(|e| SnapshotError::Decode {
        path: name.to_string(),
        detail: e.to_string(),
    })?;
    let config = state.config().map_err(|e| SnapshotError::Decode {
        path: name.to_string(),
        detail: format!("configuration: {e}"),
    })?;
    for (field, m, s) in [
        ("the memory size", manifest.mem_size_bytes, state.mem_size),
        (
            "the vCPU count",
            u64::from(manifest.vcpu_count),
            state.vcpus.len() as u64,
        ),
        (
            "the configured memory size",
            state.mem_size,
            config.machine.mem_bytes(),
        ),
        (
            "the configured vCPU count",
            state.vcpus.len() as u64,
            config.machine.vcpu_count,
        ),
    ] {
        if m != s {
            return Err(SnapshotError::Inconsistent {
                path: name.to_string(),
                field,
                manifest: m,
                state: s,
            });
        }
    }
    Ok((state, config))
}

#[cfg(test)]
mod tests {
    use std::fs::File;

    use format::encode;

    use super::*;
    use crate::config::MachineConfig;

    /// Writes a state file for a 1-vCPU, `mib` MiB guest; `vcpus_in_manifest`
    /// lets a test make the manifest disagree with the state. Returns the
    /// snapshot id.
    fn write_state(path: &Path, mib: u64, vcpus_in_manifest: u32) -> String {
        let config = VmConfig {
            machine: MachineConfig {
                vcpu_count: 1,
                mem_size_mib: mib,
                ..Default::default()
            },
            ..Default::default()
        };
        let (vcpus, vm) = crate::arch::empty_state(1);
        let state = MicrovmState {
            config_json: serde_json::to_string(&config).unwrap(),
            kind: GuestKind::Unikernel,
            mem_size: mib << 20,
            vm,
            vcpus,
            devices: Default::default(),
            generation: 0,
            signal_results: vec![0],
        };
        let bytes = bincode::serialize(&state).unwrap();
        let manifest = Manifest {
            format_version: FORMAT_VERSION,
            arch: crate::arch::NAME.into(),
            spore_version: "test".into(),
            created_unix_ms: 0,
            guest: "unikernel".into(),
            vcpu_count: vcpus_in_manifest,
            mem_size_bytes: mib << 20,
            devices: describe::devices(&config, &state),
            layer: Layer {
                id: random_id(),
                kind: LayerKind::Full,
                parent: None,
                mem_file_size: mib << 20,
                mem_data_bytes: 0,
                mem_sha256: None,
                zero_runs: None,
            },
            state_bytes: bytes.len() as u64,
            hotplug: None,
        };
        std::fs::write(path, encode(&manifest, &bytes).unwrap()).unwrap();
        manifest.layer.id
    }

    /// A memory file of `size` bytes of guest memory, its trailer naming `id`.
    fn mem_file(path: &Path, size: u64, id: &str) {
        let f = File::create(path).unwrap();
        f.set_len(size).unwrap();
        trailer::write(&f, id, size).unwrap();
    }

    #[test]
    fn load_checks_the_memory_file_and_the_manifest() {
        let dir = std::env::temp_dir().join(format!("spore-snap-load-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (state, mem) = (dir.join("s"), dir.join("m"));
        let id = write_state(&state, 4, 1);
        mem_file(&mem, 4 << 20, &id);
        let loaded = load(&state, &mem).unwrap();
        assert_eq!(loaded.config.machine.mem_size_mib, 4);
        assert_eq!(loaded.state.vcpus.len(), 1);

        // A memory file of another size (truncated, or another VM's).
        for len in [(4 << 20) - 4096, 4 << 20, 8 << 20, 0] {
            File::create(&mem).unwrap().set_len(len).unwrap();
            let e = load(&state, &mem).err().unwrap();
            assert!(matches!(e, SnapshotError::MemorySize { .. }), "{e}");
        }
        std::fs::remove_file(&mem).unwrap();
        assert!(matches!(
            load(&state, &mem).err().unwrap(),
            SnapshotError::MemoryOpen { .. }
        ));

        // The right size without a trailer (an old or foreign file).
        File::create(&mem)
            .unwrap()
            .set_len((4 << 20) + trailer::TRAILER_LEN)
            .unwrap();
        let e = load(&state, &mem).err().unwrap();
        assert!(matches!(e, SnapshotError::MemoryTrailer { .. }), "{e}");

        // A memory file of another snapshot (e.g. a write interrupted
        // between the two renames), with no xattr involved.
        mem_file(&mem, 4 << 20, "0123456789abcdef");
        let e = load(&state, &mem).err().unwrap();
        assert!(matches!(e, SnapshotError::MemoryMismatch { .. }), "{e}");

        // A manifest that disagrees with the state it carries.
        let id = write_state(&state, 4, 2);
        mem_file(&mem, 4 << 20, &id);
        let e = load(&state, &mem).err().unwrap();
        assert!(e.to_string().contains("vCPU count"), "{e}");

        // A flipped byte anywhere.
        let id = write_state(&state, 4, 1);
        mem_file(&mem, 4 << 20, &id);
        let mut bytes = std::fs::read(&state).unwrap();
        let n = bytes.len();
        bytes[n - 10] ^= 0x80;
        std::fs::write(&state, &bytes).unwrap();
        let e = load(&state, &mem).err().unwrap();
        assert!(e.to_string().contains("checksum"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
