//! The daemon's function instances ([`Instances`]): for each function
//! version, idle warm instances and a zygote (a booted instance paused after
//! init and made a clone template by its VMM). Each invocation takes the
//! fastest start path there is — an idle instance, a clone of the zygote, a
//! restore of the version's snapshot, or a cold boot that also makes the
//! snapshot and the zygote — and gives its instance back, or ends it if it
//! failed or timed out.
//!
//! Module map: [`start`] (the start paths), [`memory`] (keep-alive, the
//! memory budget, zygote demotion, gauges), [`provisioned`] (provisioned
//! concurrency: fresh clones kept ready, each used once and replaced).
//!
//! Isolation rules: an instance serves only the function and version it was
//! started for; one that timed out, crashed or broke the protocol is killed,
//! never reused; a change of `$LATEST` retires every instance and the
//! zygote of its old revision. A published version has a pool of its own,
//! retired only when the version is deleted.

mod account_memory;
mod clone_leaves;
mod cluster_slots;
mod cpu_cap;
mod held;
mod layered;
mod memory;
mod provisioned;
mod start;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cpu_cap::{invoke_capped, Cap};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::catalog::{Catalog, Function, ProcessRecord};
use crate::clock::unix_ms;
use crate::instance_conn::{InstanceConn, InvokeError, InvokeResult};
use crate::metrics::{Metrics, StartPath};
// Also the lock of the submodules (`super::lock`).
use crate::mutex::lock;
use crate::network::{InstanceNet, NetPool, Network};
use crate::snapshots::{LinuxSnapshots, RestoreMode, SnapshotStore};
use crate::vmm::VmmProcess;
use crate::vmm_exit::Ending;

/// Lines of a failed instance's VMM log (its guest console) logged.
const CRASH_LOG_LINES: usize = 20;

/// Clone processes each zygote's VMM keeps started ahead.
const STANDBY_CLONES: u32 = 2;

/// How instances are started, kept and bounded (`spore serve`'s flags).
pub struct InstancesConfig {
    pub spore_bin: PathBuf,
    pub state_dir: PathBuf,
    /// Invocations running at once on this host.
    pub max_concurrency: usize,
    /// How long a request waits for a concurrency slot before a 429.
    pub queue_wait: Duration,
    /// An idle instance is ended after this long unused.
    pub keep_alive: Duration,
    /// A zygote whose function was not invoked for this long, with no
    /// instance left, is ended (its function scales to zero; the next
    /// start restores its snapshot). Zero: zygotes are kept.
    pub zygote_keep_alive: Duration,
    /// Host memory (PSS) the daemon's VMM processes may hold, all of them
    /// measured (instances, zygotes, clone factories, clones started
    /// ahead); over it the least recently used idle instances are ended,
    /// then zygotes demoted. 0 = no budget.
    pub memory_budget: u64,
    /// Never make zygotes: every start that is not warm restores the
    /// version's snapshot or boots (for functions that must not share a
    /// template, and to compare start paths).
    pub no_clones: bool,
    /// Never snapshot: every start that is not warm or a clone boots.
    pub no_snapshots: bool,
    /// How instances are restored from snapshots.
    pub restore_mode: RestoreMode,
    /// Linux functions' snapshots: a diff on the runtime's base, or (the
    /// benchmark's baseline) merged with it into one full snapshot.
    pub linux_snapshots: LinuxSnapshots,
    /// How long the first working-set restore of a snapshot records the
    /// pages its guest touches (ms; it also ends when the instance stops).
    pub working_set_record_ms: u64,
    /// The /30s of networked instances' veth pairs (`--net-pool`).
    pub net_pool: NetPool,
    /// Networks made ahead for the next networked starts (`--net-spares`).
    pub net_spares: usize,
    /// The guest kernel of Linux functions (`--linux-kernel`, else the
    /// newest cached one); `None`: Linux functions cannot start.
    pub linux_kernel: Option<PathBuf>,
    /// Where the runtime images of Linux functions are cached.
    pub image_cache: PathBuf,
    /// How long a guest may take from `InstanceStart` (or a clone's start,
    /// or a restore) to `Ready`, a Linux function's init included.
    pub ready_limit: Duration,
    /// Each instance VMM in a cgroup of its own (`None`: with
    /// `--no-cgroups`, or a host without a usable memory controller).
    pub cgroups: Option<crate::cgroups::Cgroups>,
    /// The uid range instances' VMMs run in (`crate::jail`); `None` with
    /// `--no-jail`: they run as the daemon's user.
    pub jail: Option<crate::jail::UidRange>,
}

