//! The source side of a clone: check the request, make (or reuse) the
//! template, start the clone processes, hand each the template, and put the
//! source in its mode (frozen zygote, or running again).
//!
//! Nothing here leaves the source worse off on failure: bad requests are
//! refused before the VM is touched, and a failure after the pause kills the
//! clones of that request and resumes the source (a fresh zygote is undone).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use super::handoff::{send_go, send_handoff, Go, Handoff, MAX_LAYERS};
use super::network::CloneNetwork;
use super::spawn::{spawn, CloneProcess};
use super::{
    identity, limits, CloneError, CloneInfo, CloneMode, CloneReport, SourceState, Template,
    MAX_PER_REQUEST,
};
use crate::config::VmConfig;
use crate::device_manager::PausedDevices;
use crate::host::{lock, monotonic_ns, random_id};
use crate::memory::template::MemoryLayer;
use crate::snapshot::{capture_state, ChainState};
use crate::vm::{RunState, Vm};

/// One clone request, after the API or a guest `FORK` asked for it.
pub struct CloneOrder {
    pub count: u32,
    pub mode: Option<CloneMode>,
    pub socket_dir: Option<String>,
    /// The vCPU that signalled `FORK` (a guest-triggered clone).
    pub fork_vcpu: Option<u8>,
    pub request_ns: u64,
    /// Each clone's network namespace and addresses (`PUT /clone`'s `network`).
    pub network: Option<CloneNetwork>,
}

/// Refuses what cannot be cloned, before anything is touched.
fn check(
    vm: &Vm,
    config: &VmConfig,
    st: &SourceState,
    order: &CloneOrder,
) -> Result<CloneMode, CloneError> {
    match vm.state() {
        RunState::Running | RunState::Paused => {}
        RunState::NotStarted => return Err(crate::vm::NotStarted.into()),
        RunState::Stopped => return Err(CloneError::NotRunning("stopped")),
    }
    // A template is the source's memory mapped privately in every clone;
    // hugetlbfs pages would be copied per clone out of the host's small
    // huge page pool (nothing shared), and a huge-page snapshot restores
    // only through userfaultfd, never by mapping the template.
    if config.machine.huge_pages_2m() {
        return Err(CloneError::BadRequest(
            "a microVM with huge_pages \"2M\" cannot be cloned: clones share the source's \
             memory copy-on-write from a mapped template, but hugetlbfs memory cannot be \
             restored by mapping a file, and each clone would take all of its memory as new \
             reserved 2 MiB pages from the host's huge page pool"
                .into(),
        ));
    }
    // A guest FORK with count 0 (and fork_count 0) only makes the template.
    if order.count == 0 && order.fork_vcpu.is_none() {
        return Err(CloneError::BadRequest(
            "count must be at least 1 clone".into(),
        ));
    }
    if order.count > MAX_PER_REQUEST {
        return Err(CloneError::BadRequest(format!(
            "count {} is more than the {MAX_PER_REQUEST} clones one request may start",
            order.count
        )));
    }
    // One budget for the whole clone tree (see `limits`).
    let (cap, spent) = (st.cap(), st.spent());
    if spent >= cap {
        return Err(CloneError::CapReached { served: spent, cap });
    }
    if spent.saturating_add(u64::from(order.count)) > cap {
        return Err(CloneError::OverCap {
            count: order.count,
            left: cap - spent,
            served: spent,
            cap,
        });
    }
    if config.memory_hotplug.is_some() {
        return Err(CloneError::Unsupported(
            "has virtio-mem hotplug memory".into(),
        ));
    }
    if let Some(n) = vm.tmem().stats().map(|s| s.objects).filter(|&n| n > 0) {
        return Err(CloneError::Unsupported(format!(
            "holds {n} objects in its tmem pool"
        )));
    }
    // A tap is held by one process: clones of a VM with network
    // interfaces each reopen theirs in their own namespace.
    let network_refused =
        |e: super::network::CloneNetworkError| CloneError::BadRequest(e.to_string());
    super::network::require_namespace(config, order.network.as_ref()).map_err(network_refused)?;
    if let Some(n) = &order.network {
        let first = st.served + 1;
        n.check(config, first..first + u64::from(order.count))
            .map_err(network_refused)?;
    }
    check_host_limit(st, order.count)?;
    if st.zygote {
        if order.mode == Some(CloneMode::Continue) {
            return Err(CloneError::BadRequest(
                "this VM is already a zygote (a frozen template); it cannot continue".into(),
            ));
        }
        return Ok(CloneMode::Zygote);
    }
    Ok(order.mode.unwrap_or(st.config.mode))
}

