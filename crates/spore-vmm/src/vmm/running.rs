//! A built VM's controls: pause and resume, Ctrl+Alt+Del, the balloon,
//! hotplug memory and tmem handles, and snapshot create.
//!
//! Requests that only make sense on a VM answer [`super::NotStarted`]
//! before there is one; the balloon, hotplug memory and tmem requests that
//! also have a configuration form fall back to it before start.

use super::{bad, Inner, SnapshotApiError, Vmm};
use crate::api::{
    ApiError, ApiResponse, BalloonHintingStart, BalloonStatsUpdate, BalloonUpdate,
    HotplugMemoryUpdate, TmemInfo, TmemUpdate, VmState,
};
use crate::devices::tmem::PoolStats;
use crate::devices::virtio::balloon::BalloonHandle;
use crate::devices::virtio::mem::MemStatus;
use crate::snapshot;
use crate::snapshot::params::SnapshotCreateParams;

fn no_balloon() -> ApiError {
    bad("no balloon device: configure one with PUT /balloon before InstanceStart")
}

impl Vmm {
    /// `PATCH /vm`. A zygote stays frozen: its clones map its memory.
    pub fn set_vm_state(&self, state: VmState) -> Result<(), ApiError> {
        let mut inner = self.lock();
        let zygote = inner.source.zygote;
        let built = inner.built_mut()?;
        match state {
            VmState::Paused => built.vm.pause().map_err(bad)?,
            VmState::Resumed if zygote => {
                return Err(bad(
                    "this microVM is a zygote: it stays frozen as its clones' template \
                     (clone it with PUT /clone; stop it when no more clones are wanted)",
                ))
            }
            VmState::Resumed => {
                built.vm.resume().map_err(bad)?;
                if let Some(r) = built.restore.as_mut() {
                    r.guest_started();
                }
            }
        }
        Ok(())
    }

    /// `PUT /actions` `SendCtrlAltDel`.
    pub fn send_ctrl_alt_del(&self) -> Result<(), ApiError> {
        self.lock().built()?.vm.send_ctrl_alt_del().map_err(bad)
    }

    /// Writes a snapshot of the paused VM (Firecracker's rule: pause first):
    /// Full, or Diff against the last snapshot this VM wrote or was
    /// restored from. The single entry point for every snapshot.
    pub fn create_snapshot(
        &self,
        p: &SnapshotCreateParams,
    ) -> Result<snapshot::SnapshotInfo, SnapshotApiError> {
        // Refused before the VM is touched: `..`, and a target that is not
        // a new or regular file (a device node, a FIFO, a directory...).
        for path in [&p.snapshot_path, &p.mem_file_path] {
            let path = std::path::Path::new(path);
            crate::files::refuse_dotdot(path).map_err(SnapshotApiError::Path)?;
            crate::files::check_target(path)
                .map_err(|e| SnapshotApiError::Path(format!("{}: {e}", path.display())))?;
        }
        let mut guard = self.lock();
        let Inner { config, phase, .. } = &mut *guard;
        let built = phase.built_mut()?;
        if config.machine.huge_pages_2m()
            && p.layer_kind() == crate::snapshot::format::LayerKind::Diff
        {
            return Err(SnapshotApiError::DiffWithHugePages);
        }
        if let Some(r) = built.restore.as_mut() {
            r.before_snapshot(built.vm.ram())
                .map_err(SnapshotApiError::Restore)?;
        }
        let info = snapshot::create(
            &built.vm,
            config,
            p.layer_kind(),
            std::path::Path::new(&p.snapshot_path),
            std::path::Path::new(&p.mem_file_path),
            p.hash_memory,
            &mut built.chain,
        )?;
        guard.last_snapshot = Some(info.manifest.clone());
        Ok(info)
    }

    /// `PATCH /balloon`: a new target for the running balloon. Before
    /// start Firecracker refuses it (PUT /balloon sets the target then), and
    /// so does spore.
    pub fn patch_balloon(&self, u: &BalloonUpdate) -> Result<(), ApiError> {
        let mut inner = self.lock();
        let h = inner.built()?.vm.balloon().ok_or_else(no_balloon)?;
        h.set_target_mib(u.amount_mib).map_err(bad)?;
        // GET /vm/config shows the current target, as Firecracker's does.
        if let Some(b) = inner.config.balloon.as_mut() {
            b.amount_mib = u.amount_mib;
        }
        Ok(())
    }

