//! Snapshot state of the vsock device: its guest CID. Connections are not
//! saved: a restored device resets the guest's transport
//! ([`crate::devices::virtio::VirtioDevice::restored`]), as a live
//! migration would, and host sockets are this process's own.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{Vsock, VsockError};
use crate::persist::Persist;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VsockState {
    pub guest_cid: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum VsockStateError {
    #[error(transparent)]
    Device(#[from] VsockError),
    #[error("the snapshot's vsock has guest CID {saved}, this VM's configuration {actual}")]
    Cid { saved: u64, actual: u64 },
}

impl Persist for Vsock {
    type State = VsockState;
    /// The configured guest CID and host Unix socket path.
    type Args = (u64, PathBuf);
    type Error = VsockStateError;

    fn save(&self) -> VsockState {
        VsockState {
            guest_cid: self.guest_cid(),
        }
    }

    fn restore((cid, uds_path): (u64, PathBuf), state: &VsockState) -> Result<Self, Self::Error> {
        if cid != state.guest_cid {
            return Err(VsockStateError::Cid {
                saved: state.guest_cid,
                actual: cid,
            });
        }
        Ok(Vsock::new(cid, uds_path)?)
    }
}
