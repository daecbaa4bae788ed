//! Snapshots: capture a paused VM's complete state into a state file and a
//! sparse memory file, and check them before a restore.
//!
//! Each component owns its state type and save/restore (vCPUs in
//! `arch::x86_64::vcpu_state`, irqchip/PIT/kvmclock in `vm::vm_state`, the
//! serial port, i8042 and every virtio-mmio transport next to their device);
//! this module only gathers them into [`MicrovmState`], writes the files and
//! reads them back. The builder ([`crate::builder::restore_vm`]) rebuilds a
//! VM from them.

pub mod format;
pub mod hotplug_mem;
pub mod memory;
pub mod persist;

pub use persist::Persist;

use std::fs::File;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::arch::x86_64::vcpu_state::{saveable_msrs, VcpuState};
use crate::config::VmConfig;
use crate::devices::bus::lock;
use crate::devices::legacy::i8042::I8042State;
use crate::devices::legacy::serial::SerialSnapshot;
use crate::devices::virtio::balloon::BalloonState;
use crate::devices::virtio::device_type;
use crate::devices::virtio::mem::VirtioMemState;
use crate::devices::virtio::mmio::state::MmioTransportState;
use crate::vm::vm_state::VmState;
use crate::vm::{GuestKind, RunState, Vm};
use format::{
    DeviceInfo, FormatError, HotplugRegionInfo, Layer, LayerKind, Manifest, FORMAT_VERSION,
};

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
    #[error("the memory file {path} has {actual} bytes but the snapshot's guest has {expected} (truncated, or from another snapshot)")]
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
    #[error("{path}: the snapshot state does not decode: {detail}")]
    Decode { path: String, detail: String },
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
    pub serial: SerialSnapshot,
    pub i8042: Option<I8042State>,
    /// In attach order.
    pub virtio: Vec<MmioTransportState>,
    /// Device state beyond the transport, for devices that have any.
    pub elastic: ElasticState,
}

/// The memory devices' own state (beyond their transports).
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct ElasticState {
    pub balloon: Option<BalloonState>,
    /// The virtio-mem device; its region's memory follows boot RAM in the
    /// memory file.
    pub mem: Option<VirtioMemState>,
}

impl MicrovmState {
    pub fn config(&self) -> Result<VmConfig, serde_json::Error> {
        serde_json::from_str(&self.config_json)
    }

    /// Size of the memory file: boot RAM, then the hotplug region if any.
    pub fn mem_file_size(&self) -> u64 {
        self.mem_size + self.elastic.mem.as_ref().map_or(0, |m| m.region_size)
    }
}

/// What a created snapshot holds, for the caller's report.
#[derive(Debug, Clone, Serialize)]
pub struct SnapshotInfo {
    pub manifest: Manifest,
}

fn capture(what: &'static str) -> impl Fn(String) -> SnapshotError {
    move |detail| SnapshotError::Capture { what, detail }
}

/// Writes a full snapshot of a paused VM: device workers are stopped for
/// the capture and restarted afterwards, whatever the outcome.
pub fn create_full(
    vm: &Vm,
    config: &VmConfig,
    state_path: &Path,
    mem_path: &Path,
) -> Result<SnapshotInfo, SnapshotError> {
    match vm.state() {
        RunState::Paused => {}
        s => return Err(SnapshotError::NotPaused(s)),
    }
    let transports: Vec<_> = vm.virtio().iter().map(|t| lock(t)).collect();
    let mut guards = transports;
    let mut result = Ok(());
    for t in guards.iter_mut() {
        if let Err(e) = t.quiesce() {
            result = Err(capture("virtio device")(e.to_string()));
            break;
        }
    }
    let out = result.and_then(|()| {
        let virtio: Vec<_> = guards.iter().map(|t| t.save()).collect();
        // Device states are read while the devices are quiesced.
        let elastic = ElasticState {
            balloon: vm.balloon().map(|b| b.save()),
            mem: vm.mem_hotplug().map(|m| m.save()),
        };
        write_full(vm, config, virtio, elastic, state_path, mem_path)
    });
    for t in guards.iter_mut() {
        t.resume();
    }
    out
}

