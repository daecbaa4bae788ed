//! The VMM's state machine behind the API: configure, start, pause, resume.
//!
//! [`Vmm`] holds the configuration until `InstanceStart`, then the running
//! [`Vm`]. API requests arrive one at a time (the API thread serializes
//! them); the process's main thread waits in [`Vmm::wait_for_exit`].

mod guest_snapshot;

use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex, Weak};

use crate::api::{
    ActionType, ApiError, ApiHandler, ApiRequest, ApiResponse, InstanceInfo, InstanceState,
    TmemInfo, TmemUpdate, VmState,
};
use crate::builder::{build_for_boot, build_from_state, BuildError, BuildOptions};
use crate::clone::identity::{self, CloneIdentity, IdentityError};
use crate::clone::source::{clone_vm, fill_standby, CloneOrder};
use crate::clone::{child, CloneConfig, CloneError, CloneReport, CloneRequest, CloneState};
use crate::config::{BalloonConfig, VmConfig};
use crate::devices::legacy::serial::SerialOut;
use crate::devices::legacy::signal::Mark;
use crate::devices::tmem::PoolStats;
use crate::devices::virtio::balloon::BalloonHandle;
use crate::devices::virtio::blk::overlay::clone_drive;
use crate::devices::virtio::mem::MemStatus;
use crate::host::lock;
use crate::snapshot;
use crate::snapshot::params::{CloneDisks, LoadMemory, SnapshotCreateParams};
use crate::snapshot::restore::{self as restore_path, Backend, RestorePlan, RestoreSession};
use crate::vm::control::{ControlEvent, RunControl, StopReason};
use crate::vm::{RunState, Vm};

pub struct Vmm {
    id: String,
    control: Arc<RunControl>,
    inner: Mutex<Inner>,
    /// Where guest `FORK`s go (see [`Vmm::enable_guest_fork`]).
    fork_tx: Mutex<Option<Sender<(u8, u32)>>>,
}

struct Inner {
    config: VmConfig,
    vm: Option<Vm>,
    /// Consumed when the VM is built.
    serial_out: Option<SerialOut>,
    /// A restored VM's memory path (uffd handler, working-set recorder);
    /// finished after the VM stopped.
    restore: Option<RestoreSession>,
    clone: CloneState,
    /// The last snapshot and the pages changed since (for Diff snapshots).
    chain: snapshot::ChainState,
}

/// How [`Vmm::load_snapshot_with`] builds the VM, beyond the files.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// Start the guest (else it waits paused for `PATCH /vm`).
    pub resume: bool,
    /// Bounds a working-set recording (default: until the VM stops).
    pub record_for: Option<std::time::Duration>,
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
}

impl Vmm {
    pub fn new(id: String, config: VmConfig, serial_out: SerialOut) -> Self {
        Self {
            id,
            control: Arc::new(RunControl::new()),
            inner: Mutex::new(Inner {
                config,
                vm: None,
                serial_out: Some(serial_out),
                restore: None,
                clone: CloneState::default(),
                chain: Default::default(),
            }),
            fork_tx: Mutex::new(None),
        }
    }

    /// Builds and starts the VM from the current configuration.
    pub fn start(&self) -> Result<(), StartError> {
        let mut inner = lock(&self.inner);
        if inner.vm.is_some() || self.control.stop_reason().is_some() {
            return Err(StartError::AlreadyStarted);
        }
        let serial_out = inner.serial_out.take().ok_or(StartError::AlreadyStarted)?;
        let mut vm = match build_for_boot(
            &inner.config,
            BuildOptions {
                serial_out,
                control: self.control.clone(),
            },
        ) {
            Ok(vm) => vm,
            Err(e) => {
                // A failed build may be retried after fixing the config, but the
                // serial sink is gone: give the next attempt stdout.
                inner.serial_out = Some(Box::new(std::io::stdout()));
                return Err(StartError::Build(e));
            }
        };
        self.install_fork_handler(&vm);
        vm.start().map_err(|e| StartError::Start(e.to_string()))?;
        inner.vm = Some(vm);
        Ok(())
    }

