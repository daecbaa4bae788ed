//! Sandboxes for agents: E2B's sandbox API on spore's clones and snapshots
//! (`spore serve --sandbox-listen ADDR --sandbox-template FILE`).
//!
//! A sandbox is a Linux microVM running spore-envd (E2B's in-guest daemon on
//! the wire). It is created as a clone of its template's zygote
//! (`template`), paused as a snapshot in its directory (the VM ends, its
//! memory goes back to the host), resumed by restoring it, and forked by
//! cloning it while it runs. The daemon reaches envd, and any port the
//! guest listens on, over the VMM's vsock socket (`envd`, `proxy`).
//!
//! Files: `<state>/sbx/<id>/` holds a sandbox's record, its log (`events`), its disk overlay,
//! its paused snapshot and (while it runs) its VMM's sockets; a template's
//! zygote runs in `<state>/run/sbx-<template>/`, a resumed sandbox's VMM in
//! `<state>/run/sbx-<id>-r<n>/`; template bases are in
//! `<state>/sbx-bases/<template>/`. Every VMM is jailed as its template's
//! user unless the daemon runs with `--no-jail` (`jail`).

pub mod api;
pub mod builds;
pub mod envd;
pub mod events;
mod jail;
mod lifecycle;
mod memory;
mod metrics;
pub mod net;
pub mod proxy;
mod record;
pub mod reply;
mod request;
pub mod template;
mod template_api;
mod zygotes;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use events::Level;
pub use record::{Record, State};
pub use template::TemplateSpec;

use crate::accounts::{Accounts, DEFAULT_ACCOUNT};
use crate::instances::Instances;
use crate::mutex::lock;
use crate::vmm::VmmProcess;

/// `spore serve`'s sandbox options.
#[derive(Debug)]
pub struct SandboxConfig {
    pub listen: std::net::SocketAddr,
    pub templates: Vec<TemplateSpec>,
    /// Host-name mode for the proxy: `<port>-<id>.<domain>`.
    pub domain: Option<String>,
    /// How long a zygote may go without making a sandbox before it ends;
    /// `None` keeps them.
    pub zygote_idle: Option<Duration>,
}

/// `--sandbox-zygote-idle`'s default with `--auth`.
pub const DEFAULT_ZYGOTE_IDLE: Duration = Duration::from_secs(900);

/// A refusal of the sandbox API, with E2B's status codes.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Internal(String),
    /// Past a limit of the account's (E2B answers 429 past a team's).
    #[error("{0}")]
    TooMany(String),
}

impl SandboxError {
    pub fn status(&self) -> u16 {
        match self {
            SandboxError::BadRequest(_) => 400,
            SandboxError::NotFound(_) => 404,
            SandboxError::Conflict(_) => 409,
            SandboxError::Internal(_) => 500,
            SandboxError::TooMany(_) => 429,
        }
    }

    fn internal(e: anyhow::Error) -> SandboxError {
        SandboxError::Internal(format!("{e:#}"))
    }
}

fn not_found(id: &str) -> SandboxError {
    SandboxError::NotFound(format!("sandbox \"{id}\" not found"))
}

/// A template and its zygotes.
pub struct Template {
    pub spec: TemplateSpec,
    /// What its zygotes' directories, bases and networks are named after:
    /// its name, or `name-b<build id's first 12>` for a build of an account's template other
    /// than the one its `default` tag names ([`builds::tags`]), which may
    /// run beside it.
    key: String,
    /// The build of an account's template it is; `None` for the daemon's.
    build_id: Option<String>,
    /// Its zygote per account, once booted (again after it failed or
    /// died): sandboxes of different accounts never share a zygote, a
    /// template base or a uid.
    zygotes: Mutex<HashMap<String, ZygoteSlot>>,
}

/// One account's zygote of a template; creates of it take turns.
type ZygoteSlot = Arc<tokio::sync::Mutex<Option<template::Zygote>>>;

impl Template {
    fn zygote_of(&self, account: &str) -> ZygoteSlot {
        lock(&self.zygotes)
            .entry(account.to_string())
            .or_default()
            .clone()
    }

    fn zygote_slots(&self) -> Vec<(String, ZygoteSlot)> {
        lock(&self.zygotes)
            .iter()
            .map(|(a, z)| (a.clone(), z.clone()))
            .collect()
    }
}

