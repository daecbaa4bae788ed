//! Changing a running vsock device's guest CID (a clone gets its own) and
//! telling the guest about it.
//!
//! The VM holds a [`VsockHandle`]; the device, its config space and its
//! muxer share one [`VsockIdentity`]. [`VsockHandle::set_guest_cid`] changes
//! the CID the config space shows at once, then asks the worker for a
//! transport reset: the muxer adopts the new CID, drops every connection and
//! posts VIRTIO_VSOCK_EVENT_TRANSPORT_RESET, on which Linux re-reads the CID
//! from config space (`virtio_vsock_update_guest_cid`) and resets its
//! sockets. A [`Notice`] is then delivered as a host-initiated connection to
//! a guest port, carrying a short message, once the guest has handled the
//! reset event (it re-posted an event buffer): a guest program blocked in
//! `accept()` wakes without polling anything.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use vmm_sys_util::eventfd::EventFd;

use super::VsockError;
use crate::host::lock;

/// A message for a guest port, sent over a connection the VMM opens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notice {
    pub port: u32,
    pub message: Vec<u8>,
}

/// What the device, its config space and its muxer share.
#[derive(Debug)]
pub struct VsockIdentity {
    cid: AtomicU64,
    notices: Mutex<Vec<Notice>>,
}

/// Notices waiting for the worker; more are dropped (a guest that never
/// handles the reset event would otherwise grow this without bound).
const MAX_NOTICES: usize = 16;

impl VsockIdentity {
    pub fn new(cid: u64) -> Self {
        Self {
            cid: AtomicU64::new(cid),
            notices: Mutex::new(Vec::new()),
        }
    }

    pub fn cid(&self) -> u64 {
        self.cid.load(Ordering::Acquire)
    }

    /// Notices queued since the last call.
    pub fn take_notices(&self) -> Vec<Notice> {
        std::mem::take(&mut *lock(&self.notices))
    }
}

/// The VM's handle on its vsock device.
pub struct VsockHandle {
    identity: std::sync::Arc<VsockIdentity>,
    reset_evt: EventFd,
}

impl VsockHandle {
    pub(super) fn new(identity: std::sync::Arc<VsockIdentity>, reset_evt: EventFd) -> Self {
        Self {
            identity,
            reset_evt,
        }
    }

    pub fn guest_cid(&self) -> u64 {
        self.identity.cid()
    }

    /// Gives the guest the CID `cid` and resets the transport (every vsock
    /// connection of the VM ends); then delivers `notice`, if any.
    pub fn set_guest_cid(&self, cid: u64, notice: Option<Notice>) -> Result<(), VsockError> {
        if !(3..u64::from(u32::MAX)).contains(&cid) {
            return Err(VsockError::GuestCid(cid));
        }
        self.identity.cid.store(cid, Ordering::Release);
        if let Some(n) = notice {
            let mut notices = lock(&self.identity.notices);
            if notices.len() < MAX_NOTICES {
                notices.push(n);
            }
        }
        // Served by the worker, or by the next one when the device is
        // activated later (the eventfd stays readable until then).
        self.reset_evt.write(1).map_err(VsockError::EventFd)
    }
}