    /// Blocks until the VM stops (or a stop is requested before it starts).
    /// Guest-triggered snapshots are served here, on the caller's thread:
    /// the process's main thread must be the one waiting.
    pub fn wait_for_exit(&self) -> StopReason {
        loop {
            match self.control.wait_event() {
                ControlEvent::Stopped(reason) => return reason,
                ControlEvent::GuestSnapshot(req) => self.serve_guest_snapshot(req),
            }
        }
    }

    /// Asks the VM to stop (host signal, shutdown).
    pub fn request_stop(&self) {
        self.control.stop(StopReason::Requested);
    }

    /// Stops vCPU threads and releases the VM; returns the marks it recorded.
    pub fn shutdown(&self) -> Vec<Mark> {
        let mut inner = lock(&self.inner);
        match inner.vm.take() {
            Some(mut vm) => {
                let marks = vm.marks();
                vm.stop(StopReason::Requested);
                drop(vm);
                // Only now can nothing fault any more.
                if let Some(mut r) = inner.restore.take() {
                    r.finish();
                }
                marks
            }
            None => Vec::new(),
        }
    }

    pub fn state(&self) -> RunState {
        match &lock(&self.inner).vm {
            Some(vm) => vm.state(),
            None if self.control.stop_reason().is_some() => RunState::Stopped,
            None => RunState::NotStarted,
        }
    }

    pub fn control(&self) -> &Arc<RunControl> {
        &self.control
    }

    /// Feeds console input to the guest's serial port; returns bytes taken.
    pub fn serial_input(&self, bytes: &[u8]) -> usize {
        match &lock(&self.inner).vm {
            Some(vm) => lock(vm.serial()).enqueue_input(bytes),
            None => 0,
        }
    }

    /// Writes a snapshot of the paused VM (Firecracker's rule: pause first):
    /// Full, or Diff against the last snapshot this VM wrote or was
    /// restored from. The single entry point for every snapshot.
    pub fn create_snapshot(
        &self,
        p: &SnapshotCreateParams,
    ) -> Result<snapshot::SnapshotInfo, SnapshotApiError> {
        let mut guard = lock(&self.inner);
        let inner = &mut *guard;
        let vm = inner.vm.as_ref().ok_or(SnapshotApiError::NoVm)?;
        if let Some(r) = inner.restore.as_mut() {
            r.before_snapshot(vm.ram())
                .map_err(SnapshotApiError::Restore)?;
        }
        let kind = p.layer_kind();
        Ok(snapshot::create(
            vm,
            &inner.config,
            kind,
            std::path::Path::new(&p.snapshot_path),
            std::path::Path::new(&p.mem_file_path),
            &mut inner.chain,
        )?)
    }

