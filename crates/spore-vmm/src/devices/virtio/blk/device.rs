//! The virtio-blk device model and the worker thread that serves its queue.
//!
//! [`Block`] describes the drive to the transport (features, config space)
//! and, once activated, runs a [`BlockWorker`] on its own thread. The worker
//! sleeps in epoll on the queue's notification eventfd and the stop eventfd,
//! drains the queue, and raises the interrupt when the driver wants one.

use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::Arc;

use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_F_BLK_SIZE, VIRTIO_BLK_F_FLUSH, VIRTIO_BLK_F_RO, VIRTIO_BLK_F_SEG_MAX,
    VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK,
};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use virtio_queue::{Queue, QueueT};
use vm_memory::Bytes;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

use super::backend::{DiskImage, DiskIoError};
use super::request::{self, DiskLimits, Request, RequestKind};
use super::{BlockError, ID_BYTES, QUEUE_SIZE, SECTOR_SIZE};
use crate::devices::virtio::worker::Worker;
use crate::devices::virtio::{
    device_type, ActivateContext, ActivateError, GuestMemoryMmap, VirtioDevice, VirtioInterrupt,
};

/// Size of `struct virtio_blk_config` up to and including `blk_size`.
const CONFIG_LEN: usize = 24;

/// Chains served per wake-up before the worker yields to check for a stop
/// request; a driver that keeps the queue full cannot pin the thread.
const CHAINS_PER_WAKEUP: usize = 4 * QUEUE_SIZE as usize;

/// A virtio-blk device backed by a raw image file.
pub struct Block {
    id: String,
    disk: Arc<DiskImage>,
    avail_features: u64,
    config: [u8; CONFIG_LEN],
    worker: Option<Worker<Queue>>,
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
        config[0..8].copy_from_slice(&disk.capacity_sectors().to_le_bytes());
        // Header and status take two descriptors of a chain.
        config[12..16].copy_from_slice(&(u32::from(QUEUE_SIZE) - 2).to_le_bytes());
        config[20..24].copy_from_slice(&(SECTOR_SIZE as u32).to_le_bytes());
        Ok(Block {
            id,
            disk: Arc::new(disk),
            avail_features,
            config,
            worker: None,
        })
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn capacity_sectors(&self) -> u64 {
        self.disk.capacity_sectors()
    }

    pub fn read_only(&self) -> bool {
        self.disk.read_only()
    }

    pub fn path(&self) -> &Path {
        self.disk.path()
    }

