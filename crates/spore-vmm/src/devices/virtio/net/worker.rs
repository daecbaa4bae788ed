//! The virtio-net worker thread: frames between the two queues and the tap.
//!
//! One epoll set: the stop event, the rx and tx queue notifications, the tap
//! (edge-triggered: the loop reads until the tap is empty, or until it must
//! stop reading) and the two rate limiters' timers.
//!
//! - tx: each chain (header + frame, checked by [`header::parse_tx`]) is
//!   copied into a fixed host buffer and written to the tap as one packet.
//!   A throttled chain goes back to the head of the avail ring and waits
//!   for the tx limiter's timer.
//! - rx: a frame is read into a fixed host buffer only when the rx queue
//!   has buffers and the rx limiter is not blocked; otherwise frames stay in
//!   the tap's kernel queue (which drops what overflows, as a wire would)
//!   until the next rx notification or timer. With VIRTIO_NET_F_MRG_RXBUF a
//!   frame may span several chains (`num_buffers`); without, a frame that
//!   does not fit its chain is dropped.
//!
//! - MMDS: on an interface that routes MMDS requests, a tx frame for the
//!   MMDS address goes to its [`MmdsStack`] instead of the tap (not charged
//!   to the tx limiter, as in Firecracker), and the stack's answers go into
//!   the rx queue ahead of the tap's frames; epoll waits no longer than the
//!   stack's next TCP timer.
//!
//! Rounds are bounded (a guest that keeps its rings full is served in
//! batches, the stop event is always seen); the driver is interrupted once
//! per round per used queue, when it asks to be.

use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use virtio_bindings::virtio_net::VIRTIO_NET_F_MRG_RXBUF;
use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

use super::header::{self, Segment, MAX_FRAME_WITH_HEADER, MAX_SEGMENTS, VNET_HDR_LEN};
use super::tap::{tun_offload_flags, NetBackend};
use super::{RX_QUEUE, TX_QUEUE};
use crate::devices::virtio::{GuestMemoryMmap, VirtioInterrupt};
use crate::host::lock;
use crate::mmds::stack::MmdsStack;
use crate::rate_limiter::RateLimiter;

/// What the device counts (dropped frames are the guest's or the host's
/// fault, never silently).
#[derive(Debug, Default)]
pub struct NetCounters {
    pub rx_frames: AtomicU64,
    pub rx_bytes: AtomicU64,
    pub tx_frames: AtomicU64,
    pub tx_bytes: AtomicU64,
    /// Frames from the tap the guest's buffers could not take.
    pub rx_dropped: AtomicU64,
    /// Guest frames the tap did not take.
    pub tx_dropped: AtomicU64,
    /// Malformed chains (either queue), returned unused.
    pub bad_chains: AtomicU64,
}

/// What happened, counted per device and in Firecracker's `net` metrics.
#[derive(Clone, Copy)]
enum Event {
    RxFrame(u64),
    TxFrame(u64),
    RxDropped,
    TxDropped,
    BadRxChain,
    BadTxChain,
}

impl NetCounters {
    fn count(&self, e: Event) {
        let m = &crate::metrics::METRICS.net;
        let bump = |c: &AtomicU64| {
            c.fetch_add(1, Ordering::Relaxed);
        };
        match e {
            Event::RxFrame(bytes) => {
                bump(&self.rx_frames);
                self.rx_bytes.fetch_add(bytes, Ordering::Relaxed);
                m.rx_packets.inc();
                m.rx_bytes.add(bytes);
            }
            Event::TxFrame(bytes) => {
                bump(&self.tx_frames);
                self.tx_bytes.fetch_add(bytes, Ordering::Relaxed);
                m.tx_packets.inc();
                m.tx_bytes.add(bytes);
            }
            Event::RxDropped => {
                bump(&self.rx_dropped);
                m.rx_fails.inc();
            }
            Event::TxDropped => {
                bump(&self.tx_dropped);
                m.tx_fails.inc();
            }
            Event::BadRxChain => {
                bump(&self.bad_chains);
                m.rx_fails.inc();
            }
            Event::BadTxChain => {
                bump(&self.bad_chains);
                m.tx_malformed_frames.inc();
            }
        }
    }
}

