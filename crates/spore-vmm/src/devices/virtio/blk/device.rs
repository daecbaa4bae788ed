//! The virtio-blk device model.
//!
//! [`Block`] describes the drive to the transport (features, config space)
//! and, once activated, serves its queue on a [`QueueServer`] worker thread;
//! [`BlockRequests`] runs each validated request against the image.

use std::os::fd::RawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_F_BLK_SIZE, VIRTIO_BLK_F_FLUSH, VIRTIO_BLK_F_RO, VIRTIO_BLK_F_SEG_MAX,
};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use virtio_queue::{DescriptorChain, Queue};
use vm_memory::Bytes;

use super::async_io::AsyncEngine;
use super::backend::{DiskImage, DiskIoError};
use super::disk::{BlockHandle, Disk, LiveDevice};
use super::overlay::CowDisk;
use super::request::{self, DiskLimits, Request, RequestKind};
use super::{BlockError, ID_BYTES, QUEUE_SIZE, SECTOR_SIZE};
use crate::config::DriveConfig;
use crate::devices::virtio::queue_server::{ChainHandler, QueueServer, Served};
use crate::devices::virtio::worker::Worker;
use crate::devices::virtio::{
    device_type, ActivateContext, ActivateError, GuestMemoryMmap, VirtioDevice,
};
use crate::host::lock;
use crate::rate_limiter::RateLimiter;

/// Size of `struct virtio_blk_config` up to and including `blk_size`.
const CONFIG_LEN: usize = 24;

/// A virtio-blk device backed by a raw image file.
pub struct Block {
    id: String,
    disk: Arc<Mutex<Disk>>,
    durable_flush: bool,
    avail_features: u64,
    config: [u8; CONFIG_LEN],
    /// Shared with the worker (which consumes it) and the handle (PATCH).
    limiter: Arc<Mutex<RateLimiter>>,
    /// The activated device's interrupt and queue kick, for the handle.
    live: Arc<Mutex<Option<LiveDevice>>>,
    /// `io_engine: "Async"`: the io_uring, lent to the worker while active.
    engine: Option<AsyncEngine>,
    async_io: bool,
    worker: Option<Worker<(Queue, BlockRequests)>>,
}

impl Block {
    /// Opens the image at `path`. `id` is the drive id, which the guest reads
    /// back as its serial (first 20 bytes). With `durable_flush`, a guest
    /// FLUSH waits for the data to reach the host's storage (fdatasync).
    pub fn new(
        id: String,
        path: &Path,
        read_only: bool,
        durable_flush: bool,
    ) -> Result<Block, BlockError> {
        let disk = DiskImage::open(path, read_only, durable_flush)?;
        Self::with_disk(id, Disk::Raw(disk), durable_flush, None)
    }

    /// Opens the drive `d` describes: its image, or its image as the
    /// read-only base of the copy-on-write overlay `d.cow_overlay`.
    pub fn open(d: &DriveConfig) -> Result<Block, BlockError> {
        let durable = d.flush_is_durable();
        let disk = match &d.cow_overlay {
            None => Disk::Raw(DiskImage::open(
                Path::new(&d.path_on_host),
                d.is_read_only,
                durable,
            )?),
            Some(o) => Disk::cow(CowDisk::open(Path::new(&d.path_on_host), o, durable)?),
        };
        let mut block =
            Self::with_disk(d.drive_id.clone(), disk, durable, d.rate_limiter.as_ref())?;
        // A copy-on-write disk moves data through its own bounce buffer,
        // block by block: it stays on the Sync path (so does a raw drive
        // frozen to copy-on-write for cloning, from then on).
        if d.io_engine.as_deref() == Some("Async") && d.cow_overlay.is_none() {
            block.engine = Some(AsyncEngine::new().map_err(BlockError::Async)?);
            block.async_io = true;
        }
        Ok(block)
    }