    fn stop_worker(&mut self) {
        if let Some(worker) = self.worker.take() {
            if worker.stop().is_none() {
                tracing::error!("virtio-blk {}: worker thread panicked", self.id);
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
        read_config_bytes(&self.config, offset, data);
    }

    fn activate(&mut self, ctx: ActivateContext) -> Result<(), ActivateError> {
        let ActivateContext {
            mem,
            interrupt,
            queues,
            queue_events,
            ..
        } = ctx;
        let (Ok([queue]), Ok([queue_evt])) = (
            <[Queue; 1]>::try_from(queues),
            <[EventFd; 1]>::try_from(queue_events),
        ) else {
            return Err(ActivateError::Device(
                "virtio-blk takes exactly one queue and one queue eventfd".into(),
            ));
        };
        if !queue.ready() {
            return Err(ActivateError::Device(
                "virtio-blk: the driver did not enable the request queue".into(),
            ));
        }
        self.stop_worker();
        let mut id_bytes = [0u8; ID_BYTES];
        let n = self.id.len().min(ID_BYTES);
        id_bytes[..n].copy_from_slice(&self.id.as_bytes()[..n]);
        let worker = BlockWorker {
            queue,
            mem,
            interrupt,
            queue_evt,
            disk: self.disk.clone(),
            id_bytes,
            tag: self.id.clone(),
        };
        let name = thread_name("blk", &self.id);
        self.worker =
            Some(Worker::spawn(&name, move |stop| worker.run(stop)).map_err(ActivateError::Worker)?);
        Ok(())
    }

    fn reset(&mut self) {
        self.stop_worker();
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

/// A thread name within Linux's 15-byte limit.
fn thread_name(kind: &str, id: &str) -> String {
    let mut name = format!("{kind}-{id}");
    while name.len() > 15 {
        name.pop();
    }
    name
}

const TOKEN_QUEUE: u64 = 0;
const TOKEN_STOP: u64 = 1;

/// Everything the worker thread owns.
struct BlockWorker {
    queue: Queue,
    mem: GuestMemoryMmap,
    interrupt: Arc<VirtioInterrupt>,
    queue_evt: EventFd,
    disk: Arc<DiskImage>,
    id_bytes: [u8; ID_BYTES],
    /// The drive id, for log messages.
    tag: String,
}

impl BlockWorker {
    /// Serves the queue until `stop` fires; returns the queue.
    fn run(mut self, stop: EventFd) -> Queue {
        let epoll = match self.epoll(&stop) {
            Ok(e) => e,
            Err(e) => {
                tracing::error!("virtio-blk {}: cannot set up epoll: {e}", self.tag);
                return self.queue;
            }
        };
        // Requests queued before activation were notified into the eventfd
        // already, but serving first costs nothing and covers suppressed ones.
        self.process_queue();
        let mut events = [EpollEvent::default(); 2];
        loop {
            let n = match epoll.wait(-1, &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::error!("virtio-blk {}: epoll failed: {e}", self.tag);
                    return self.queue;
                }
            };
            for ev in &events[..n] {
                match ev.data() {
                    TOKEN_STOP => return self.queue,
                    TOKEN_QUEUE => {
                        // EAGAIN: a wake-up with nothing counted; serve anyway.
                        let _ = self.queue_evt.read();
                        self.process_queue();
                    }
                    _ => {}
                }
            }
        }
    }

    fn epoll(&self, stop: &EventFd) -> std::io::Result<Epoll> {
        let epoll = Epoll::new()?;
        for (fd, token) in [
            (self.queue_evt.as_raw_fd(), TOKEN_QUEUE),
            (stop.as_raw_fd(), TOKEN_STOP),
        ] {
            epoll.ctl(
                ControlOperation::Add,
                fd,
                EpollEvent::new(EventSet::IN, token),
            )?;
        }
        Ok(epoll)
    }

    /// Serves every available chain, with notification suppression while
    /// busy, and interrupts the driver if it asked for it.
    fn process_queue(&mut self) {
        let mut served = 0;
        let mut used_any = false;
        loop {
            if let Err(e) = self.queue.disable_notification(&self.mem) {
                tracing::warn!("virtio-blk {}: queue unusable: {e}", self.tag);
                break;
            }
            let before = served;
            while served < CHAINS_PER_WAKEUP {
                let Some(chain) = self.queue.pop_descriptor_chain(&self.mem) else {
                    break;
                };
                served += 1;
                let head = chain.head_index();
                let used_len = self.serve(chain);
                match self.queue.add_used(&self.mem, head, used_len) {
                    Ok(()) => used_any = true,
                    Err(e) => tracing::warn!("virtio-blk {}: cannot return chain {head}: {e}", self.tag),
                }
            }
            if served >= CHAINS_PER_WAKEUP {
                // Come back through epoll so a stop request is seen.
                let _ = self.queue_evt.write(1);
                break;
            }
            match self.queue.enable_notification(&self.mem) {
                // More chains arrived, but only retry if the last round made
                // progress: a corrupt avail index would otherwise spin forever.
                Ok(true) if served > before => continue,
                Ok(_) => break,
                Err(e) => {
                    tracing::warn!("virtio-blk {}: queue unusable: {e}", self.tag);
                    break;
                }
            }
        }
        if used_any && self.queue.needs_notification(&self.mem).unwrap_or(true) {
            self.interrupt.signal_used_queue();
        }
    }

    /// Serves one chain; returns the number of bytes written to guest memory.
    fn serve<I>(&self, descriptors: I) -> u32
    where
        I: Iterator<Item = virtio_queue::desc::split::Descriptor>,
    {
        let limits = DiskLimits {
            capacity_sectors: self.disk.capacity_sectors(),
            read_only: self.disk.read_only(),
        };
        let (status_addr, status, written) = match request::parse(descriptors, &self.mem, limits) {
            Ok(req) => {
                let (status, written) = self.execute(&req);
                (req.status_addr, status, written)
            }
            Err(rejected) => {
                tracing::debug!("virtio-blk {}: bad request: {}", self.tag, rejected.error);
                match rejected.status_addr {
                    Some(addr) => (addr, rejected.error.status(), 0),
                    // No status byte to write: hand the chain back untouched.
                    None => return 0,
                }
            }
        };
        match self.mem.write_obj(status, status_addr) {
            Ok(()) => written.saturating_add(1),
            Err(e) => {
                tracing::warn!("virtio-blk {}: cannot write status: {e}", self.tag);
                written
            }
        }
    }

    /// Runs a validated request; returns its status and the data bytes written
    /// to guest memory.
    fn execute(&self, req: &Request) -> (u8, u32) {
        let result = match req.kind {
            RequestKind::In => self
                .disk
                .read_into(&self.mem, req.sector, &req.data)
                .map(|()| u32::try_from(req.data_len).unwrap_or(u32::MAX)),
            RequestKind::Out => self.disk.write_from(&self.mem, req.sector, &req.data).map(|()| 0),
            RequestKind::Flush => self.disk.flush().map(|()| 0),
            RequestKind::GetId => self.write_id(&req.data),
        };
        match result {
            Ok(written) => (VIRTIO_BLK_S_OK as u8, written),
            Err(e) => {
                tracing::warn!("virtio-blk {}: {:?} request failed: {e}", self.tag, req.kind);
                (VIRTIO_BLK_S_IOERR as u8, 0)
            }
        }
    }

    /// Writes the serial into the request's buffers, as much as fits.
    fn write_id(&self, data: &[request::Segment]) -> Result<u32, DiskIoError> {
        let mut rest: &[u8] = &self.id_bytes;
        for seg in data {
            if rest.is_empty() {
                break;
            }
            let n = rest.len().min(seg.len as usize);
            self.mem.write_slice(&rest[..n], seg.addr)?;
            rest = &rest[n..];
        }
        Ok((ID_BYTES - rest.len()) as u32)
    }
}