/// Why an invocation got no instance.
#[derive(Debug, thiserror::Error)]
pub enum AcquireError {
    #[error("Rate Exceeded.")]
    Throttled { reserved: bool },
    /// The account's live instances fill its memory limit (bytes).
    #[error("the account's instances hold all of its {limit} bytes of memory")]
    AccountMemory { limit: u64 },
    #[error("the function's instance could not start: {0}")]
    Start(String),
    /// The function's init failed in a fresh instance (Lambda answers the
    /// invocation with the init error).
    #[error("the function's init failed")]
    Init(InvokeResult),
}

/// How an invocation ended. `log` is what the function logged before an
/// invocation that got no result ended (what a spore-uk guest streamed;
/// a Linux function's output is on the console instead).
pub enum Outcome {
    Done(InvokeResult),
    /// The instance ended or broke the protocol before answering: the
    /// guest's doing (the function's fault), with what its console said
    /// last.
    Crashed {
        why: String,
        console: String,
        log: Vec<u8>,
    },
    /// The instance's VMM was killed or failed before answering: a host
    /// fault, not the function's; with what the guest's console said last.
    HostFault {
        why: String,
        console: String,
        log: Vec<u8>,
    },
    TimedOut {
        log: Vec<u8>,
    },
    /// The kernel ended the instance for going past its cgroup's memory
    /// (the function's doing: Lambda's `Runtime.OutOfMemory`).
    OutOfMemory {
        limit_bytes: u64,
        console: String,
        log: Vec<u8>,
    },
}

pub struct Invocation {
    pub outcome: Outcome,
    pub path: StartPath,
}

struct Instance {
    vmm: VmmProcess,
    conn: InstanceConn,
    last_used: Instant,
}

struct Zygote {
    vmm: VmmProcess,
    clone_dir: PathBuf,
    /// The cgroups its standby processes were moved into ahead.
    standby_leaves: clone_leaves::StandbyLeaves,
}

impl Zygote {
    /// Its run directory's name, which names its clones' networks and
    /// cgroups.
    fn name(&self) -> String {
        self.vmm
            .run_dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }
}

/// The instances of one function version.
struct Pool {
    function: Function,
    idle: Mutex<Vec<Instance>>,
    /// Provisioned instances: clones started ahead and never invoked.
    fresh: Mutex<Vec<Instance>>,
    /// A refill of `fresh` is under way.
    refilling: std::sync::atomic::AtomicBool,
    /// `None` until the first cold start or restore; serialises clone
    /// requests and the starts that make a zygote.
    zygote: tokio::sync::Mutex<Option<Zygote>>,
    busy: AtomicU64,
    /// Non-zero while the zygote is demoted under the memory budget: what
    /// it held (PSS), which must fit again before a zygote is made; until
    /// then starts restore the snapshot.
    demoted_bytes: AtomicU64,
    /// When an invocation last started (ms since the epoch), for the
    /// memory budget's least-recently-used order of zygotes.
    last_used_ms: AtomicU64,
}

type PoolKey = (String, Option<u32>);

fn pool_key(f: &Function) -> PoolKey {
    (f.name.clone(), f.published)
}