fn write_full(
    vm: &Vm,
    config: &VmConfig,
    virtio: Vec<MmioTransportState>,
    elastic: ElasticState,
    state_path: &Path,
    mem_path: &Path,
) -> Result<SnapshotInfo, SnapshotError> {
    let msr_list = saveable_msrs(vm.kvm()).map_err(|e| capture("the MSR list")(e.to_string()))?;
    let mut vcpus = Vec::new();
    for (id, fd) in vm.vcpu_fds().iter().enumerate() {
        let fd = lock(fd);
        vcpus.push(
            VcpuState::save(id as u8, &fd, &msr_list, vm.has_irqchip())
                .map_err(|e| capture("vCPU state")(e.to_string()))?,
        );
    }
    let vm_state = VmState::save(vm.vm_fd(), vm.has_irqchip(), vm.kind() == GuestKind::Linux)
        .map_err(|e| capture("VM state")(e.to_string()))?;
    let state = MicrovmState {
        config_json: serde_json::to_string(config)
            .map_err(|e| capture("the configuration")(e.to_string()))?,
        kind: vm.kind(),
        mem_size: vm.ram().size(),
        vm: vm_state,
        vcpus,
        serial: lock(vm.serial()).save(),
        i8042: vm.i8042().map(|d| lock(d).save()),
        virtio,
        elastic,
    };
    let state_bytes =
        bincode::serialize(&state).map_err(|e| capture("the state")(e.to_string()))?;

    // Memory first, both under temporary names; renamed only when both are
    // complete and on disk.
    let mem_pending = format::PendingFile::create(mem_path)?;
    let mem_err = |source| SnapshotError::MemoryWrite {
        path: mem_path.display().to_string(),
        source,
    };
    let mut data_bytes = memory::write_sparse(vm.ram(), &mem_pending.file).map_err(mem_err)?;
    let hotplug = match (vm.mem_hotplug(), &state.elastic.mem) {
        (Some(h), Some(m)) => {
            let written = h
                .write_memory(&mem_pending.file, state.mem_size)
                .map_err(mem_err)?;
            data_bytes += written;
            Some(HotplugRegionInfo {
                guest_addr: m.addr,
                file_offset: state.mem_size,
                region_size_bytes: m.region_size,
                block_size_bytes: m.block_size,
                plugged_bytes: h.plugged_bytes(),
                requested_bytes: m.requested_size,
                data_bytes: written,
            })
        }
        _ => None,
    };
    let id = random_id();
    memory::tag(&mem_pending.file, &id);
    mem_pending.sync()?;

    let manifest = Manifest {
        format_version: FORMAT_VERSION,
        spore_version: env!("CARGO_PKG_VERSION").to_string(),
        created_unix_ms: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0),
        guest: format!("{:?}", state.kind).to_lowercase(),
        vcpu_count: state.vcpus.len() as u32,
        mem_size_bytes: state.mem_size,
        devices: devices(config, &state),
        layer: Layer {
            id,
            kind: LayerKind::Full,
            parent: None,
            mem_file_size: state.mem_file_size(),
            mem_data_bytes: data_bytes,
        },
        state_bytes: state_bytes.len() as u64,
        hotplug,
    };
    let bytes = format::encode(&manifest, &state_bytes)
        .map_err(|e| capture("the manifest")(e.to_string()))?;
    let state_pending = format::write_pending(state_path, &bytes)?;
    mem_pending.commit()?;
    state_pending.commit()?;
    Ok(SnapshotInfo { manifest })
}

