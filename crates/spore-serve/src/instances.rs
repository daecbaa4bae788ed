//! The instance manager: for each function version, idle warm instances and a
//! zygote (a booted instance paused after init and made a clone template by
//! its VMM). Each invocation takes the fastest start path there is — an idle
//! instance, a clone of the zygote, or a cold boot that also makes the zygote —
//! and gives its instance back, or ends it if it failed or timed out.
//!
//! Isolation rules: an instance serves only the function and version it was
//! started for; one that timed out, crashed or broke the protocol is killed,
//! never reused; a function's new version retires every instance and the
//! zygote of the old one.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::catalog::{Catalog, Function, ProcessRecord};
use crate::code;
use crate::invoke::{InstanceConn, InvokeError, InvokeResult};
use crate::metrics::{Gauges, Metrics, StartPath};
use crate::runtime;
use crate::vmm::VmmProcess;

/// How long a guest may take from `InstanceStart` (or a clone's start) to
/// `Ready`.
const READY_LIMIT: Duration = Duration::from_secs(30);
/// Clone processes each zygote's VMM keeps started ahead.
const STANDBY_CLONES: u32 = 2;

pub struct ManagerConfig {
    pub spore_bin: PathBuf,
    pub state_dir: PathBuf,
    /// Invocations running at once on this host.
    pub max_concurrency: usize,
    /// How long a request waits for a concurrency slot before a 429.
    pub queue_wait: Duration,
    /// An idle instance is ended after this long unused.
    pub keep_alive: Duration,
    /// Host memory (PSS) instances may hold; over it the least recently used
    /// idle instances are ended. 0 = no budget.
    pub memory_budget: u64,
    /// Never make zygotes: every start that is not warm boots (for functions
    /// that must not share a template, and to compare start paths).
    pub no_clones: bool,
}

/// Why an invocation got no instance.
#[derive(Debug, thiserror::Error)]
pub enum AcquireError {
    #[error("Rate Exceeded.")]
    Throttled { reserved: bool },
    #[error("the function's instance could not start: {0}")]
    Start(String),
}

/// How an invocation ended.
pub enum Outcome {
    Done(InvokeResult),
    /// The instance ended or broke the protocol before answering.
    Crashed(String),
    TimedOut,
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
}

/// The instances of one function version.
struct Pool {
    function: Function,
    idle: Mutex<Vec<Instance>>,
    /// `None` until the first cold start; serialises clone requests.
    zygote: tokio::sync::Mutex<Option<Zygote>>,
    busy: AtomicU64,
}

