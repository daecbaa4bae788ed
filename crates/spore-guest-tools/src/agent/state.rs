//! The agent's shared state: where the host link (one connection at a time)
//! and the Runtime API (one thread per HTTP connection) meet.
//!
//! One mutex and one condition variable: every change notifies all waiters,
//! each of which rechecks its own condition. The runtime has an *epoch*,
//! bumped when it exits, so that `/next` requests the dead runtime left
//! waiting never take an invocation meant for its successor.
//! Lock order: the state, then the output log (never the reverse).

use std::net::SocketAddr;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::config::{FunctionConfig, Options, RuntimeKind};
use super::runtime::{self, error_json, lock, Output};

/// One invocation from the host.
#[derive(Clone, Debug)]
pub struct Invocation {
    pub id: String,
    pub payload: Vec<u8>,
    /// Unix ms.
    pub deadline_ms: u64,
}

/// What the runtime made of an invocation.
#[derive(Debug)]
pub struct Outcome {
    pub ok: bool,
    pub body: Vec<u8>,
    pub log: Vec<u8>,
    pub handler_ns: u64,
    /// The runtime died (or was killed): the host link closes after this result.
    pub runtime_gone: bool,
}

/// A failed init, sent as `InitError` on every connection from then on.
#[derive(Clone, Debug)]
pub struct InitFailure {
    pub body: Vec<u8>,
    pub log: Vec<u8>,
    pub init_ns: u64,
}

/// How a wait of the host side ended.
#[derive(Debug)]
pub enum Wait<T> {
    Done(T),
    InitFailed(InitFailure),
    /// A newer host connection took over.
    Superseded,
}

/// Why the runtime's call was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum ApiRefusal {
    /// No such invocation in flight (400 `InvalidRequestID`).
    UnknownRequest,
    /// Init error after init (403 `InvalidStateTransition`).
    NotInInit,
    /// The runtime this request came from is gone.
    RuntimeGone,
}

#[derive(Default)]
struct State {
    config: Option<FunctionConfig>,
    log_stream: String,
    /// What `/runtime/spore/function` returns: the Configure JSON with the
    /// runtime's whole environment in `env`.
    function_json: Option<Vec<u8>>,
    /// The Python bootstrap waits in `/runtime/spore/function`.
    preinit_waiting: bool,
    runtime_pid: Option<i32>,
    epoch: u64,
    /// Start of the current runtime's function init (Configure, or a restart).
    init_started: Option<Instant>,
    /// The current runtime's init time, once it first asked for `/next`.
    init_us: Option<u64>,
    init_error: Option<InitFailure>,
    /// `/next` requests of the current runtime waiting for an invocation.
    next_waiters: u32,
    pending: Option<Invocation>,
    /// Handed to the runtime, not answered yet.
    current: Option<(Invocation, Instant)>,
    outcome: Option<(String, Outcome)>,
    /// Bumped for each new host connection.
    link_gen: u64,
    /// How the last runtime ended.
    last_exit: Option<String>,
}

pub struct Agent {
    pub opts: Options,
    /// Where the Runtime API really listens (its port may have been 0).
    pub api_addr: SocketAddr,
    pub started: Instant,
    pub output: Arc<Output>,
    state: Mutex<State>,
    cv: Condvar,
    /// PID 1 reaps every child itself; otherwise each runtime gets a waiter.
    pub reaper_is_pid1: bool,
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| saturating_u64(d.as_millis()))
}

/// A duration's count (`as_nanos`, `as_micros`, ...) as u64, saturating
/// (u64::MAX nanoseconds is 584 years).
pub(crate) fn saturating_u64(count: u128) -> u64 {
    u64::try_from(count).unwrap_or(u64::MAX)
}

fn elapsed_ns(since: Option<Instant>, fallback: Instant) -> u64 {
    saturating_u64(since.unwrap_or(fallback).elapsed().as_nanos())
}

