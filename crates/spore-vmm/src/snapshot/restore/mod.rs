//! Restore paths: how a restored VM's RAM gets the snapshot's memory.
//!
//! Every path reads memory through [`MemoryLayers`] (newest layer wins), so
//! they restore the same bytes from a full snapshot or a chain:
//!
//! | mode / backend | RAM | before the guest runs | afterwards |
//! |---|---|---|---|
//! | `lazy` (File) | the layers mapped privately | nothing | pages fault in from the page cache, shared by every VM of the same file |
//! | `eager` (File) | the same mapping | every data extent populated ([`eager`]) | no file faults |
//! | `working_set` (File), set cached | the layers mapped privately, as lazy | nothing: a thread populates the set's 2 MiB blocks beside the guest ([`prefetch`]) | as lazy |
//! | `working_set` (File), set not cached | a memfd + the built-in uffd handler | nothing: a thread reads the set's packed data in first-touch order and copies it in beside the guest ([`working_set::BackgroundLoad`]) | what the guest reaches first, and the rest, through the handler |
//! | `working_set` (File), set not cached, version-2 file | a memfd + the built-in uffd handler | the set's packed data, one sequential read ([`working_set`]) | the rest through the handler |
//! | `working_set` (File), first run | a memfd + the built-in uffd handler | nothing | every page through the handler, which records the set ([`working_set`]) |
//! | `Uffd` + memory file | a memfd + the built-in uffd handler | nothing | every page through the handler |
//! | `Uffd` + socket | a memfd | the uffd and the layout sent to the external handler | the external handler serves faults |
//!
//! A snapshot of a `huge_pages: "2M"` VM restores only through the two
//! `Uffd` rows (as in Firecracker): RAM is again a reserved 2 MiB hugetlbfs
//! memfd, and faults are filled one whole huge page at a time. Mapping the
//! memory file (File) would put the guest on 4 KiB page-cache pages.
//!
//! A [`RestoreSession`] lives as long as the VM: it owns the handler thread
//! and the working-set recorder, and is finished once the vCPUs stopped.

pub mod backing;
pub mod eager;
pub mod prefetch;
pub mod uffd;
pub mod working_set;

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use uffd::{PageSource, Uffd, UffdError, UffdServer};
use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};

use crate::host_usize;
use crate::memory::layers::MemoryLayers;
use crate::memory::{GuestRam, MemoryError};

/// How the VMM fills RAM from a File backend (`restore_mode` in
/// `PUT /snapshot/load`, `--mode` of `spore snapshot restore`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RestoreMode {
    #[default]
    Lazy,
    Eager,
    WorkingSet,
}

/// Where RAM comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Backend {
    /// The snapshot's memory file, filled per [`RestoreMode`].
    File(RestoreMode),
    /// userfaultfd, served by the built-in handler from the memory file.
    UffdBuiltin,
    /// userfaultfd handed to an external handler listening on this socket.
    UffdExternal(PathBuf),
}

/// Options of one restore.
#[derive(Clone, Debug)]
pub struct RestorePlan {
    pub backend: Backend,
    /// The working-set file (`working_set` mode): beside the state file.
    pub working_set_path: Option<PathBuf>,
    /// The snapshot's id (newest layer): a working set of another id is stale.
    pub snapshot_id: String,
    /// Recording a working set ends after this long, or when the VM stops.
    pub record_for: Option<Duration>,
    /// The snapshot's VM had `huge_pages: "2M"`: RAM on hugetlbfs again
    /// (Uffd backends only).
    pub huge_pages: bool,
}

/// Where a snapshot's working-set file lives: beside its state file.
pub fn working_set_path(state_path: &Path) -> PathBuf {
    let mut s = state_path.as_os_str().to_owned();
    s.push(".ws");
    PathBuf::from(s)
}

#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error(transparent)]
    Memory(#[from] MemoryError),
    #[error(transparent)]
    Uffd(#[from] UffdError),
    #[error("cannot read the snapshot memory: {0}")]
    Read(#[source] std::io::Error),
    #[error(
        "Cannot restore hugetlbfs backed snapshot by mapping the memory file. Please use uffd."
    )]
    HugePagesFile,
}

