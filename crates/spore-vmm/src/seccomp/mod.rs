//! Seccomp filters for every thread of a VMM process, on by default.
//!
//! Three thread kinds, each with its allow list in its own file, as in
//! Firecracker: [`vmm`] (the main thread, the virtio device workers and the
//! helper threads), [`api`] (the API server's thread, which also runs every
//! request: start, snapshots, clones, loads) and [`vcpu`] (the `KVM_RUN`
//! loops; `ioctl` only on the KVM request numbers a vCPU thread makes). A
//! syscall outside the list kills the whole process (`SECCOMP_RET_KILL_PROCESS`,
//! signal `SIGSYS`).
//!
//! How the filters get onto every thread: a filter is per thread and a new
//! thread inherits its creator's, stacked under any it installs itself (a
//! syscall must pass every filter of the stack). So every thread of the
//! process starts through [`spawn`], which installs the thread's kind's filter
//! first thing (unless it already runs under the same kind, inherited); the
//! main thread installs the VMM filter ([`apply_main`]) before any guest code
//! runs. A vCPU thread never creates a thread: a device worker that a guest's
//! MMIO write activates on a vCPU thread is started by a spawner thread that
//! runs the VMM filter ([`spawn`] sends it there). A clone process, which a
//! source VMM starts with `posix_spawn`, inherits the filter of the thread
//! that started it (seccomp filters survive `execve`); that is why the VMM and
//! API lists hold what a whole VMM process needs outside a vCPU loop, and why
//! a clone's main thread adds none ([`configure`]).
//!
//! `spore vmm --no-seccomp` turns the filters off; `--seccomp-filter FILE`
//! replaces them with a seccompiler JSON file (keys `vmm`, `api`, `vcpu`) or
//! a filter compiled by Firecracker's `seccompiler-bin` ([`file`]), as in
//! Firecracker. `SPORE_SECCOMP_LOG=1` makes a syscall outside the built-in
//! lists logged by the kernel (audit, in `dmesg`) instead of fatal: a
//! debugging aid for finding a missing syscall.

mod api;
mod file;
mod vcpu;
mod vmm;

use std::cell::Cell;
use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;
use std::sync::mpsc::{channel, sync_channel, Sender};
use std::sync::{Mutex, OnceLock};
use std::thread::JoinHandle;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// seccompiler's name for the architecture this spore runs on (filters
/// check it: a syscall number means something else on another one).
#[cfg(target_arch = "x86_64")]
pub(crate) const TARGET_ARCH: TargetArch = TargetArch::x86_64;
#[cfg(target_arch = "aarch64")]
pub(crate) const TARGET_ARCH: TargetArch = TargetArch::aarch64;

use crate::host::lock;

/// The kinds of threads, each with its own filter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThreadKind {
    /// The main thread, device workers, helper threads.
    Vmm,
    /// The API server's thread.
    Api,
    /// A vCPU's `KVM_RUN` loop.
    Vcpu,
}

impl ThreadKind {
    /// The kind's key in a seccompiler JSON file (Firecracker's names).
    pub fn key(self) -> &'static str {
        match self {
            ThreadKind::Vmm => "vmm",
            ThreadKind::Api => "api",
            ThreadKind::Vcpu => "vcpu",
        }
    }
}

/// What the user chose (`--no-seccomp`, `--seccomp-filter FILE`, neither).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum SeccompSetting {
    /// The built-in lists.
    #[default]
    Default,
    /// No filters.
    Off,
    /// The filters of a file (seccompiler JSON or Firecracker's compiled form).
    File(PathBuf),
}

