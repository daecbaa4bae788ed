//! The virtio-mem device model: config space, request handling on its own
//! worker thread, and the handle the API uses to change the target size.
//!
//! State (block map, requested size, backing memory) is shared by three
//! threads: the device worker (guest requests), the vCPU thread reading the
//! config space, and the API thread. One mutex guards it; every operation
//! under it is short except a KVM slot change or a hole punch, and those are
//! what the request is waiting for anyway.

use std::sync::{Arc, Mutex, MutexGuard};

use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_queue::{DescriptorChain, Queue};
use vm_memory::Bytes;

use super::blocks::{BlockMap, BlockRange, RangeState};
use super::request::{
    parse_chain, Request, Response, RESPONSE_LEN, RESP_ACK, RESP_ERROR, RESP_NACK, STATE_MIXED,
    STATE_PLUGGED, STATE_UNPLUGGED,
};
use super::{CONFIG_SPACE_SIZE, QUEUE_SIZE, VIRTIO_MEM_F_UNPLUGGED_INACCESSIBLE};
use crate::devices::virtio::queue_server::{ChainHandler, QueueServer, Served};
use crate::devices::virtio::worker::Worker;
use crate::devices::virtio::{
    device_type, ActivateContext, ActivateError, GuestMemoryMmap, VirtioDevice, VirtioInterrupt,
};
use crate::memory::hotplug::HotplugMemory;

/// Why the host's new target size is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MemError {
    #[error(
        "requested size {requested_mib} MiB is not a multiple of the block size ({block_mib} MiB)"
    )]
    NotBlockMultiple { requested_mib: u64, block_mib: u64 },
    #[error("requested size {requested_mib} MiB exceeds the hotplug region ({total_mib} MiB)")]
    TooLarge { requested_mib: u64, total_mib: u64 },
}

/// What `GET /hotplug/memory` reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct MemStatus {
    pub total_size_mib: u64,
    pub slot_size_mib: u64,
    pub block_size_mib: u64,
    pub plugged_size_mib: u64,
    pub requested_size_mib: u64,
}

pub(super) struct State {
    pub(super) blocks: BlockMap,
    pub(super) backing: HotplugMemory,
    pub(super) requested: u64,
    pub(super) slot_size: u64,
    /// Set once the driver activated the device; config changes interrupt it.
    interrupt: Option<Arc<VirtioInterrupt>>,
    /// Chunks left without plugged blocks whose KVM slot is still there
    /// ([`State::retire_slots`]). Deleting a slot costs milliseconds, and
    /// in KVM it drops the guest's whole stage-2 mapping (every vCPU then
    /// faults its working set back in), so it waits until the driver's
    /// burst of requests is over ([`RETIRE_AFTER_IDLE`]) or a STATE request
    /// asks for a barrier; the blocks themselves were released at once.
    retiring: Vec<u64>,
}

pub(super) struct Shared {
    state: Mutex<State>,
}

