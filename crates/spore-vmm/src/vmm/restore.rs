//! Building the VM from a snapshot instead of a boot source (`PUT
//! /snapshot/load`, `spore snapshot restore`): the state and memory layers
//! are read, the restore path prepared (`snapshot::restore`), the VM built
//! and, optionally, given a clone's identity and disks before it first runs.
//!
//! Only on a VMM that has not built a VM; every failure after the restore
//! path was prepared cancels it, so nothing is left serving pages.

use std::path::Path;
use std::time::{Duration, Instant};

use super::{bad, BuiltVm, Phase, SnapshotApiError, Vmm};
use crate::api::snapshot_body::SnapshotLoadParams;
use crate::api::ApiError;
use crate::builder::{build_from_state, BuildOptions};
use crate::clone::identity::{self, CloneIdentity};
use crate::devices::virtio::blk::overlay::clone_drive;
use crate::snapshot;
use crate::snapshot::params::{CloneDisks, LoadMemory, RestoreMode};
use crate::snapshot::restore::{self as restore_path, Backend, RestorePlan};

/// How [`Vmm::load_snapshot_with`] builds the VM, beyond the files.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// Start the guest (else it waits paused for `PATCH /vm`).
    pub resume: bool,
    /// Bounds a working-set recording (default: until the VM stops).
    pub record_for: Option<Duration>,
    /// A clone's identity, given before the VM first runs.
    pub identity: Option<CloneIdentity>,
    /// Restore every writable drive as a clone's (a new overlay).
    pub disks: Option<CloneDisks>,
    /// Dirty page tracking for the restored VM's diff snapshots; `None`
    /// keeps the setting the snapshot was taken with.
    pub track_dirty_pages: Option<bool>,
    /// The files of the snapshot's parents, nearest first, when they are
    /// not where the diff's manifest says.
    pub parents: Vec<snapshot::LayerPaths>,
    /// The vsock device's new Unix socket path (Firecracker's `vsock_override`).
    pub vsock_uds: Option<String>,
    /// Advance kvmclock to the host's wall clock (Firecracker's `clock_realtime`).
    pub clock_realtime: bool,
    /// (iface_id, tap name): the tap each interface reopens instead of the
    /// snapshot's (Firecracker's `network_overrides`).
    pub network_overrides: Vec<(String, String)>,
}

impl LoadOptions {
    /// The options a `PUT /snapshot/load` body asks for.
    fn from_body(p: &SnapshotLoadParams) -> Result<Self, String> {
        // Each entry is looked up in the snapshot once it is read.
        for o in &p.network_overrides {
            crate::config::validate_tap_name(&o.host_dev_name)
                .map_err(|e| format!("network_overrides ({}): {e}", o.iface_id))?;
        }
        Ok(LoadOptions {
            resume: p.resume_vm,
            record_for: p.working_set_record_ms.map(Duration::from_millis),
            identity: p.clone_identity()?,
            disks: p.clone_disks.clone(),
            track_dirty_pages: p.track_dirty(),
            parents: p.parent_paths(),
            vsock_uds: p.vsock_override.as_ref().map(|v| v.uds_path.clone()),
            clock_realtime: p.clock_realtime,
            network_overrides: p
                .network_overrides
                .iter()
                .map(|o| (o.iface_id.clone(), o.host_dev_name.clone()))
                .collect(),
        })
    }
}

impl Vmm {
    /// `PUT /snapshot/load`: the body is checked (memory source, identity)
    /// before anything is read.
    pub fn load_snapshot_request(&self, p: &SnapshotLoadParams) -> Result<(), ApiError> {
        p.refuse_dotdot().map_err(bad)?;
        let memory = p.memory().map_err(bad)?;
        let options = LoadOptions::from_body(p).map_err(bad)?;
        self.load_snapshot_with(Path::new(&p.snapshot_path), &memory, &options)
            .map_err(bad)
    }