/// Refuses `count` more clone processes over the host's limit, if one is
/// set (standby processes of this VM that a request would use are no new
/// processes).
fn check_host_limit(st: &SourceState, count: u32) -> Result<(), CloneError> {
    let Some((limit, source_of)) = limits::host_limit(st.config.host_max_clones) else {
        return Ok(());
    };
    let running = limits::count_clone_processes(Path::new("/proc"));
    let new = u64::from(count).saturating_sub(st.standby.len() as u64);
    if new > 0 && running.saturating_add(new) > limit {
        return Err(CloneError::HostLimit {
            running,
            count: new,
            limit,
            source_of,
        });
    }
    Ok(())
}

/// Where clones' sockets and logs go.
pub fn clone_dir(st: &SourceState, asked: Option<&str>) -> PathBuf {
    if let Some(d) = asked.or(st.config.socket_dir.as_deref()) {
        return PathBuf::from(d);
    }
    st.api_socket
        .as_deref()
        .and_then(Path::parent)
        .filter(|p| !p.as_os_str().is_empty())
        .map(Path::to_path_buf)
        .unwrap_or_else(std::env::temp_dir)
}

/// The prefix of clone names: this VMM's socket name without `.sock`.
fn stem(st: &SourceState) -> String {
    st.api_socket
        .as_deref()
        .and_then(Path::file_stem)
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "spore".into())
}

pub fn next_name(st: &mut SourceState) -> String {
    st.names += 1;
    format!("{}-c{}", stem(st), st.names)
}

/// Pauses the VM, captures its state and freezes its memory as a template.
/// In zygote mode the devices stay stopped (the VM never runs again); in
/// continue mode they are restarted and RAM is re-mapped privately.
fn make_template(
    vm: &Vm,
    config: &mut VmConfig,
    (st, chain): (&mut SourceState, &mut ChainState),
    mode: CloneMode,
    fork_vcpu: Option<u8>,
    dir: &Path,
) -> Result<Arc<Template>, CloneError> {
    vm.pause().map_err(|e| CloneError::Capture(e.to_string()))?;
    // The source's devices, stopped while the template is made.
    let devices =
        PausedDevices::new(vm.devices()).map_err(|e| CloneError::Capture(e.to_string()))?;
    let result = (|| {
        // The source stops writing its disk images (they become the clones'
        // shared bases): each writable drive goes on in a new overlay of its
        // own, which the configuration records so clones derive theirs.
        identity::freeze_disks(vm, config, dir)
            .map_err(|e| CloneError::Capture(format!("cannot freeze the disks: {e}")))?;
        let config = &*config;
        let state =
            capture_state(vm, config, &devices).map_err(|e| CloneError::Capture(e.to_string()))?;
        let state = bincode::serialize(&state).map_err(|e| CloneError::Capture(e.to_string()))?;
        let ram = vm.ram();
        let mut layers: Vec<MemoryLayer> = Vec::new();
        if ram.is_private() {
            if st.ram_layers.is_empty() {
                // A VM restored from snapshot files (never cloned yet): the
                // files it was mapped from are the template's first layers.
                layers.extend(ram.mapped_from().iter().cloned());
            } else {
                layers.extend(st.ram_layers.iter().cloned());
            }
            if let Some(overlay) = ram.private_layer()? {
                // The pages were just copied: map the copy instead of
                // keeping them twice.
                ram.remap_private(&overlay)?;
                layers.push(overlay);
            }
        } else {
            let base = ram.base_layer()?;
            if mode == CloneMode::Continue {
                ram.remap_private(&base)?;
            }
            layers.push(base);
        }
        if layers.len() > MAX_LAYERS {
            return Err(CloneError::BadRequest(format!(
                "this VM's memory is {} layers deep (a clone of a clone ...); at most \
                 {MAX_LAYERS} are supported",
                layers.len()
            )));
        }
        if ram.is_private() {
            st.ram_layers = layers.clone();
        }
        let chain = chain
            .for_clone(vm, config)
            .map_err(|e| CloneError::Capture(e.to_string()))?;
        Ok(Arc::new(Template {
            id: random_id(),
            layers,
            state: Arc::new(state),
            mem_size: ram.size(),
            fork_vcpu,
            chain,
            vsock_cid: vm
                .vsock()
                .and_then(|dev| u32::try_from(dev.guest_cid()).ok()),
        }))
    })();
    if result.is_ok() && mode == CloneMode::Zygote {
        // A zygote never runs again: its devices stay stopped.
        devices.keep_stopped();
    }
    result
}