pub struct Manager {
    cfg: ManagerConfig,
    catalog: Arc<Catalog>,
    pub metrics: Metrics,
    pools: Mutex<HashMap<String, Arc<Pool>>>,
    /// Per function: its reserved concurrency, if set.
    reserved: Mutex<HashMap<String, (u32, Arc<Semaphore>)>>,
    host_slots: Arc<Semaphore>,
    next_id: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Manager {
    pub fn new(cfg: ManagerConfig, catalog: Arc<Catalog>) -> Arc<Self> {
        Arc::new(Manager {
            host_slots: Arc::new(Semaphore::new(cfg.max_concurrency.max(1))),
            cfg,
            catalog,
            metrics: Metrics::default(),
            pools: Mutex::new(HashMap::new()),
            reserved: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
        })
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

    /// Runs one invocation of `f` (its current version).
    pub async fn invoke(
        &self,
        f: &Function,
        request_id: &str,
        payload: &[u8],
    ) -> Result<Invocation, AcquireError> {
        let _permits = self.admit(f).await?;
        let pool = self.pool_for(f).await;
        let (mut inst, path) = self.acquire(&pool).await?;
        pool.busy.fetch_add(1, Ordering::Relaxed);
        let timeout = Duration::from_secs(f.timeout_s.max(1) as u64);
        let deadline_ms = unix_ms() + timeout.as_millis() as u64;
        let result =
            tokio::time::timeout(timeout, inst.conn.invoke(request_id, payload, deadline_ms)).await;
        pool.busy.fetch_sub(1, Ordering::Relaxed);
        let outcome = match result {
            Ok(Ok(r)) => {
                if r.ok || !is_runtime_error(&r.body) {
                    inst.last_used = Instant::now();
                    self.release(&pool, inst);
                } else {
                    // The runtime itself failed (a panic): the guest is ending.
                    self.end(inst.vmm).await;
                }
                Outcome::Done(r)
            }
            Ok(Err(e)) => {
                let why = crash_reason(&e, &mut inst).await;
                self.end(inst.vmm).await;
                Outcome::Crashed(why)
            }
            Err(_) => {
                self.end(inst.vmm).await;
                Outcome::TimedOut
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
        let reserved = lock(&self.reserved).get(&f.name).map(|(_, s)| s.clone());
        let fn_permit = match reserved {
            Some(sem) => Some(self.take(sem).await.ok_or_else(|| {
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
        let mut r = lock(&self.reserved);
        match n {
            Some(n) => {
                r.insert(name.to_string(), (n, Arc::new(Semaphore::new(n as usize))));
            }
            None => {
                r.remove(name);
            }
        }
    }

    /// The pool of `f`'s current version; a pool of an older version is
    /// retired (its idle instances and zygote ended).
    async fn pool_for(&self, f: &Function) -> Arc<Pool> {
        let old = {
            let mut pools = lock(&self.pools);
            match pools.get(&f.name) {
                Some(p) if p.function.version == f.version => return p.clone(),
                _ => pools.insert(f.name.clone(), Arc::new(Pool::new(f.clone()))),
            }
        };
        if let Some(old) = old {
            self.retire(old).await;
        }
        lock(&self.pools)
            .get(&f.name)
            .cloned()
            .unwrap_or_else(|| Arc::new(Pool::new(f.clone())))
    }

    /// Ends everything of a function (deleted, or changed: its next
    /// invocation starts a new pool).
    pub async fn forget(&self, name: &str) {
        let old = lock(&self.pools).remove(name);
        if let Some(old) = old {
            self.retire(old).await;
        }
    }

    async fn retire(&self, pool: Arc<Pool>) {
        let idle = std::mem::take(&mut *lock(&pool.idle));
        for inst in idle {
            self.end(inst.vmm).await;
        }
        if let Some(z) = pool.zygote.lock().await.take() {
            self.end(z.vmm).await;
            let _ = std::fs::remove_dir_all(&z.clone_dir);
        }
    }

    async fn acquire(&self, pool: &Arc<Pool>) -> Result<(Instance, StartPath), AcquireError> {
        // Warm: the most recently used idle instance (its pages are hottest).
        loop {
            let Some(mut inst) = lock(&pool.idle).pop() else {
                break;
            };
            if inst.vmm.is_alive() {
                return Ok((inst, StartPath::Warm));
            }
            self.end(inst.vmm).await;
        }
        if self.cfg.no_clones {
            let (vmm, conn) = self
                .boot(&pool.function)
                .await
                .map_err(|e| AcquireError::Start(format!("{e:#}")))?;
            return Ok((
                Instance {
                    vmm,
                    conn,
                    last_used: Instant::now(),
                },
                StartPath::Cold,
            ));
        }
        let mut zygote = pool.zygote.lock().await;
        if let Some(z) = zygote.as_mut() {
            match self.clone_of(&pool.function, z).await {
                Ok(inst) => return Ok((inst, StartPath::Clone)),
                Err(e) => {
                    // A zygote that cannot clone (its cap reached, its VMM
                    // gone) is replaced by a cold start.
                    tracing::warn!(function = %pool.function.name, "zygote retired: {e:#}");
                    if let Some(z) = zygote.take() {
                        self.end(z.vmm).await;
                        let _ = std::fs::remove_dir_all(&z.clone_dir);
                    }
                }
            }
        }
        let inst = self.cold_start(&pool.function, &mut zygote).await?;
        Ok((inst, StartPath::Cold))
    }

    /// Boots the function, makes the booted VM the zygote and returns its
    /// first clone; if the VM cannot become a zygote, returns it as a plain
    /// instance.
    async fn cold_start(
        &self,
        f: &Function,
        zygote_slot: &mut Option<Zygote>,
    ) -> Result<Instance, AcquireError> {
        let started = Instant::now();
        let (vmm, conn) = self
            .boot(f)
            .await
            .map_err(|e| AcquireError::Start(format!("{e:#}")))?;
        tracing::info!(function = %f.name, version = f.version, init_us = conn.init_us,
            "booted in {:.1} ms", started.elapsed().as_secs_f64() * 1e3);
        // The guest goes back to accepting when this connection closes; the
        // zygote is paused there.
        drop(conn);
        let clone_dir = vmm.run_dir.join("clones");
        let mut z = Zygote { vmm, clone_dir };
        let config = serde_json::json!({
            "mode": "zygote", "standby": STANDBY_CLONES, "max_clones": 1000,
            "socket_dir": z.clone_dir,
        });
        let made = async {
            std::fs::create_dir_all(&z.clone_dir)?;
            z.vmm
                .api("PUT", "/clone/config", Some(config.to_string()))
                .await?;
            self.clone_of(f, &mut z).await
        }
        .await;
        match made {
            Ok(inst) => {
                tracing::info!(function = %f.name, "zygote ready after {:.1} ms",
                    started.elapsed().as_secs_f64() * 1e3);
                *zygote_slot = Some(z);
                Ok(inst)
            }
            Err(e) => {
                tracing::warn!(function = %f.name, "no zygote ({e:#}); serving from the booted VM");
                let conn = InstanceConn::connect(&z.vmm.vsock_uds, READY_LIMIT)
                    .await
                    .map_err(|e| AcquireError::Start(e.to_string()))?;
                Ok(Instance {
                    vmm: z.vmm,
                    conn,
                    last_used: Instant::now(),
                })
            }
        }
    }

    /// A fresh VMM booted with the function, connected and ready.
    async fn boot(&self, f: &Function) -> anyhow::Result<(VmmProcess, InstanceConn)> {
        let rt = runtime::find(&f.runtime)
            .ok_or_else(|| anyhow::anyhow!("unknown runtime {}", f.runtime))?;
        let run_dir = self.run_dir();
        let vmm = VmmProcess::spawn(&self.cfg.spore_bin, &run_dir).await?;
        self.record(&vmm);
        let image = code::image_path(&self.cfg.state_dir, &f.code_sha256, &f.handler);
        let setup = async {
            for call in rt.configure(f, &image, &vmm.vsock_uds) {
                vmm.api(call.method, call.path, Some(call.body)).await?;
            }
            vmm.api(
                "PUT",
                "/actions",
                Some(r#"{"action_type":"InstanceStart"}"#.into()),
            )
            .await?;
            anyhow::Ok(InstanceConn::connect(&vmm.vsock_uds, READY_LIMIT).await?)
        }
        .await;
        match setup {
            Ok(conn) => Ok((vmm, conn)),
            Err(e) => {
                let tail = vmm.log_tail();
                self.end(vmm).await;
                Err(e.context(format!("VMM log: {tail}")))
            }
        }
    }

    /// One clone of the zygote, connected and ready.
    async fn clone_of(&self, f: &Function, z: &mut Zygote) -> anyhow::Result<Instance> {
        let body = serde_json::json!({ "count": 1, "socket_dir": z.clone_dir });
        let asked = Instant::now();
        let resp = z.vmm.api("PUT", "/clone", Some(body.to_string())).await?;
        let cloned_us = asked.elapsed().as_micros();
        let report: serde_json::Value = serde_json::from_str(&resp)?;
        let clone = report
            .get("clones")
            .and_then(|c| c.get(0))
            .ok_or_else(|| anyhow::anyhow!("PUT /clone answered no clone: {resp}"))?;
        let field = |k: &str| clone.get(k).and_then(|v| v.as_str()).map(PathBuf::from);
        let (Some(sock), Some(name), Some(pid)) = (
            field("socket"),
            clone.get("name").and_then(|v| v.as_str()),
            clone.get("pid").and_then(|v| v.as_i64()),
        ) else {
            anyhow::bail!("PUT /clone answered an incomplete clone: {clone}");
        };
        let vsock = z.clone_dir.join(format!("{name}.vsock"));
        let vmm = VmmProcess::adopt(pid as i32, sock, vsock, z.clone_dir.clone());
        self.record(&vmm);
        match InstanceConn::connect(&vmm.vsock_uds, READY_LIMIT).await {
            Ok(conn) => {
                tracing::debug!(
                    function = %f.name,
                    "clone: PUT /clone {cloned_us} µs, ready {} µs later",
                    asked.elapsed().as_micros() - cloned_us
                );
                Ok(Instance {
                    vmm,
                    conn,
                    last_used: Instant::now(),
                })
            }
            Err(e) => {
                self.end(vmm).await;
                Err(anyhow::anyhow!("clone of {}: {e}", f.name))
            }
        }
    }

    fn release(&self, pool: &Arc<Pool>, inst: Instance) {
        // A pool retired meanwhile (new version, delete) is no longer in the
        // map: its instances must not be reused.
        let current = lock(&self.pools)
            .get(&pool.function.name)
            .is_some_and(|p| Arc::ptr_eq(p, pool));
        // Keep-alive 0: no warm instances at all.
        if current && !self.cfg.keep_alive.is_zero() {
            lock(&pool.idle).push(inst);
        } else {
            let mgr_end = inst.vmm;
            tokio::spawn(async move {
                let mut v = mgr_end;
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

    /// Ends idle instances unused for longer than the keep-alive, then, over
    /// the memory budget, the least recently used idle ones. Returns how many
    /// were ended.
    pub async fn reap_idle(&self) -> usize {
        let pools: Vec<Arc<Pool>> = lock(&self.pools).values().cloned().collect();
        let now = Instant::now();
        let mut ended = Vec::new();
        for pool in &pools {
            let mut idle = lock(&pool.idle);
            let (old, keep): (Vec<_>, Vec<_>) = idle
                .drain(..)
                .partition(|i| now.duration_since(i.last_used) >= self.cfg.keep_alive);
            *idle = keep;
            ended.extend(old);
        }
        if self.cfg.memory_budget > 0 {
            let mut held = self.held_bytes(&pools);
            while held > self.cfg.memory_budget {
                // The least recently used idle instance of any pool.
                let victim = pools
                    .iter()
                    .filter_map(|p| {
                        let idle = lock(&p.idle);
                        let (i, inst) = idle.iter().enumerate().min_by_key(|(_, i)| i.last_used)?;
                        Some((inst.last_used, p.clone(), i))
                    })
                    .min_by_key(|(t, _, _)| *t);
                let Some((_, pool, i)) = victim else { break };
                let inst = lock(&pool.idle).remove(i);
                held = held.saturating_sub(inst.vmm.pss_bytes());
                ended.push(inst);
            }
        }
        let n = ended.len();
        for inst in ended {
            tracing::info!(
                pid = inst.vmm.pid,
                "idle instance ended (keep-alive or memory budget)"
            );
            self.end(inst.vmm).await;
        }
        n
    }

    fn held_bytes(&self, pools: &[Arc<Pool>]) -> u64 {
        pools
            .iter()
            .map(|p| lock(&p.idle).iter().map(|i| i.vmm.pss_bytes()).sum::<u64>())
            .sum()
    }

    /// Instance counts and memory, for `/metrics`.
    pub async fn gauges(&self) -> Gauges {
        let pools: Vec<Arc<Pool>> = lock(&self.pools).values().cloned().collect();
        let mut instances = BTreeMap::new();
        let mut instance_bytes = 0;
        let mut template_bytes = 0;
        for p in &pools {
            let name = p.function.name.clone();
            let idle = lock(&p.idle);
            instances.insert((name.clone(), "idle"), idle.len() as u64);
            instance_bytes += idle.iter().map(|i| i.vmm.pss_bytes()).sum::<u64>();
            drop(idle);
            instances.insert((name.clone(), "busy"), p.busy.load(Ordering::Relaxed));
            if let Ok(z) = p.zygote.try_lock() {
                if let Some(z) = z.as_ref() {
                    instances.insert((name, "zygote"), 1);
                    template_bytes += z.vmm.pss_bytes();
                }
            }
        }
        Gauges {
            instances,
            instance_bytes,
            template_bytes,
        }
    }

    /// Ends every instance and zygote (daemon shutdown).
    pub async fn shutdown(&self) {
        let pools: Vec<Arc<Pool>> = lock(&self.pools).drain().map(|(_, p)| p).collect();
        for p in pools {
            self.retire(p).await;
        }
    }
}

impl Pool {
    fn new(function: Function) -> Self {
        Pool {
            function,
            idle: Mutex::new(Vec::new()),
            zygote: tokio::sync::Mutex::new(None),
            busy: AtomicU64::new(0),
        }
    }
}

/// Why an instance failed, from the error and whether its VMM is still there.
async fn crash_reason(e: &InvokeError, inst: &mut Instance) -> String {
    // Give an exiting VMM a moment to be gone, so the message says so.
    tokio::time::sleep(Duration::from_millis(5)).await;
    if inst.vmm.is_alive() {
        format!("Runtime error: {e}")
    } else {
        "Runtime exited before answering".to_string()
    }
}

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

pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