/// Every function's instances: a [`Pool`] per function version, the
/// admission semaphores, the snapshot and base stores, the network.
pub struct Instances {
    cfg: InstancesConfig,
    catalog: Arc<Catalog>,
    snapshots: SnapshotStore,
    /// Linux runtimes' base snapshots (shared by all their functions).
    bases: Arc<crate::bases::BaseStore>,
    pub metrics: Metrics,
    /// By function and published version (`None`: `$LATEST`). A published
    /// version has a pool of its own, even while it holds `$LATEST`'s
    /// revision: it outlives `$LATEST`'s changes.
    pools: Mutex<HashMap<PoolKey, Arc<Pool>>>,
    /// Per function: its reserved concurrency, if set.
    reserved: Mutex<HashMap<String, cluster_slots::Reserved>>,
    /// Per function version (a published one; `$LATEST` only as an older
    /// daemon's catalogue left it): its provisioned concurrency, if set.
    provisioned: Mutex<HashMap<PoolKey, u32>>,
    host_slots: Arc<Semaphore>,
    /// The last measurement of what every VMM process holds (`memory`).
    census: Mutex<memory::Census>,
    /// A process under the daemon that is not an instance's (its
    /// guardian), left out of the census.
    census_skip: std::sync::atomic::AtomicI32,
    /// Per account with a memory limit: serialises its starts, so that
    /// the room each takes is counted before the next looks.
    account_gates: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// What accounts' sandboxes hold: counted with their instances against
    /// their memory limits.
    pub(crate) sandbox_memory: Arc<crate::sandbox_memory::SandboxMemory>,
    next_id: AtomicU64,
    /// Networked functions' and sandboxes' namespaces (made on first use).
    pub(crate) network: Arc<Network>,
    /// Who each function's VMMs run as (`None`: unjailed).
    jail: Option<crate::jail::Jail>,
    /// In a cluster: this node (code this node lacks is fetched from peers).
    cluster: std::sync::OnceLock<Arc<crate::cluster::Node>>,
}

impl Instances {
    pub fn new(cfg: InstancesConfig, catalog: Arc<Catalog>) -> Arc<Self> {
        let jail = cfg
            .jail
            .map(|range| crate::jail::Jail::new(range, catalog.clone()));
        Arc::new(Instances {
            host_slots: Arc::new(Semaphore::new(cfg.max_concurrency.max(1))),
            snapshots: SnapshotStore::new(
                &cfg.state_dir,
                catalog.clone(),
                cfg.restore_mode,
                cfg.working_set_record_ms,
            ),
            bases: Arc::new(crate::bases::BaseStore::new(&cfg.state_dir)),
            catalog,
            metrics: Metrics::default(),
            pools: Mutex::new(HashMap::new()),
            reserved: Mutex::new(HashMap::new()),
            provisioned: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            census: Mutex::new(memory::Census::default()),
            census_skip: std::sync::atomic::AtomicI32::new(0),
            account_gates: Mutex::new(HashMap::new()),
            sandbox_memory: Arc::default(),
            network: Arc::new(
                Network::new(&cfg.state_dir, cfg.net_pool).keeping_spares(cfg.net_spares),
            ),
            jail,
            cluster: std::sync::OnceLock::new(),
            cfg,
        })
    }

    /// Makes this daemon a cluster node: code it lacks comes from peers.
    pub fn join_cluster(&self, node: Arc<crate::cluster::Node>) {
        let _ = self.cluster.set(node);
    }

    /// This node's function snapshots (served to peers in a cluster).
    pub fn snapshot_store(&self) -> &SnapshotStore {
        &self.snapshots
    }

    /// After a restart: removes snapshots that are half-written, of old
    /// versions or of deleted functions; returns how many.
    pub fn recover_snapshots(&self) -> usize {
        // Bases first: a function diff whose base is gone is then dropped.
        self.bases.recover() + self.snapshots.recover()
    }

    /// After a restart: removes the network namespaces, veths and NAT
    /// table a killed daemon of this state directory left; returns how
    /// many.
    pub async fn remove_network_leftovers(&self) -> usize {
        let network = self.network.clone();
        tokio::task::spawn_blocking(move || network.remove_leftovers())
            .await
            .unwrap_or(0)
    }

    /// The network of a new instance `instance` of `f` (None if `f` asks
    /// for none).
    async fn instance_net(
        &self,
        f: &Function,
        instance: &str,
        user: Option<&crate::jail::User>,
        handoff: bool,
    ) -> anyhow::Result<Option<InstanceNet>> {
        if !f.network {
            return Ok(None);
        }
        let (network, name, instance) =
            (self.network.clone(), f.name.clone(), instance.to_string());
        let owner = user.map(|u| (u.uid, u.gid));
        let net = {
            let network = network.clone();
            tokio::task::spawn_blocking(move || network.make(&name, &instance, owner, handoff))
                .await??
        };
        // The next networked start's namespace, made off this one's path.
        tokio::task::spawn_blocking(move || network.refill());
        Ok(Some(net))
    }