impl Agent {
    pub fn new(opts: Options, api_addr: SocketAddr) -> Arc<Self> {
        Arc::new(Self {
            reaper_is_pid1: opts.pid1,
            opts,
            api_addr,
            started: Instant::now(),
            output: Arc::new(Output::default()),
            state: Mutex::new(State::default()),
            cv: Condvar::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    fn wait<'a>(&self, g: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.cv.wait(g).unwrap_or_else(|e| e.into_inner())
    }

    /// Starts the Python runtime's pre-init (boot, before any function).
    pub fn start_preinit(self: &Arc<Self>) {
        if self.opts.runtime == RuntimeKind::Python3 {
            let mut g = self.lock();
            self.start_runtime(&mut g);
        }
    }

    /// Starts a runtime (the first, or after the last one died). A failure
    /// to start is an init failure.
    fn start_runtime(self: &Arc<Self>, g: &mut State) {
        let function = g.config.as_ref().map(|c| (c, g.log_stream.as_str()));
        let env = runtime::environment(&self.opts, &self.api_addr.to_string(), function);
        match runtime::spawn(&self.opts, &env, g.config.as_ref()) {
            Ok(s) => {
                eprintln!("spore-agent: runtime started (pid {})", s.pid);
                g.runtime_pid = Some(s.pid);
                g.init_us = None;
                if g.config.is_some() {
                    g.init_started = Some(Instant::now());
                }
                self.output.attach(s.stdout, s.stderr);
                if !self.reaper_is_pid1 {
                    let me = Arc::clone(self);
                    let pid = s.pid;
                    std::thread::spawn(move || {
                        let mut status = 0;
                        // SAFETY: waitpid on our own child with a valid status pointer.
                        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
                        if r == pid {
                            me.on_child_exit(pid, status);
                        }
                    });
                }
            }
            Err(e) => {
                eprintln!("spore-agent: {}: {}", e.error_type, e.message);
                g.init_error = Some(InitFailure {
                    body: error_json(e.error_type, &e.message),
                    log: Vec::new(),
                    init_ns: elapsed_ns(g.init_started, self.started),
                });
            }
        }
        self.cv.notify_all();
    }

    /// A child exited (from the waiter, or PID 1's reaper: any child).
    pub fn on_child_exit(&self, pid: i32, status: libc::c_int) {
        let mut g = self.lock();
        if g.runtime_pid != Some(pid) {
            return;
        }
        let how = runtime::describe_status(status);
        eprintln!("spore-agent: runtime (pid {pid}) ended: {how}");
        g.runtime_pid = None;
        g.last_exit = Some(how.clone());
        g.epoch += 1;
        g.next_waiters = 0;
        g.preinit_waiting = false;
        if let Some((inv, handed)) = g.current.take() {
            let body = error_json(
                "Runtime.ExitError",
                &format!(
                    "RequestId: {} Error: Runtime exited with error: {how}",
                    inv.id
                ),
            );
            let outcome = Outcome {
                ok: false,
                body,
                log: self.output.take_log(),
                handler_ns: saturating_u64(handed.elapsed().as_nanos()),
                runtime_gone: true,
            };
            g.outcome = Some((inv.id, outcome));
        } else if g.init_us.is_none() && g.init_error.is_none() {
            // Died before it was ready: before or during the function's init.
            g.init_error = Some(InitFailure {
                body: error_json(
                    "Runtime.ExitError",
                    &format!("Runtime exited with error: {how}"),
                ),
                log: self.output.take_log(),
                init_ns: elapsed_ns(g.init_started, self.started),
            });
        }
        // Otherwise it died idle: the next connection restarts it.
        self.cv.notify_all();
    }

    // ---- host side ----

    /// A new host connection: older ones stop waiting.
    pub fn new_link(&self) -> u64 {
        let mut g = self.lock();
        g.link_gen += 1;
        self.cv.notify_all();
        g.link_gen
    }

    pub fn is_configured(&self) -> bool {
        self.lock().config.is_some()
    }

    /// Waits until the runtime's pre-init is done (the Python bootstrap waits
    /// for its function; a provided runtime has none).
    pub fn wait_standby(&self, link: u64) -> Wait<()> {
        let mut g = self.lock();
        loop {
            if let Some(f) = &g.init_error {
                return Wait::InitFailed(f.clone());
            }
            if g.link_gen != link {
                return Wait::Superseded;
            }
            if g.preinit_waiting || self.opts.runtime == RuntimeKind::Provided {
                return Wait::Done(());
            }
            g = self.wait(g);
        }
    }

    /// The first Configure: records the function and starts (provided) or
    /// releases (Python) the runtime.
    pub fn configure(self: &Arc<Self>, config: FunctionConfig) {
        let mut g = self.lock();
        g.log_stream = runtime::log_stream_name(&config.function_version);
        g.init_started = Some(Instant::now());
        g.function_json = Some(self.function_json(&config, &g.log_stream));
        g.config = Some(config);
        if self.opts.runtime == RuntimeKind::Provided || g.runtime_pid.is_none() {
            if g.init_error.is_none() {
                self.start_runtime(&mut g);
            }
        } else {
            self.cv.notify_all();
        }
    }

    /// A later Configure: only the metadata may change (version, environment,
    /// memory, timeout); the runtime keeps running. A different function,
    /// handler or code is refused.
    pub fn reconfigure(&self, config: FunctionConfig) -> Result<(), String> {
        let mut g = self.lock();
        let Some(old) = g.config.as_ref() else {
            return Err("not configured".into());
        };
        if (
            &old.function_name,
            &old.handler,
            &old.region,
            &old.code_dir,
            &old.code_device,
        ) != (
            &config.function_name,
            &config.handler,
            &config.region,
            &config.code_dir,
            &config.code_device,
        ) {
            return Err(format!(
                "a configured agent cannot switch to another function or code \
                 ({} {} → {} {})",
                old.function_name, old.handler, config.function_name, config.handler
            ));
        }
        g.function_json = Some(self.function_json(&config, &g.log_stream));
        g.config = Some(config);
        Ok(())
    }

    fn function_json(&self, config: &FunctionConfig, log_stream: &str) -> Vec<u8> {
        let mut shown = config.clone();
        shown.env = runtime::environment(
            &self.opts,
            &self.api_addr.to_string(),
            Some((config, log_stream)),
        );
        serde_json::to_vec(&shown).unwrap_or_default()
    }

    /// Waits until the runtime waits for an invocation, restarting a runtime
    /// that died since the last one. Done(init time in µs).
    pub fn wait_ready(self: &Arc<Self>, link: u64) -> Wait<u64> {
        let mut g = self.lock();
        loop {
            if let Some(f) = &g.init_error {
                return Wait::InitFailed(f.clone());
            }
            if g.link_gen != link {
                return Wait::Superseded;
            }
            if g.runtime_pid.is_none() && g.config.is_some() && g.current.is_none() {
                eprintln!("spore-agent: restarting the runtime");
                self.start_runtime(&mut g);
                continue;
            }
            if g.init_us.is_none() && g.next_waiters > 0 && g.config.is_some() {
                // Its first /next came before the function was known (a
                // provided bootstrap that skips spore/function).
                g.init_us = Some(
                    g.init_started
                        .map_or(0, |t| saturating_u64(t.elapsed().as_micros())),
                );
            }
            if let Some(us) = g.init_us {
                if g.next_waiters > 0 && g.current.is_none() && g.pending.is_none() {
                    return Wait::Done(us);
                }
            }
            g = self.wait(g);
        }
    }

    /// Hands an invocation to the runtime and waits for its outcome, the
    /// runtime's death, or the deadline (then the runtime is killed, as
    /// Lambda does: the next connection starts a fresh one).
    pub fn invoke(&self, mut inv: Invocation) -> Outcome {
        let timeout_s = {
            let g = self.lock();
            g.config.as_ref().map_or(3, |c| c.timeout_s)
        };
        if inv.deadline_ms == 0 {
            inv.deadline_ms = unix_ms() + u64::from(timeout_s) * 1000;
        }
        let id = inv.id.clone();
        let deadline =
            Instant::now() + Duration::from_millis(inv.deadline_ms.saturating_sub(unix_ms()));
        let started = Instant::now();
        let mut g = self.lock();
        g.outcome = None;
        g.pending = Some(inv);
        self.cv.notify_all();
        loop {
            if let Some((oid, _)) = &g.outcome {
                if *oid == id {
                    if let Some((_, mut o)) = g.outcome.take() {
                        if o.log.is_empty() {
                            o.log = self.output.take_log();
                        }
                        return o;
                    }
                }
            }
            if g.runtime_pid.is_none() && g.current.is_none() {
                // It died before taking this invocation (idle, or just now).
                g.pending = None;
                let how = g.last_exit.clone().unwrap_or_default();
                drop(g);
                return Outcome {
                    ok: false,
                    body: error_json(
                        "Runtime.ExitError",
                        &format!("RequestId: {id} Error: Runtime exited with error: {how}"),
                    ),
                    log: self.output.take_log(),
                    handler_ns: 0,
                    runtime_gone: true,
                };
            }
            let now = Instant::now();
            if now >= deadline {
                g.pending = None;
                g.current = None;
                let pid = g.runtime_pid;
                drop(g);
                if let Some(pid) = pid {
                    runtime::kill_group(pid);
                }
                let secs = started.elapsed().as_secs_f64();
                return Outcome {
                    ok: false,
                    body: error_json(
                        "Sandbox.Timedout",
                        &format!("RequestId: {id} Error: Task timed out after {secs:.2} seconds"),
                    ),
                    log: self.output.take_log(),
                    handler_ns: saturating_u64(started.elapsed().as_nanos()),
                    runtime_gone: true,
                };
            }
            g = self
                .cv
                .wait_timeout(g, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    // ---- runtime side (Runtime API) ----

    /// `GET /runtime/spore/function`: blocks until configured.
    pub fn wait_function(&self) -> Result<Vec<u8>, ApiRefusal> {
        let mut g = self.lock();
        let epoch = g.epoch;
        loop {
            if g.epoch != epoch {
                return Err(ApiRefusal::RuntimeGone);
            }
            if let Some(json) = g.function_json.clone() {
                g.preinit_waiting = false;
                return Ok(json);
            }
            if !g.preinit_waiting {
                g.preinit_waiting = true;
                self.cv.notify_all();
            }
            g = self.wait(g);
        }
    }

    /// `GET /invocation/next`: the first one ends the init; blocks until the
    /// host sends an invocation. Returns it with the function's ARN.
    pub fn next(&self) -> Result<(Invocation, String), ApiRefusal> {
        let mut g = self.lock();
        let epoch = g.epoch;
        if g.config.is_some() && g.init_us.is_none() && g.init_error.is_none() {
            let us = g
                .init_started
                .map_or(0, |t| saturating_u64(t.elapsed().as_micros()));
            g.init_us = Some(us);
        }
        g.next_waiters += 1;
        self.cv.notify_all();
        loop {
            if g.epoch != epoch {
                return Err(ApiRefusal::RuntimeGone);
            }
            if g.pending.is_some() {
                if let (Some(inv), Some(c)) = (g.pending.take(), g.config.as_ref()) {
                    let arn = c.invoked_arn();
                    g.next_waiters = g.next_waiters.saturating_sub(1);
                    g.current = Some((inv.clone(), Instant::now()));
                    // Output from before this invocation is not part of its log.
                    self.output.pump();
                    self.output.clear_log();
                    return Ok((inv, arn));
                }
            }
            g = self.wait(g);
        }
    }

    /// The runtime could not deliver an invocation (its connection broke):
    /// it goes back to waiting for the next `/next`.
    pub fn requeue(&self, id: &str) {
        let mut g = self.lock();
        if g.current.as_ref().is_some_and(|(inv, _)| inv.id == id) && g.pending.is_none() {
            g.pending = g.current.take().map(|(inv, _)| inv);
            self.cv.notify_all();
        }
    }

    /// `POST /invocation/{id}/response` and `/error`.
    pub fn post_result(&self, id: &str, ok: bool, body: Vec<u8>) -> Result<(), ApiRefusal> {
        let mut g = self.lock();
        match g.current.take() {
            Some((inv, handed)) if inv.id == id => {
                let outcome = Outcome {
                    ok,
                    body,
                    log: self.output.take_log(),
                    handler_ns: saturating_u64(handed.elapsed().as_nanos()),
                    runtime_gone: false,
                };
                g.outcome = Some((inv.id, outcome));
                self.cv.notify_all();
                Ok(())
            }
            other => {
                g.current = other;
                Err(ApiRefusal::UnknownRequest)
            }
        }
    }

    /// `POST /runtime/init/error`.
    pub fn post_init_error(&self, body: Vec<u8>) -> Result<(), ApiRefusal> {
        let mut g = self.lock();
        if g.init_us.is_some() {
            return Err(ApiRefusal::NotInInit);
        }
        if g.init_error.is_none() {
            g.init_error = Some(InitFailure {
                body,
                log: self.output.take_log(),
                init_ns: elapsed_ns(g.init_started, self.started),
            });
        }
        self.cv.notify_all();
        Ok(())
    }

    /// The running runtime's pid (power-off stops it first).
    pub fn runtime_pid(&self) -> Option<i32> {
        self.lock().runtime_pid
    }
}