/// Serves one clone request; see the module docs.
pub fn clone_vm(
    vm: &Vm,
    config: &mut VmConfig,
    (st, chain): (&mut SourceState, &mut ChainState),
    order: CloneOrder,
) -> Result<CloneReport, CloneError> {
    let mode = match check(vm, config, st, &order) {
        Ok(m) => m,
        Err(e) => {
            // A guest's FORK refused: it reads the failure and runs on.
            // The vCPU asks for the pause itself after signalling: wait
            // until it parked, or a resume now would come before its pause.
            if let Some(v) = order.fork_vcpu {
                let parked = vm.pause().is_ok();
                fork_failed(vm, v, &e);
                if parked && !st.zygote {
                    let _ = vm.resume();
                }
            }
            return Err(e);
        }
    };
    let dir = clone_dir(st, order.socket_dir.as_deref());
    std::fs::create_dir_all(&dir).map_err(|source| CloneError::Io {
        what: "create the clone socket directory",
        source,
    })?;
    let was_running = vm.state() == RunState::Running || order.fork_vcpu.is_some();
    let t0 = Instant::now();
    let (template, fresh) = match (&st.template, st.zygote) {
        (Some(t), true) => (t.clone(), false),
        _ => match make_template(vm, config, (st, chain), mode, order.fork_vcpu, &dir) {
            Ok(t) => (t, true),
            Err(e) => {
                if let Some(v) = order.fork_vcpu {
                    fork_failed(vm, v, &e);
                }
                if was_running {
                    let _ = vm.resume();
                }
                return Err(e);
            }
        },
    };
    let template_us = u64::try_from(t0.elapsed().as_micros()).unwrap_or(u64::MAX);
    if mode == CloneMode::Zygote {
        st.zygote = true;
    }
    let started = start_clones(config, st, &template, &order, &dir);
    match started {
        Ok((clones, granted)) => {
            st.served += clones.len() as u64;
            st.granted = st.granted.saturating_add(granted);
            st.template = Some(template.clone());
            if mode == CloneMode::Continue {
                if let Some(v) = order.fork_vcpu {
                    vm.signal().set_pending_result(v, 0);
                }
                if was_running {
                    let _ = vm.resume();
                }
            }
            Ok(CloneReport {
                template: template.id.clone(),
                mode,
                request_ns: order.request_ns,
                template_us,
                served: st.served,
                max_clones: st.cap(),
                clones,
                standby_processes: super::StandbyProcess::pool(st),
            })
        }
        Err(e) => {
            if fresh && mode == CloneMode::Zygote {
                // Undo the zygote: restart the devices and let it run.
                st.zygote = false;
                for t in vm.virtio() {
                    lock(t).resume();
                }
            }
            if let Some(v) = order.fork_vcpu {
                fork_failed(vm, v, &e);
            }
            // An older zygote stays frozen; anything else runs on.
            if was_running && (fresh || !st.zygote) {
                let _ = vm.resume();
            }
            Err(e)
        }
    }
}