    /// `GET /balloon`: the device's status, or its configuration before start.
    pub fn balloon_status(&self) -> Result<ApiResponse, ApiError> {
        let inner = self.lock();
        match inner.vm() {
            Some(vm) => ApiResponse::json(&balloon_of(vm)?.status()),
            None => ApiResponse::json(inner.config.balloon.as_ref().ok_or_else(no_balloon)?),
        }
    }

    /// `GET /balloon/statistics`: only from a running balloon.
    pub fn balloon_statistics(&self) -> Result<ApiResponse, ApiError> {
        let inner = self.lock();
        let stats = balloon_of(&inner.built()?.vm)?.statistics().map_err(bad)?;
        ApiResponse::json(&stats)
    }

    /// `PATCH /balloon/statistics`: a new polling interval for the running
    /// balloon (before start Firecracker refuses it; PUT /balloon sets it).
    pub fn patch_balloon_statistics(&self, u: &BalloonStatsUpdate) -> Result<(), ApiError> {
        let mut inner = self.lock();
        balloon_of(&inner.built()?.vm)?
            .set_stats_interval(u.stats_polling_interval_s)
            .map_err(bad)?;
        if let Some(b) = inner.config.balloon.as_mut() {
            b.stats_polling_interval_s = u.stats_polling_interval_s;
        }
        Ok(())
    }

    /// `PATCH /balloon/hinting/start`: a free page hinting run (running VM
    /// only, as in Firecracker; the guest's driver must have set the device up).
    pub fn start_balloon_hinting(&self, c: &BalloonHintingStart) -> Result<(), ApiError> {
        let inner = self.lock();
        balloon_of(&inner.built()?.vm)?
            .start_hinting(c.acknowledge_on_stop)
            .map_err(bad)
    }

    /// `GET /balloon/hinting/status`: the host's and the guest's last command.
    pub fn balloon_hinting_status(&self) -> Result<ApiResponse, ApiError> {
        let inner = self.lock();
        let status = balloon_of(&inner.built()?.vm)?
            .hinting_status()
            .map_err(bad)?;
        ApiResponse::json(&status)
    }

    /// `PATCH /balloon/hinting/stop`: ends the run; the guest reuses its pages.
    pub fn stop_balloon_hinting(&self) -> Result<(), ApiError> {
        let inner = self.lock();
        balloon_of(&inner.built()?.vm)?.stop_hinting().map_err(bad)
    }

    /// `PATCH /hotplug/memory`: the plugged size the guest should reach.
    pub fn patch_hotplug_memory(&self, u: &HotplugMemoryUpdate) -> Result<(), ApiError> {
        let inner = self.lock();
        let mem = inner.built()?.vm.mem_hotplug().ok_or_else(|| {
            bad("this microVM has no hotplug memory (PUT /hotplug/memory before boot)")
        })?;
        mem.set_requested_mib(u.requested_size_mib).map_err(bad)
    }

    /// `GET /hotplug/memory`: the running device's status. Before start
    /// Firecracker answers 400, and so does spore (GET /vm/config shows the
    /// configured region).
    pub fn hotplug_memory_status(&self) -> Result<MemStatus, ApiError> {
        let inner = self.lock();
        let mem = inner.built()?.vm.mem_hotplug().ok_or_else(|| {
            bad("no hotplug memory is configured (PUT /hotplug/memory before boot)")
        })?;
        Ok(mem.status())
    }

    /// `GET /tmem`: the running pool, or the configured one before start.
    pub fn tmem_info(&self) -> TmemInfo {
        let inner = self.lock();
        let vm = inner.vm();
        if let Some(vm) = vm {
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
            enabled: t.enabled && vm.is_none(),
            stats: PoolStats {
                quota_bytes: t.quota_bytes,
                compression: t.compression,
                ..Default::default()
            },
            timing: None,
        }
    }

    /// `PUT /tmem`: any field before start, only the quota afterwards.
    pub fn update_tmem(&self, update: &TmemUpdate) -> Result<(), ApiError> {
        let mut inner = self.lock();
        let Some(vm) = inner.vm() else {
            inner.config.tmem = update.apply(&inner.config.tmem);
            return Ok(());
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
        Ok(())
    }
}

fn balloon_of(vm: &crate::vm::Vm) -> Result<&BalloonHandle, ApiError> {
    vm.balloon().ok_or_else(no_balloon)
}