/// What a restore did, for `GET /snapshot/restore` callers and the bench.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RestoreReport {
    pub backend: String,
    pub mode: String,
    /// Time spent filling RAM before the guest runs.
    pub prefill_us: u64,
    /// Pages copied in before the guest runs (eager, working set), or
    /// being loaded beside it ("loading" working set).
    pub prefilled_pages: u64,
    /// "loaded", "loading" (beside the guest), "recording", "ignored:
    /// <why>" for working-set restores.
    pub working_set: Option<String>,
}

/// The restore-time state that lives as long as the restored VM.
pub struct RestoreSession {
    server: Option<UffdServer>,
    /// Kept open for an external handler: if it dies the guest blocks
    /// rather than silently reading zero pages.
    external: Option<(Uffd, std::os::unix::net::UnixStream)>,
    recorder: Option<working_set::Recorder>,
    /// A working-set replay's background prefetch.
    prefetch: Option<prefetch::Prefetch>,
    /// A working set (version 3) loading into uffd-served RAM.
    loader: Option<working_set::BackgroundLoad>,
    /// Every data page of the snapshot is in RAM (faulted in for a
    /// snapshot or a clone); the handler serves only holes from then on.
    all_served: bool,
    report: RestoreReport,
    /// The memory files RAM still reads from, checked before a snapshot.
    backing: backing::Backing,
}

/// Guest RAM prepared by a restore path, and its session.
pub struct PreparedRam {
    pub ram: GuestRam,
    pub session: RestoreSession,
}

/// Where each RAM region lies: (memory-file offset, host address, length).
pub(crate) fn spans(ram: &GuestRam) -> Vec<(u64, *mut u8, usize)> {
    let mut out = Vec::new();
    let mut offset = 0u64;
    for region in ram.memory().iter() {
        let len = host_usize::from_u64(region.len());
        out.push((offset, region.as_ptr(), len));
        offset += len as u64;
    }
    out
}

/// Maps the layers privately (lazy): the base file copy-on-write.
fn map_lazy(layers: &MemoryLayers) -> Result<GuestRam, RestoreError> {
    Ok(GuestRam::from_layers(layers)?)
}

/// Empty RAM for a uffd restore: on reserved 2 MiB hugetlbfs pages for a
/// huge-page snapshot (failing cleanly if the host has too few free, as
/// at boot), else the ordinary memfd.
fn empty_ram(size: u64, huge_pages: bool) -> Result<GuestRam, RestoreError> {
    Ok(if huge_pages {
        GuestRam::new_hugetlb(size)?
    } else {
        GuestRam::new(size)?
    })
}