    /// How `f`'s VMMs are jailed (`None`: unjailed): its uid, a root
    /// showing its snapshots (to write), its code, the runtime bases and,
    /// for a Linux runtime, the image cache and the guest kernel.
    fn jailed(&self, f: &Function) -> anyhow::Result<Option<crate::jail::Jailed>> {
        let Some(jail) = &self.jail else {
            return Ok(None);
        };
        let state = &self.cfg.state_dir;
        let runtime = crate::runtime::find(&f.runtime);
        let linux = runtime.is_some_and(|rt| rt.linux());
        let mut read_only = vec![crate::code::dir(state, &f.code_sha256)];
        // Its own runtime base only (bases are per account), if it has one
        // yet (it is made before the first instance restores it), and the
        // placeholder code disk a restored base opens before it gets the
        // function's.
        if let Some(rt) = runtime.filter(|rt| rt.linux()) {
            let base = self
                .bases
                .dir_of(&layered::base_runtime(f, rt), f.memory_mib);
            let placeholder = self.bases.root().join(crate::bases::PLACEHOLDER);
            read_only.extend([base, placeholder].into_iter().filter(|p| p.exists()));
        }
        read_only.extend(self.shared_files(linux));
        Ok(Some(crate::jail::Jailed {
            user: jail.user_of(&f.name)?,
            writable: vec![state.join("snapshots")],
            read_only,
        }))
    }

    /// How the VMMs that build runtime bases are jailed (`None`:
    /// unjailed): as the shared id, writing the bases.
    fn base_jailed(&self) -> Option<crate::jail::Jailed> {
        let jail = self.jail.as_ref()?;
        Some(crate::jail::Jailed {
            user: jail.base_user(),
            writable: vec![self.cfg.state_dir.join("bases")],
            read_only: self.shared_files(true),
        })
    }

    /// What every jailed VMM may read outside the state directory
    /// ([`crate::jail::system_paths`]), and for Linux the image cache and
    /// kernel.
    fn shared_files(&self, linux: bool) -> Vec<PathBuf> {
        let mut files = crate::jail::system_paths(&self.cfg.spore_bin);
        if linux {
            if self.cfg.image_cache.is_dir() {
                files.push(self.cfg.image_cache.clone());
            }
            if let Some(k) = &self.cfg.linux_kernel {
                if !k.starts_with(&self.cfg.image_cache) {
                    files.push(k.clone());
                }
            }
        }
        files
    }

    /// Where Linux runtimes' images are looked up.
    pub fn image_cache(&self) -> PathBuf {
        self.cfg.image_cache.clone()
    }

    /// A new cgroup for instance `instance` of `f` (`None` without
    /// cgroups); made off the async threads (cgroupfs writes can block).
    async fn cgroup_for(
        &self,
        f: &Function,
        instance: &str,
    ) -> anyhow::Result<Option<crate::cgroups::Leaf>> {
        let Some(cgroups) = self.cfg.cgroups.clone() else {
            return Ok(None);
        };
        let limits = cgroups.limits(f.memory_mib);
        let (group, instance) = (f.name.clone(), instance.to_string());
        let leaf = tokio::task::spawn_blocking(move || cgroups.leaf(&group, &instance, limits))
            .await?
            .map_err(|e| anyhow::anyhow!("making the instance's cgroup: {e}"))?;
        Ok(Some(leaf))
    }

    pub fn max_concurrency(&self) -> usize {
        self.cfg.max_concurrency
    }

    /// A new instance's directory: short (`<state>/run/r<n>`), because the
    /// VMM's Unix sockets (clones' included) live under it and a socket path
    /// has at most 107 bytes. The daemon holds the state directory's lock, so
    /// names never collide with another daemon's.
    fn run_dir(&self) -> PathBuf {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.cfg.state_dir.join("run").join(format!("r{n}"))
    }

