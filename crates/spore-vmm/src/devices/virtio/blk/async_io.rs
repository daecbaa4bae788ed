//! `io_engine: "Async"`: a drive's reads, writes and flushes go through an
//! io_uring (Firecracker's Async engine). The worker submits a request and
//! moves on to the next chain; the kernel signals completions on an eventfd
//! the worker watches, and only then is the status byte written and the
//! chain returned to the guest. Before a snapshot or a reset the worker
//! waits for every request in flight ([`AsyncEngine::drain`]), so a saved
//! queue never holds a chain the kernel is still working on.
//!
//! Guest memory is handed to the kernel as iovecs over the VMM's mapping of
//! guest RAM; buffers the kernel fills are marked dirty for diff snapshots
//! (vm-memory's bitmap does not see the kernel's writes).

use std::collections::HashMap;
use std::os::fd::{AsRawFd, RawFd};

use io_uring::{opcode, types, IoUring};
use vm_memory::bitmap::Bitmap;
use vm_memory::{Bytes, GuestAddress, GuestMemory, Permissions};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::backend::DiskIoError;
use super::request::{Request, RequestKind};
use super::{QUEUE_SIZE, SECTOR_SIZE};
use crate::devices::virtio::GuestMemoryMmap;

/// A request the kernel holds.
struct InFlight {
    head: u16,
    status_addr: GuestAddress,
    /// Bytes the operation must move (0 for a flush).
    expect: u64,
    /// Used length to report on success (data written into guest memory).
    used_ok: u32,
    /// The iovecs the SQE points to: alive until the completion.
    _iovecs: Vec<libc::iovec>,
}

// SAFETY: the iovecs point into guest memory mappings that outlive the
// device's worker; they are only handed to the kernel, never dereferenced.
unsafe impl Send for InFlight {}

pub struct AsyncEngine {
    ring: IoUring,
    /// Written by the kernel on every completion.
    evt: EventFd,
    in_flight: HashMap<u64, InFlight>,
    next_id: u64,
}

impl std::fmt::Debug for AsyncEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncEngine")
            .field("in_flight", &self.in_flight.len())
            .finish()
    }
}

impl AsyncEngine {
    pub fn new() -> std::io::Result<AsyncEngine> {
        let ring = IoUring::new(u32::from(QUEUE_SIZE))?;
        let evt = EventFd::new(EFD_NONBLOCK)?;
        ring.submitter().register_eventfd(evt.as_raw_fd())?;
        Ok(AsyncEngine {
            ring,
            evt,
            in_flight: HashMap::new(),
            next_id: 0,
        })
    }

    /// Readable when completions are waiting.
    pub fn event_fd(&self) -> RawFd {
        self.evt.as_raw_fd()
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Submits `req` (In, Out or a durable Flush) on `fd`, the chain `head`.
    pub fn submit(
        &mut self,
        mem: &GuestMemoryMmap,
        fd: RawFd,
        head: u16,
        req: &Request,
    ) -> Result<(), DiskIoError> {
        let offset = req
            .sector
            .checked_mul(SECTOR_SIZE)
            .ok_or(DiskIoError::Offset(req.sector))?;
        let mut iovecs = Vec::with_capacity(req.data.len());
        let access = match req.kind {
            RequestKind::In => Permissions::Write,
            _ => Permissions::Read,
        };
        for seg in &req.data {
            for slice in mem.get_slices(seg.addr, seg.len as usize, access)? {
                let slice = slice?;
                if req.kind == RequestKind::In {
                    // The kernel's writes bypass vm-memory's dirty bitmap.
                    slice.bitmap().mark_dirty(0, slice.len());
                }
                iovecs.push(libc::iovec {
                    iov_base: slice.ptr_guard_mut().as_ptr().cast(),
                    iov_len: slice.len(),
                });
            }
        }
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        let count = u32::try_from(iovecs.len()).map_err(|_| DiskIoError::Offset(req.sector))?;
        let entry = match req.kind {
            RequestKind::In => opcode::Readv::new(types::Fd(fd), iovecs.as_ptr(), count)
                .offset(offset)
                .build(),
            RequestKind::Out => opcode::Writev::new(types::Fd(fd), iovecs.as_ptr(), count)
                .offset(offset)
                .build(),
            _ => opcode::Fsync::new(types::Fd(fd))
                .flags(types::FsyncFlags::DATASYNC)
                .build(),
        }
        .user_data(id);
        // SAFETY: the iovecs and the guest buffers they describe stay valid
        // until the completion: the iovecs live in `in_flight`, the guest
        // memory mapping outlives the worker, which drains before it stops.
        unsafe { self.ring.submission().push(&entry) }
            .map_err(|_| DiskIoError::Async(std::io::Error::other("submission queue full")))?;
        self.ring.submit().map_err(DiskIoError::Async)?;
        let (expect, used_ok) = match req.kind {
            RequestKind::In => (
                req.data_len,
                u32::try_from(req.data_len).unwrap_or(u32::MAX),
            ),
            RequestKind::Out => (req.data_len, 0),
            _ => (0, 0),
        };
        self.in_flight.insert(
            id,
            InFlight {
                head,
                status_addr: req.status_addr,
                expect,
                used_ok,
                _iovecs: iovecs,
            },
        );
        Ok(())
    }

    /// Finishes every completed request: writes its status byte; returns
    /// `(head, used length)` for each, to go on the used ring.
    pub fn reap(&mut self, mem: &GuestMemoryMmap, tag: &str) -> Vec<(u16, u32)> {
        let _ = self.evt.read();
        let mut done = Vec::new();
        for cqe in self.ring.completion() {
            let Some(req) = self.in_flight.remove(&cqe.user_data()) else {
                tracing::warn!("{tag}: completion for an unknown request");
                continue;
            };
            let res = cqe.result();
            let ok = res >= 0 && res as u64 == req.expect;
            if !ok {
                tracing::warn!(
                    "{tag}: async request failed: {} (wanted {} bytes)",
                    if res < 0 {
                        std::io::Error::from_raw_os_error(-res).to_string()
                    } else {
                        format!("{res} bytes moved")
                    },
                    req.expect
                );
            }
            let (status, used) = if ok {
                (super::request::STATUS_OK, req.used_ok)
            } else {
                (super::request::STATUS_IOERR, 0)
            };
            let used = match mem.write_obj(status, req.status_addr) {
                Ok(()) => used.saturating_add(1),
                Err(e) => {
                    tracing::warn!("{tag}: cannot write status: {e}");
                    used
                }
            };
            done.push((req.head, used));
        }
        done
    }

    /// Waits for every request in flight and finishes them ([`Self::reap`]).
    pub fn drain(&mut self, mem: &GuestMemoryMmap, tag: &str) -> Vec<(u16, u32)> {
        let mut done = Vec::new();
        while !self.in_flight.is_empty() {
            let want = self.in_flight.len();
            match self.ring.submit_and_wait(want) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::error!("{tag}: cannot wait for requests in flight: {e}");
                    break;
                }
            }
            done.extend(self.reap(mem, tag));
        }
        done
    }
}