/// A guest's `FORK` that made no clone: the VMM says why (before the
/// guest runs again, so the line does not land inside the guest's output
/// on a shared console), and the vCPU reads the failure.
fn fork_failed(vm: &Vm, vcpu: u8, e: &CloneError) {
    if !matches!(e, CloneError::NotStarted(_)) {
        eprintln!("spore: guest fork failed: {e}");
    }
    vm.signal()
        .set_pending_result(vcpu, spore_abi::signal::FORK_FAILED);
}

/// Starts `order.count` clones of `template` (standby processes first),
/// waits until each runs and serves its API; returns them and the budget
/// handed to them. On any failure the clones of this request are stopped.
fn start_clones(
    config: &VmConfig,
    st: &mut SourceState,
    template: &Template,
    order: &CloneOrder,
    dir: &Path,
) -> Result<(Vec<CloneInfo>, u64), CloneError> {
    let shares = limits::shares(
        st.cap().saturating_sub(st.spent()),
        order.count,
        st.config.clone_budget,
        st.config.clones_may_fork,
    )
    .ok_or_else(|| CloneError::BadRequest("the clone tree's budget is spent".into()))?;
    // Drop standby processes that died (reaped here).
    st.standby.retain_mut(|p| p.child.running());
    let mut procs: Vec<(CloneProcess, bool)> = Vec::new();
    let result = (|| {
        // Each process gets its template as soon as it exists, so that it
        // restores and starts on another CPU while the next is spawned
        // (a batch of a thousand is not held back until the last spawn).
        for (i, &budget) in shares.iter().enumerate() {
            let standby = st.standby.iter().position(|p| p.dir == dir);
            let (p, from_standby) = match standby {
                Some(i) => (st.standby.swap_remove(i), true),
                None => {
                    let name = next_name(st);
                    let prep = prepare_for(config);
                    (spawn(dir, &name, st.config.marks, prep)?, false)
                }
            };
            let index = st.served + 1 + i as u64;
            procs.push((p, from_standby));
            let p = &procs[procs.len() - 1].0;
            let sent = if p.prestarted.as_deref() == Some(template.id.as_str()) {
                let go = Go {
                    index,
                    budget,
                    request_ns: order.request_ns,
                };
                send_go(&p.sock, &go)
            } else {
                let at = (index, budget, order.request_ns);
                let mut handoff = clone_handoff(config, st, template, p, at, false)?;
                handoff.network.clone_from(&order.network);
                send_handoff(&p.sock, &handoff, &template.layers)
            };
            sent.map_err(|e| CloneError::Child {
                name: p.name.clone(),
                detail: format!("cannot send the template: {e}"),
                log: p.log.display().to_string(),
            })?;
        }
        tracing::debug!(
            "{} handoffs sent {} µs after the request",
            procs.len(),
            monotonic_ns().saturating_sub(order.request_ns) / 1000
        );
        let mut out = Vec::new();
        for (i, (p, standby)) in procs.iter().enumerate() {
            let ready = p.wait_ready()?;
            out.push(CloneInfo {
                index: st.served + 1 + i as u64,
                name: p.name.clone(),
                socket: p.socket.display().to_string(),
                pid: ready.pid,
                log: p.log.display().to_string(),
                start_ns: ready.start_ns,
                standby: *standby,
            });
        }
        Ok(out)
    })();
    match result {
        Ok(out) => {
            for (p, _) in procs {
                p.detach();
            }
            Ok((out, shares.iter().sum()))
        }
        Err(e) => {
            for (p, _) in procs {
                p.kill();
            }
            Err(e)
        }
    }
}

/// What a clone process of this VM prepares ahead (none where a clone
/// could not use it).
fn prepare_for(config: &VmConfig) -> Option<(u64, u8)> {
    let m = &config.machine;
    let vcpus = u8::try_from(m.vcpu_count).ok()?;
    let usable = !m.track_dirty_pages && config.memory_hotplug.is_none();
    usable.then_some((m.mem_bytes(), vcpus))
}

