//! The per-clone hooks: each clone's disks and identity.
//!
//! What a clone needs beyond memory and CPU state: its own view of every
//! read-write disk (a read-only base plus a private copy-on-write overlay)
//! and its own identity (a generation counter the guest is told about, a new
//! vsock CID). Those are built in `devices::virtio::blk::overlay` and
//! `vm::identity` (the "cloneid" work); this module is the one place the
//! clone path calls them.

use std::path::Path;

use super::CloneError;
use crate::config::{DriveConfig, VmConfig};
use crate::vm::Vm;

/// The clone's configuration for one of its source's drives: read-only
/// drives are shared as they are; a writable one becomes the source's image
/// (frozen: the source writes its own overlay since) as a read-only base plus
/// a new private overlay beside the clone's socket.
pub fn clone_drive(drive: &DriveConfig, dir: &Path, name: &str) -> Result<DriveConfig, CloneError> {
    if drive.is_read_only {
        return Ok(drive.clone());
    }
    crate::devices::virtio::blk::overlay::clone_drive(drive, dir, name).map_err(|e| {
        CloneError::Unsupported(format!(
            "cannot give the clone its own copy of drive {:?}: {e}",
            drive.drive_id
        ))
    })
}

/// The vsock CID a clone gets (a fresh one per clone number).
pub fn clone_vsock_cid(config: &VmConfig, index: u64) -> Option<u32> {
    config.vsock.as_ref().map(|v| {
        // CIDs 0-2 and u32::MAX are reserved: wrap within 3..u32::MAX, so
        // clone k of a source with CID c gets c + k.
        let span = u64::from(u32::MAX) - 3;
        let cid = u64::from(v.guest_cid).saturating_sub(3) + index;
        (cid % span + 3) as u32
    })
}

/// Gives a restored, still-paused clone its identity before it resumes: a
/// new generation (the guest reseeds) and its own vsock CID.
pub fn apply_identity(vm: &Vm, generation: u64, vsock_cid: Option<u32>) -> Result<(), CloneError> {
    vm.apply_clone_identity(&crate::vm::identity::CloneIdentity {
        generation,
        vsock_cid,
    })
    .map_err(|e| CloneError::Capture(format!("cannot give the clone its identity: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::VsockConfig;

    #[test]
    fn clone_cids_follow_the_source_and_skip_reserved_ones() {
        let mut config = VmConfig::default();
        assert_eq!(clone_vsock_cid(&config, 1), None);
        config.vsock = Some(VsockConfig {
            guest_cid: 3,
            uds_path: "v.sock".into(),
            vsock_id: None,
        });
        assert_eq!(clone_vsock_cid(&config, 1), Some(4));
        assert_eq!(clone_vsock_cid(&config, 2), Some(5));
        if let Some(v) = config.vsock.as_mut() {
            v.guest_cid = u32::MAX - 1;
        }
        assert_eq!(clone_vsock_cid(&config, 1), Some(3));
    }
}