/// Builds guest RAM for a restore. Nothing guest-visible runs yet; the
/// session must outlive the VM.
pub fn prepare(layers: MemoryLayers, plan: &RestorePlan) -> Result<PreparedRam, RestoreError> {
    let t0 = Instant::now();
    if plan.huge_pages && matches!(plan.backend, Backend::File(_)) {
        return Err(RestoreError::HugePagesFile);
    }
    let backing = backing::Backing::record(layers.files()).map_err(RestoreError::Read)?;
    let mut report = RestoreReport::default();
    let prepared = match &plan.backend {
        Backend::File(RestoreMode::Lazy) => {
            report.backend = "File".into();
            report.mode = "lazy".into();
            PreparedRam {
                ram: map_lazy(&layers)?,
                session: RestoreSession::plain(),
            }
        }
        Backend::File(RestoreMode::Eager) => {
            report.backend = "File".into();
            report.mode = "eager".into();
            let ram = map_lazy(&layers)?;
            report.prefilled_pages = eager::populate(&ram, &layers).map_err(RestoreError::Read)?;
            PreparedRam {
                ram,
                session: RestoreSession::plain(),
            }
        }
        Backend::File(RestoreMode::WorkingSet) => {
            report.backend = "File".into();
            report.mode = "working_set".into();
            let ws_path = plan
                .working_set_path
                .clone()
                .ok_or_else(|| RestoreError::Read(std::io::Error::other("no working-set path")))?;
            let t = Instant::now();
            let replayed =
                working_set::open(&ws_path, &plan.snapshot_id, layers.size()).and_then(|ws| {
                    tracing::debug!("working set: opened in {:?}", t.elapsed());
                    replay_working_set(&layers, ws)
                });
            tracing::debug!("working set: replay ready in {:?}", t.elapsed());
            match replayed {
                Ok((Replay::Mapped(ram, prefetch), pages)) => {
                    report.prefilled_pages = pages;
                    report.working_set = Some("loaded".into());
                    let mut session = RestoreSession::plain();
                    session.prefetch = Some(prefetch);
                    PreparedRam { ram, session }
                }
                Ok((Replay::Background(ram, ws), pages)) => {
                    report.prefilled_pages = pages;
                    report.working_set = Some("loading".into());
                    let uffd = uffd::register_ram(&ram)?;
                    let loader_uffd = uffd.try_clone().map_err(RestoreError::Read)?;
                    let source = Arc::new(
                        PageSource::new(layers, uffd::regions_of(&ram))
                            .map_err(RestoreError::Read)?,
                    );
                    let mut session = RestoreSession::plain();
                    session.server = Some(UffdServer::start(uffd, source, false)?);
                    match ws.load_in_background(&ram, loader_uffd) {
                        Ok(load) => session.loader = Some(load),
                        Err(e) => tracing::warn!(
                            "cannot start the working-set load: {e}; pages fault in lazily"
                        ),
                    }
                    PreparedRam { ram, session }
                }
                Ok((Replay::Read(ram, prefilled), pages)) => {
                    report.prefilled_pages = pages;
                    report.working_set = Some("loaded".into());
                    let uffd = uffd::register_ram(&ram)?;
                    let source = Arc::new(
                        PageSource::new(layers, uffd::regions_of(&ram))
                            .map_err(RestoreError::Read)?,
                    );
                    let mut session = RestoreSession::plain();
                    session.server = Some(UffdServer::start_over(uffd, source, &prefilled)?);
                    PreparedRam { ram, session }
                }
                Err(why) => {
                    let why = match why {
                        working_set::WsLoad::Absent => "recording".to_string(),
                        working_set::WsLoad::Ignored(why) => {
                            tracing::warn!(
                                "ignoring the working set {}: {why}; recording a new one",
                                ws_path.display()
                            );
                            format!("ignored ({why}); recording")
                        }
                    };
                    report.working_set = Some(why);
                    record_working_set(layers, plan, ws_path)?
                }
            }
        }
        Backend::UffdBuiltin => {
            report.backend = "Uffd".into();
            report.mode = "builtin_handler".into();
            let ram = empty_ram(layers.size(), plan.huge_pages)?;
            let uffd = uffd::register_ram(&ram)?;
            let source = Arc::new(
                PageSource::new(layers, uffd::regions_of(&ram)).map_err(RestoreError::Read)?,
            );
            let server = UffdServer::start(uffd, source, false)?;
            PreparedRam {
                ram,
                session: RestoreSession {
                    server: Some(server),
                    external: None,
                    recorder: None,
                    prefetch: None,
                    loader: None,
                    all_served: false,
                    report: RestoreReport::default(),
                    backing: Default::default(),
                },
            }
        }
        Backend::UffdExternal(sock) => {
            return prepare_external(layers.size(), sock, plan.huge_pages)
        }
    };
    report.prefill_us = u64::try_from(t0.elapsed().as_micros()).unwrap_or(u64::MAX);
    let mut prepared = prepared;
    prepared.session.report = report;
    prepared.session.backing = backing;
    Ok(prepared)
}