/// The handoff for clone process `p`, clone number `index` with its
/// share of the budget, asked for at `request_ns` (`at`).
fn clone_handoff(
    config: &VmConfig,
    st: &SourceState,
    template: &Template,
    p: &CloneProcess,
    (index, budget, request_ns): (u64, u64, u64),
    prestart: bool,
) -> Result<Handoff, CloneError> {
    let dir = &p.dir;
    let mut cfg = config.clone();
    if let Some(v) = cfg.vsock.as_mut() {
        v.uds_path = dir.join(format!("{}.vsock", p.name)).display().to_string();
        // The CID the template's device state carries (see `Template`).
        v.guest_cid = template.vsock_cid.unwrap_or(v.guest_cid);
    }
    cfg.drives = config
        .drives
        .iter()
        .map(|d| identity::clone_drive(d, dir, &p.name))
        .collect::<Result<_, _>>()?;
    Ok(Handoff {
        template_id: template.id.clone(),
        name: p.name.clone(),
        index,
        generation: st.generation + 1,
        config_json: serde_json::to_string(&cfg).map_err(|e| CloneError::Capture(e.to_string()))?,
        state: template.state.to_vec(),
        layer_runs: template.layers.iter().map(|l| l.runs.clone()).collect(),
        fork_vcpu: template.fork_vcpu,
        // A clone may fork only if this VM's settings grant it.
        clone_config: super::CloneConfig {
            standby: 0,
            guest_fork: st.config.clones_may_fork,
            ..st.config.clone()
        },
        budget,
        request_ns,
        prestart,
        network: None,
        chain: template.chain.clone(),
    })
}

/// Tops the standby pool up to the configured size; standby processes
/// prepare a VM of this one's size.
pub fn fill_standby(st: &mut SourceState, config: &VmConfig) -> Result<(), CloneError> {
    let dir = clone_dir(st, None);
    std::fs::create_dir_all(&dir).map_err(|source| CloneError::Io {
        what: "create the clone socket directory",
        source,
    })?;
    // Standby processes prepared for another size (the machine config
    // changed before boot) or directory are replaced.
    let want = prepare_for(config);
    let (keep, stale): (Vec<_>, Vec<_>) = st
        .standby
        .drain(..)
        .partition(|p| p.dir == dir && p.prepared_for == want);
    st.standby = keep;
    for p in stale {
        p.kill();
    }
    while st.standby.len() < st.config.standby as usize {
        if let Err(e) = check_host_limit(
            st,
            u32::try_from(st.standby.len())
                .unwrap_or(u32::MAX)
                .saturating_add(1),
        ) {
            tracing::warn!("standby processes: {e}");
            break;
        }
        let name = next_name(st);
        let p = spawn(&dir, &name, st.config.marks, want)?;
        st.standby.push(p);
    }
    // A zygote's template never changes: standby processes restore a clone
    // of it ahead, paused, so that a clone request only gives it its number
    // and starts it.
    // Not with network interfaces: a clone's taps are opened in the
    // namespace of its number, known only with the go.
    let restore_ahead = config.network_interfaces.is_empty();
    if let (true, true, Some(t)) = (restore_ahead, st.zygote, st.template.clone()) {
        let mut standby = std::mem::take(&mut st.standby);
        for p in standby.iter_mut() {
            if p.prestarted.as_deref() == Some(t.id.as_str()) {
                continue;
            }
            // Number and budget come with the go.
            let sent = clone_handoff(config, st, &t, p, (0, 0, 0), true).and_then(|h| {
                send_handoff(&p.sock, &h, &t.layers).map_err(|e| CloneError::Child {
                    name: p.name.clone(),
                    detail: e.to_string(),
                    log: p.log.display().to_string(),
                })
            });
            match sent {
                Ok(()) => p.prestarted = Some(t.id.clone()),
                Err(e) => tracing::warn!("cannot restore standby clone {} ahead: {e}", p.name),
            }
        }
        st.standby = standby;
    }
    Ok(())
}