/// One sandbox: its record, and its VMM while it runs.
pub struct Entry {
    pub rec: Record,
    pub vmm: Option<VmmProcess>,
    /// Killed: whoever waited for its lock finds it gone.
    pub gone: bool,
    /// Its metrics while it ran (since the daemon started).
    metrics: metrics::History,
}

pub struct Sandboxes {
    spore_bin: PathBuf,
    state_dir: PathBuf,
    /// `<state>/sbx`.
    dir: PathBuf,
    /// `<state>/sbx-bases`: the templates' bases (`template::Zygote::base`),
    /// a directory per template.
    bases: PathBuf,
    /// How VMMs are jailed; `None` with `--no-jail`.
    jail: Option<jail::SandboxJail>,
    /// The daemon's templates (`--sandbox-template`), every account's.
    templates: HashMap<String, Arc<Template>>,
    /// Templates accounts built (`builds`), by account and name: each
    /// account's own; the build its `default` tag names.
    built: Mutex<HashMap<(String, String), Arc<Template>>>,
    /// Other builds of accounts' templates a sandbox was asked of (by a
    /// tag or a build id), by account and build id.
    pinned: Mutex<HashMap<(String, String), Arc<Template>>>,
    /// Template builds (E2B's template-build API).
    builds: builds::Builds,
    table: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Entry>>>>,
    /// Forks' shared VMM directories (`Record::vm_dir`) and how many
    /// sandboxes use each: removed with the last.
    groups: Mutex<HashMap<String, usize>>,
    pub domain: Option<String>,
    /// The namespaces networked templates' VMMs run in.
    network: net::SandboxNetwork,
    /// See [`SandboxConfig::zygote_idle`].
    zygote_idle: Option<Duration>,
    /// The function instances: an account's memory limit covers both
    /// (`memory`).
    instances: Arc<Instances>,
    /// Accounts' limits.
    accounts: Arc<Accounts>,
}

/// A sandbox's default timeout (E2B's: 15 s when create names none).
pub const DEFAULT_TIMEOUT_S: u64 = 15;
/// The longest timeout a sandbox may be given (E2B's Pro tier: 24 h).
pub const MAX_TIMEOUT_S: u64 = 24 * 3600;
/// How often timeouts are checked.
const REAP_EVERY: Duration = Duration::from_secs(1);

impl Sandboxes {
    /// The sandboxes of `state_dir`: paused ones a previous daemon left are
    /// found again; whatever else is there (sandboxes that were running)
    /// is removed.
    pub fn open(
        spore_bin: &Path,
        state_dir: &Path,
        config: SandboxConfig,
        (instances, accounts): (Arc<Instances>, Arc<Accounts>),
        jail: Option<crate::jail::Jail>,
    ) -> anyhow::Result<Arc<Sandboxes>> {
        let dir = state_dir.join("sbx");
        crate::fs::create_private_dir(&dir)?;
        let mut table = HashMap::new();
        let mut groups: HashMap<String, usize> = HashMap::new();
        let mut others = Vec::new();
        for e in std::fs::read_dir(&dir)?.flatten() {
            let path = e.path();
            match Record::load(&path) {
                Ok(rec) if rec.state == State::Paused && paused_files_exist(&path, &rec) => {
                    if let Some(g) = &rec.vm_dir {
                        *groups.entry(g.clone()).or_default() += 1;
                    }
                    table.insert(
                        rec.id.clone(),
                        Arc::new(tokio::sync::Mutex::new(Entry {
                            rec,
                            vmm: None,
                            gone: false,
                            metrics: metrics::History::default(),
                        })),
                    );
                }
                _ => others.push(path),
            }
        }
        // Sandboxes that were running, and fork directories no paused
        // sandbox needs.
        let kept = table.len();
        let mut removed = 0;
        for path in others {
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
            if name.is_some_and(|n| groups.contains_key(&n)) {
                continue;
            }
            removed += 1;
            let _ = std::fs::remove_dir_all(&path);
        }
        if kept + removed > 0 {
            tracing::info!(
                "sandboxes: {kept} paused sandboxes found again, {removed} left by a daemon that ended removed"
            );
        }
        let bases = state_dir.join("sbx-bases");
        let needed: HashSet<PathBuf> = table
            .values()
            .filter_map(|e| e.try_lock().ok().and_then(|e| e.rec.base.clone()))
            .collect();
        zygotes::remove_bases_but(&bases, &needed);
        let templates = config
            .templates
            .into_iter()
            .map(|spec| {
                (
                    spec.name.clone(),
                    Arc::new(Template {
                        key: spec.name.clone(),
                        build_id: None,
                        spec,
                        zygotes: Mutex::default(),
                    }),
                )
            })
            .collect();
        let (builds, built) = builds::Builds::load(&state_dir.join("sbx-templates"))?;
        let built = built
            .into_iter()
            .map(|b| {
                (
                    (b.account, b.spec.name.clone()),
                    Arc::new(Template {
                        key: b.spec.name.clone(),
                        build_id: Some(b.build_id),
                        spec: b.spec,
                        zygotes: Mutex::default(),
                    }),
                )
            })
            .collect();
        Ok(Arc::new(Sandboxes {
            spore_bin: spore_bin.to_path_buf(),
            state_dir: state_dir.to_path_buf(),
            dir,
            bases,
            templates,
            built: Mutex::new(built),
            pinned: Mutex::default(),
            builds,
            table: Mutex::new(table),
            groups: Mutex::new(groups),
            domain: config.domain,
            zygote_idle: config.zygote_idle,
            network: net::SandboxNetwork::new(instances.network.clone()),
            jail: jail.map(|j| jail::SandboxJail::new(j, spore_bin, &state_dir.join("sbx"))),
            instances,
            accounts,
        }))
    }