    /// Builds the VM from a snapshot instead of a boot source, through any
    /// restore path (see `snapshot::restore`), optionally as a clone; only on
    /// a VMM that has not started a VM. Without `resume` the VM waits paused.
    pub fn load_snapshot_with(
        &self,
        state_path: &Path,
        memory: &LoadMemory,
        lo: &LoadOptions,
    ) -> Result<(), SnapshotApiError> {
        let mut inner = self.lock();
        if !matches!(inner.phase, Phase::PreBoot { .. }) || self.control.stop_reason().is_some() {
            return Err(SnapshotApiError::AlreadyStarted);
        }
        let t0 = Instant::now();
        let mut head = None;
        let (manifest, mut state, mut config, prepared) = match memory {
            LoadMemory::UffdExternal { socket } => {
                let (manifest, state, config) = snapshot::load_state(state_path)?;
                refuse_huge_pages(&config, memory, lo)?;
                let prepared = restore_path::prepare_external(
                    state.mem_size,
                    Path::new(socket),
                    config.machine.huge_pages_2m(),
                )?;
                (manifest, state, config, prepared)
            }
            LoadMemory::File { path, .. } | LoadMemory::UffdBuiltin { path } => {
                crate::phase::mark("restore: request");
                let loaded = snapshot::load_chain(state_path, Path::new(path), &lo.parents)?;
                crate::phase::mark("restore: state read");
                refuse_huge_pages(&loaded.config, memory, lo)?;
                head = Some(loaded.head());
                if matches!(
                    memory,
                    LoadMemory::File {
                        mode: RestoreMode::Eager,
                        ..
                    }
                ) {
                    // An eager restore reads everything anyway: check what
                    // was recorded of the memory's contents first.
                    snapshot::integrity::verify_memory(&loaded.chain, loaded.layers.files())?;
                }
                let backend = match memory {
                    LoadMemory::File { mode, .. } => Backend::File(*mode),
                    _ => Backend::UffdBuiltin,
                };
                let plan = RestorePlan {
                    backend,
                    working_set_path: Some(restore_path::working_set_path(state_path)),
                    snapshot_id: loaded.manifest.layer.id.clone(),
                    record_for: lo.record_for,
                    huge_pages: loaded.config.machine.huge_pages_2m(),
                };
                let prepared = restore_path::prepare(loaded.layers, &plan)?;
                (loaded.manifest, loaded.state, loaded.config, prepared)
            }
        };
        crate::phase::mark("restore: memory prepared");
        tracing::info!("restore: {:?}", prepared.session.report());
        let mut session = prepared.session;
        if let Some(track) = lo.track_dirty_pages {
            config.machine.track_dirty_pages = track;
        }
        // Guest snapshot points configured on this VMM before the load win
        // over the snapshot's own.
        if inner.config.guest_snapshots.is_some() {
            config.guest_snapshots = inner.config.guest_snapshots.clone();
        }
        if lo.clock_realtime {
            if let Err(e) = state.vm.set_clock_realtime() {
                session.cancel();
                return Err(SnapshotApiError::Path(e.into()));
            }
        }
        if let Some(uds) = &lo.vsock_uds {
            match config.vsock.as_mut() {
                Some(v) => v.uds_path = uds.clone(),
                None => {
                    session.cancel();
                    return Err(SnapshotApiError::NoVsock);
                }
            }
        }
        if let Err(e) = apply_network_overrides(&mut config, &lo.network_overrides) {
            session.cancel();
            return Err(e);
        }
        if let Some(c) = &lo.disks {
            for d in &mut config.drives {
                match clone_drive(d, Path::new(&c.dir), &c.name) {
                    Ok(cloned) => *d = cloned,
                    Err(e) => {
                        session.cancel();
                        return Err(SnapshotApiError::Freeze(e.to_string()));
                    }
                }
            }
        }
        let serial_out = inner.take_serial_out(&self.control)?;
        let opts = BuildOptions {
            serial_out,
            control: self.control.clone(),
            mmds: inner.mmds.clone(),
        };
        let mut vm = match build_from_state(&config, &state, prepared.ram, None, opts) {
            Ok(vm) => vm,
            Err(e) => {
                inner.build_failed();
                session.cancel();
                return Err(SnapshotApiError::Build(e));
            }
        };
        crate::phase::mark("restore: VM built");
        self.install_fork_handler(&vm);
        let started = if lo.resume && lo.identity.is_none() {
            vm.start()
        } else {
            vm.start_paused()
        };
        if let Err(e) = started {
            drop(vm);
            session.cancel();
            return Err(SnapshotApiError::Start(e.to_string()));
        }
        tracing::debug!(
            "snapshot {} restored in {} µs",
            manifest.layer.id,
            t0.elapsed().as_micros()
        );
        if let Some(id) = &lo.identity {
            let applied = identity::apply(&vm, id)
                .map_err(SnapshotApiError::from)
                .and_then(|()| {
                    if lo.resume {
                        vm.resume()
                            .map_err(|e| SnapshotApiError::Start(e.to_string()))
                    } else {
                        Ok(())
                    }
                });
            if let Err(e) = applied {
                drop(vm);
                session.cancel();
                return Err(e);
            }
            identity::record(&mut config, id);
        }
        if lo.resume {
            session.guest_started();
        }
        inner.config = config;
        inner.phase = Phase::Built(Box::new(BuiltVm {
            vm,
            restore: Some(session),
            // A diff of this VM continues the chain from the layer it came from.
            chain: head
                .map(snapshot::ChainState::restored_from)
                .unwrap_or_default(),
        }));
        Ok(())
    }
}

/// Points each overridden interface at its new tap (the device reopens
/// the tap by this name when it is rebuilt).
pub(super) fn apply_network_overrides(
    config: &mut crate::config::VmConfig,
    overrides: &[(String, String)],
) -> Result<(), SnapshotApiError> {
    for (iface_id, tap) in overrides {
        let iface = config
            .network_interfaces
            .iter_mut()
            .find(|i| i.iface_id == *iface_id)
            .ok_or_else(|| SnapshotApiError::UnknownNetworkInterface(iface_id.clone()))?;
        iface.host_dev_name.clone_from(tap);
    }
    Ok(())
}

/// A snapshot of a VM on 2 MiB hugetlbfs pages restores only where
/// Firecracker restores it: through a `Uffd` backend, which fills the new
/// hugetlbfs RAM one huge page at a time. Mapping the memory file (File)
/// and clones are refused before anything is read or reserved.
fn refuse_huge_pages(
    config: &crate::config::VmConfig,
    memory: &LoadMemory,
    lo: &LoadOptions,
) -> Result<(), SnapshotApiError> {
    if !config.machine.huge_pages_2m() {
        return Ok(());
    }
    if matches!(memory, LoadMemory::File { .. }) {
        return Err(SnapshotApiError::HugePagesFile);
    }
    if lo.identity.is_some() || lo.disks.is_some() {
        return Err(SnapshotApiError::HugePagesClone);
    }
    Ok(())
}
