//! The VMM's state machine: configure → start (boot, restore or clone) →
//! pause/resume → stop, for one microVM.
//!
//! [`Vmm`] holds the configuration and, once one is built, the [`Vm`]; which
//! of the two a request may touch is decided by [`Phase`], in one place
//! ([`Inner::built`] answers "is there a VM" with [`NotStarted`]). Each
//! request takes the state lock once. API requests arrive one at a time
//! (the API thread serializes them); the process's main thread waits in
//! [`Vmm::wait_for_exit`] and serves guest-triggered snapshots there.
//!
//! Module map, by question:
//! - [`dispatch`]: API request → one typed call below (the only place that
//!   knows `ApiRequest`).
//! - [`preboot`]: the configuration, set before `InstanceStart`; `start`.
//! - [`running`]: a built VM's controls: pause/resume, balloon, hotplug
//!   memory, tmem, snapshot create.
//! - [`net`]: network interfaces: PUT before boot, PATCH (limits) after.
//! - [`restore`]: building the VM from a snapshot instead.
//! - [`clone_source`]: this VM as a clone source (`PUT /clone`, guest `FORK`).
//! - [`clone_child`]: this process becoming a clone (`spore vmm --clone-handoff`).
//! - [`guest_snapshot`]: guest-triggered snapshot points.
//!
//! Nothing here parses HTTP or guest memory; nothing here runs on a vCPU.

mod clone_child;
pub mod clone_process;
mod clone_source;
mod dispatch;
mod drives;
mod fc_config;
mod guest_snapshot;
pub mod mmds;
mod net;
mod outputs;
mod preboot;
mod restore;
mod running;
mod standby;
#[cfg(test)]
mod tests;

use std::sync::atomic::AtomicBool;
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

pub use clone_source::CloneStatus;
pub use restore::LoadOptions;

use crate::api::ApiError;
use crate::builder::BuildError;
use crate::clone::identity::IdentityError;
use crate::clone::{ChildState, SourceState};
use crate::config::VmConfig;
use crate::devices::legacy::serial::SerialOut;
use crate::devices::legacy::signal::Mark;
use crate::host::lock;
use crate::snapshot;
use crate::snapshot::restore::{RestoreError, RestoreSession};
use crate::vm::control::{ControlEvent, RunControl, StopReason};
pub use crate::vm::NotStarted;
use crate::vm::{RunState, Vm};

/// The guest-fork thread's inbox and its owner, until the thread starts.
type PendingForkThread = (Receiver<(u8, u32)>, Weak<Vmm>);

pub struct Vmm {
    id: String,
    control: Arc<RunControl>,
    inner: Mutex<Inner>,
    /// Where guest `FORK`s go (see [`Vmm::enable_guest_fork`]).
    fork_tx: Mutex<Option<Sender<(u8, u32)>>>,
    /// The guest-fork thread's inbox and owner until the thread starts.
    fork_thread: Mutex<Option<PendingForkThread>>,
    /// The clone config's `guest_fork`, read on vCPU threads (which must
    /// not take the state lock: a clone under way holds it while pausing).
    guest_fork: Arc<AtomicBool>,
    /// The standby pool's refill thread (see [`Vmm::enable_background_standby`]).
    standby_refill: Mutex<standby::Refill>,
}

/// Everything a request may read or change, behind the one lock.
struct Inner {
    config: VmConfig,
    phase: Phase,
    source: SourceState,
    child: ChildState,
    /// The manifest of the last snapshot this VMM wrote (`GET /snapshot/last`).
    last_snapshot: Option<snapshot::format::Manifest>,
    /// The MMDS data store (`/mmds`), shared with the network interfaces
    /// that route the guest's MMDS requests.
    mmds: crate::mmds::SharedMmds,
}

/// Whether a VM exists. Requests that need one go through [`Inner::built`].
enum Phase {
    /// Configuring: no VM yet; the serial sink waits for the one to come.
    PreBoot { serial_out: SerialOut },
    /// A VM exists: booted, restored, or a clone waiting for its number.
    Built(Box<BuiltVm>),
    /// The VM was shut down, or a build used up the serial sink and failed
    /// after it could be given back.
    Ended,
}

/// A built VM and what lives exactly as long as it.
struct BuiltVm {
    vm: Vm,
    /// A restored VM's memory path (uffd handler, working-set recorder);
    /// finished after the VM stopped.
    restore: Option<RestoreSession>,
    /// The last snapshot and the pages changed since (for Diff snapshots).
    chain: snapshot::ChainState,
}

impl BuiltVm {
    fn new(vm: Vm) -> Box<Self> {
        Box::new(BuiltVm {
            vm,
            restore: None,
            chain: Default::default(),
        })
    }
}

impl Phase {
    /// The VM, or the one "not started" answer.
    fn built(&self) -> Result<&BuiltVm, NotStarted> {
        match self {
            Phase::Built(b) => Ok(b),
            _ => Err(NotStarted),
        }
    }

    fn built_mut(&mut self) -> Result<&mut BuiltVm, NotStarted> {
        match self {
            Phase::Built(b) => Ok(b),
            _ => Err(NotStarted),
        }
    }
}

impl Inner {
    fn built(&self) -> Result<&BuiltVm, NotStarted> {
        self.phase.built()
    }

    fn built_mut(&mut self) -> Result<&mut BuiltVm, NotStarted> {
        self.phase.built_mut()
    }