fn devices(config: &VmConfig, state: &MicrovmState) -> Vec<DeviceInfo> {
    let mut out = vec![DeviceInfo {
        kind: "serial".into(),
        detail: "COM1".into(),
    }];
    if state.i8042.is_some() {
        out.push(DeviceInfo {
            kind: "i8042".into(),
            detail: String::new(),
        });
    }
    let mut drives: Vec<_> = config.drives.iter().collect();
    drives.sort_by_key(|d| !d.is_root_device);
    let mut drives = drives.into_iter();
    for t in &state.virtio {
        let (kind, detail) = match t.device_type {
            device_type::BLOCK => (
                "virtio-blk",
                drives
                    .next()
                    .map(|d| {
                        format!(
                            "{} {} ({})",
                            d.drive_id,
                            d.path_on_host,
                            if d.is_read_only { "ro" } else { "rw" }
                        )
                    })
                    .unwrap_or_default(),
            ),
            device_type::RNG => ("virtio-rng", String::new()),
            device_type::BALLOON => (
                "virtio-balloon",
                state
                    .elastic
                    .balloon
                    .as_ref()
                    .map(|b| {
                        format!(
                            "target {} pages, actual {} pages",
                            b.target_pages, b.actual_pages
                        )
                    })
                    .unwrap_or_default(),
            ),
            device_type::MEM => (
                "virtio-mem",
                state
                    .elastic
                    .mem
                    .as_ref()
                    .map(|m| {
                        let plugged: u32 = m.plugged.iter().map(|w| w.count_ones()).sum();
                        format!(
                            "region {:#x}+{} MiB, {} MiB plugged, {} MiB requested",
                            m.addr,
                            m.region_size >> 20,
                            (u64::from(plugged) * m.block_size) >> 20,
                            m.requested_size >> 20
                        )
                    })
                    .unwrap_or_default(),
            ),
            device_type::VSOCK => (
                "virtio-vsock",
                config
                    .vsock
                    .as_ref()
                    .map(|v| format!("cid {} {}", v.guest_cid, v.uds_path))
                    .unwrap_or_default(),
            ),
            _ => ("virtio", format!("type {}", t.device_type)),
        };
        let detail = match (detail.is_empty(), t.activated) {
            (_, true) => detail,
            (true, false) => "inactive".to_string(),
            (false, false) => format!("{detail}, inactive"),
        };
        out.push(DeviceInfo {
            kind: kind.into(),
            detail,
        });
    }
    out
}

