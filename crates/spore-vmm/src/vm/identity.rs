//! What makes a clone a different machine from its source: its clone
//! generation, its vsock CID and its own disks.
//!
//! [`Vm::apply_clone_identity`] runs on a restored VM that is still paused:
//! it sets the generation the guest reads (signal port `GENERATION`, and for
//! a unikernel the word at `spore_abi::boot::GENERATION_ADDR`), changes the
//! vsock CID (config space + transport reset, on which Linux re-reads it),
//! tells a Linux guest through a vsock connection to
//! `spore_abi::signal::GENERATION_VSOCK_PORT`, and wakes a `WAIT`. The
//! contract is documented in `spore_abi::signal`.
//!
//! [`Vm::freeze_disks_for_clone`] runs on the source before its state is
//! captured: every writable drive stops writing its image, which becomes the
//! read-only base its clones share.

use std::path::Path;

use serde::{Deserialize, Serialize};
use spore_abi::boot::GENERATION_ADDR;
use spore_abi::signal::GENERATION_VSOCK_PORT;
use vm_memory::{Bytes, GuestAddress};

use super::{GuestKind, RunState, Vm};
use crate::config::CowOverlayConfig;
use crate::devices::virtio::blk::FreezeError;
use crate::devices::virtio::vsock::{Notice, VsockError};

/// The identity a clone gets before it first runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CloneIdentity {
    /// Must differ from the source's (and from every sibling's) for the guest
    /// to notice; 0 is the generation of a booted VM.
    pub generation: u64,
    /// A new vsock CID; `None` keeps the source's.
    pub vsock_cid: Option<u32>,
}

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error(
        "the VM is {0:?}; a clone identity is applied to a restored VM before it resumes (paused)"
    )]
    NotPaused(RunState),
    #[error("vsock_cid {0} was given but the VM has no vsock device")]
    NoVsock(u32),
    #[error("vsock: {0}")]
    Vsock(#[from] VsockError),
    #[error("cannot write the generation into guest memory: {0}")]
    Memory(String),
}

/// A drive that [`Vm::freeze_disks_for_clone`] switched to copy-on-write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrozenDrive {
    pub drive_id: String,
    /// Its new overlay; the drive's image is now the read-only base.
    pub cow_overlay: CowOverlayConfig,
}

impl Vm {
    /// The VM's clone generation (0 for a booted VM).
    pub fn generation(&self) -> u64 {
        self.io.signal.generation()
    }

    /// Gives this (restored, paused) VM a clone's identity; see the module docs.
    pub fn apply_clone_identity(&self, id: &CloneIdentity) -> Result<(), IdentityError> {
        match self.state() {
            // Built and not yet run (a clone about to start), or paused.
            RunState::NotStarted | RunState::Paused => {}
            s => return Err(IdentityError::NotPaused(s)),
        }
        if self.kind == GuestKind::Unikernel {
            self.ram
                .memory()
                .write_obj(id.generation, GuestAddress(GENERATION_ADDR))
                .map_err(|e| IdentityError::Memory(e.to_string()))?;
        }
        match (&self.devices().handles().vsock, id.vsock_cid) {
            (None, Some(cid)) => return Err(IdentityError::NoVsock(cid)),
            (None, None) => {}
            (Some(vsock), cid) => {
                // The reset is owed even with the same CID: the source's host
                // sockets are not this VMM's. Only Linux has a listener for
                // the notice (the unikernel reads the generation word).
                let notice = (self.kind == GuestKind::Linux).then(|| Notice {
                    port: GENERATION_VSOCK_PORT,
                    message: format!("generation {}\n", id.generation).into_bytes(),
                });
                let cid = cid.map_or_else(|| vsock.guest_cid(), u64::from);
                vsock.set_guest_cid(cid, notice)?;
            }
        }
        self.io.signal.set_generation(id.generation);
        tracing::info!(
            generation = id.generation,
            vsock_cid = ?id.vsock_cid,
            "clone identity applied"
        );
        Ok(())
    }

    /// Makes every writable drive of this paused VM stop writing its image:
    /// raw drives get a new overlay file in `dir` (their image becomes the
    /// base its clones share), in-memory overlays move to a file there.
    /// Returns the drives that changed, for the caller's configuration.
    pub fn freeze_disks_for_clone(&self, dir: &Path) -> Result<Vec<FrozenDrive>, FreezeError> {
        let prefix = format!("source-{}", std::process::id());
        let mut changed = Vec::new();
        for drive in &self.devices().handles().drives {
            if let Some(cow_overlay) = drive.freeze(dir, &prefix)? {
                changed.push(FrozenDrive {
                    drive_id: drive.id().to_string(),
                    cow_overlay,
                });
            }
        }
        Ok(changed)
    }
}