impl SeccompSetting {
    /// The `spore vmm` flags that ask for this setting (none for the default).
    pub fn to_args(&self) -> Vec<std::ffi::OsString> {
        match self {
            SeccompSetting::Default => Vec::new(),
            SeccompSetting::Off => vec!["--no-seccomp".into()],
            SeccompSetting::File(p) => vec!["--seccomp-filter".into(), p.clone().into()],
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("--seccomp-filter {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("--seccomp-filter {path}: {source}")]
    Compile {
        path: String,
        #[source]
        source: seccompiler::Error,
    },
    #[error("--seccomp-filter {path}: {why}")]
    Format { path: String, why: String },
    #[error(
        "--seccomp-filter {path}: no {key:?} filter (the file needs \"vmm\", \"api\" and \"vcpu\")"
    )]
    Missing { path: String, key: &'static str },
    #[error("building the built-in seccomp filters: {0}")]
    Builtin(String),
    #[error("installing the {kind} seccomp filter: {source}")]
    Install {
        kind: &'static str,
        #[source]
        source: seccompiler::Error,
    },
}

/// Compiled filters, one per thread kind.
pub struct Filters {
    vmm: BpfProgram,
    api: BpfProgram,
    vcpu: BpfProgram,
}

impl Filters {
    /// The filters `setting` asks for (`None` when off).
    pub fn for_setting(setting: &SeccompSetting) -> Result<Option<Filters>, SeccompError> {
        match setting {
            SeccompSetting::Off => Ok(None),
            SeccompSetting::Default => Filters::builtin().map(Some),
            SeccompSetting::File(p) => file::read(p).map(Some),
        }
    }

    /// The built-in lists (`vmm.rs`, `api.rs`, `vcpu.rs`).
    pub fn builtin() -> Result<Filters, SeccompError> {
        let log = std::env::var_os("SPORE_SECCOMP_LOG").is_some_and(|v| v == "1");
        let mismatch = if log {
            SeccompAction::Log
        } else {
            SeccompAction::KillProcess
        };
        let build = |map: BTreeMap<i64, Vec<SeccompRule>>| -> Result<BpfProgram, SeccompError> {
            let filter =
                SeccompFilter::new(map, mismatch.clone(), SeccompAction::Allow, TARGET_ARCH)
                    .map_err(|e| SeccompError::Builtin(e.to_string()))?;
            filter
                .try_into()
                .map_err(|e: seccompiler::BackendError| SeccompError::Builtin(e.to_string()))
        };
        let builtin = |e: seccompiler::Error| SeccompError::Builtin(e.to_string());
        let vmm_rules: BTreeMap<_, _> = vmm::rules().map_err(builtin)?.into_iter().collect();
        let api_rules: BTreeMap<_, _> = api::rules().map_err(builtin)?.into_iter().collect();
        let vcpu_rules = vcpu::rules().map_err(builtin)?;
        // The API list is the VMM list today: compiled once (every VMM
        // process compiles its filters at start-up).
        let api = (api_rules != vmm_rules)
            .then(|| build(api_rules))
            .transpose()?;
        let vmm = build(vmm_rules)?;
        Ok(Filters {
            api: api.unwrap_or_else(|| vmm.clone()),
            vmm,
            vcpu: build(vcpu_rules.into_iter().collect())?,
        })
    }

    fn get(&self, kind: ThreadKind) -> &BpfProgram {
        match kind {
            ThreadKind::Vmm => &self.vmm,
            ThreadKind::Api => &self.api,
            ThreadKind::Vcpu => &self.vcpu,
        }
    }

    /// Whether a thread running `current`'s filter already runs exactly
    /// `kind`'s (the built-in API and VMM lists are the same set: a thread
    /// that inherited one needs no second install, each of which costs
    /// the kernel a filter preparation — about 0.4 ms here for ~740
    /// instructions).
    fn same(&self, current: ThreadKind, kind: ThreadKind) -> bool {
        current == kind || self.get(current) == self.get(kind)
    }

    /// Installs `kind`'s filter on the calling thread (none if the user's
    /// file gave it an empty program, as Firecracker reads such a file).
    pub fn install(&self, kind: ThreadKind) -> Result<(), SeccompError> {
        if self.get(kind).is_empty() {
            return Ok(());
        }
        seccompiler::apply_filter(self.get(kind)).map_err(|source| SeccompError::Install {
            kind: kind.key(),
            source,
        })
    }
}

/// A rule that lets the syscall through when its argument `index` equals
/// `value` (compared as a 32-bit word: request numbers, signals, families,
/// namespace types).
pub(super) fn arg_is(index: u8, value: u64) -> seccompiler::Result<SeccompRule> {
    let cond = SeccompCondition::new(index, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, value)?;
    Ok(SeccompRule::new(vec![cond])?)
}

/// This process's choice and filters, set once by [`configure`].
struct Config {
    setting: SeccompSetting,
    filters: Option<Filters>,
    /// The process started under a filter (a clone process inherits its
    /// source's): the VMM and API kinds are taken as already applied.
    inherited: bool,
}

static CONFIG: OnceLock<Config> = OnceLock::new();

/// Where [`spawn`] sends threads that a vCPU thread asks for.
static SPAWNER: Mutex<Option<Sender<Job>>> = Mutex::new(None);

/// A thread start the spawner runs.
type Job = Box<dyn FnOnce() + Send>;

/// Whether a filter applies to a thread's kind: the one it installed, or
/// `Inherited` (a clone process's main thread, under its source's filter).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Applied {
    Kind(ThreadKind),
    Inherited,
}

thread_local! {
    static APPLIED: Cell<Option<Applied>> = const { Cell::new(None) };
}

/// Sets this process's seccomp choice; call once, on the main thread, before
/// starting any thread. Compiles the filters (a bad `--seccomp-filter` file
/// fails here).
pub fn configure(setting: SeccompSetting) -> Result<(), SeccompError> {
    // The one executable the VMM filter lets this process exec, opened
    // before the filter names its descriptor.
    crate::own_exe::open_at_start();
    let filters = Filters::for_setting(&setting)?;
    // SAFETY: PR_GET_SECCOMP takes no pointer; it returns the calling
    // thread's mode (2 under a filter).
    let inherited = unsafe { libc::prctl(libc::PR_GET_SECCOMP) } == 2;
    if inherited {
        APPLIED.with(|a| a.set(Some(Applied::Inherited)));
    }
    // A second call changes nothing: the first choice stays.
    let _ = CONFIG.set(Config {
        setting,
        filters,
        inherited,
    });
    Ok(())
}

/// The choice [`configure`] set (the default if it was never called), for a
/// clone process's command line.
pub fn setting() -> SeccompSetting {
    CONFIG.get().map(|c| c.setting.clone()).unwrap_or_default()
}

/// Whether a vCPU thread may read its own registers (after a guest crash):
/// the built-in vCPU filter allows it; a user's `--seccomp-filter` file may
/// not, and a request it forbids would end the process.
pub fn vcpu_may_read_registers() -> bool {
    !matches!(setting(), SeccompSetting::File(_))
}

/// Whether filters are on in this process.
pub fn enabled() -> bool {
    CONFIG.get().is_some_and(|c| c.filters.is_some())
}

/// Starts the spawner thread ahead of [`apply_main`] (it filters itself),
/// so that a clone process waiting for its template does not create a
/// thread between the source's request and its guest's first instruction.
pub fn start_spawner_ahead() -> Result<(), SeccompError> {
    if enabled() && lock(&SPAWNER).is_none() {
        start_spawner()?;
    }
    Ok(())
}

/// Installs `kind`'s filter on the calling thread unless it already runs
/// under it (or filters are off).
pub fn apply(kind: ThreadKind) -> Result<(), SeccompError> {
    let Some(filters) = CONFIG.get().and_then(|c| c.filters.as_ref()) else {
        return Ok(());
    };
    let current = APPLIED.with(Cell::get);
    let covered = match current {
        Some(Applied::Kind(k)) => filters.same(k, kind),
        Some(Applied::Inherited) => kind != ThreadKind::Vcpu,
        None => false,
    };
    if !covered {
        filters.install(kind)?;
        APPLIED.with(|a| a.set(Some(Applied::Kind(kind))));
    }
    Ok(())
}

/// The main thread's filter (VMM), installed before any guest code runs,
/// and the spawner thread (started here, after the caller blocked the host
/// signals, so that it and the workers it starts keep them blocked). A
/// clone process's main thread keeps the filter it inherited.
pub fn apply_main() -> Result<(), SeccompError> {
    if !enabled() {
        return Ok(());
    }
    if lock(&SPAWNER).is_none() {
        start_spawner()?;
    }
    if CONFIG.get().is_some_and(|c| c.inherited) {
        return Ok(());
    }
    apply(ThreadKind::Vmm)
}

/// Installs `kind`'s filter at the top of a new thread; a thread that cannot
/// install its filter must not run unfiltered, so the process ends.
fn apply_or_die(kind: ThreadKind) {
    if let Err(e) = apply(kind) {
        eprintln!("spore: {e}");
        // SAFETY: _exit ends the process at once; nothing is left half done
        // that an orderly exit would finish.
        unsafe { libc::_exit(1) };
    }
}

/// Starts `body` on a thread named `name` that runs `kind`'s filter. From a
/// vCPU thread (whose filter allows no thread creation), a non-vCPU thread is
/// started by the spawner thread instead.
pub fn spawn<T, F>(kind: ThreadKind, name: String, body: F) -> io::Result<JoinHandle<T>>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let parent = APPLIED.with(Cell::get);
    let on_vcpu = parent == Some(Applied::Kind(ThreadKind::Vcpu));
    if !on_vcpu || kind == ThreadKind::Vcpu {
        return std::thread::Builder::new()
            .name(name)
            .spawn(move || start(parent, kind, body));
    }
    let (tx, rx) = sync_channel(1);
    let job: Job = Box::new(move || {
        // Started by the spawner, the thread inherits the VMM filter.
        let parent = Some(Applied::Kind(ThreadKind::Vmm));
        let spawned = std::thread::Builder::new()
            .name(name)
            .spawn(move || start(parent, kind, body));
        let _ = tx.send(spawned);
    });
    let sent = lock(&SPAWNER).as_ref().map(|s| s.send(job).is_ok());
    if sent != Some(true) {
        return Err(io::Error::other("the seccomp spawner thread is gone"));
    }
    rx.recv()
        .map_err(|_| io::Error::other("the seccomp spawner thread is gone"))?
}

/// A new thread's first steps: what it inherited, its own filter, `body`.
fn start<T>(parent: Option<Applied>, kind: ThreadKind, body: impl FnOnce() -> T) -> T {
    APPLIED.with(|a| a.set(parent));
    apply_or_die(kind);
    body()
}

/// The spawner: a VMM-filtered thread that starts threads for vCPU threads.
fn start_spawner() -> Result<(), SeccompError> {
    let (tx, rx) = channel::<Job>();
    let spawned = spawn(ThreadKind::Vmm, "spawner".into(), move || {
        while let Ok(job) = rx.recv() {
            job();
        }
    });
    match spawned {
        Ok(_) => {
            *lock(&SPAWNER) = Some(tx);
            Ok(())
        }
        Err(e) => Err(SeccompError::Builtin(format!(
            "starting the spawner thread: {e}"
        ))),
    }
}

#[cfg(test)]
mod tests;