    /// Ends sandboxes whose timeout passed (pausing those with
    /// `autoPause`) in the background. A `local` daemon's (no `--auth`: one
    /// account) zygotes are booted now; with `--auth` each account's boots
    /// on its first create of the template.
    pub fn spawn_background(self: &Arc<Self>, local: bool) -> tokio::task::JoinHandle<()> {
        let accounts: &[&str] = if local { &[DEFAULT_ACCOUNT] } else { &[] };
        for t in self.templates.values() {
            for account in accounts {
                let (me, t, account) = (self.clone(), t.clone(), account.to_string());
                tokio::spawn(async move {
                    let slot = t.zygote_of(&account);
                    let mut slot = slot.lock().await;
                    if let Err(e) = me.ensure_zygote(&t, &account, &mut slot).await {
                        tracing::error!(template = %t.spec.name, "sandbox template: {e}");
                    }
                });
            }
        }
        let me = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(metrics::SAMPLE_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                me.sample_metrics().await;
            }
        });
        let me = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(REAP_EVERY);
            loop {
                tick.tick().await;
                me.end_timed_out().await;
                me.end_idle_zygotes().await;
            }
        })
    }

    /// The user `account`'s VMMs of template `template` run as; `None`
    /// unjailed.
    fn user_of(
        &self,
        account: &str,
        template: &str,
    ) -> Result<Option<crate::jail::User>, SandboxError> {
        self.jail
            .as_ref()
            .map(|j| j.user(account, template))
            .transpose()
            .map_err(|e| SandboxError::Internal(format!("template {template}'s user: {e:#}")))
    }

    /// `account`'s template `asked` (`name`, `name:tag`, `name:<build id>`,
    /// with or without a `team/` before it): the build of one it built that
    /// the tag names (`default` without one), else the daemon's template of
    /// that name (which has no tags but `default`).
    fn template_for(&self, account: &str, asked: &str) -> Result<Arc<Template>, SandboxError> {
        let not_found = || SandboxError::NotFound(format!("template \"{asked}\" not found"));
        let (name, tag) = builds::tags::split_ref(asked);
        if let Some(build) =
            self.builds
                .build_of(account, name, tag.unwrap_or(builds::tags::DEFAULT_TAG))
        {
            return self.template_of_build(account, name, &build);
        }
        match tag {
            None | Some(builds::tags::DEFAULT_TAG) => {
                self.templates.get(name).cloned().ok_or_else(not_found)
            }
            _ => Err(not_found()),
        }
    }

    /// The template a sandbox of `rec` runs (its resume and forks need the
    /// build it was made of, whatever its tags name now).
    fn template_of_record(
        &self,
        account: &str,
        rec: &Record,
    ) -> Result<Arc<Template>, SandboxError> {
        match &rec.build {
            Some(build) => self.template_of_build(account, &rec.template, build),
            None => self.template_for(account, &rec.template),
        }
    }

    /// Build `build` of `account`'s template `name`: the one served as its
    /// default if it is that, else one made for it (kept for the next).
    fn template_of_build(
        &self,
        account: &str,
        name: &str,
        build: &str,
    ) -> Result<Arc<Template>, SandboxError> {
        let served = lock(&self.built)
            .get(&(account.to_string(), name.to_string()))
            .filter(|t| t.build_id.as_deref() == Some(build))
            .cloned();
        if let Some(t) = served {
            return Ok(t);
        }
        let key = (account.to_string(), build.to_string());
        if let Some(t) = lock(&self.pinned).get(&key) {
            return Ok(t.clone());
        }
        let built = self
            .builds
            .built_record(account, name, build)
            .ok_or_else(|| {
                SandboxError::NotFound(format!(
                    "template \"{name}\": build {build} is gone (its image was removed)"
                ))
            })?;
        let t = Arc::new(Template {
            // Short: the zygote's API socket path must fit a Unix socket
            // address; 48 random bits of the build id tell builds apart.
            key: format!("{name}-b{}", &build[..12.min(build.len())]),
            build_id: Some(built.build_id),
            spec: built.spec,
            zygotes: Mutex::default(),
        });
        Ok(lock(&self.pinned).entry(key).or_insert(t).clone())
    }

    /// Every template: the daemon's and those accounts built.
    fn all_templates(&self) -> Vec<Arc<Template>> {
        let mut all: Vec<Arc<Template>> = self.templates.values().cloned().collect();
        all.extend(lock(&self.built).values().cloned());
        all.extend(lock(&self.pinned).values().cloned());
        all
    }

    /// The sandbox `id` of `account`, locked (another account's is
    /// "not found", as a missing one).
    async fn entry(
        &self,
        account: &str,
        id: &str,
    ) -> Result<tokio::sync::OwnedMutexGuard<Entry>, SandboxError> {
        let entry = lock(&self.table)
            .get(id)
            .cloned()
            .ok_or_else(|| not_found(id))?;
        let guard = entry.lock_owned().await;
        if guard.gone || guard.rec.account != account {
            return Err(not_found(id));
        }
        Ok(guard)
    }

    /// Records of `account`'s sandboxes.
    pub async fn list(&self, account: &str) -> Vec<Record> {
        let entries: Vec<_> = lock(&self.table).values().cloned().collect();
        let mut out = Vec::new();
        for e in entries {
            let g = e.lock().await;
            if !g.gone && g.rec.account == account {
                out.push(g.rec.clone());
            }
        }
        out.sort_by_key(|r| std::cmp::Reverse(r.started_at_ms));
        out
    }

    pub async fn get(&self, account: &str, id: &str) -> Result<Record, SandboxError> {
        Ok(self.entry(account, id).await?.rec.clone())
    }

    /// `account`'s sandbox `id`'s metrics (E2B's `SandboxMetric`s, oldest
    /// first) taken in `start_s..=end_s` (Unix seconds; open ends when
    /// `None`): those sampled every [`metrics::SAMPLE_EVERY`] while it ran,
    /// and, if it runs, one taken now.
    pub async fn metrics(
        &self,
        account: &str,
        id: &str,
        start_s: Option<u64>,
        end_s: Option<u64>,
    ) -> Result<Vec<serde_json::Value>, SandboxError> {
        let running = {
            let entry = self.entry(account, id).await?;
            entry
                .vmm
                .as_ref()
                .map(|vmm| (vmm.vsock_uds.clone(), entry.rec.access_token.clone()))
        };
        if let Some((uds, token)) = running {
            let now = metrics::sample(&uds, &token)
                .await
                .map_err(|e| SandboxError::Internal(format!("sandbox {id}: {e:#}")))?;
            self.entry(account, id).await?.metrics.push(now);
        }
        Ok(self
            .entry(account, id)
            .await?
            .metrics
            .between(start_s, end_s))
    }

    /// Samples every running sandbox's metrics into its history, a few at
    /// a time (one that is busy or does not answer is skipped this round).
    async fn sample_metrics(&self) {
        let entries: Vec<_> = lock(&self.table).values().cloned().collect();
        let mut running = Vec::new();
        for e in entries {
            // One being paused, resumed or forked is skipped this round.
            let Ok(g) = e.try_lock() else { continue };
            if let (Some(vmm), false) = (&g.vmm, g.gone) {
                running.push((e.clone(), vmm.vsock_uds.clone(), g.rec.access_token.clone()));
            }
        }
        for batch in running.chunks(metrics::SAMPLE_AT_ONCE) {
            let mut taken = tokio::task::JoinSet::new();
            for (e, uds, token) in batch.iter().cloned() {
                taken.spawn(async move { (e, metrics::sample(&uds, &token).await) });
            }
            while let Some(joined) = taken.join_next().await {
                if let Ok((e, Ok(sample))) = joined {
                    let mut g = e.lock().await;
                    if g.vmm.is_some() && !g.gone {
                        g.metrics.push(sample);
                    }
                }
            }
        }
    }

    /// The vsock socket of a running sandbox, for the proxy; `Err` names
    /// why there is none. Any account's: the proxy is reached with the
    /// sandbox's id, and envd checks its own access token.
    /// The vsock socket of a sandbox the proxy sends a request to; a paused
    /// one with `autoResume` is resumed first (with the timeout it was
    /// created with), as E2B wakes a sandbox on inbound traffic.
    pub async fn vsock_for_request(&self, id: &str) -> Result<PathBuf, SandboxError> {
        match self.vsock_of(id).await {
            Err(SandboxError::Conflict(paused)) => {
                let wake = {
                    let entry = lock(&self.table).get(id).cloned();
                    match entry {
                        Some(e) => {
                            let g = e.lock().await;
                            g.rec
                                .auto_resume
                                .then(|| (g.rec.account.clone(), g.rec.timeout_s))
                        }
                        None => None,
                    }
                };
                let Some((account, timeout_s)) = wake else {
                    return Err(SandboxError::Conflict(paused));
                };
                let timeout_s = if timeout_s == 0 { 300 } else { timeout_s };
                if self.resume(&account, id, timeout_s, None).await? {
                    tracing::info!(sandbox = %id, "sandbox resumed by a request (autoResume)");
                    events::record(
                        &self.dir.join(id),
                        Level::Info,
                        "resumed by a request to it (autoResume)",
                        &[],
                    );
                }
                self.vsock_of(id).await
            }
            other => other,
        }
    }

    /// Its log ([`events`]): the events `query` selects. 404 as for `get`.
    pub async fn log(
        &self,
        account: &str,
        id: &str,
        query: &events::Query,
    ) -> Result<Vec<events::Event>, SandboxError> {
        self.get(account, id).await?;
        Ok(query.select(events::read(&self.dir.join(id))))
    }

    /// Adds an event to a sandbox's log, if it is still there.
    pub fn note(&self, id: &str, level: Level, message: &str) {
        if lock(&self.table).contains_key(id) {
            events::record(&self.dir.join(id), level, message, &[]);
        }
    }

    /// The last `n` lines of a running sandbox's VMM log (its console and
    /// messages), for a warning about it; `None` when it has no VMM.
    pub async fn vmm_log_lines(&self, id: &str, n: usize) -> Option<String> {
        let entry = lock(&self.table).get(id).cloned()?;
        let g = entry.lock().await;
        g.vmm.as_ref().map(|vmm| vmm.log_lines(n))
    }

    pub async fn vsock_of(&self, id: &str) -> Result<PathBuf, SandboxError> {
        let entry = lock(&self.table)
            .get(id)
            .cloned()
            .ok_or_else(|| not_found(id))?;
        let g = entry.lock().await;
        match (&g.vmm, g.gone) {
            (Some(vmm), false) => Ok(vmm.vsock_uds.clone()),
            (None, false) => Err(SandboxError::Conflict(format!(
                "sandbox \"{id}\" is paused: resume it (Sandbox.connect) first"
            ))),
            _ => Err(not_found(id)),
        }
    }

    fn insert(&self, rec: Record, vmm: VmmProcess) {
        if let Some(g) = &rec.vm_dir {
            *lock(&self.groups).entry(g.clone()).or_default() += 1;
        }
        let id = rec.id.clone();
        let bytes = u64::from(rec.memory_mib) << 20;
        self.instances
            .sandbox_memory
            .running(&id, &rec.account, bytes);
        lock(&self.table).insert(
            id,
            Arc::new(tokio::sync::Mutex::new(Entry {
                rec,
                vmm: Some(vmm),
                gone: false,
                metrics: metrics::History::default(),
            })),
        );
    }

    /// One sandbox less uses fork directory `group`; the last removes it.
    fn release_group(&self, group: &str) {
        let mut groups = lock(&self.groups);
        let last = match groups.get_mut(group) {
            Some(n) if *n > 1 => {
                *n -= 1;
                false
            }
            _ => true,
        };
        if last {
            groups.remove(group);
            let _ = std::fs::remove_dir_all(self.dir.join(group));
        }
    }

    /// Ends every running sandbox and the zygotes (the daemon stops;
    /// paused sandboxes stay on disk).
    pub async fn shutdown(&self) {
        let entries: Vec<_> = lock(&self.table).drain().map(|(_, e)| e).collect();
        self.instances.sandbox_memory.clear();
        for e in entries {
            let mut g = e.lock().await;
            if let Some(mut vmm) = g.vmm.take() {
                vmm.kill().await;
            }
        }
        for t in self.all_templates() {
            for (_, slot) in t.zygote_slots() {
                if let Some(mut z) = slot.lock().await.take() {
                    z.vmm.kill().await;
                }
            }
        }
    }

    /// Ends sandboxes whose timeout passed, and those whose VMM ended on
    /// its own (the guest powered off or rebooted, the VMM crashed or was
    /// killed): gone, as in E2B, with the end of its VMM's log logged.
    async fn end_timed_out(&self) {
        let now = crate::clock::unix_ms();
        let entries: Vec<_> = lock(&self.table).values().cloned().collect();
        for e in entries {
            let (id, account, auto_pause) = {
                let mut g = e.lock().await;
                if g.gone || g.rec.state != State::Running {
                    continue;
                }
                // Its VMM ended on its own: the sandbox goes (`kill` logs why).
                if g.vmm.as_mut().is_some_and(|vmm| !vmm.is_alive()) {
                    let (id, account) = (g.rec.id.clone(), g.rec.account.clone());
                    drop(g);
                    if let Err(e) = self.kill(&account, &id).await {
                        tracing::warn!(sandbox = %id, "removing it: {e}");
                    }
                    continue;
                }
                if g.rec.end_at_ms > now {
                    continue;
                }
                (g.rec.id.clone(), g.rec.account.clone(), g.rec.auto_pause)
            };
            let ended = if auto_pause {
                self.pause(&account, &id).await
            } else {
                self.kill(&account, &id).await
            };
            match ended {
                Ok(()) => {
                    tracing::info!(
                        sandbox = %id,
                        "timeout: {}",
                        if auto_pause { "paused" } else { "killed" }
                    );
                    if auto_pause {
                        self.note(&id, Level::Info, "timeout: paused (autoPause)");
                    }
                }
                Err(e) => tracing::warn!(sandbox = %id, "timeout: {e}"),
            }
        }
    }
}