    fn with_disk(
        id: String,
        disk: Disk,
        durable_flush: bool,
        limits: Option<&crate::config::RateLimiterConfig>,
    ) -> Result<Block, BlockError> {
        let limiter = RateLimiter::new(limits).map_err(BlockError::Timer)?;
        let read_only = disk.read_only();
        let mut avail_features = 1 << VIRTIO_F_VERSION_1
            | 1 << VIRTIO_RING_F_EVENT_IDX
            | 1 << VIRTIO_BLK_F_FLUSH
            | 1 << VIRTIO_BLK_F_SEG_MAX
            | 1 << VIRTIO_BLK_F_BLK_SIZE;
        if read_only {
            avail_features |= 1 << VIRTIO_BLK_F_RO;
        }
        // struct virtio_blk_config: capacity (le64), size_max (le32),
        // seg_max (le32), geometry (4 bytes), blk_size (le32).
        let mut config = [0u8; CONFIG_LEN];
        // The capacity never changes, not even when the disk is frozen to
        // copy-on-write (the overlay has its base's size).
        config[0..8].copy_from_slice(&disk.capacity_sectors().to_le_bytes());
        // Header and status take two descriptors of a chain.
        config[12..16].copy_from_slice(&(u32::from(QUEUE_SIZE) - 2).to_le_bytes());
        #[allow(clippy::cast_possible_truncation, reason = "SECTOR_SIZE is 512")]
        let sector_size = SECTOR_SIZE as u32;
        config[20..24].copy_from_slice(&sector_size.to_le_bytes());
        Ok(Block {
            id,
            disk: Arc::new(Mutex::new(disk)),
            durable_flush,
            avail_features,
            config,
            limiter: Arc::new(Mutex::new(limiter)),
            live: Arc::new(Mutex::new(None)),
            engine: None,
            async_io: false,
            worker: None,
        })
    }

    /// The drive's rate limiter (its snapshot state, a restore's).
    pub fn limiter(&self) -> &Arc<Mutex<RateLimiter>> {
        &self.limiter
    }

    /// Replaces the rate limiter (a restore puts back the saved one).
    pub fn set_limiter(&mut self, limiter: RateLimiter) {
        *lock(&self.limiter) = limiter;
    }

    /// A handle on this drive's disk for the VM (freezing to copy-on-write).
    pub fn handle(&self) -> BlockHandle {
        BlockHandle::new(
            self.id.clone(),
            self.disk.clone(),
            self.durable_flush,
            self.limiter.clone(),
            self.live.clone(),
        )
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn capacity_sectors(&self) -> u64 {
        lock(&self.disk).capacity_sectors()
    }

    /// Whether the guest sees a read-only disk (fixed at creation).
    pub fn read_only(&self) -> bool {
        self.avail_features & (1 << VIRTIO_BLK_F_RO) != 0
    }

    /// The image file (a copy-on-write disk's base).
    pub fn path(&self) -> PathBuf {
        lock(&self.disk).path().to_path_buf()
    }

    fn stop_worker(&mut self) {
        *lock(&self.live) = None;
        if let Some(worker) = self.worker.take() {
            match worker.stop() {
                // The worker drained its io_uring before it stopped.
                Some((_, handler)) => self.engine = handler.engine,
                None => tracing::error!("virtio-blk {}: worker thread panicked", self.id),
            }
        }
    }
}

impl VirtioDevice for Block {
    fn device_type(&self) -> u32 {
        device_type::BLOCK
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE]
    }

    fn avail_features(&self) -> u64 {
        self.avail_features
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        // The capacity is read live: PATCH /drives may swap the image.
        let mut config = self.config;
        config[0..8].copy_from_slice(&lock(&self.disk).capacity_sectors().to_le_bytes());
        read_config_bytes(&config, offset, data);
    }