impl Shared {
    pub(super) fn new(state: State) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(state),
        })
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves consistent-enough state:
        // every update below completes or rolls back before it can panic.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl State {
    pub(super) fn new(
        blocks: BlockMap,
        backing: HotplugMemory,
        requested: u64,
        slot_size: u64,
    ) -> Self {
        Self {
            blocks,
            backing,
            requested,
            slot_size,
            interrupt: None,
            retiring: Vec::new(),
        }
    }

    pub(super) fn region_size(&self) -> u64 {
        self.blocks.nb_blocks() * self.blocks.block_size()
    }

    fn plugged_bytes(&self) -> u64 {
        self.blocks.plugged_blocks() * self.blocks.block_size()
    }

    fn config_space(&self) -> [u8; CONFIG_SPACE_SIZE] {
        let mut c = [0u8; CONFIG_SPACE_SIZE];
        let region = self.region_size();
        let fields: [(usize, u64); 6] = [
            (0x00, self.blocks.block_size()),
            (0x10, self.backing.addr()),
            (0x18, region),
            // The whole region is usable from the start: the guest may plug
            // anywhere in it, up to `requested_size`.
            (0x20, region),
            (0x28, self.plugged_bytes()),
            (0x30, self.requested),
        ];
        for (at, v) in fields {
            c[at..at + 8].copy_from_slice(&v.to_le_bytes());
        }
        // node_id (0x08, le16) stays 0: spore has one NUMA node.
        c
    }

    fn range(&self, addr: u64, nb_blocks: u64) -> Option<BlockRange> {
        match self.blocks.range(addr, nb_blocks, self.blocks.nb_blocks()) {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::debug!("virtio-mem: refused range: {e}");
                None
            }
        }
    }

    fn handle(&mut self, req: Request) -> Response {
        match req {
            Request::Plug { addr, nb_blocks } => self.plug(addr, nb_blocks),
            Request::Unplug { addr, nb_blocks } => self.unplug(addr, nb_blocks),
            Request::UnplugAll => self.unplug_all(),
            Request::State { addr, nb_blocks } => match self.range(addr, nb_blocks) {
                None => Response::of(RESP_ERROR),
                Some(r) => Response {
                    resp_type: RESP_ACK,
                    state: match self.blocks.state(r) {
                        RangeState::Plugged => STATE_PLUGGED,
                        RangeState::Unplugged => STATE_UNPLUGGED,
                        RangeState::Mixed => STATE_MIXED,
                    },
                },
            },
        }
    }

    fn plug(&mut self, addr: u64, nb_blocks: u64) -> Response {
        let Some(r) = self.range(addr, nb_blocks) else {
            return Response::of(RESP_ERROR);
        };
        if self.blocks.state(r) != RangeState::Unplugged {
            return Response::of(RESP_ERROR);
        }
        let after = self.blocks.plugged_blocks() + r.count;
        if after.saturating_mul(self.blocks.block_size()) > self.requested {
            return Response::of(RESP_NACK);
        }
        let changes = self.blocks.set(r, true);
        // A chunk emptied a moment ago may still have its slot.
        let now_used: Vec<u64> = changes
            .now_used
            .into_iter()
            .filter(|&c| !self.backing.is_registered(c))
            .collect();
        for (i, &chunk) in now_used.iter().enumerate() {
            if let Err(e) = self.backing.add_slot(chunk) {
                tracing::error!("virtio-mem: cannot plug: {e}");
                for &c in &now_used[..i] {
                    let _ = self.backing.remove_slot(c);
                }
                self.blocks.set(r, false);
                return Response::of(RESP_ERROR);
            }
        }
        Response::of(RESP_ACK)
    }

    fn unplug(&mut self, addr: u64, nb_blocks: u64) -> Response {
        let Some(r) = self.range(addr, nb_blocks) else {
            return Response::of(RESP_ERROR);
        };
        if self.blocks.state(r) != RangeState::Plugged {
            return Response::of(RESP_ERROR);
        }
        let bs = self.blocks.block_size();
        if let Err(e) = self.backing.discard(r.first * bs, r.count * bs) {
            tracing::error!("virtio-mem: {e}");
            return Response::of(RESP_ERROR);
        }
        let changes = self.blocks.set(r, false);
        self.retiring.extend(changes.now_empty);
        Response::of(RESP_ACK)
    }

    fn unplug_all(&mut self) -> Response {
        if let Err(e) = self.backing.discard(0, self.region_size()) {
            tracing::error!("virtio-mem: {e}");
            return Response::of(RESP_ERROR);
        }
        let used = self.blocks.clear();
        self.retiring.extend(used);
        Response::of(RESP_ACK)
    }

    /// Deletes the slots of chunks that are still empty, then punches them
    /// again: a guest that broke the rules and touched them between the
    /// answer and now must not keep host memory.
    fn retire_slots(&mut self) {
        let bs = self.blocks.block_size();
        let per_chunk = self.blocks.blocks_per_slot();
        for c in std::mem::take(&mut self.retiring) {
            if self.blocks.chunk_plugged(c) > 0 || !self.backing.is_registered(c) {
                continue;
            }
            // The blocks are already released and unplugged for the guest;
            // a slot KVM refuses to delete only keeps zero pages reachable.
            if let Err(e) = self.backing.remove_slot(c) {
                tracing::error!("virtio-mem: {e}");
            }
            let first = c * per_chunk;
            let count = per_chunk.min(self.blocks.nb_blocks() - first);
            if let Err(e) = self.backing.discard(first * bs, count * bs) {
                tracing::error!("virtio-mem: {e}");
            }
        }
    }
}

