//! This VM as a clone source: `PUT /clone`, `PUT /clone/config`, `GET
//! /clone`, and the guest's `FORK` (served on a `guest-fork` thread while
//! the vCPU that signalled parks).
//!
//! The cloning itself is `clone::source`'s; here the VMM only hands it the
//! VM, the configuration and the [`crate::clone::SourceState`] under one
//! lock, and has the standby pool topped up afterwards (`standby.rs`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::channel;
use std::sync::{Arc, Mutex};

use super::{Inner, Vmm};
use crate::clone::source::{clone_vm, fill_standby, CloneOrder};
use crate::clone::{
    CloneConfig, CloneError, CloneReport, CloneRequest, SourceState, StandbyProcess,
};
use crate::host::{lock, monotonic_ns};
use crate::vm::Vm;

/// Refused guest forks the VMM reports (one line each); more are silent.
const REFUSALS_LOGGED: u64 = 3;

/// `GET /clone`.
#[derive(Debug, serde::Serialize)]
pub struct CloneStatus {
    pub config: CloneConfig,
    pub zygote: bool,
    pub served: u64,
    /// What this VM may still count in its clone tree (see
    /// `clone::limits`).
    pub budget_left: u64,
    pub generation: u64,
    pub template: Option<String>,
    pub template_layers: usize,
    pub standby: usize,
    /// The standby processes by name and pid: a host may set each up
    /// before a request hands it out (the name a clone report gives tells
    /// which one a request used).
    pub standby_processes: Vec<StandbyProcess>,
}

impl Vmm {
    /// Tells the VMM its API socket (clones' sockets go beside it).
    pub fn set_api_socket(&self, path: &std::path::Path) {
        self.lock().source.api_socket = Some(path.to_path_buf());
    }

    /// `PUT /clone`.
    pub fn clone_vm(&self, r: &CloneRequest) -> Result<CloneReport, CloneError> {
        let request_ns = monotonic_ns();
        self.clone_with(|_| CloneOrder {
            count: r.count,
            mode: r.mode,
            socket_dir: r.socket_dir.clone(),
            fork_vcpu: None,
            request_ns,
            network: r.network.clone(),
        })
    }

    /// Serves one clone order (made from the source's settings) on the
    /// built VM, then has the standby pool refilled (off the request path
    /// when a refill thread runs).
    fn clone_with(
        &self,
        order: impl FnOnce(&SourceState) -> CloneOrder,
    ) -> Result<CloneReport, CloneError> {
        let mut inner = self.lock();
        let Inner {
            config,
            phase,
            source,
            ..
        } = &mut *inner;
        let built = phase.built_mut()?;
        // What a snapshot needs first, a template needs too: the pages a
        // userfaultfd handler has not served yet.
        if let Some(r) = built.restore.as_mut() {
            if r.served_externally() {
                return Err(CloneError::Unsupported(
                    "is served by an external userfaultfd handler".into(),
                ));
            }
            r.before_snapshot(built.vm.ram())
                .map_err(CloneError::Capture)?;
        }
        let order = order(source);
        let report = clone_vm(&built.vm, config, (source, &mut built.chain), order)?;
        drop(inner);
        self.refill_standby();
        Ok(report)
    }

    /// `PUT /clone/config`; starts (or stops) standby processes to match.
    pub fn set_clone_config(&self, c: CloneConfig) -> Result<(), CloneError> {
        c.validate()?;
        let mut inner = self.lock();
        let Inner { config, source, .. } = &mut *inner;
        self.set_guest_fork(c.guest_fork);
        source.config = c;
        let extra = source
            .standby
            .len()
            .saturating_sub(source.config.standby as usize);
        for p in source.standby.drain(..extra) {
            p.kill();
        }
        fill_standby(source, config)
    }