/// How a working set was replayed.
enum Replay {
    /// The layers mapped lazily, the set prefetched beside the guest.
    Mapped(GuestRam, prefetch::Prefetch),
    /// A memfd holding the set's packed data; the rest through a handler.
    /// The set's runs come along: the handler must not copy over them.
    Read(GuestRam, Vec<(u64, u64)>),
    /// An empty memfd: the handler serves it while the set (version 3)
    /// loads beside the guest.
    Background(GuestRam, working_set::Pending),
}

/// The share of the set's pages that must be in the page cache for the
/// mapped replay (see [`working_set`]), of this many sampled pages.
const CACHED_SHARE: f64 = 0.9;
const CACHE_SAMPLES: u64 = 64;

/// Replays an opened working set: mapped if the page cache holds the
/// memory file's pages of it (or the file has no data), else read in
/// (version 2) or loaded beside the guest (version 3). Returns the RAM
/// and the set's pages.
fn replay_working_set(
    layers: &MemoryLayers,
    opened: working_set::Opened,
) -> Result<(Replay, u64), working_set::WsLoad> {
    use working_set::Opened;
    let io = |e: RestoreError| working_set::WsLoad::Ignored(e.to_string());
    let t = Instant::now();
    let ram = map_lazy(layers).map_err(io)?;
    let t_map = t.elapsed();
    let (sample, pages, version) = match &opened {
        Opened::Ready(ws) => (&ws.runs[..], ws.pages(), ws.version),
        Opened::Pending(p) => (p.sample(), p.pages(), 3),
    };
    let cached = prefetch::resident_share(ram.memory(), sample, CACHE_SAMPLES);
    tracing::debug!(
        "working set v{version}: {pages} pages, {:.0} % cached (mapped in {t_map:?}, \
         sampled at {:?})",
        cached * 100.0,
        t.elapsed()
    );
    let runs = match opened {
        Opened::Ready(ws) if !ws.has_data() || cached >= CACHED_SHARE => {
            prefetch::Runs::Now(ws.sorted_runs().to_vec())
        }
        Opened::Pending(p) if cached >= CACHED_SHARE => prefetch::Runs::Later(Box::new(|| {
            p.finish()
                .map(|ws| ws.sorted_runs().to_vec())
                .map_err(|e| match e {
                    working_set::WsLoad::Ignored(why) => why,
                    working_set::WsLoad::Absent => "it is gone".into(),
                })
        })),
        Opened::Pending(p) => {
            drop(ram);
            let ram = GuestRam::new(layers.size()).map_err(|e| io(e.into()))?;
            return Ok((Replay::Background(ram, p), pages));
        }
        Opened::Ready(ws) => {
            drop(ram);
            let ram = GuestRam::new(layers.size()).map_err(|e| io(e.into()))?;
            ws.read_into(&ram)?;
            return Ok((Replay::Read(ram, ws.runs), pages));
        }
    };
    let p = prefetch::Prefetch::start(ram.memory(), runs);
    Ok((Replay::Mapped(ram, p), pages))
}

/// A recording run: every page through the built-in handler, which logs
/// the first-touch order for the [`working_set::Recorder`].
fn record_working_set(
    layers: MemoryLayers,
    plan: &RestorePlan,
    ws_path: PathBuf,
) -> Result<PreparedRam, RestoreError> {
    let ram = GuestRam::new(layers.size())?;
    let uffd = uffd::register_ram(&ram)?;
    let source =
        Arc::new(PageSource::new(layers, uffd::regions_of(&ram)).map_err(RestoreError::Read)?);
    let server = UffdServer::start(uffd, source.clone(), true)?;
    let recorder = working_set::Recorder::new(
        ws_path,
        plan.snapshot_id.clone(),
        server.log().clone(),
        source,
        plan.record_for,
    );
    let mut session = RestoreSession::plain();
    session.server = Some(server);
    session.recorder = Some(recorder);
    Ok(PreparedRam { ram, session })
}