    /// Builds the VM from a snapshot instead of a boot source, through any
    /// restore path (see `snapshot::restore`), optionally as a clone; only on
    /// a VMM that has not started a VM. Without `resume` the VM waits paused.
    pub fn load_snapshot_with(
        &self,
        state_path: &std::path::Path,
        memory: &LoadMemory,
        lo: &LoadOptions,
    ) -> Result<(), SnapshotApiError> {
        let mut inner = lock(&self.inner);
        if inner.vm.is_some() || self.control.stop_reason().is_some() {
            return Err(SnapshotApiError::AlreadyStarted);
        }
        let t0 = std::time::Instant::now();
        let mut head = None;
        let (manifest, state, config, prepared) = match memory {
            LoadMemory::UffdExternal { socket } => {
                let (manifest, state, config) = snapshot::load_state(state_path)?;
                let prepared =
                    restore_path::prepare_external(state.mem_size, std::path::Path::new(socket))?;
                (manifest, state, config, prepared)
            }
            LoadMemory::File { path, .. } | LoadMemory::UffdBuiltin { path } => {
                let loaded =
                    snapshot::load_chain(state_path, std::path::Path::new(path), &lo.parents)?;
                head = Some(loaded.head());
                let backend = match memory {
                    LoadMemory::File { mode, .. } => Backend::File(*mode),
                    _ => Backend::UffdBuiltin,
                };
                let plan = RestorePlan {
                    backend,
                    working_set_path: Some(restore_path::working_set_path(state_path)),
                    snapshot_id: loaded.manifest.layer.id.clone(),
                    record_for: lo.record_for,
                };
                let prepared = restore_path::prepare(loaded.layers, &plan)?;
                (loaded.manifest, loaded.state, loaded.config, prepared)
            }
        };
        tracing::info!("restore: {:?}", prepared.session.report());
        let mut session = prepared.session;
        let mut config = config;
        if let Some(track) = lo.track_dirty_pages {
            config.machine.track_dirty_pages = track;
        }
        // Guest snapshot points configured on this VMM before the load win
        // over the snapshot's own.
        if inner.config.guest_snapshots.is_some() {
            config.guest_snapshots = inner.config.guest_snapshots.clone();
        }
        if let Some(c) = &lo.disks {
            for d in &mut config.drives {
                match clone_drive(d, std::path::Path::new(&c.dir), &c.name) {
                    Ok(cloned) => *d = cloned,
                    Err(e) => {
                        session.cancel();
                        return Err(SnapshotApiError::Freeze(e.to_string()));
                    }
                }
            }
        }
        let serial_out = inner
            .serial_out
            .take()
            .ok_or(SnapshotApiError::AlreadyStarted)?;
        let opts = BuildOptions {
            serial_out,
            control: self.control.clone(),
        };
        let mut vm = match build_from_state(&config, &state, prepared.ram, None, opts) {
            Ok(vm) => vm,
            Err(e) => {
                inner.serial_out = Some(Box::new(std::io::stdout()));
                session.cancel();
                return Err(SnapshotApiError::Build(e));
            }
        };
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
        // A diff of this VM continues the chain from the layer it came from.
        inner.chain = head
            .map(snapshot::ChainState::restored_from)
            .unwrap_or_default();
        tracing::debug!(
            "snapshot {} restored in {} µs",
            manifest.layer.id,
            t0.elapsed().as_micros()
        );
        inner.config = config;
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
            identity::record(&mut inner.config, id);
        }
        if lo.resume {
            session.guest_started();
        }
        inner.vm = Some(vm);
        inner.restore = Some(session);
        Ok(())
    }

    fn configure(&self, f: impl FnOnce(&mut VmConfig)) -> Result<ApiResponse, ApiError> {
        let mut inner = lock(&self.inner);
        if inner.vm.is_some() {
            return Err(ApiError::BadRequest(
                "the microVM is already started; this can only be set before InstanceStart".into(),
            ));
        }
        f(&mut inner.config);
        Ok(ApiResponse::NoContent)
    }
}

impl Vmm {
    /// `GET /tmem`: the running pool, or the configured one before start.
    pub fn tmem_info(&self) -> TmemInfo {
        let inner = lock(&self.inner);
        if let Some(vm) = inner.vm.as_ref() {
            if let Some(stats) = vm.tmem().stats() {
                return TmemInfo {
                    enabled: true,
                    stats,
                    timing: vm.tmem().timing(),
                };
            }
        }
        let t = &inner.config.tmem;
        TmemInfo {
            enabled: t.enabled && inner.vm.is_none(),
            stats: PoolStats {
                quota_bytes: t.quota_bytes,
                compression: t.compression,
                ..Default::default()
            },
            timing: None,
        }
    }