    /// `GET /clone`: the standby pool as it is once a refill under way is
    /// done.
    pub fn clone_status(&self) -> CloneStatus {
        self.settle_standby();
        let inner = self.lock();
        let s = &inner.source;
        CloneStatus {
            config: s.config.clone(),
            zygote: s.zygote,
            served: s.served,
            budget_left: s.cap().saturating_sub(s.spent()),
            generation: s.generation,
            template: s.template.as_ref().map(|t| t.id.clone()),
            template_layers: s.template.as_ref().map_or(0, |t| t.layers.len()),
            standby: s.standby.len(),
            standby_processes: StandbyProcess::pool(s),
        }
    }

    /// Lets the guest's signal-port `FORK` clone this VM: a thread serves
    /// the forks (the vCPU that signalled parks meanwhile). Without this,
    /// `FORK` fails at once in the guest.
    /// The thread starts when `guest_fork` is first turned on (a clone,
    /// which may not fork unless its source grants it, never starts it).
    pub fn enable_guest_fork(self: &Arc<Self>) {
        let (tx, rx) = channel::<(u8, u32)>();
        *lock(&self.fork_tx) = Some(tx);
        *lock(&self.fork_thread) = Some((rx, Arc::downgrade(self)));
        if self.guest_fork.load(Ordering::Acquire) {
            self.start_guest_fork_thread();
        }
        if let Some(vm) = self.lock().vm() {
            self.install_fork_handler(vm);
        }
    }

    /// Starts the guest-fork thread if it is wanted and not started yet.
    fn start_guest_fork_thread(&self) {
        let Some((rx, me)) = lock(&self.fork_thread).take() else {
            return;
        };
        let _ = crate::seccomp::spawn(
            crate::seccomp::ThreadKind::Vmm,
            "guest-fork".into(),
            move || {
                while let Ok((vcpu, n)) = rx.recv() {
                    let Some(vmm) = me.upgrade() else { return };
                    vmm.guest_fork(vcpu, n);
                }
            },
        );
    }

    /// Routes the VM's `FORK`s to the guest-fork thread, if there is one,
    /// while the clone config's `guest_fork` is on; while it is off, a
    /// `FORK` fails at once in the guest and the VMM says so (the first
    /// few times).
    pub(super) fn install_fork_handler(&self, vm: &Vm) {
        if let Some(tx) = lock(&self.fork_tx).clone() {
            let tx = Mutex::new(tx);
            let allowed = self.guest_fork.clone();
            let refused = AtomicU64::new(0);
            vm.signal().set_fork_handler(Box::new(move |vcpu, n| {
                if !allowed.load(Ordering::Acquire) {
                    let seen = refused.fetch_add(1, Ordering::Relaxed);
                    if seen < REFUSALS_LOGGED {
                        eprintln!(
                            "spore: guest fork refused (vCPU {vcpu}, count {n}): {}",
                            CloneError::GuestForkOff
                        );
                    }
                    return false;
                }
                lock(&tx).send((vcpu, n)).is_ok()
            }));
        }
    }

    /// Turns the guest's `FORK` on or off (the clone config's `guest_fork`).
    pub(super) fn set_guest_fork(&self, on: bool) {
        self.guest_fork.store(on, Ordering::Release);
        if on {
            self.start_guest_fork_thread();
        }
    }

    /// One guest `FORK` of `n` clones (0: the configured `fork_count`).
    fn guest_fork(&self, vcpu: u8, n: u32) {
        let request_ns = monotonic_ns();
        let order = |source: &SourceState| CloneOrder {
            count: if n == 0 { source.config.fork_count } else { n },
            mode: None,
            socket_dir: None,
            fork_vcpu: Some(vcpu),
            request_ns,
            // A guest FORK of a VM with network interfaces is refused (no
            // namespaces to put its clones in).
            network: None,
        };
        // A failure was said (by `clone::source`) before the guest ran on;
        // or the VM is gone and the FORK has nobody left to answer.
        if let Ok(r) = self.clone_with(order) {
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
        }
    }
}