/// Chains or frames handled per queue per round before the loop looks at
/// its other events again.
const ROUND: usize = 4 * super::QUEUE_SIZE as usize;

const TOKEN_STOP: u64 = 0;
const TOKEN_RX_QUEUE: u64 = 1;
const TOKEN_TX_QUEUE: u64 = 2;
const TOKEN_TAP: u64 = 3;
const TOKEN_RX_TIMER: u64 = 4;
const TOKEN_TX_TIMER: u64 = 5;

/// What a stopped worker hands back to the device.
pub struct WorkerState {
    /// rx, tx, with their ring positions.
    pub queues: Vec<Queue>,
    pub backend: Box<dyn NetBackend>,
}

/// Everything the loop owns while it runs.
pub struct NetWorker {
    pub mem: GuestMemoryMmap,
    pub interrupt: Arc<VirtioInterrupt>,
    pub queues: Vec<Queue>,
    pub queue_events: Vec<EventFd>,
    pub backend: Box<dyn NetBackend>,
    pub rx_limiter: Arc<Mutex<RateLimiter>>,
    pub tx_limiter: Arc<Mutex<RateLimiter>>,
    pub counters: Arc<NetCounters>,
    pub acked_features: u64,
    /// Names the interface in log messages.
    pub tag: String,
    /// The MMDS endpoint, where this interface routes MMDS requests.
    pub mmds: Option<Arc<Mutex<MmdsStack>>>,
}

/// The loop's own state beside what it owns.
struct Buffers {
    rx: Box<[u8]>,
    tx: Box<[u8]>,
    segments: Vec<Segment>,
    /// (head, used length) of the chains one rx frame fills.
    rx_chains: Vec<(u16, u32)>,
    /// The buffers of the first of them (where the header goes).
    first_segments: Vec<Segment>,
    /// A frame read from the tap that is still in `rx`: its length and
    /// whether the rx limiter was charged for it.
    rx_pending: Option<(usize, bool)>,
    /// The tap may hold frames (no EAGAIN seen since its last edge).
    tap_readable: bool,
}

/// Whether a frame reached the guest.
enum Delivery {
    Delivered,
    /// Not enough buffers: the frame waits for the next rx notification.
    NoBuffers,
    Dropped,
}