    /// Runs one invocation of `f` (its current version); a new instance
    /// must fit in `account_memory` (bytes) with the account's others.
    pub async fn invoke(
        self: &Arc<Self>,
        f: &Function,
        request_id: &str,
        payload: &[u8],
        account_memory: Option<u64>,
    ) -> Result<Invocation, AcquireError> {
        let _permits = self.admit(f).await?;
        let pool = self.pool_for(f).await;
        pool.last_used_ms.store(unix_ms(), Ordering::Relaxed);
        // Under an account memory limit, one start of the account at a
        // time: room is made, the instance taken and counted busy.
        let gate = match account_memory {
            Some(_) => Some(self.account_gate(&f.name).lock_owned().await),
            None => None,
        };
        self.room_in_account(f, &pool, account_memory).await?;
        let started = self.acquire(&pool).await;
        if started.is_ok() {
            pool.busy.fetch_add(1, Ordering::Relaxed);
        }
        drop(gate);
        let (mut inst, path) = match started {
            Ok(started) => started,
            // Its instance is already ended; the next invocation initialises
            // the function again, as Lambda does.
            Err(AcquireError::Init(r)) => {
                return Ok(Invocation {
                    outcome: Outcome::Done(r),
                    path: StartPath::Cold,
                })
            }
            Err(e) => return Err(e),
        };
        let timeout = Duration::from_secs(u64::from(f.timeout_s.max(1)));
        let timeout_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        let deadline_ms = unix_ms().saturating_add(timeout_ms);
        let cap = match path {
            StartPath::Warm => Cap::Capped,
            StartPath::Provisioned => Cap::IfLong,
            _ if self.cfg.keep_alive.is_zero() => Cap::IfLong,
            _ => Cap::AfterFirst,
        };
        let result = invoke_capped(&mut inst, cap, timeout, request_id, payload, deadline_ms).await;
        pool.busy.fetch_sub(1, Ordering::Relaxed);
        if path == StartPath::Provisioned {
            // Throughput mode: a provisioned instance serves once, and a
            // fresh clone takes its place.
            self.refill(&pool);
        }
        let outcome = match result {
            Ok(Ok(r)) => {
                if path == StartPath::Provisioned {
                    self.end(inst.vmm).await;
                } else if r.ok || !is_runtime_error(&r.body) {
                    inst.last_used = Instant::now();
                    self.release(&pool, inst);
                } else {
                    // The runtime itself failed (a panic): the guest is ending.
                    self.end(inst.vmm).await;
                }
                Outcome::Done(r)
            }
            Ok(Err(e)) => {
                let ending = crash_reason(&e, &mut inst).await;
                // The guest's console is in the VMM's log, which goes with
                // its run directory: what it said last is kept here and in
                // the invocation's log.
                let console = inst.vmm.log_lines(CRASH_LOG_LINES);
                let log = inst.conn.take_streamed_log();
                let outcome = match ending {
                    _ if inst.vmm.oom_killed() => {
                        tracing::warn!(function = %f.name, start = path.as_str(),
                            "instance ended by the kernel: past its memory limit; its VMM log ends: {console}");
                        Outcome::OutOfMemory {
                            limit_bytes: inst.vmm.memory_limit().unwrap_or(0),
                            console,
                            log,
                        }
                    }
                    Ending::Guest(why) => {
                        tracing::warn!(function = %f.name, start = path.as_str(),
                            "instance failed ({why}); its VMM log ends: {console}");
                        Outcome::Crashed { why, console, log }
                    }
                    Ending::Host(why) => {
                        tracing::error!(function = %f.name, start = path.as_str(),
                            "instance lost to a host fault ({why}); its VMM log ends: {console}");
                        Outcome::HostFault { why, console, log }
                    }
                };
                self.end(inst.vmm).await;
                outcome
            }
            Err(_) => {
                tracing::warn!(function = %f.name, start = path.as_str(),
                    "instance timed out; its VMM log ends: {}", inst.vmm.log_lines(CRASH_LOG_LINES));
                let log = inst.conn.take_streamed_log();
                self.end(inst.vmm).await;
                Outcome::TimedOut { log }
            }
        };
        Ok(Invocation { outcome, path })
    }

