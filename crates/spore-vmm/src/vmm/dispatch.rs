//! The API's requests, each mapped to one typed call on the [`Vmm`].
//!
//! The only place that knows [`ApiRequest`]: every arm is one call and its
//! answer (204, or the JSON of what the call returned). What a request does
//! lives in the modules beside this one; errors keep their messages (a
//! [`CloneError`] a client caused is a 400, a host failure a 500).

use super::{bad, Vmm};
use crate::api::{ActionType, ApiError, ApiHandler, ApiRequest, ApiResponse, VersionInfo};
use crate::clone::CloneError;

/// 204 once the call succeeded.
fn done<E: Into<ApiError>>(r: Result<(), E>) -> Result<ApiResponse, ApiError> {
    r.map(|()| ApiResponse::NoContent).map_err(Into::into)
}

/// 200 with the call's value as JSON.
fn json<T: serde::Serialize, E: Into<ApiError>>(r: Result<T, E>) -> Result<ApiResponse, ApiError> {
    ApiResponse::json(&r.map_err(Into::into)?)
}

impl From<CloneError> for ApiError {
    fn from(e: CloneError) -> Self {
        if e.is_client_error() {
            ApiError::BadRequest(e.to_string())
        } else {
            ApiError::Internal(e.to_string())
        }
    }
}

impl ApiHandler for Vmm {
    fn handle(&self, req: ApiRequest) -> Result<ApiResponse, ApiError> {
        use ApiRequest as R;
        match req {
            R::GetInstanceInfo => ApiResponse::json(&self.instance_info()),
            R::GetMachineConfig => ApiResponse::json(&self.machine_config()),
            R::GetVmConfig => ApiResponse::json(&self.vm_config()),
            R::PutBootSource(b) => done(self.set_boot_source(b)),
            R::PutMachineConfig(m) => done(self.set_machine_config(m)),
            R::PatchMachineConfig(p) => done(self.patch_machine_config(&p)),
            R::PutDrive(d) => done(self.put_drive(d)),
            R::PatchDrive(d) => done(self.patch_drive(&d)),
            R::PutNetworkInterface(n) => done(self.put_network_interface(n)),
            R::PatchNetworkInterface(p) => done(self.patch_network_interface(&p)),
            R::PutVsock(v) => done(self.set_vsock(v)),
            R::Action(ActionType::InstanceStart) => done(self.start().map_err(bad)),
            R::Action(ActionType::SendCtrlAltDel) => done(self.send_ctrl_alt_del()),
            R::Action(ActionType::FlushMetrics) => done(self.flush_metrics()),
            R::PatchVm(state) => done(self.set_vm_state(state)),
            R::GetTmem => ApiResponse::json(&self.tmem_info()),
            R::PutTmem(update) => done(self.update_tmem(&update)),
            R::PutBalloon(b) => done(self.set_balloon(b)),
            R::PatchBalloon(u) => done(self.patch_balloon(&u)),
            R::GetBalloon => self.balloon_status(),
            R::GetBalloonStatistics => self.balloon_statistics(),
            R::PatchBalloonStatistics(u) => done(self.patch_balloon_statistics(&u)),
            R::StartBalloonHinting(c) => done(self.start_balloon_hinting(&c)),
            R::GetBalloonHintingStatus => self.balloon_hinting_status(),
            R::StopBalloonHinting => done(self.stop_balloon_hinting()),
            R::PutHotplugMemory(h) => done(self.set_hotplug_memory(h)),
            R::PatchHotplugMemory(u) => done(self.patch_hotplug_memory(&u)),
            R::GetHotplugMemory => json(self.hotplug_memory_status()),
            // 204 as Firecracker answers; the manifest is GET /snapshot/last.
            R::CreateSnapshot(p) => done(self.create_snapshot(&p).map(|_| ()).map_err(bad)),
            R::GetLastSnapshot => json(self.last_snapshot()),
            R::GetVersion => ApiResponse::json(&VersionInfo::current()),
            R::PutLogger(c) => done(self.set_logger(c)),
            R::PutMetrics(c) => done(self.set_metrics(c)),
            R::LoadSnapshot(p) => done(self.load_snapshot_request(&p)),
            R::PutClone(r) => json(self.clone_vm(&r)),
            R::PutCloneConfig(c) => done(self.set_clone_config(c)),
            R::GetClone => ApiResponse::json(&self.clone_status()),
            R::PutGuestSnapshots(c) => done(self.set_guest_snapshots(c)),
            R::GetGuestSnapshots => json(self.guest_snapshots()),
            R::PutEntropy(e) => done(self.set_entropy(e)),
            R::PutSerial(s) => done(self.set_serial(s)),
            R::PutCpuConfig(c) => done(self.set_cpu_config(c)),
            R::GetMmds => json(self.mmds()),
            R::PutMmds(v) => done(self.put_mmds(v)),
            R::PatchMmds(v) => done(self.patch_mmds(&v)),
            R::PutMmdsConfig(c) => done(self.set_mmds_config(c)),
        }
    }
}