    /// `PUT /tmem`: any field before start, only the quota afterwards.
    fn update_tmem(&self, update: &TmemUpdate) -> Result<ApiResponse, ApiError> {
        let mut inner = lock(&self.inner);
        let Some(vm) = &inner.vm else {
            inner.config.tmem = update.apply(&inner.config.tmem);
            return Ok(ApiResponse::NoContent);
        };
        if update.enabled.is_some() || update.compression.is_some() {
            return Err(bad(
                "the microVM is started: PUT /tmem may only change quota_bytes now \
                 (enabled and compression are set before InstanceStart)",
            ));
        }
        let quota = update.quota_bytes.unwrap_or(inner.config.tmem.quota_bytes);
        if !vm.tmem().set_quota(quota) {
            return Err(bad(
                "this microVM has no tmem pool (tmem.enabled was false at InstanceStart)",
            ));
        }
        inner.config.tmem.quota_bytes = quota;
        Ok(ApiResponse::NoContent)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SnapshotApiError {
    #[error("{0}")]
    Unsupported(&'static str),
    #[error("the microVM is not started; there is nothing to snapshot")]
    NoVm,
    #[error("a snapshot can only be loaded before any microVM was started or loaded in this VMM")]
    AlreadyStarted,
    #[error(transparent)]
    Snapshot(#[from] snapshot::SnapshotError),
    #[error("cannot restore the microVM: {0}")]
    Build(#[source] BuildError),
    #[error("cannot start the restored microVM: {0}")]
    Start(String),
    #[error("cannot restore the microVM's memory: {0}")]
    Memory(#[from] restore_path::RestoreError),
    #[error("cannot snapshot this microVM: {0}")]
    Restore(String),
    #[error("clone identity: {0}")]
    Identity(#[from] IdentityError),
    #[error("copy-on-write disks for cloning: {0}")]
    Freeze(String),
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("the microVM was already started (InstanceStart is accepted once)")]
    AlreadyStarted,
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error("cannot start the microVM: {0}")]
    Start(String),
}

fn bad(e: impl std::fmt::Display) -> ApiError {
    ApiError::BadRequest(e.to_string())
}

impl ApiHandler for Vmm {
    fn handle(&self, req: ApiRequest) -> Result<ApiResponse, ApiError> {
        match req {
            ApiRequest::GetInstanceInfo => {
                let state = match self.state() {
                    RunState::NotStarted => InstanceState::NotStarted,
                    RunState::Running => InstanceState::Running,
                    RunState::Paused => InstanceState::Paused,
                    RunState::Stopped => InstanceState::Stopped,
                };
                ApiResponse::json(&InstanceInfo::new(self.id.clone(), state))
            }
            ApiRequest::GetMachineConfig => ApiResponse::json(&lock(&self.inner).config.machine),
            ApiRequest::GetVmConfig => ApiResponse::json(&lock(&self.inner).config),
            ApiRequest::PutBootSource(b) => {
                b.validate().map_err(bad)?;
                self.configure(|c| c.boot_source = Some(b))
            }
            ApiRequest::PutMachineConfig(m) => {
                m.validate().map_err(bad)?;
                self.configure(|c| c.machine = m)
            }
            ApiRequest::PatchMachineConfig(p) => {
                let m = p.apply(&lock(&self.inner).config.machine);
                m.validate().map_err(bad)?;
                self.configure(|c| c.machine = m)
            }
            ApiRequest::PutDrive(d) => {
                d.validate().map_err(bad)?;
                self.configure(|c| c.upsert_drive(d))
            }
            ApiRequest::PutVsock(v) => {
                v.validate().map_err(bad)?;
                self.configure(|c| c.vsock = Some(v))
            }
            ApiRequest::Action(ActionType::InstanceStart) => {
                self.start().map_err(bad)?;
                Ok(ApiResponse::NoContent)
            }
            ApiRequest::Action(ActionType::SendCtrlAltDel) => {
                let inner = lock(&self.inner);
                let vm = inner
                    .vm
                    .as_ref()
                    .ok_or_else(|| bad("the microVM is not started"))?;
                vm.send_ctrl_alt_del().map_err(bad)?;
                Ok(ApiResponse::NoContent)
            }
            ApiRequest::Action(ActionType::FlushMetrics) => Ok(ApiResponse::NoContent),
            ApiRequest::GetTmem => ApiResponse::json(&self.tmem_info()),
            ApiRequest::PutTmem(update) => self.update_tmem(&update),
            ApiRequest::PutHotplugMemory(h) => {
                h.validate().map_err(bad)?;
                self.configure(|c| c.memory_hotplug = Some(h))
            }
            ApiRequest::PatchHotplugMemory(u) => {
                let inner = lock(&self.inner);
                let vm = inner.vm.as_ref().ok_or_else(|| {
                    bad("PATCH /hotplug/memory needs a running microVM; before InstanceStart, PUT /hotplug/memory sets the region")
                })?;
                let mem = vm.mem_hotplug().ok_or_else(|| {
                    bad("this microVM has no hotplug memory (PUT /hotplug/memory before boot)")
                })?;
                mem.set_requested_mib(u.requested_size_mib).map_err(bad)?;
                Ok(ApiResponse::NoContent)
            }
            ApiRequest::GetHotplugMemory => {
                let inner = lock(&self.inner);
                if let Some(mem) = inner.vm.as_ref().and_then(|vm| vm.mem_hotplug()) {
                    return ApiResponse::json(&mem.status());
                }
                let h = inner.config.memory_hotplug.as_ref().ok_or_else(|| {
                    bad("no hotplug memory is configured (PUT /hotplug/memory before boot)")
                })?;
                ApiResponse::json(&MemStatus {
                    total_size_mib: h.total_size_mib,
                    slot_size_mib: h.slot_size_mib,
                    block_size_mib: h.block_size_mib,
                    plugged_size_mib: 0,
                    requested_size_mib: 0,
                })
            }
            ApiRequest::CreateSnapshot(p) => {
                let info = self.create_snapshot(&p).map_err(bad)?;
                ApiResponse::json(&info.manifest)
            }
            ApiRequest::LoadSnapshot(p) => {
                let memory = p.memory().map_err(ApiError::BadRequest)?;
                let lo = LoadOptions {
                    resume: p.resume_vm,
                    record_for: p
                        .working_set_record_ms
                        .map(std::time::Duration::from_millis),
                    identity: p.clone_identity().map_err(ApiError::BadRequest)?,
                    disks: p.clone_disks.clone(),
                    track_dirty_pages: p.track_dirty(),
                    parents: p.parent_paths(),
                };
                self.load_snapshot_with(std::path::Path::new(&p.snapshot_path), &memory, &lo)
                    .map_err(bad)?;
                Ok(ApiResponse::NoContent)
            }
            ApiRequest::PutClone(r) => ApiResponse::json(&self.clone_vm(&r).map_err(clone_err)?),
            ApiRequest::PutCloneConfig(c) => {
                self.set_clone_config(c).map_err(clone_err)?;
                Ok(ApiResponse::NoContent)
            }
            ApiRequest::GetClone => ApiResponse::json(&self.clone_status()),
            ApiRequest::PutGuestSnapshots(c) => self.put_guest_snapshots(c),
            ApiRequest::GetGuestSnapshots => self.get_guest_snapshots(),
            ApiRequest::PatchVm(state) => {
                let inner = lock(&self.inner);
                let vm = inner
                    .vm
                    .as_ref()
                    .ok_or_else(|| bad("the microVM is not started"))?;
                if state == VmState::Resumed && inner.clone.zygote {
                    return Err(bad(
                        "this microVM is a zygote: it stays frozen as its clones' template \
                         (clone it with PUT /clone; stop it when no more clones are wanted)",
                    ));
                }
                match state {
                    VmState::Paused => vm.pause().map_err(bad)?,
                    VmState::Resumed => vm.resume().map_err(bad)?,
                }
                if state == VmState::Resumed {
                    let mut inner = inner;
                    if let Some(r) = inner.restore.as_mut() {
                        r.guest_started();
                    }
                }
                Ok(ApiResponse::NoContent)
            }
            ApiRequest::PutBalloon(b) => {
                b.validate_for(&lock(&self.inner).config.machine)
                    .map_err(bad)?;
                self.configure(|c| c.balloon = Some(b))
            }
            ApiRequest::PatchBalloon(u) => self.balloon(
                |h| {
                    h.set_target_mib(u.amount_mib)
                        .map(|()| ApiResponse::NoContent)
                },
                |c| {
                    let machine = c.machine.clone();
                    let b = c.balloon.as_mut().ok_or_else(no_balloon)?;
                    let new = BalloonConfig {
                        amount_mib: u.amount_mib,
                        ..b.clone()
                    };
                    new.validate_for(&machine).map_err(bad)?;
                    *b = new;
                    Ok(ApiResponse::NoContent)
                },
            ),
            ApiRequest::GetBalloon => self.balloon(
                |h| ApiResponse::json(&h.status()).map_err(|e| e.to_string()),
                |c| ApiResponse::json(c.balloon.as_ref().ok_or_else(no_balloon)?),
            ),
            ApiRequest::GetBalloonStatistics => self.balloon(
                |h| match h.statistics() {
                    Ok(s) => ApiResponse::json(&s).map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                },
                |_| {
                    Err(bad(
                        "balloon statistics are available once the microVM is started",
                    ))
                },
            ),
            ApiRequest::PatchBalloonStatistics(u) => self.balloon(
                |h| {
                    h.set_stats_interval(u.stats_polling_interval_s)
                        .map(|()| ApiResponse::NoContent)
                },
                |c| {
                    let b = c.balloon.as_mut().ok_or_else(no_balloon)?;
                    b.stats_polling_interval_s = u.stats_polling_interval_s;
                    Ok(ApiResponse::NoContent)
                },
            ),
        }
    }
}

fn clone_err(e: CloneError) -> ApiError {
    if e.is_client_error() {
        ApiError::BadRequest(e.to_string())
    } else {
        ApiError::Internal(e.to_string())
    }
}

/// `GET /clone`.
#[derive(Debug, serde::Serialize)]
pub struct CloneStatus {
    pub config: CloneConfig,
    pub zygote: bool,
    pub served: u64,
    pub generation: u64,
    pub template: Option<String>,
    pub template_layers: usize,
    pub standby: usize,
}

impl Vmm {
    /// Tells the VMM its API socket (clones' sockets go beside it).
    pub fn set_api_socket(&self, path: &std::path::Path) {
        lock(&self.inner).clone.api_socket = Some(path.to_path_buf());
    }

    /// `PUT /clone`.
    pub fn clone_vm(&self, r: &CloneRequest) -> Result<CloneReport, CloneError> {
        let request_ns = crate::host::monotonic_ns();
        let mut inner = lock(&self.inner);
        let Inner {
            config, vm, clone, ..
        } = &mut *inner;
        let vm = vm.as_ref().ok_or(CloneError::NotRunning("not started"))?;
        let order = CloneOrder {
            count: r.count,
            mode: r.mode,
            socket_dir: r.socket_dir.clone(),
            fork_vcpu: None,
            request_ns,
        };
        let report = clone_vm(vm, config, clone, order)?;
        if let Err(e) = fill_standby(clone, config) {
            tracing::warn!("cannot refill the standby clone processes: {e}");
        }
        Ok(report)
    }

    /// `PUT /clone/config`; starts (or stops) standby processes to match.
    pub fn set_clone_config(&self, c: CloneConfig) -> Result<(), CloneError> {
        c.validate()?;
        let mut inner = lock(&self.inner);
        inner.clone.config = c;
        let extra = inner
            .clone
            .standby
            .len()
            .saturating_sub(inner.clone.config.standby as usize);
        for p in inner.clone.standby.drain(..extra) {
            p.kill();
        }
        let Inner { config, clone, .. } = &mut *inner;
        fill_standby(clone, config)
    }

    pub fn clone_status(&self) -> CloneStatus {
        let inner = lock(&self.inner);
        let c = &inner.clone;
        CloneStatus {
            config: c.config.clone(),
            zygote: c.zygote,
            served: c.served,
            generation: c.generation,
            template: c.template.as_ref().map(|t| t.id.clone()),
            template_layers: c.template.as_ref().map_or(0, |t| t.layers.len()),
            standby: c.standby.len(),
        }
    }

    /// Lets the guest's signal-port `FORK` clone this VM: a thread serves
    /// the forks (the vCPU that signalled parks meanwhile). Without this,
    /// `FORK` fails at once in the guest.
    pub fn enable_guest_fork(self: &Arc<Self>) {
        let (tx, rx) = channel::<(u8, u32)>();
        *lock(&self.fork_tx) = Some(tx);
        let me: Weak<Vmm> = Arc::downgrade(self);
        let _ = std::thread::Builder::new()
            .name("guest-fork".into())
            .spawn(move || {
                while let Ok((vcpu, n)) = rx.recv() {
                    let Some(vmm) = me.upgrade() else { return };
                    vmm.guest_fork(vcpu, n);
                }
            });
        if let Some(vm) = lock(&self.inner).vm.as_ref() {
            self.install_fork_handler(vm);
        }
    }

    fn install_fork_handler(&self, vm: &Vm) {
        if let Some(tx) = lock(&self.fork_tx).clone() {
            let tx = Mutex::new(tx);
            vm.signal().set_fork_handler(Box::new(move |vcpu, n| {
                let _ = lock(&tx).send((vcpu, n));
            }));
        }
    }

    fn guest_fork(&self, vcpu: u8, n: u32) {
        let request_ns = crate::host::monotonic_ns();
        let mut inner = lock(&self.inner);
        let Inner {
            config, vm, clone, ..
        } = &mut *inner;
        let Some(vm) = vm.as_ref() else { return };
        let count = if n == 0 { clone.config.fork_count } else { n };
        let order = CloneOrder {
            count,
            mode: None,
            socket_dir: None,
            fork_vcpu: Some(vcpu),
            request_ns,
        };
        match clone_vm(vm, config, clone, order) {
            Ok(r) => {
                let pids: Vec<_> = r.clones.iter().map(|c| c.pid).collect();
                tracing::info!("guest fork: {} clones started: {pids:?}", r.clones.len());
                eprintln!(
                    "spore: guest fork: {} clone(s) of template {} started ({:?} mode): {}",
                    r.clones.len(),
                    r.template,
                    r.mode,
                    r.clones
                        .iter()
                        .map(|c| format!("{} pid {}", c.socket, c.pid))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                if let Err(e) = fill_standby(clone, config) {
                    tracing::warn!("cannot refill the standby clone processes: {e}");
                }
            }
            Err(e) => eprintln!("spore: guest fork failed: {e}"),
        }
    }

    /// Makes a clone process's KVM VM, vCPUs and memory slots for a
    /// `mem_bytes`, `vcpus` VM while it waits for its template.
    pub fn prepare_clone(&self, mem_bytes: u64, vcpus: u8) -> Result<(), CloneError> {
        let p = child::Prepared::new(mem_bytes, vcpus)?;
        lock(&self.inner).clone.prepared = Some(p);
        Ok(())
    }

    /// Runs this VMM as a clone: maps the template that came over the
    /// handoff socket, restores the VM and starts it. Returns the host
    /// monotonic time right before its vCPUs started.
    pub fn start_clone(
        &self,
        handoff: &crate::clone::handoff::Handoff,
        layers: Vec<crate::memory::template::MemoryLayer>,
    ) -> Result<u64, CloneError> {
        self.restore_clone(handoff, layers)?;
        self.go_clone(handoff.index)
    }

    /// Restores the clone that came over the handoff socket, paused, until
    /// [`Vmm::go_clone`] gives it its number and starts it (a zygote's
    /// standby process restores ahead of the request).
    pub fn restore_clone(
        &self,
        handoff: &crate::clone::handoff::Handoff,
        layers: Vec<crate::memory::template::MemoryLayer>,
    ) -> Result<(), CloneError> {
        let mut inner = lock(&self.inner);
        if inner.vm.is_some() || self.control.stop_reason().is_some() {
            return Err(CloneError::BadRequest(
                "this VMM already runs a microVM".into(),
            ));
        }
        let serial_out = inner
            .serial_out
            .take()
            .ok_or_else(|| CloneError::BadRequest("this VMM already ran a microVM".into()))?;
        let opts = BuildOptions {
            serial_out,
            control: self.control.clone(),
        };
        let prepared = inner.clone.prepared.take();
        let restored = child::restore(handoff, layers, prepared, opts)?;
        self.install_fork_handler(&restored.vm);
        let api_socket = inner.clone.api_socket.take();
        inner.clone = restored.clone;
        inner.clone.api_socket = api_socket;
        inner.clone.awaiting_go = Some((handoff.fork_vcpu, handoff.generation));
        inner.config = restored.config;
        inner.vm = Some(restored.vm);
        Ok(())
    }

    /// Makes the restored clone clone number `index` and starts it; returns
    /// the host monotonic time right before its vCPUs started.
    pub fn go_clone(&self, index: u64) -> Result<u64, CloneError> {
        let mut inner = lock(&self.inner);
        let (fork_vcpu, generation) = inner
            .clone
            .awaiting_go
            .take()
            .ok_or_else(|| CloneError::BadRequest("no restored clone waits to start".into()))?;
        let Inner { config, vm, .. } = &mut *inner;
        let vm = vm
            .as_mut()
            .ok_or_else(|| CloneError::BadRequest("no restored clone waits to start".into()))?;
        child::activate(vm, config, fork_vcpu, index, generation)?;
        let start_ns = crate::host::monotonic_ns();
        vm.start()
            .map_err(|e| CloneError::Capture(format!("cannot start the clone: {e}")))?;
        Ok(start_ns)
    }
}

fn no_balloon() -> ApiError {
    bad("no balloon device: configure one with PUT /balloon before InstanceStart")
}

impl Vmm {
    /// Runs `running` on the balloon of the started VM, or `configuring` on
    /// the configuration before InstanceStart.
    fn balloon<E: std::fmt::Display>(
        &self,
        running: impl FnOnce(&BalloonHandle) -> Result<ApiResponse, E>,
        configuring: impl FnOnce(&mut VmConfig) -> Result<ApiResponse, ApiError>,
    ) -> Result<ApiResponse, ApiError> {
        let mut inner = lock(&self.inner);
        match &inner.vm {
            Some(vm) => running(vm.balloon().ok_or_else(no_balloon)?).map_err(bad),
            None => configuring(&mut inner.config),
        }
    }
}

#[cfg(test)]
mod tmem_api_tests {
    use super::*;
    use crate::config::Compression;

    fn vmm() -> Vmm {
        Vmm::new("t".into(), VmConfig::default(), Box::new(std::io::sink()))
    }

    fn info(v: &Vmm) -> serde_json::Value {
        match v.handle(ApiRequest::GetTmem) {
            Ok(ApiResponse::Json(j)) => j,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn tmem_is_configured_before_start() {
        let v = vmm();
        let j = info(&v);
        assert_eq!(j["enabled"], true);
        assert_eq!(j["quota_bytes"], 256u64 << 20);
        assert_eq!(j["compression"], "none");
        assert_eq!(j["objects"], 0);
        assert_eq!(j["puts"], 0);
        let update = TmemUpdate {
            quota_bytes: Some(4096),
            compression: Some(Compression::Lz4),
            enabled: None,
        };
        assert_eq!(
            v.handle(ApiRequest::PutTmem(update)),
            Ok(ApiResponse::NoContent)
        );
        let j = info(&v);
        assert_eq!(
            (j["quota_bytes"].as_u64(), j["compression"].as_str()),
            (Some(4096), Some("lz4"))
        );
        let off = TmemUpdate {
            enabled: Some(false),
            ..Default::default()
        };
        v.handle(ApiRequest::PutTmem(off)).unwrap();
        assert_eq!(info(&v)["enabled"], false);
        assert!(lock(&v.inner).config.tmem.compression == Compression::Lz4);
    }
}