/// The owner part of the namespaces of forks and resumed sandboxes.
const SANDBOX_NET_OWNER: &str = "sbx";

fn paused_files_exist(dir: &Path, rec: &Record) -> bool {
    let (state, mem) = Record::snapshot_files(dir, rec.pause_generation);
    state.is_file() && mem.is_file() && rec.chain_files(dir).iter().all(|f| f.is_file())
}

/// A new sandbox id: 20 lower-case letters and digits (E2B's form).
fn new_id() -> Result<String, SandboxError> {
    random_chars(20, b"abcdefghijklmnopqrstuvwxyz0123456789")
}

/// A new envd access token.
fn new_token() -> Result<String, SandboxError> {
    random_chars(40, b"0123456789abcdef")
}

/// A new build id: a random (version 4) UUID, as E2B's build ids are (the
/// SDK reads them as UUIDs).
fn new_uuid() -> Result<String, SandboxError> {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b)
        .map_err(|e| SandboxError::Internal(format!("the OS random number generator: {e}")))?;
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    Ok(format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    ))
}

/// `n` random characters of `alphabet`; without the OS generator, an error
/// rather than a guessable id or token.
fn random_chars(n: usize, alphabet: &[u8]) -> Result<String, SandboxError> {
    let mut raw = vec![0u8; n];
    getrandom::fill(&mut raw)
        .map_err(|e| SandboxError::Internal(format!("the OS random number generator: {e}")))?;
    Ok(raw
        .iter()
        .map(|b| alphabet[usize::from(*b) % alphabet.len()] as char)
        .collect())
}
