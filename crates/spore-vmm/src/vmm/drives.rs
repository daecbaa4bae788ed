//! `PATCH /drives/{id}`: a running VM's drive gets a new image and/or new
//! rate limits (Firecracker's `PartialDrive`). Before boot a drive is
//! changed with `PUT /drives/{id}` instead, as in Firecracker.

use std::path::Path;

use super::{bad, Inner, Vmm};
use crate::api::{ApiError, PartialDrive};

impl Vmm {
    pub fn patch_drive(&self, p: &PartialDrive) -> Result<(), ApiError> {
        let mut guard = self.lock();
        let Inner { config, phase, .. } = &mut *guard;
        let Ok(built) = phase.built() else {
            return Err(bad(
                "The requested operation is not supported before starting the microVM \
                 (change the drive with PUT /drives/{drive_id})",
            ));
        };
        let handle = built
            .vm
            .drives()
            .iter()
            .find(|h| h.id() == p.drive_id)
            .ok_or_else(|| bad(format!("no drive with id {:?}", p.drive_id)))?;
        let drive = config
            .drives
            .iter_mut()
            .find(|d| d.drive_id == p.drive_id)
            .ok_or_else(|| bad(format!("no drive with id {:?}", p.drive_id)))?;
        if let Some(path) = &p.path_on_host {
            if path.is_empty() {
                return Err(bad("path_on_host must not be empty"));
            }
            // Opened before anything changes: a bad path leaves the drive as it was.
            handle.replace_image(Path::new(path)).map_err(bad)?;
            drive.path_on_host.clone_from(path);
        }
        if let Some(limits) = &p.rate_limiter {
            handle.update_rate_limiter(limits);
            // The configuration (GET /vm/config, a snapshot's) shows the limits now in force.
            drive.rate_limiter = handle.rate_limiter();
        }
        Ok(())
    }
}