fn random_id() -> String {
    let mut b = [0u8; 8];
    if getrandom::fill(&mut b).is_err() {
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        b = t.to_le_bytes();
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A snapshot read from disk and checked against its memory file.
pub struct LoadedSnapshot {
    pub manifest: Manifest,
    pub state: MicrovmState,
    pub config: VmConfig,
    pub mem_file: File,
}

/// Reads the state file, checks it, and opens the memory file (read-only:
/// the VM maps it copy-on-write).
pub fn load(state_path: &Path, mem_path: &Path) -> Result<LoadedSnapshot, SnapshotError> {
    let name = state_path.display().to_string();
    let (manifest, bytes) = format::read_state_file(state_path)?;
    let state: MicrovmState = bincode::deserialize(&bytes).map_err(|e| SnapshotError::Decode {
        path: name.clone(),
        detail: e.to_string(),
    })?;
    let config = state.config().map_err(|e| SnapshotError::Decode {
        path: name.clone(),
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
                path: name,
                field,
                manifest: m,
                state: s,
            });
        }
    }
    let mem_name = mem_path.display().to_string();
    let mem_file = File::open(mem_path).map_err(|source| SnapshotError::MemoryOpen {
        path: mem_name.clone(),
        source,
    })?;
    let actual = mem_file
        .metadata()
        .map_err(|source| SnapshotError::MemoryOpen {
            path: mem_name.clone(),
            source,
        })?
        .len();
    if actual != state.mem_file_size() {
        return Err(SnapshotError::MemorySize {
            path: mem_name,
            expected: state.mem_file_size(),
            actual,
        });
    }
    if let Some(mem_id) = memory::read_tag(&mem_file) {
        if mem_id != manifest.layer.id {
            return Err(SnapshotError::MemoryMismatch {
                path: mem_name,
                mem_id,
                state_id: manifest.layer.id,
            });
        }
    }
    Ok(LoadedSnapshot {
        manifest,
        state,
        config,
        mem_file,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::MachineConfig;
    use format::encode;

    fn vcpu() -> VcpuState {
        VcpuState {
            id: 0,
            cpuid: Vec::new(),
            regs: Default::default(),
            sregs: Default::default(),
            xsave: Default::default(),
            xcrs: Default::default(),
            msrs: Vec::new(),
            lapic: None,
            mp_state: Default::default(),
            events: Default::default(),
            debug_regs: Default::default(),
            tsc_khz: None,
        }
    }

    /// Writes a state file for a 1-vCPU, `mib` MiB guest; `vcpus_in_manifest`
    /// lets a test make the manifest disagree with the state.
    fn write_state(path: &Path, mib: u64, vcpus_in_manifest: u32) {
        let config = VmConfig {
            machine: MachineConfig {
                vcpu_count: 1,
                mem_size_mib: mib,
                ..Default::default()
            },
            ..Default::default()
        };
        let state = MicrovmState {
            config_json: serde_json::to_string(&config).unwrap(),
            kind: GuestKind::Unikernel,
            mem_size: mib << 20,
            vm: VmState {
                irqchips: Vec::new(),
                pit: None,
                clock: Default::default(),
            },
            vcpus: vec![vcpu()],
            serial: Default::default(),
            i8042: None,
            virtio: Vec::new(),
            elastic: Default::default(),
        };
        let bytes = bincode::serialize(&state).unwrap();
        let manifest = Manifest {
            format_version: FORMAT_VERSION,
            spore_version: "test".into(),
            created_unix_ms: 0,
            guest: "unikernel".into(),
            vcpu_count: vcpus_in_manifest,
            mem_size_bytes: mib << 20,
            devices: devices(&config, &state),
            layer: Layer {
                id: random_id(),
                kind: LayerKind::Full,
                parent: None,
                mem_file_size: mib << 20,
                mem_data_bytes: 0,
            },
            state_bytes: bytes.len() as u64,
            hotplug: None,
        };
        std::fs::write(path, encode(&manifest, &bytes).unwrap()).unwrap();
    }

    #[test]
    fn load_checks_the_memory_file_and_the_manifest() {
        let dir = std::env::temp_dir().join(format!("spore-snap-load-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (state, mem) = (dir.join("s"), dir.join("m"));
        write_state(&state, 4, 1);
        File::create(&mem).unwrap().set_len(4 << 20).unwrap();
        let loaded = load(&state, &mem).unwrap();
        assert_eq!(loaded.config.machine.mem_size_mib, 4);
        assert_eq!(loaded.state.vcpus.len(), 1);

        // A memory file of another size (truncated, or another VM's).
        for len in [(4 << 20) - 4096, 8 << 20, 0] {
            File::create(&mem).unwrap().set_len(len).unwrap();
            let e = load(&state, &mem).err().unwrap();
            assert!(matches!(e, SnapshotError::MemorySize { .. }), "{e}");
        }
        std::fs::remove_file(&mem).unwrap();
        assert!(matches!(
            load(&state, &mem).err().unwrap(),
            SnapshotError::MemoryOpen { .. }
        ));

        // A memory file tagged by another snapshot (e.g. a write interrupted
        // between the two renames).
        File::create(&mem).unwrap().set_len(4 << 20).unwrap();
        let f = File::options().write(true).open(&mem).unwrap();
        if memory::tag(&f, "0123456789abcdef") {
            let e = load(&state, &mem).err().unwrap();
            assert!(matches!(e, SnapshotError::MemoryMismatch { .. }), "{e}");
        }
        drop(f);
        File::create(&mem).unwrap().set_len(4 << 20).unwrap();

        // A manifest that disagrees with the state it carries.
        write_state(&state, 4, 2);
        File::create(&mem).unwrap().set_len(4 << 20).unwrap();
        let e = load(&state, &mem).err().unwrap();
        assert!(e.to_string().contains("vCPU count"), "{e}");

        // A flipped byte anywhere.
        write_state(&state, 4, 1);
        let mut bytes = std::fs::read(&state).unwrap();
        let n = bytes.len();
        bytes[n - 10] ^= 0x80;
        std::fs::write(&state, &bytes).unwrap();
        let e = load(&state, &mem).err().unwrap();
        assert!(e.to_string().contains("checksum"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