    fn activate(&mut self, ctx: ActivateContext) -> Result<(), ActivateError> {
        self.stop_worker();
        let mut id_bytes = [0u8; ID_BYTES];
        let n = self.id.len().min(ID_BYTES);
        id_bytes[..n].copy_from_slice(&self.id.as_bytes()[..n]);
        let engine = self.engine.take();
        if self.async_io && engine.is_none() {
            return Err(ActivateError::Device(format!(
                "virtio-blk {}: its io_uring was lost with a worker that panicked",
                self.id
            )));
        }
        let handler = BlockRequests {
            engine,
            disk: self.disk.clone(),
            limiter: self.limiter.clone(),
            timer_fd: lock(&self.limiter).timer_fd(),
            id_bytes,
            tag: format!("virtio-blk {}", self.id),
        };
        let live = LiveDevice {
            interrupt: ctx.interrupt.clone(),
            kick: ctx
                .queue_events
                .first()
                .map(|e| e.try_clone())
                .transpose()
                .map_err(ActivateError::Worker)?,
        };
        let server =
            QueueServer::from_single_queue(ctx, handler, format!("virtio-blk {}", self.id))?;
        self.worker = Some(server.spawn("blk", &self.id)?);
        *lock(&self.live) = Some(live);
        Ok(())
    }

    fn reset(&mut self) {
        self.stop_worker();
    }

    fn quiesce(&mut self) -> Result<Vec<Queue>, ActivateError> {
        *lock(&self.live) = None;
        let worker = self.worker.take().ok_or_else(|| {
            ActivateError::Device(format!("virtio-blk {} is not active", self.id))
        })?;
        // The worker finishes the request it is on, and waits for every
        // request its io_uring holds (Async): every completed write has
        // reached the backing file (not necessarily the disk: the guest
        // flushes when it needs durability), every chain is on the used ring.
        let (queue, handler) = worker.stop().ok_or_else(|| {
            ActivateError::Device(format!("virtio-blk {}: worker panicked", self.id))
        })?;
        self.engine = handler.engine;
        Ok(vec![queue])
    }
}

/// Copies `config[offset..]` into `data`, zero-filling bytes past its end.
pub(crate) fn read_config_bytes(config: &[u8], offset: u64, data: &mut [u8]) {
    data.fill(0);
    let Ok(start) = usize::try_from(offset) else {
        return;
    };
    if let Some(src) = config.get(start..) {
        let n = src.len().min(data.len());
        data[..n].copy_from_slice(&src[..n]);
    }
}

/// Serves block requests on the worker thread.
struct BlockRequests {
    engine: Option<AsyncEngine>,
    disk: Arc<Mutex<Disk>>,
    limiter: Arc<Mutex<RateLimiter>>,
    /// The limiter's timer (fixed for the limiter's life).
    timer_fd: RawFd,
    id_bytes: [u8; ID_BYTES],
    /// Names the drive in log messages.
    tag: String,
}

impl ChainHandler for BlockRequests {
    fn serve(&mut self, mem: &GuestMemoryMmap, chain: DescriptorChain<&GuestMemoryMmap>) -> Served {
        let head = chain.head_index();
        let limits = {
            let disk = lock(&self.disk);
            DiskLimits {
                capacity_sectors: disk.capacity_sectors(),
                read_only: disk.read_only(),
            }
        };
        let (status_addr, status, written) = match request::parse(chain, mem, limits) {
            Ok(req) => {
                // Firecracker's accounting: every request is one op; reads
                // and writes cost their data bytes.
                let bytes = match req.kind {
                    RequestKind::In | RequestKind::Out => req.data_len,
                    RequestKind::Flush | RequestKind::GetId => 0,
                };
                if !lock(&self.limiter).consume(bytes) {
                    return Served::Deferred;
                }
                match self.submit(mem, head, &req) {
                    Some(Ok(())) => return Served::Kept,
                    Some(Err(e)) => {
                        tracing::warn!("{}: {:?} request failed: {e}", self.tag, req.kind);
                        (req.status_addr, request::STATUS_IOERR, 0)
                    }
                    None => {
                        let (status, written) = self.execute(mem, &req);
                        (req.status_addr, status, written)
                    }
                }
            }
            Err(rejected) => {
                tracing::debug!("{}: bad request: {}", self.tag, rejected.error);
                match rejected.status_addr {
                    Some(addr) => (addr, rejected.error.status(), 0),
                    // No status byte to write: hand the chain back untouched.
                    None => return Served::Used(0),
                }
            }
        };
        Served::Used(match mem.write_obj(status, status_addr) {
            Ok(()) => written.saturating_add(1),
            Err(e) => {
                tracing::warn!("{}: cannot write status: {e}", self.tag);
                written
            }
        })
    }