/// The virtio-mem device, as the transport sees it.
pub struct VirtioMem {
    pub(super) shared: Arc<Shared>,
    worker: Option<Worker<(Queue, RequestHandler)>>,
}

/// The host's handle on a virtio-mem device: status and target size.
#[derive(Clone)]
pub struct MemHandle {
    pub(super) shared: Arc<Shared>,
}

impl VirtioMem {
    /// A device over `backing`, in blocks of `block_size` bytes (a power of
    /// two dividing the region size), with KVM slots of `slot_size` bytes
    /// (a multiple of `block_size`). Nothing is plugged; the target is 0.
    pub fn new(backing: HotplugMemory, block_size: u64, slot_size: u64) -> (Self, MemHandle) {
        let nb_blocks = backing.size() / block_size;
        let blocks = BlockMap::new(
            backing.addr(),
            block_size,
            nb_blocks,
            slot_size / block_size,
        );
        Self::from_state(State::new(blocks, backing, 0, slot_size))
    }

    /// Another handle on this device, for the API.
    pub fn handle(&self) -> MemHandle {
        MemHandle {
            shared: self.shared.clone(),
        }
    }

    pub(super) fn from_state(state: State) -> (Self, MemHandle) {
        let shared = Shared::new(state);
        let handle = MemHandle {
            shared: shared.clone(),
        };
        (
            Self {
                shared,
                worker: None,
            },
            handle,
        )
    }

    fn stop_worker(&mut self) {
        if let Some(worker) = self.worker.take() {
            if worker.stop().is_none() {
                tracing::error!("virtio-mem: worker thread panicked");
            }
        }
    }
}

impl VirtioDevice for VirtioMem {
    fn device_type(&self) -> u32 {
        device_type::MEM
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE]
    }

    fn avail_features(&self) -> u64 {
        1 << VIRTIO_F_VERSION_1 | 1 << VIRTIO_MEM_F_UNPLUGGED_INACCESSIBLE
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        let config = self.shared.lock().config_space();
        data.fill(0);
        let Ok(start) = usize::try_from(offset) else {
            return;
        };
        if let Some(src) = config.get(start..) {
            let n = src.len().min(data.len());
            data[..n].copy_from_slice(&src[..n]);
        }
    }

    // Every field is read-only for the driver: writes are ignored (the
    // default `write_config`).

    fn activate(&mut self, ctx: ActivateContext) -> Result<(), ActivateError> {
        self.stop_worker();
        let interrupt = ctx.interrupt.clone();
        let handler = RequestHandler {
            shared: self.shared.clone(),
        };
        let server = QueueServer::from_single_queue(ctx, handler, "virtio-mem".into())?;
        self.worker = Some(server.spawn("virtio", "mem")?);
        self.shared.lock().interrupt = Some(interrupt);
        Ok(())
    }

    /// A driver reset leaves plugged blocks plugged (the spec's rule: a new
    /// driver learns them from `plugged_size` and sends UNPLUG_ALL).
    fn reset(&mut self) {
        self.stop_worker();
        let mut s = self.shared.lock();
        s.interrupt = None;
        // No worker is left to retire them when the queue goes quiet.
        s.retire_slots();
    }

    /// Stops the worker for a snapshot; the block map, the backing and its
    /// slots stay as they are (the snapshot reads them through
    /// [`MemHandle::save`]).
    fn quiesce(&mut self) -> Result<Vec<Queue>, ActivateError> {
        let worker = self
            .worker
            .take()
            .ok_or_else(|| ActivateError::Device("virtio-mem is not active".into()))?;
        let (queue, _) = worker
            .stop()
            .ok_or_else(|| ActivateError::Device("virtio-mem worker panicked".into()))?;
        // Slots of chunks emptied by the last requests go now, so that the
        // running VM and its restored copy have the same slots.
        self.shared.lock().retire_slots();
        Ok(vec![queue])
    }
}