    /// Takes a slot of the function's reserved concurrency (if set) and of
    /// the host's, each waiting at most `queue_wait`.
    async fn admit(
        &self,
        f: &Function,
    ) -> Result<(Option<OwnedSemaphorePermit>, OwnedSemaphorePermit), AcquireError> {
        let reserved = lock(&self.reserved).get(&f.name).cloned();
        let fn_permit = match reserved {
            Some(r) => Some(self.take_reserved(&f.name, &r).await.ok_or_else(|| {
                self.metrics.throttled(&f.name);
                AcquireError::Throttled { reserved: true }
            })?),
            None => None,
        };
        let host = self.take(self.host_slots.clone()).await.ok_or_else(|| {
            self.metrics.throttled(&f.name);
            AcquireError::Throttled { reserved: false }
        })?;
        Ok((fn_permit, host))
    }

    async fn take(&self, sem: Arc<Semaphore>) -> Option<OwnedSemaphorePermit> {
        if let Ok(p) = sem.clone().try_acquire_owned() {
            return Some(p);
        }
        tokio::time::timeout(self.cfg.queue_wait, sem.acquire_owned())
            .await
            .ok()?
            .ok()
    }

    /// Sets (or with `None` removes) a function's reserved concurrency.
    pub fn set_reserved(&self, name: &str, n: Option<u32>) {
        let in_cluster = self.cluster.get().is_some();
        let old = {
            let mut r = lock(&self.reserved);
            match n {
                Some(n) => r.insert(
                    name.to_string(),
                    cluster_slots::Reserved::new(n, in_cluster),
                ),
                None => r.remove(name),
            }
        };
        if let Some(old) = old {
            self.give_back_slots(name, &old);
        }
    }

    /// The pool of `f` (`$LATEST` or a published version) at its current
    /// revision; a pool of an older revision is retired (its idle instances
    /// and zygote ended).
    async fn pool_for(&self, f: &Function) -> Arc<Pool> {
        let key = pool_key(f);
        let old = {
            let mut pools = lock(&self.pools);
            match pools.get(&key) {
                Some(p) if p.function.version == f.version => return p.clone(),
                _ => pools.insert(key.clone(), Arc::new(Pool::new(f.clone()))),
            }
        };
        if let Some(old) = old {
            self.retire(old).await;
        }
        lock(&self.pools)
            .get(&key)
            .cloned()
            .unwrap_or_else(|| Arc::new(Pool::new(f.clone())))
    }

    /// Whether `pool` is still the pool of its function version (not
    /// retired by a change or a delete): only then are its instances kept.
    fn is_current(&self, pool: &Arc<Pool>) -> bool {
        lock(&self.pools)
            .get(&pool_key(&pool.function))
            .is_some_and(|p| Arc::ptr_eq(p, pool))
    }

    /// Ends what a function no longer runs: everything of `$LATEST` after a
    /// change (its next invocation starts a new pool), the pools of deleted
    /// versions, everything after a delete; and deletes the snapshots of
    /// every revision nothing runs any more.
    pub async fn forget(self: &Arc<Self>, name: &str) {
        let current = self.catalog.get(name).ok().flatten();
        let live = self.catalog.live_revisions(name).unwrap_or_default();
        let published: Vec<Option<u32>> = self
            .catalog
            .versions(name)
            .unwrap_or_default()
            .iter()
            .map(|v| v.published)
            .collect();
        let old: Vec<Arc<Pool>> = {
            let mut pools = lock(&self.pools);
            let gone: Vec<PoolKey> = pools
                .iter()
                .filter(|((n, v), pool)| {
                    n == name
                        && match v {
                            None => current
                                .as_ref()
                                .is_none_or(|f| f.version != pool.function.version),
                            Some(_) => !published.contains(v),
                        }
                })
                .map(|(k, _)| k.clone())
                .collect();
            gone.iter().filter_map(|k| pools.remove(k)).collect()
        };
        for pool in old {
            self.retire(pool).await;
        }
        self.snapshots.prune(name, &live);
        // Versions gone are provisioned no more.
        lock(&self.provisioned).retain(|(n, v), _| {
            n != name
                || match v {
                    None => current.is_some(),
                    Some(_) => published.contains(v),
                }
        });
        // A `$LATEST` kept provisioned (an older daemon's record) stays so
        // at its new revision.
        if let Some(f) = current {
            if lock(&self.provisioned).contains_key(&(name.to_string(), None)) {
                let pool = self.pool_for(&f).await;
                self.refill(&pool);
            }
        }
    }

