//! The per-clone hooks: each clone's disks and identity.
//!
//! What a clone needs beyond memory and CPU state: its own view of every
//! read-write disk (a read-only base plus a private copy-on-write overlay)
//! and its own identity (a generation counter the guest is told about, a new
//! vsock CID). Those are built in `devices::virtio::blk::overlay` and
//! `vm::identity` (the "cloneid" work); this module is the one place the
//! clone path calls them, so wiring them in touches nothing else.
//!
//! Until they are merged: read-only drives are shared as they are (nothing
//! can write them), a read-write drive is refused with a clear error, and a
//! clone keeps its source's identity (same vsock CID, no generation event).

use std::path::Path;

use super::CloneError;
use crate::config::{DriveConfig, VmConfig};
use crate::vm::Vm;

/// The clone's configuration for one of its source's drives.
///
/// MERGE (cloneid): becomes
/// `crate::devices::virtio::blk::overlay::clone_drive(drive, dir, name)`
/// (read-only base + a new private overlay beside the clone's socket),
/// with its error mapped to `CloneError::Unsupported`/`Io`.
pub fn clone_drive(drive: &DriveConfig, dir: &Path, name: &str) -> Result<DriveConfig, CloneError> {
    let _ = (dir, name);
    if drive.is_read_only {
        return Ok(drive.clone());
    }
    Err(CloneError::Unsupported(format!(
        "has the read-write drive {:?} (per-clone disk overlays are not available in this \
         build); attach it read-only to clone this VM",
        drive.drive_id
    )))
}

/// The vsock CID a clone gets (a fresh one per clone number).
pub fn clone_vsock_cid(config: &VmConfig, index: u64) -> Option<u32> {
    config.vsock.as_ref().map(|v| {
        // CIDs 0-2 are reserved; keep clones of one source apart.
        let cid = u64::from(v.guest_cid) + index;
        (cid % (u64::from(u32::MAX) - 3) + 3) as u32
    })
}

/// Gives a restored, still-paused clone its identity before it resumes.
///
/// MERGE (cloneid): becomes
/// `vm.apply_clone_identity(&crate::vm::identity::CloneIdentity { generation, vsock_cid })`
/// with its error mapped to `CloneError::Capture`.
pub fn apply_identity(vm: &Vm, generation: u64, vsock_cid: Option<u32>) -> Result<(), CloneError> {
    tracing::debug!(
        kind = ?vm.kind(),
        generation,
        ?vsock_cid,
        "clone identity: not applied in this build (same CID, no generation event)"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_only_drives_pass_read_write_ones_are_refused() {
        let mut d = DriveConfig {
            drive_id: "root".into(),
            path_on_host: "/x".into(),
            is_root_device: true,
            is_read_only: true,
            partuuid: None,
            cache_type: None,
            io_engine: None,
        };
        let dir = Path::new("/tmp");
        assert_eq!(clone_drive(&d, dir, "c1").unwrap(), d);
        d.is_read_only = false;
        let e = clone_drive(&d, dir, "c1").unwrap_err();
        assert!(e.to_string().contains("read-write drive \"root\""), "{e}");
    }
}