/// How long the request queue must be quiet before emptied chunks lose
/// their KVM slots: longer than the gap between a Linux driver's UNPLUG
/// requests while it offlines one memory block after another.
pub const RETIRE_AFTER_IDLE: std::time::Duration = std::time::Duration::from_millis(500);

/// Serves requests on the device's worker thread.
struct RequestHandler {
    shared: Arc<Shared>,
}

impl ChainHandler for RequestHandler {
    fn serve(&mut self, mem: &GuestMemoryMmap, chain: DescriptorChain<&GuestMemoryMmap>) -> Served {
        Served::Used(self.respond(mem, chain))
    }

    fn idle_timeout(&self) -> Option<std::time::Duration> {
        (!self.shared.lock().retiring.is_empty()).then_some(RETIRE_AFTER_IDLE)
    }

    fn on_idle(&mut self) {
        self.shared.lock().retire_slots();
    }
}

impl RequestHandler {
    /// Answers one request; returns the used length.
    fn respond(&mut self, mem: &GuestMemoryMmap, chain: DescriptorChain<&GuestMemoryMmap>) -> u32 {
        let parsed = parse_chain(chain, mem);
        let response = match parsed.request {
            Ok(req) => {
                let t = std::time::Instant::now();
                let mut s = self.shared.lock();
                // STATE is the barrier: once it is answered, chunks emptied
                // by earlier UNPLUGs have no slot (a unikernel's `sync`).
                if matches!(req, Request::State { .. }) {
                    s.retire_slots();
                }
                let r = s.handle(req);
                drop(s);
                tracing::debug!(
                    "virtio-mem: {req:?} -> {} in {} us",
                    r.resp_type,
                    t.elapsed().as_micros()
                );
                r
            }
            Err(e) => {
                tracing::warn!("virtio-mem: bad request: {e}");
                Response::of(RESP_ERROR)
            }
        };
        match parsed.response_at {
            Some(at) => match mem.write_slice(&response.encode(), at) {
                Ok(()) => u32::try_from(RESPONSE_LEN).unwrap_or(u32::MAX),
                Err(e) => {
                    tracing::warn!("virtio-mem: response buffer not in guest memory: {e}");
                    0
                }
            },
            None => 0,
        }
    }
}

const MIB: u64 = 1 << 20;

impl MemHandle {
    pub fn status(&self) -> MemStatus {
        let s = self.shared.lock();
        MemStatus {
            total_size_mib: s.region_size() / MIB,
            slot_size_mib: s.slot_size / MIB,
            block_size_mib: s.blocks.block_size() / MIB,
            plugged_size_mib: s.plugged_bytes() / MIB,
            requested_size_mib: s.requested / MIB,
        }
    }

    /// Sets the target size and tells the driver (config-change interrupt).
    pub fn set_requested_mib(&self, requested_mib: u64) -> Result<(), MemError> {
        let mut s = self.shared.lock();
        let block_mib = s.blocks.block_size() / MIB;
        let total_mib = s.region_size() / MIB;
        if requested_mib > total_mib {
            return Err(MemError::TooLarge {
                requested_mib,
                total_mib,
            });
        }
        if block_mib == 0 || !requested_mib.is_multiple_of(block_mib) {
            return Err(MemError::NotBlockMultiple {
                requested_mib,
                block_mib,
            });
        }
        s.requested = requested_mib * MIB;
        if let Some(irq) = &s.interrupt {
            irq.signal_config_change();
        }
        Ok(())
    }

    /// Handles one request as if the driver had sent it (host-side tests and
    /// the unikernel path share the device's rules this way).
    pub fn handle_request(&self, req: Request) -> Response {
        let mut s = self.shared.lock();
        let r = s.handle(req);
        s.retire_slots();
        r
    }

    /// Bytes of host memory the region holds right now.
    pub fn resident_bytes(&self) -> u64 {
        self.shared.lock().backing.resident_bytes()
    }

    /// Chunks with a KVM slot right now.
    pub fn registered_slots(&self) -> usize {
        self.shared.lock().backing.registered_slots()
    }
}

#[cfg(test)]
#[path = "device_tests.rs"]
mod tests;