    fn vm(&self) -> Option<&Vm> {
        self.built().ok().map(|b| &b.vm)
    }

    /// Hands the serial sink to a VM about to be built: only before any VM
    /// was built and before a stop was asked for. On a failed build, give it
    /// back with [`Inner::build_failed`].
    fn take_serial_out(&mut self, control: &RunControl) -> Result<SerialOut, StartError> {
        if control.stop_reason().is_some() {
            return Err(StartError::AlreadyStarted);
        }
        match std::mem::replace(&mut self.phase, Phase::Ended) {
            // `PUT /serial`'s file, opened now (a bad path leaves the VMM
            // as it was, to be fixed and retried).
            Phase::PreBoot { serial_out } => match fc_config::serial_sink(&self.config, serial_out)
            {
                Ok(out) => Ok(out),
                Err((serial_out, e)) => {
                    self.phase = Phase::PreBoot { serial_out };
                    Err(StartError::Build(e))
                }
            },
            other => {
                self.phase = other;
                Err(StartError::AlreadyStarted)
            }
        }
    }

    /// A failed build may be retried after fixing the configuration, but
    /// the serial sink is gone: the next attempt gets stdout.
    fn build_failed(&mut self) {
        self.phase = Phase::PreBoot {
            serial_out: Box::new(std::io::stdout()),
        };
    }
}

impl Vmm {
    pub fn new(id: String, config: VmConfig, serial_out: SerialOut) -> Self {
        Self {
            id,
            control: Arc::new(RunControl::new()),
            inner: Mutex::new(Inner {
                config,
                phase: Phase::PreBoot { serial_out },
                source: SourceState::default(),
                child: ChildState::default(),
                last_snapshot: None,
                mmds: crate::mmds::Mmds::shared(),
            }),
            fork_tx: Mutex::new(None),
            fork_thread: Mutex::new(None),
            guest_fork: Arc::new(AtomicBool::new(false)),
            standby_refill: Mutex::new(standby::Refill::Inline),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        lock(&self.inner)
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
        let mut inner = self.lock();
        if !matches!(inner.phase, Phase::Built(_)) {
            return Vec::new();
        }
        let Phase::Built(built) = std::mem::replace(&mut inner.phase, Phase::Ended) else {
            return Vec::new();
        };
        let BuiltVm {
            mut vm, restore, ..
        } = *built;
        let marks = vm.marks();
        vm.stop(StopReason::Requested);
        drop(vm);
        // Only now can nothing fault any more.
        if let Some(mut r) = restore {
            r.finish();
        }
        marks
    }

    pub fn state(&self) -> RunState {
        match self.lock().vm() {
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
        match self.lock().vm() {
            Some(vm) => lock(vm.serial()).enqueue_input(bytes),
            None => 0,
        }
    }
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

#[derive(Debug, thiserror::Error)]
pub enum SnapshotApiError {
    #[error(transparent)]
    NotStarted(#[from] NotStarted),
    #[error("a snapshot can only be loaded before any microVM was started or loaded in this VMM")]
    AlreadyStarted,
    #[error(transparent)]
    Snapshot(#[from] snapshot::SnapshotError),
    #[error("cannot restore the microVM: {0}")]
    Build(#[source] BuildError),
    #[error("cannot start the restored microVM: {0}")]
    Start(String),
    #[error("cannot restore the microVM's memory: {0}")]
    Memory(#[from] RestoreError),
    #[error("cannot snapshot this microVM: {0}")]
    Restore(String),
    #[error("clone identity: {0}")]
    Identity(#[from] IdentityError),
    #[error("copy-on-write disks for cloning: {0}")]
    Freeze(String),
    #[error("vsock_override: the snapshot has no vsock device")]
    NoVsock,
    /// Firecracker refuses an override for an interface the snapshot lacks.
    #[error("Unknown Network Device: {0:?} (network_overrides: the snapshot has no network interface with this iface_id)")]
    UnknownNetworkInterface(String),
    #[error("Cannot restore hugetlbfs backed snapshot by mapping the memory file. Please use uffd. (the snapshot's microVM has huge_pages \"2M\": give mem_backend {{\"backend_type\": \"Uffd\", \"backend_path\": <the memory file, or a page-fault handler's socket>}})")]
    HugePagesFile,
    #[error("the snapshot's microVM has huge_pages \"2M\" and cannot be restored as a clone: every clone would need all of its memory as new reserved 2 MiB pages from the host's small huge page pool, none shared with the snapshot (restore it without clone_generation/clone_disks)")]
    HugePagesClone,
    #[error("Diff snapshots are not supported for a microVM with huge_pages \"2M\" (as in Firecracker): take a Full snapshot")]
    DiffWithHugePages,
    #[error("{0}")]
    Path(String),
}

impl From<StartError> for SnapshotApiError {
    fn from(e: StartError) -> Self {
        match e {
            StartError::AlreadyStarted => SnapshotApiError::AlreadyStarted,
            StartError::Build(b) => SnapshotApiError::Build(b),
            StartError::Start(s) => SnapshotApiError::Start(s),
        }
    }
}

impl From<NotStarted> for ApiError {
    fn from(e: NotStarted) -> Self {
        ApiError::BadRequest(e.to_string())
    }
}

/// A request that cannot be served now, or names something wrong: a 400
/// carrying the message.
fn bad(e: impl std::fmt::Display) -> ApiError {
    ApiError::BadRequest(e.to_string())
}