    fn wake_fds(&self) -> Vec<RawFd> {
        let mut fds = vec![self.timer_fd];
        fds.extend(self.engine.as_ref().map(AsyncEngine::event_fd));
        fds
    }

    fn on_wake(&mut self, which: usize, mem: &GuestMemoryMmap) -> Vec<(u16, u32)> {
        match (which, self.engine.as_mut()) {
            (0, _) => {
                lock(&self.limiter).on_timer();
                Vec::new()
            }
            (_, Some(engine)) => engine.reap(mem, &self.tag),
            (_, None) => Vec::new(),
        }
    }

    fn finish(&mut self, mem: &GuestMemoryMmap) -> Vec<(u16, u32)> {
        match self.engine.as_mut() {
            Some(engine) => engine.drain(mem, &self.tag),
            None => Vec::new(),
        }
    }
}

impl BlockRequests {
    /// With the Async engine, submits a read, a write or a durable flush to
    /// the io_uring (`Some(Ok)`: the chain is returned on completion);
    /// `None`: serve it synchronously (GET_ID, a flush that need not sync).
    fn submit(
        &mut self,
        mem: &GuestMemoryMmap,
        head: u16,
        req: &Request,
    ) -> Option<Result<(), DiskIoError>> {
        let engine = self.engine.as_mut()?;
        // Under the disk's lock: a PATCH swapping the image waits until the
        // kernel holds its own reference to this one.
        let disk = lock(&self.disk);
        let (fd, durable) = disk.async_target()?;
        match req.kind {
            RequestKind::In | RequestKind::Out => {}
            RequestKind::Flush if durable => {}
            RequestKind::Flush | RequestKind::GetId => return None,
        }
        Some(engine.submit(mem, fd, head, req))
    }
    /// Runs a validated request; returns its status and the data bytes written
    /// to guest memory.
    fn execute(&self, mem: &GuestMemoryMmap, req: &Request) -> (u8, u32) {
        // Held for the whole request, so a freeze to copy-on-write happens
        // between requests, never inside one.
        let mut disk = lock(&self.disk);
        let result = match req.kind {
            RequestKind::In => disk
                .read_into(mem, req.sector, &req.data)
                .map(|()| u32::try_from(req.data_len).unwrap_or(u32::MAX)),
            RequestKind::Out => disk.write_from(mem, req.sector, &req.data).map(|()| 0),
            RequestKind::Flush => disk.flush().map(|()| 0),
            RequestKind::GetId => self.write_id(mem, &req.data),
        };
        match result {
            Ok(written) => (request::STATUS_OK, written),
            Err(e) => {
                tracing::warn!("{}: {:?} request failed: {e}", self.tag, req.kind);
                (request::STATUS_IOERR, 0)
            }
        }
    }

    /// Writes the serial into the request's buffers, as much as fits.
    fn write_id(
        &self,
        mem: &GuestMemoryMmap,
        data: &[request::Segment],
    ) -> Result<u32, DiskIoError> {
        let mut rest: &[u8] = &self.id_bytes;
        for seg in data {
            if rest.is_empty() {
                break;
            }
            let n = rest.len().min(seg.len as usize);
            mem.write_slice(&rest[..n], seg.addr)?;
            rest = &rest[n..];
        }
        #[allow(clippy::cast_possible_truncation, reason = "at most ID_BYTES (20)")]
        let written = (ID_BYTES - rest.len()) as u32;
        Ok(written)
    }
}
