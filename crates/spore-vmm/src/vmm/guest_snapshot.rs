//! Guest-triggered snapshot points: the guest's `SNAPSHOT` signal (see
//! `spore_abi::signal`) served on the VMM's main thread.
//!
//! The asking vCPU has already paused the VM (`RunControl::request_guest_snapshot`)
//! and parks right after its `out`; here the other vCPUs are parked too, the
//! snapshot is written through [`Vmm::create_snapshot`] (the very path of
//! `PUT /snapshot/create`, so full and diff snapshots behave alike), the
//! asking vCPU's result register is set, and the VM resumes or stops as
//! configured. Nothing of this runs on a vCPU thread.

use spore_abi::signal::{SNAPSHOT_FAILED, SNAPSHOT_RESTORED, SNAPSHOT_TAKEN};

use super::Vmm;
use crate::api::ApiError;
use crate::config::{AfterSnapshot, GuestSnapshotConfig};
use crate::snapshot::params::SnapshotCreateParams;
use crate::vm::control::{GuestSnapshotRequest, StopReason};

impl Vmm {
    /// Serves one guest request; never fails (the guest reads the outcome).
    pub(super) fn serve_guest_snapshot(&self, req: GuestSnapshotRequest) {
        let outcome = self.write_guest_snapshot(req);
        let inner = self.lock();
        let Some(vm) = inner.vm() else {
            self.control.finish_guest_snapshot();
            return;
        };
        let tag = req.tag;
        match outcome {
            Ok((after, path)) => {
                tracing::info!(
                    tag,
                    vcpu = req.vcpu,
                    "guest-triggered snapshot written: {path}"
                );
                vm.set_signal_result(req.vcpu, SNAPSHOT_TAKEN);
                self.control.finish_guest_snapshot();
                match after {
                    AfterSnapshot::Resume => {
                        if let Err(e) = vm.resume() {
                            tracing::warn!(tag, "cannot resume after the guest snapshot: {e}");
                        }
                    }
                    AfterSnapshot::Exit => {
                        tracing::info!(tag, "stopping the VM after its snapshot, as configured");
                        self.control.stop(StopReason::GuestExit(0));
                    }
                }
            }
            Err(e) => {
                tracing::warn!(tag, vcpu = req.vcpu, "guest-triggered snapshot failed: {e}");
                vm.set_signal_result(req.vcpu, SNAPSHOT_FAILED);
                self.control.finish_guest_snapshot();
                // The guest learns of the failure and decides; it is not
                // stopped even when `after` is `exit`.
                if let Err(e) = vm.resume() {
                    tracing::warn!(tag, "cannot resume after a failed guest snapshot: {e}");
                }
            }
        }
    }

    /// Pauses every vCPU and writes the snapshot; returns what follows and
    /// the state file's path.
    fn write_guest_snapshot(
        &self,
        req: GuestSnapshotRequest,
    ) -> Result<(AfterSnapshot, String), String> {
        let config = {
            let inner = self.lock();
            let config = inner
                .config
                .guest_snapshots
                .clone()
                .ok_or("guest-triggered snapshots were switched off")?;
            let vm = &inner.built().map_err(|e| e.to_string())?.vm;
            vm.pause().map_err(|e| e.to_string())?;
            // What the asking vCPU reads in a VM restored from this snapshot;
            // the running VM gets its own result afterwards.
            vm.set_signal_result(req.vcpu, SNAPSHOT_RESTORED);
            config
        };
        let params = SnapshotCreateParams::for_guest_tag(&config, req.tag);
        self.create_snapshot(&params).map_err(|e| e.to_string())?;
        Ok((config.after, params.snapshot_path))
    }

    /// `PUT /snapshot/guest-triggered`: valid before and after InstanceStart
    /// (the API has also checked that the directory exists).
    pub fn set_guest_snapshots(&self, config: GuestSnapshotConfig) -> Result<(), ApiError> {
        config.validate().map_err(ApiError::BadRequest)?;
        self.lock().config.guest_snapshots = Some(config);
        self.control.set_guest_snapshots(true);
        Ok(())
    }

    /// `GET /snapshot/guest-triggered`.
    pub fn guest_snapshots(&self) -> Result<GuestSnapshotConfig, ApiError> {
        match &self.lock().config.guest_snapshots {
            Some(c) => Ok(c.clone()),
            None => Err(ApiError::BadRequest(
                "guest-triggered snapshots are not configured: PUT /snapshot/guest-triggered \
                 {\"directory\": ...} first"
                    .into(),
            )),
        }
    }
}