impl NetWorker {
    /// Runs until `stop` is readable (or epoll fails).
    pub fn run(mut self, stop: EventFd) -> WorkerState {
        let epoll = match self.epoll(&stop) {
            Ok(e) => e,
            Err(e) => {
                tracing::error!("{}: cannot set up epoll: {e}", self.tag);
                return self.finish();
            }
        };
        let offload = tun_offload_flags(self.acked_features);
        if let Err(e) = self.backend.set_offload(offload) {
            tracing::warn!(
                "{}: the tap refused offloads {offload:#x} ({e}); the guest may get frames it cannot take",
                self.tag
            );
        }
        let mut bufs = Buffers {
            rx: vec![0u8; MAX_FRAME_WITH_HEADER].into_boxed_slice(),
            tx: vec![0u8; MAX_FRAME_WITH_HEADER].into_boxed_slice(),
            segments: Vec::with_capacity(MAX_SEGMENTS),
            rx_chains: Vec::with_capacity(usize::from(super::QUEUE_SIZE)),
            first_segments: Vec::with_capacity(MAX_SEGMENTS),
            rx_pending: None,
            tap_readable: true,
        };
        // Chains queued and frames arrived before the worker started.
        self.round(&mut bufs);
        let mut events = [EpollEvent::default(); 8];
        loop {
            let n = match epoll.wait(self.mmds_timeout_ms(), &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::error!("{}: epoll failed, the interface stops: {e}", self.tag);
                    return self.finish();
                }
            };
            for ev in &events[..n] {
                match ev.data() {
                    TOKEN_STOP => return self.finish(),
                    // EAGAIN only means the counter was already consumed.
                    TOKEN_RX_QUEUE => drop(self.queue_events[RX_QUEUE].read()),
                    TOKEN_TX_QUEUE => drop(self.queue_events[TX_QUEUE].read()),
                    TOKEN_TAP => bufs.tap_readable = true,
                    TOKEN_RX_TIMER => lock(&self.rx_limiter).on_timer(),
                    TOKEN_TX_TIMER => lock(&self.tx_limiter).on_timer(),
                    _ => {}
                }
            }
            self.round(&mut bufs);
        }
    }

    fn epoll(&self, stop: &EventFd) -> io::Result<Epoll> {
        let epoll = Epoll::new()?;
        let rx_timer = lock(&self.rx_limiter).timer_fd();
        let tx_timer = lock(&self.tx_limiter).timer_fd();
        for (fd, token, set) in [
            (stop.as_raw_fd(), TOKEN_STOP, EventSet::IN),
            (
                self.queue_events[RX_QUEUE].as_raw_fd(),
                TOKEN_RX_QUEUE,
                EventSet::IN,
            ),
            (
                self.queue_events[TX_QUEUE].as_raw_fd(),
                TOKEN_TX_QUEUE,
                EventSet::IN,
            ),
            (
                self.backend.fd(),
                TOKEN_TAP,
                EventSet::IN | EventSet::EDGE_TRIGGERED,
            ),
            (rx_timer, TOKEN_RX_TIMER, EventSet::IN),
            (tx_timer, TOKEN_TX_TIMER, EventSet::IN),
        ] {
            epoll.ctl(ControlOperation::Add, fd, EpollEvent::new(set, token))?;
        }
        Ok(epoll)
    }

    /// How long epoll may wait: until the MMDS stack's next TCP timer, or
    /// for ever.
    fn mmds_timeout_ms(&self) -> i32 {
        let Some(m) = &self.mmds else { return -1 };
        match lock(m).poll_delay() {
            None => -1,
            // At least 1 ms (0 would spin), at most 1 s (rechecked then).
            Some(d) => i32::try_from(d.as_millis().clamp(1, 1000)).unwrap_or(1000),
        }
    }

    /// Serves tx, then rx, then interrupts the driver for what was used.
    fn round(&mut self, bufs: &mut Buffers) {
        let tx_used = self.process_tx(bufs);
        if let Some(m) = &self.mmds {
            lock(m).poll();
        }
        let rx_used = self.process_rx(bufs);
        let mut notify = false;
        for (q, used) in [(RX_QUEUE, rx_used), (TX_QUEUE, tx_used)] {
            if used {
                notify |= self.queues[q].needs_notification(&self.mem).unwrap_or(true);
            }
        }
        if notify {
            self.interrupt.signal_used_queue();
        }
    }

    /// Sends the tx queue's frames to the tap; whether any chain was used.
    fn process_tx(&mut self, bufs: &mut Buffers) -> bool {
        let Self {
            mem,
            queues,
            queue_events,
            backend,
            tx_limiter,
            counters,
            tag,
            mmds,
            ..
        } = self;
        let queue = &mut queues[TX_QUEUE];
        let mut used = false;
        for _ in 0..ROUND {
            let Some(chain) = queue.pop_descriptor_chain(&*mem) else {
                return used;
            };
            let head = chain.head_index();
            match header::parse_tx(chain, mem, &mut bufs.segments) {
                Err(e) => {
                    tracing::debug!("{tag}: tx chain dropped: {e}");
                    counters.count(Event::BadTxChain);
                }
                Ok(total) => match header::gather(mem, &bufs.segments, &mut bufs.tx) {
                    Ok(n) if n == total => {
                        let frame = &bufs.tx[VNET_HDR_LEN..total];
                        if !to_mmds(mmds.as_ref(), frame) {
                            // Firecracker's accounting: one op and the frame's bytes.
                            let bytes = (total - VNET_HDR_LEN) as u64;
                            if !lock(tx_limiter).consume(bytes) {
                                // Sent once the limiter's timer fires.
                                queue.go_to_previous_position();
                                return used;
                            }
                            send_frame(backend.as_mut(), &bufs.tx[..total], counters, tag);
                        }
                    }
                    Ok(_) | Err(_) => counters.count(Event::BadTxChain),
                },
            }
            if let Err(e) = queue.add_used(&*mem, head, 0) {
                tracing::warn!("{tag}: cannot return tx chain {head}: {e}");
            }
            used = true;
        }
        // More than a round's worth: come back after the other events.
        let _ = queue_events[TX_QUEUE].write(1);
        used
    }

    /// Moves frames from the tap into the rx queue; whether any chain was used.
    fn process_rx(&mut self, bufs: &mut Buffers) -> bool {
        let mut used = false;
        for _ in 0..ROUND {
            if bufs.rx_pending.is_none() {
                match self.deliver_mmds(bufs) {
                    Some(Delivery::NoBuffers) => return used,
                    Some(_) => {
                        used = true;
                        continue;
                    }
                    None => {}
                }
            }
            let (len, charged) = match bufs.rx_pending {
                Some(p) => p,
                None => {
                    if !bufs.tap_readable || lock(&self.rx_limiter).is_blocked() {
                        return used;
                    }
                    // Frames stay in the tap while the guest has no buffers.
                    if !self.rx_has_buffers() {
                        return used;
                    }
                    match self.backend.read_frame(&mut bufs.rx) {
                        // End of file (a socket backend's peer gone): no
                        // more frames until the next edge.
                        Ok(0) => {
                            bufs.tap_readable = false;
                            return used;
                        }
                        Ok(n) if n < VNET_HDR_LEN => {
                            self.counters.count(Event::RxDropped);
                            continue;
                        }
                        Ok(n) => (n, false),
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            bufs.tap_readable = false;
                            return used;
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => {
                            tracing::warn!("{}: cannot read from the tap: {e}", self.tag);
                            bufs.tap_readable = false;
                            return used;
                        }
                    }
                }
            };
            bufs.rx_pending = Some((len, charged));
            if !charged {
                if !lock(&self.rx_limiter).consume((len - VNET_HDR_LEN) as u64) {
                    // Delivered once the limiter's timer fires.
                    return used;
                }
                bufs.rx_pending = Some((len, true));
            }
            match self.deliver(bufs, len) {
                Delivery::Delivered => {
                    used = true;
                    self.counters
                        .count(Event::RxFrame((len - VNET_HDR_LEN) as u64));
                }
                Delivery::Dropped => {
                    used = true;
                    self.counters.count(Event::RxDropped);
                }
                Delivery::NoBuffers => return used,
            }
            bufs.rx_pending = None;
        }
        // More than a round's worth: come back after the other events.
        let _ = self.queue_events[RX_QUEUE].write(1);
        used
    }

    /// Puts the MMDS stack's next frame (if any) in the rx queue; `None`
    /// when it has none.
    fn deliver_mmds(&mut self, bufs: &mut Buffers) -> Option<Delivery> {
        let m = self.mmds.clone()?;
        let frame = lock(&m).next_frame()?;
        let len = VNET_HDR_LEN + frame.len();
        if len > bufs.rx.len() {
            self.counters.count(Event::RxDropped);
            return Some(Delivery::Dropped);
        }
        if !self.rx_has_buffers() {
            lock(&m).unread(frame);
            return Some(Delivery::NoBuffers);
        }
        // No offloads: a zeroed virtio-net header.
        bufs.rx[..VNET_HDR_LEN].fill(0);
        bufs.rx[VNET_HDR_LEN..len].copy_from_slice(&frame);
        let delivery = self.deliver(bufs, len);
        match delivery {
            Delivery::Delivered => self.counters.count(Event::RxFrame(frame.len() as u64)),
            Delivery::Dropped => self.counters.count(Event::RxDropped),
            Delivery::NoBuffers => lock(&m).unread(frame),
        }
        Some(delivery)
    }

    /// Whether the driver has made rx buffers available that we have not used.
    fn rx_has_buffers(&self) -> bool {
        let q = &self.queues[RX_QUEUE];
        match q.avail_idx(&self.mem, Ordering::Acquire) {
            Ok(idx) => idx.0 != q.next_avail(),
            Err(_) => false,
        }
    }

    /// Copies the frame in `bufs.rx[..len]` into rx chains: several with
    /// mergeable rx buffers, else one that must hold it all.
    fn deliver(&mut self, bufs: &mut Buffers, len: usize) -> Delivery {
        let mergeable = self.acked_features & (1 << VIRTIO_NET_F_MRG_RXBUF) != 0;
        let Self {
            mem,
            queues,
            counters,
            tag,
            ..
        } = self;
        let queue = &mut queues[RX_QUEUE];
        bufs.rx_chains.clear();
        let mut placed = 0usize;
        header::set_num_buffers(&mut bufs.rx[..len], 1);
        while placed < len && (mergeable || bufs.rx_chains.is_empty()) {
            let Some(chain) = queue.pop_descriptor_chain(&*mem) else {
                // Written buffers go back unused: the driver never saw them.
                for _ in 0..bufs.rx_chains.len() {
                    queue.go_to_previous_position();
                }
                return Delivery::NoBuffers;
            };
            let head = chain.head_index();
            let written = header::parse_rx(chain, mem, &mut bufs.segments)
                .map_err(|e| e.to_string())
                .and_then(|_| {
                    header::scatter(mem, &bufs.segments, &bufs.rx[placed..len])
                        .map_err(|e| e.to_string())
                });
            match written {
                Ok(n) => {
                    if bufs.rx_chains.is_empty() {
                        // Where the header went: num_buffers is known last.
                        bufs.first_segments.clone_from(&bufs.segments);
                    }
                    bufs.rx_chains
                        .push((head, u32::try_from(n).unwrap_or(u32::MAX)));
                    placed += n;
                }
                Err(e) => {
                    tracing::debug!("{tag}: rx chain dropped: {e}");
                    counters.count(Event::BadRxChain);
                    bufs.rx_chains.push((head, 0));
                    break;
                }
            }
        }
        let delivery = if placed >= len {
            let count = u16::try_from(bufs.rx_chains.len()).unwrap_or(u16::MAX);
            header::set_num_buffers(&mut bufs.rx[..len], count);
            match header::scatter(mem, &bufs.first_segments, &bufs.rx[..VNET_HDR_LEN]) {
                Ok(_) => Delivery::Delivered,
                Err(_) => Delivery::Dropped,
            }
        } else {
            Delivery::Dropped
        };
        for &(head, n) in &bufs.rx_chains {
            // A dropped frame's chains go back empty.
            let n = if matches!(delivery, Delivery::Delivered) {
                n
            } else {
                0
            };
            if let Err(e) = queue.add_used(&*mem, head, n) {
                tracing::warn!("{tag}: cannot return rx chain {head}: {e}");
            }
        }
        delivery
    }

    fn finish(self) -> WorkerState {
        WorkerState {
            queues: self.queues,
            backend: self.backend,
        }
    }
}

/// Hands `frame` to the MMDS stack if it is for the MMDS; whether it was.
fn to_mmds(mmds: Option<&Arc<Mutex<MmdsStack>>>, frame: &[u8]) -> bool {
    let Some(m) = mmds else { return false };
    let mut m = lock(m);
    if !m.is_mmds_frame(frame) {
        return false;
    }
    m.receive(frame);
    true
}

/// Writes a gathered tx frame (virtio header first) to the tap.
fn send_frame(backend: &mut dyn NetBackend, frame: &[u8], counters: &NetCounters, tag: &str) {
    match backend.write_frame(frame) {
        Ok(_) => counters.count(Event::TxFrame((frame.len() - VNET_HDR_LEN) as u64)),
        Err(e) => {
            // A full tap queue, or a frame the kernel refused (a bad
            // header): dropped, as a congested wire would.
            tracing::debug!("{tag}: frame not sent: {e}");
            counters.count(Event::TxDropped);
        }
    }
}