/// Builds guest RAM for an external-handler restore, where the VMM never
/// sees the memory file (Firecracker's `Uffd` backend).
pub fn prepare_external(
    size: u64,
    sock: &Path,
    huge_pages: bool,
) -> Result<PreparedRam, RestoreError> {
    let t0 = Instant::now();
    let ram = empty_ram(size, huge_pages)?;
    let uffd = uffd::register_ram(&ram)?;
    let conn = uffd::send_to_handler(sock, &uffd, &uffd::regions_of(&ram))?;
    Ok(PreparedRam {
        ram,
        session: RestoreSession {
            server: None,
            external: Some((uffd, conn)),
            recorder: None,
            prefetch: None,
            loader: None,
            all_served: false,
            report: RestoreReport {
                backend: "Uffd".into(),
                mode: "external_handler".into(),
                prefill_us: u64::try_from(t0.elapsed().as_micros()).unwrap_or(u64::MAX),
                ..Default::default()
            },
            backing: Default::default(),
        },
    })
}

impl RestoreSession {
    fn plain() -> Self {
        Self {
            server: None,
            external: None,
            recorder: None,
            prefetch: None,
            loader: None,
            all_served: false,
            report: RestoreReport::default(),
            backing: Default::default(),
        }
    }

    pub fn report(&self) -> &RestoreReport {
        &self.report
    }

    /// Starts the recording timer, if any (call when the guest starts).
    pub fn guest_started(&mut self) {
        if let Some(r) = &mut self.recorder {
            r.start_timer();
        }
        if let Some(p) = &mut self.prefetch {
            p.release();
        }
    }

    /// Before a snapshot or a clone of this VM (a clone's template is its
    /// memory as it is): RAM a uffd handler has not served yet holds
    /// nothing in the memfd, so a snapshot would lose it and a clone would
    /// read zeros there. The built-in handler's pages are faulted in first
    /// (once: the snapshot's data pages then stay in the memfd); a VM served
    /// by an external handler cannot be snapshotted or cloned. A memory file
    /// changed since the restore (truncated, rewritten) fails the snapshot
    /// ([`backing::Backing::check`]).
    pub fn before_snapshot(&mut self, ram: &GuestRam) -> Result<(), String> {
        self.backing.check()?;
        if self.external.is_some() {
            return Err(
                "this microVM's memory is served by an external userfaultfd handler; \
                        the VMM cannot read the pages it has not served, so it cannot snapshot \
                        or clone it"
                    .into(),
            );
        }
        // A snapshot ends a working-set recording: the faults below are the
        // VMM's, not the guest's working set.
        if let Some(r) = self.recorder.take() {
            r.finish();
        }
        if let (Some(server), false) = (&self.server, self.all_served) {
            let n = server.fault_in_all(ram).map_err(|e| e.to_string())?;
            tracing::debug!("faulted in {n} pages before the snapshot");
            self.all_served = true;
        }
        Ok(())
    }

    /// Whether an external userfaultfd handler serves this VM's memory.
    pub fn served_externally(&self) -> bool {
        self.external.is_some()
    }

    /// Drops a session whose VM could not be built: nothing is recorded.
    pub fn cancel(mut self) {
        if let Some(r) = self.recorder.take() {
            r.cancel();
        }
    }

    /// Once the VM's vCPUs stopped: ends recording (writing the working
    /// set) and stops the handler.
    pub fn finish(&mut self) {
        if let Some(mut p) = self.prefetch.take() {
            p.stop();
        }
        if let Some(mut l) = self.loader.take() {
            l.stop();
        }
        if let Some(r) = self.recorder.take() {
            if let Some(server) = &self.server {
                server.log().recording.store(false, Ordering::Relaxed);
            }
            r.finish();
        }
        if let Some(mut s) = self.server.take() {
            tracing::info!(
                "page-fault handler served {} faults",
                s.log().faults.load(Ordering::Relaxed)
            );
            if let Some(e) = s.stop() {
                tracing::warn!("page-fault handler: {e}");
            }
        }
    }
}

impl Drop for RestoreSession {
    fn drop(&mut self) {
        self.finish();
    }
}