    async fn retire(&self, pool: Arc<Pool>) {
        let mut idle = std::mem::take(&mut *lock(&pool.idle));
        idle.append(&mut lock(&pool.fresh));
        for inst in idle {
            self.end(inst.vmm).await;
        }
        if let Some(z) = pool.zygote.lock().await.take() {
            self.end_zygote(z).await;
        }
    }

    fn release(&self, pool: &Arc<Pool>, inst: Instance) {
        // A pool retired meanwhile (new version, delete) is no longer in the
        // map: its instances must not be reused.
        let current = self.is_current(pool);
        // Keep-alive 0: no warm instances at all.
        if current && !self.cfg.keep_alive.is_zero() {
            lock(&pool.idle).push(inst);
        } else {
            let vmm = inst.vmm;
            tokio::spawn(async move {
                let mut v = vmm;
                v.kill().await;
            });
        }
    }

    fn record(&self, vmm: &VmmProcess) {
        let rec = ProcessRecord {
            pid: vmm.pid,
            run_dir: vmm.run_dir.display().to_string(),
        };
        if let Err(e) = self.catalog.add_process(&rec) {
            tracing::warn!("{e}");
        }
    }

    async fn end(&self, mut vmm: VmmProcess) {
        vmm.kill().await;
        let rec = ProcessRecord {
            pid: vmm.pid,
            run_dir: vmm.run_dir.display().to_string(),
        };
        if let Err(e) = self.catalog.remove_process(&rec) {
            tracing::warn!("{e}");
        }
    }

    /// Ends every instance and zygote (a fenced cluster node; shutdown).
    pub async fn end_all(&self) {
        let pools: Vec<Arc<Pool>> = lock(&self.pools).drain().map(|(_, p)| p).collect();
        for p in pools {
            self.retire(p).await;
        }
        self.forget_slots();
    }

    /// Ends every instance and zygote, and their networks (daemon shutdown).
    pub async fn shutdown(&self) {
        self.end_all().await;
        let network = self.network.clone();
        let _ = tokio::task::spawn_blocking(move || {
            network.teardown();
            // Clones a zygote started that the daemon never adopted.
            network.remove_leftovers()
        })
        .await;
        if let Some(c) = &self.cfg.cgroups {
            c.remove_all();
        }
    }
}

impl Pool {
    /// Whether the zygote is demoted under the memory budget.
    fn demoted(&self) -> bool {
        self.demoted_bytes.load(Ordering::Relaxed) > 0
    }

    fn new(function: Function) -> Self {
        Pool {
            function,
            idle: Mutex::new(Vec::new()),
            fresh: Mutex::new(Vec::new()),
            refilling: std::sync::atomic::AtomicBool::new(false),
            zygote: tokio::sync::Mutex::new(None),
            busy: AtomicU64::new(0),
            demoted_bytes: AtomicU64::new(0),
            last_used_ms: AtomicU64::new(unix_ms()),
        }
    }
}

/// Why an instance failed, from the error and whether its VMM is still there.
/// Why an instance's connection failed mid-invocation: a guest that broke
/// the connection while its VMM runs is the function's fault; a VMM that
/// is gone says how it ended (its record, `vmm_exit`).
async fn crash_reason(e: &InvokeError, inst: &mut Instance) -> Ending {
    // An ending VMM closes the connection as it stops: give it time to be
    // gone (and its record written) before asking.
    for _ in 0..ENDING_WAIT_STEPS {
        if let Some(ending) = inst.vmm.ending() {
            return ending;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ending::Guest(format!("Runtime error: {e}"))
}

/// How many 5 ms steps [`crash_reason`] waits for a VMM to be gone (2 s: a
/// clone whose zygote was killed stops in order, which takes a while on a
/// loaded host; only a failed invocation waits).
const ENDING_WAIT_STEPS: u32 = 400;

/// Whether an error body names a runtime failure (`Runtime.*`), after which
/// the instance is not reused.
fn is_runtime_error(body: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| {
            v.get("errorType")?
                .as_str()
                .map(|t| t.starts_with("Runtime."))
        })
        .unwrap_or(false)
}
