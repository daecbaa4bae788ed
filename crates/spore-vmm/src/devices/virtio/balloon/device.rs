//! The balloon device model, its worker thread and the host-side release.
//!
//! [`Balloon`] is what the transport sees; [`BalloonHandle`] is what the VMM
//! keeps to change the target and read statistics while the VM runs. Both
//! share one [`Shared`] block: the config space (target, actual), the last
//! statistics, the polling interval and, once activated, the interrupt.
//!
//! The worker ([`BalloonWorker`]) serves every queue on one thread of its
//! own, woken by the queues' ioeventfds, a stats timer and a "settings
//! changed" eventfd. Inflated pages and reported free ranges are released
//! on the host with [`release`].

use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use virtio_queue::{DescriptorChain, Queue, QueueT};
use vm_memory::{Address, GuestAddress, GuestMemoryBackend, GuestMemoryRegion};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
use vmm_sys_util::timerfd::TimerFd;

use super::request::{
    parse_pfns, parse_report, parse_stats, read_readable, GuestRange, GuestStats, MAX_PFN_BYTES,
    MAX_STATS_BYTES, PAGE_SHIFT,
};
use crate::devices::bus::lock;
use crate::devices::virtio::worker::Worker;
use crate::devices::virtio::{
    device_type, ActivateContext, ActivateError, GuestMemoryMmap, VirtioDevice, VirtioInterrupt,
};

/// Feature bits (virtio 1.2, §5.5.3).
pub const F_MUST_TELL_HOST: u64 = 1 << 0;
pub const F_STATS_VQ: u64 = 1 << 1;
pub const F_DEFLATE_ON_OOM: u64 = 1 << 2;
pub const F_REPORTING: u64 = 1 << 5;

/// Entries per queue.
pub const QUEUE_SIZE: u16 = 256;
/// Size of the config space: num_pages, actual, free_page_hint_cmd_id, poison_val.
const CONFIG_SIZE: usize = 16;
const CONFIG_ACTUAL: u64 = 4;
/// Pages per MiB, at the balloon's 4 KiB page size.
const PAGES_PER_MIB_SHIFT: u32 = 20 - PAGE_SHIFT;

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum BalloonError {
    #[error("amount_mib {amount} exceeds the guest's memory ({mem} MiB)")]
    TooLarge { amount: u64, mem: u64 },
    #[error(
        "statistics were {0} when the balloon was configured; the polling interval can be \
         changed but not switched between 0 and non-zero"
    )]
    StatsStateChange(&'static str),
    #[error(
        "balloon statistics are disabled: configure the balloon with stats_polling_interval_s > 0"
    )]
    StatsDisabled,
}

/// What the device is configured with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BalloonSettings {
    pub amount_mib: u32,
    pub deflate_on_oom: bool,
    pub stats_polling_interval_s: u16,
    pub free_page_reporting: bool,
    /// Guest RAM, bounding the target.
    pub mem_mib: u64,
}

/// Host-side counters, for tests and the statistics endpoint.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ReleaseCounters {
    /// Pages the guest inflated (each released on the host).
    pub inflated_pages: u64,
    /// Pages the guest deflated.
    pub deflated_pages: u64,
    /// Bytes of free page reports released on the host.
    pub reported_bytes: u64,
    /// PFNs and report ranges refused (outside guest RAM, misaligned).
    pub refused: u64,
}

struct State {
    target_pages: u32,
    actual_pages: u32,
    stats_interval_s: u16,
    stats: Option<(GuestStats, SystemTime)>,
    /// When the target was last set and when the driver last changed
    /// `actual`: the time a resize took, measured where it happens.
    target_set_at: Option<SystemTime>,
    actual_set_at: Option<SystemTime>,
    counters: ReleaseCounters,
    /// Present while the device is activated: config changes interrupt.
    interrupt: Option<Arc<VirtioInterrupt>>,
}

struct Shared {
    state: Mutex<State>,
    deflate_on_oom: bool,
    free_page_reporting: bool,
    mem_mib: u64,
    /// Tells a running worker the polling interval changed.
    settings_evt: EventFd,
}

/// The VMM's hold on a balloon: target, actual, statistics.
#[derive(Clone)]
pub struct BalloonHandle(Arc<Shared>);

/// `GET /balloon`: Firecracker's fields, plus spore's view of progress.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BalloonStatus {
    pub amount_mib: u32,
    pub deflate_on_oom: bool,
    pub stats_polling_interval_s: u16,
    pub free_page_reporting: bool,
    pub target_pages: u32,
    pub actual_pages: u32,
    pub target_mib: u32,
    pub actual_mib: u32,
    /// When the target was last changed (Unix ms), if it was at run time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_updated_ms: Option<u64>,
    /// When the driver last changed `actual` (Unix ms).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub actual_updated_ms: Option<u64>,
}

/// `GET /balloon/statistics`, Firecracker's shape.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BalloonStatistics {
    pub target_pages: u32,
    pub actual_pages: u32,
    pub target_mib: u32,
    pub actual_mib: u32,
    #[serde(flatten)]
    pub stats: GuestStats,
    /// spore extension: when the guest last reported, in ms since the epoch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_update_ms: Option<u64>,
    /// spore extension: what was released on the host.
    pub host: ReleaseCounters,
}

impl BalloonHandle {
    /// Changes the target and tells the driver (config-change interrupt).
    pub fn set_target_mib(&self, amount_mib: u32) -> Result<(), BalloonError> {
        let s = &self.0;
        if u64::from(amount_mib) > s.mem_mib {
            return Err(BalloonError::TooLarge {
                amount: amount_mib.into(),
                mem: s.mem_mib,
            });
        }
        let interrupt = {
            let mut st = lock(&s.state);
            st.target_pages = amount_mib << PAGES_PER_MIB_SHIFT;
            st.target_set_at = Some(SystemTime::now());
            st.interrupt.clone()
        };
        if let Some(i) = interrupt {
            i.signal_config_change();
        }
        Ok(())
    }

    /// Changes the statistics polling interval; 0 ↔ non-zero is refused
    /// (the stats queue exists only if it was non-zero at configuration).
    pub fn set_stats_interval(&self, interval_s: u16) -> Result<(), BalloonError> {
        {
            let mut st = lock(&self.0.state);
            match (st.stats_interval_s == 0, interval_s == 0) {
                (true, false) => return Err(BalloonError::StatsStateChange("disabled")),
                (false, true) => return Err(BalloonError::StatsStateChange("enabled")),
                _ => st.stats_interval_s = interval_s,
            }
        }
        if let Err(e) = self.0.settings_evt.write(1) {
            tracing::warn!("virtio-balloon: cannot wake the worker: {e}");
        }
        Ok(())
    }

    pub fn status(&self) -> BalloonStatus {
        let st = lock(&self.0.state);
        BalloonStatus {
            amount_mib: st.target_pages >> PAGES_PER_MIB_SHIFT,
            deflate_on_oom: self.0.deflate_on_oom,
            stats_polling_interval_s: st.stats_interval_s,
            free_page_reporting: self.0.free_page_reporting,
            target_pages: st.target_pages,
            actual_pages: st.actual_pages,
            target_mib: st.target_pages >> PAGES_PER_MIB_SHIFT,
            actual_mib: st.actual_pages >> PAGES_PER_MIB_SHIFT,
            target_updated_ms: st.target_set_at.and_then(unix_ms),
            actual_updated_ms: st.actual_set_at.and_then(unix_ms),
        }
    }

    pub fn statistics(&self) -> Result<BalloonStatistics, BalloonError> {
        let st = lock(&self.0.state);
        if st.stats_interval_s == 0 {
            return Err(BalloonError::StatsDisabled);
        }
        let (stats, when) = st.stats.clone().unzip();
        Ok(BalloonStatistics {
            target_pages: st.target_pages,
            actual_pages: st.actual_pages,
            target_mib: st.target_pages >> PAGES_PER_MIB_SHIFT,
            actual_mib: st.actual_pages >> PAGES_PER_MIB_SHIFT,
            stats: stats.unwrap_or_default(),
            last_update_ms: when.and_then(unix_ms),
            host: st.counters,
        })
    }

    pub fn counters(&self) -> ReleaseCounters {
        lock(&self.0.state).counters
    }
}

fn unix_ms(t: SystemTime) -> Option<u64> {
    t.duration_since(UNIX_EPOCH)
        .ok()
        .map(|d| d.as_millis() as u64)
}

/// A virtio balloon (device id 5).
pub struct Balloon {
    shared: Arc<Shared>,
    features: u64,
    queue_sizes: Vec<u16>,
    worker: Option<Worker<()>>,
}

impl Balloon {
    pub fn new(settings: BalloonSettings) -> Result<Self, std::io::Error> {
        if u64::from(settings.amount_mib) > settings.mem_mib {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                BalloonError::TooLarge {
                    amount: settings.amount_mib.into(),
                    mem: settings.mem_mib,
                },
            ));
        }
        let mut features =
            1 << VIRTIO_F_VERSION_1 | 1 << VIRTIO_RING_F_EVENT_IDX | F_MUST_TELL_HOST;
        let mut queues = 2;
        if settings.stats_polling_interval_s > 0 {
            features |= F_STATS_VQ;
            queues += 1;
        }
        if settings.deflate_on_oom {
            features |= F_DEFLATE_ON_OOM;
        }
        if settings.free_page_reporting {
            features |= F_REPORTING;
            queues += 1;
        }
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                target_pages: settings.amount_mib << PAGES_PER_MIB_SHIFT,
                actual_pages: 0,
                stats_interval_s: settings.stats_polling_interval_s,
                stats: None,
                target_set_at: None,
                actual_set_at: None,
                counters: ReleaseCounters::default(),
                interrupt: None,
            }),
            deflate_on_oom: settings.deflate_on_oom,
            free_page_reporting: settings.free_page_reporting,
            mem_mib: settings.mem_mib,
            settings_evt: EventFd::new(EFD_NONBLOCK)?,
        });
        Ok(Self {
            shared,
            features,
            queue_sizes: vec![QUEUE_SIZE; queues],
            worker: None,
        })
    }

    pub fn handle(&self) -> BalloonHandle {
        BalloonHandle(self.shared.clone())
    }

    fn stop_worker(&mut self) {
        if let Some(w) = self.worker.take() {
            if w.stop().is_none() {
                tracing::error!("virtio-balloon: worker thread panicked");
            }
        }
        lock(&self.shared.state).interrupt = None;
    }

    fn config_bytes(&self) -> [u8; CONFIG_SIZE] {
        let st = lock(&self.shared.state);
        let mut c = [0u8; CONFIG_SIZE];
        c[..4].copy_from_slice(&st.target_pages.to_le_bytes());
        c[4..8].copy_from_slice(&st.actual_pages.to_le_bytes());
        c
    }
}

impl VirtioDevice for Balloon {
    fn device_type(&self) -> u32 {
        device_type::BALLOON
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &self.queue_sizes
    }

    fn avail_features(&self) -> u64 {
        self.features
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        let config = self.config_bytes();
        for (i, byte) in data.iter_mut().enumerate() {
            *byte = offset
                .checked_add(i as u64)
                .and_then(|o| usize::try_from(o).ok())
                .and_then(|o| config.get(o).copied())
                .unwrap_or(0);
        }
    }

    /// Only `actual` is writable: the driver reports how many pages it holds.
    fn write_config(&mut self, offset: u64, data: &[u8]) {
        let mut st = lock(&self.shared.state);
        let mut actual = st.actual_pages.to_le_bytes();
        let mut touched = false;
        for (i, &b) in data.iter().enumerate() {
            let Some(o) = offset.checked_add(i as u64) else {
                break;
            };
            if let Some(slot) = o
                .checked_sub(CONFIG_ACTUAL)
                .and_then(|k| usize::try_from(k).ok())
                .and_then(|k| actual.get_mut(k))
            {
                *slot = b;
                touched = true;
            } else {
                tracing::debug!("virtio-balloon: write to read-only config byte {o} ignored");
            }
        }
        let actual = u32::from_le_bytes(actual);
        if touched && actual != st.actual_pages {
            st.actual_pages = actual;
            st.actual_set_at = Some(SystemTime::now());
        }
    }

    fn activate(&mut self, ctx: ActivateContext) -> Result<(), ActivateError> {
        self.stop_worker();
        let worker = BalloonWorker::new(ctx, self.shared.clone())?;
        let epoll = worker.epoll().map_err(ActivateError::Worker)?;
        lock(&self.shared.state).interrupt = Some(worker.interrupt.clone());
        let w = Worker::spawn("virtio-balloon", move |stop| worker.run(epoll, stop));
        match w {
            Ok(w) => {
                self.worker = Some(w);
                Ok(())
            }
            Err(e) => {
                lock(&self.shared.state).interrupt = None;
                Err(ActivateError::Worker(e))
            }
        }
    }

    fn reset(&mut self) {
        self.stop_worker();
    }
}

/// One queue and its notification eventfd.
struct QueueSlot {
    queue: Queue,
    evt: EventFd,
}

const TOKEN_STOP: u64 = 100;
const TOKEN_TIMER: u64 = 101;
const TOKEN_SETTINGS: u64 = 102;
const Q_INFLATE: u64 = 0;
const Q_DEFLATE: u64 = 1;
const Q_STATS: u64 = 2;
const Q_REPORT: u64 = 3;

/// Serves the balloon's queues; runs on the device's worker thread.
pub(super) struct BalloonWorker {
    mem: GuestMemoryMmap,
    interrupt: Arc<VirtioInterrupt>,
    shared: Arc<Shared>,
    inflate: QueueSlot,
    deflate: QueueSlot,
    stats: Option<QueueSlot>,
    report: Option<QueueSlot>,
    /// The stats buffer the device holds until the next poll.
    held_stats: Option<u16>,
    timer: TimerFd,
    /// The driver promised to deflate before reusing a page.
    must_tell_host: bool,
}

impl BalloonWorker {
    /// Maps the driver's queues: inflate, deflate, then stats and reporting
    /// if negotiated. Linux numbers only the queues it uses, so the index of
    /// the reporting queue depends on whether stats were negotiated.
    fn new(ctx: ActivateContext, shared: Arc<Shared>) -> Result<Self, ActivateError> {
        let ActivateContext {
            mem,
            interrupt,
            queues,
            queue_events,
            acked_features,
        } = ctx;
        let got = queues.len().min(queue_events.len());
        let mut slots = queues
            .into_iter()
            .zip(queue_events)
            .map(|(queue, evt)| QueueSlot { queue, evt });
        let mut take = |what: &str| -> Result<QueueSlot, ActivateError> {
            let slot = slots.next().ok_or(ActivateError::QueueCount {
                expected: got + 1,
                got,
            })?;
            if !slot.queue.ready() {
                return Err(ActivateError::Device(format!(
                    "virtio-balloon: the driver did not enable the {what} queue"
                )));
            }
            Ok(slot)
        };
        let inflate = take("inflate")?;
        let deflate = take("deflate")?;
        let stats = (acked_features & F_STATS_VQ != 0)
            .then(|| take("statistics"))
            .transpose()?;
        let report = (acked_features & F_REPORTING != 0)
            .then(|| take("free page reporting"))
            .transpose()?;
        let timer = TimerFd::new().map_err(|e| ActivateError::Worker(e.into()))?;
        let mut w = Self {
            mem,
            interrupt,
            shared,
            inflate,
            deflate,
            stats,
            report,
            held_stats: None,
            timer,
            must_tell_host: acked_features & F_MUST_TELL_HOST != 0,
        };
        w.arm_timer();
        Ok(w)
    }

    fn epoll(&self) -> std::io::Result<Epoll> {
        let epoll = Epoll::new()?;
        let mut fds = vec![
            (self.inflate.evt.as_raw_fd(), Q_INFLATE),
            (self.deflate.evt.as_raw_fd(), Q_DEFLATE),
            (self.timer.as_raw_fd(), TOKEN_TIMER),
            (self.shared.settings_evt.as_raw_fd(), TOKEN_SETTINGS),
        ];
        if let Some(s) = &self.stats {
            fds.push((s.evt.as_raw_fd(), Q_STATS));
        }
        if let Some(r) = &self.report {
            fds.push((r.evt.as_raw_fd(), Q_REPORT));
        }
        for (fd, token) in fds {
            epoll.ctl(
                ControlOperation::Add,
                fd,
                EpollEvent::new(EventSet::IN, token),
            )?;
        }
        Ok(epoll)
    }

    fn run(mut self, epoll: Epoll, stop: EventFd) {
        if let Err(e) = epoll.ctl(
            ControlOperation::Add,
            stop.as_raw_fd(),
            EpollEvent::new(EventSet::IN, TOKEN_STOP),
        ) {
            tracing::error!("virtio-balloon: cannot watch the stop event: {e}");
            return;
        }
        // Buffers made available before activation need no new notification.
        self.serve_all();
        let mut events = [EpollEvent::default(); 8];
        loop {
            let n = match epoll.wait(-1, &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::error!("virtio-balloon: epoll failed: {e}");
                    return;
                }
            };
            for ev in &events[..n] {
                match ev.data() {
                    TOKEN_STOP => return,
                    TOKEN_TIMER => {
                        // A read error only means no expiry is pending.
                        let _ = self.timer.wait();
                        self.poll_stats();
                    }
                    TOKEN_SETTINGS => {
                        let _ = self.shared.settings_evt.read();
                        self.arm_timer();
                        // As in Firecracker: the first update comes at once.
                        self.poll_stats();
                    }
                    Q_INFLATE => {
                        let _ = self.inflate.evt.read();
                        self.serve_inflate();
                    }
                    Q_DEFLATE => {
                        let _ = self.deflate.evt.read();
                        self.serve_deflate();
                    }
                    Q_STATS => {
                        if let Some(s) = &self.stats {
                            let _ = s.evt.read();
                        }
                        self.serve_stats();
                    }
                    Q_REPORT => {
                        if let Some(r) = &self.report {
                            let _ = r.evt.read();
                        }
                        self.serve_report();
                    }
                    _ => {}
                }
            }
        }
    }

    fn serve_all(&mut self) {
        self.serve_inflate();
        self.serve_deflate();
        self.serve_stats();
        self.serve_report();
    }

    /// (Re)arms the stats timer at the current interval; disarms it when
    /// there is no stats queue.
    fn arm_timer(&mut self) {
        let interval = lock(&self.shared.state).stats_interval_s;
        let result = if self.stats.is_some() && interval > 0 {
            let d = Duration::from_secs(interval.into());
            self.timer.reset(d, Some(d))
        } else {
            self.timer.clear()
        };
        if let Err(e) = result {
            tracing::warn!("virtio-balloon: cannot arm the statistics timer: {e}");
        }
    }

    /// When the driver acked VIRTIO_BALLOON_F_MUST_TELL_HOST, inflated pages
    /// are released *after* the chain is returned, so the guest fills its
    /// next batch while the host frees this one: the guest may then reuse a
    /// page only after the device used its deflate request, and deflate
    /// requests are served on this thread, after this release. Otherwise
    /// the driver may reuse pages at once, so they are released first.
    pub(super) fn serve_inflate(&mut self) {
        let (mem, shared, must_tell) = (&self.mem, &self.shared, self.must_tell_host);
        let mut pending: Vec<GuestRange> = Vec::new();
        let used = drain(&mut self.inflate.queue, mem, |chain| {
            let (bytes, skipped) = read_readable(mem, chain, MAX_PFN_BYTES);
            let batch = parse_pfns(mem, &bytes);
            let mut st = lock(&shared.state);
            st.counters.inflated_pages += batch.pages;
            st.counters.refused += batch.refused;
            drop(st);
            if batch.refused > 0 || skipped > 0 || batch.ignored_bytes > 0 {
                tracing::warn!(
                    "virtio-balloon: inflate refused {} PFNs outside guest RAM, ignored {} bytes",
                    batch.refused,
                    skipped + batch.ignored_bytes
                );
            }
            if must_tell {
                pending.extend(batch.ranges);
            } else if let Err(e) = release(mem, &batch.ranges) {
                tracing::error!("virtio-balloon: cannot release inflated pages: {e}");
            }
            Some(0)
        });
        notify(&self.interrupt, mem, &mut self.inflate.queue, used);
        if let Err(e) = release(mem, &pending) {
            tracing::error!("virtio-balloon: cannot release inflated pages: {e}");
        }
    }

    pub(super) fn serve_deflate(&mut self) {
        let (mem, shared) = (&self.mem, &self.shared);
        // Nothing to do on the host: a deflated page is backed again on the
        // guest's next touch (as a zero page).
        let used = drain(&mut self.deflate.queue, mem, |chain| {
            let (bytes, _) = read_readable(mem, chain, MAX_PFN_BYTES);
            let batch = parse_pfns(mem, &bytes);
            let mut st = lock(&shared.state);
            st.counters.deflated_pages += batch.pages;
            st.counters.refused += batch.refused;
            Some(0)
        });
        notify(&self.interrupt, mem, &mut self.deflate.queue, used);
    }

    /// Takes a statistics buffer: record it and hold it until the next poll.
    pub(super) fn serve_stats(&mut self) {
        let Some(slot) = &mut self.stats else {
            return;
        };
        let (mem, shared) = (&self.mem, &self.shared);
        let mut newest: Option<u16> = None;
        let mut extra: Vec<u16> = Vec::new();
        let used = drain(&mut slot.queue, mem, |chain| {
            let head = chain.head_index();
            let (bytes, _) = read_readable(mem, chain, MAX_STATS_BYTES);
            let batch = parse_stats(&bytes);
            if batch.unknown_tags > 0 || batch.truncated_bytes > 0 {
                tracing::debug!(
                    "virtio-balloon: stats with {} unknown tags, {} trailing bytes",
                    batch.unknown_tags,
                    batch.truncated_bytes
                );
            }
            lock(&shared.state).stats = Some((batch.stats, SystemTime::now()));
            // Linux keeps one buffer in flight; hold only the newest.
            if let Some(old) = newest.replace(head) {
                extra.push(old);
            }
            None
        });
        let mut returned = used;
        if let Some(h) = newest {
            if let Some(old) = self.held_stats.replace(h) {
                extra.push(old);
            }
        }
        for head in extra {
            returned |= add_used(&mut slot.queue, mem, head);
        }
        notify(&self.interrupt, mem, &mut slot.queue, returned);
    }

    /// Asks the driver for fresh statistics by returning the held buffer.
    pub(super) fn poll_stats(&mut self) {
        let (Some(slot), Some(head)) = (&mut self.stats, self.held_stats.take()) else {
            return;
        };
        let used = add_used(&mut slot.queue, &self.mem, head);
        notify(&self.interrupt, &self.mem, &mut slot.queue, used);
    }

    /// Releases each reported free range on the host.
    pub(super) fn serve_report(&mut self) {
        let Some(slot) = &mut self.report else {
            return;
        };
        let (mem, shared) = (&self.mem, &self.shared);
        let used = drain(&mut slot.queue, mem, |chain| {
            let mut ranges = Vec::new();
            let mut refused = 0;
            for d in chain {
                match parse_report(mem, &d) {
                    Ok(r) => ranges.push(r),
                    Err(e) => {
                        refused += 1;
                        tracing::warn!("virtio-balloon: free page report refused: {e}");
                    }
                }
            }
            if let Err(e) = release(mem, &ranges) {
                tracing::error!("virtio-balloon: cannot release reported pages: {e}");
            }
            let mut st = lock(&shared.state);
            st.counters.reported_bytes += ranges.iter().map(|r| r.len).sum::<u64>();
            st.counters.refused += refused;
            Some(0)
        });
        notify(&self.interrupt, mem, &mut slot.queue, used);
    }
}

/// Interrupts the driver after buffers were used, if it wants to know.
fn notify(interrupt: &VirtioInterrupt, mem: &GuestMemoryMmap, queue: &mut Queue, used: bool) {
    if used && queue.needs_notification(mem).unwrap_or(true) {
        interrupt.signal_used_queue();
    }
}

fn add_used(queue: &mut Queue, mem: &GuestMemoryMmap, head: u16) -> bool {
    match queue.add_used(mem, head, 0) {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!("virtio-balloon: cannot return chain {head}: {e}");
            false
        }
    }
}

/// Pops every available chain (in bounded batches, with notifications
/// suppressed while busy) and returns those `serve` answers with a used
/// length; `None` keeps the chain. Returns whether any chain was used.
fn drain(
    queue: &mut Queue,
    mem: &GuestMemoryMmap,
    mut serve: impl FnMut(DescriptorChain<&GuestMemoryMmap>) -> Option<u32>,
) -> bool {
    let batch = 4 * usize::from(queue.size());
    let mut served = 0;
    let mut used_any = false;
    loop {
        if let Err(e) = queue.disable_notification(mem) {
            tracing::warn!("virtio-balloon: queue unusable: {e}");
            break;
        }
        let before = served;
        while served < batch {
            let Some(chain) = queue.pop_descriptor_chain(mem) else {
                break;
            };
            served += 1;
            let head = chain.head_index();
            if let Some(len) = serve(chain) {
                match queue.add_used(mem, head, len) {
                    Ok(()) => used_any = true,
                    Err(e) => tracing::warn!("virtio-balloon: cannot return chain {head}: {e}"),
                }
            }
        }
        if served >= batch {
            break;
        }
        match queue.enable_notification(mem) {
            // More arrived while notifications were off; retry only after
            // progress, so a corrupt avail index cannot make this spin.
            Ok(true) if served > before => continue,
            Ok(_) => break,
            Err(e) => {
                tracing::warn!("virtio-balloon: queue unusable: {e}");
                break;
            }
        }
    }
    used_any
}

/// Gives guest RAM ranges back to the host. Shared mappings (the memfd)
/// get `MADV_REMOVE`, which punches a hole in the file at the mapping's
/// offset; private mappings get `MADV_DONTNEED`. Either way the pages read
/// as zero on the guest's next touch (or as the file's content for a
/// private file mapping, which a balloon page's content never matters for).
pub fn release(mem: &GuestMemoryMmap, ranges: &[GuestRange]) -> std::io::Result<()> {
    let mut first_error = None;
    for r in ranges {
        let Some(region) = mem.find_region(GuestAddress(r.addr)) else {
            continue;
        };
        let offset = r.addr - region.start_addr().raw_value();
        let fits = offset
            .checked_add(r.len)
            .is_some_and(|end| end <= region.len());
        if !fits {
            // parse_* never produce such a range; refuse rather than trust it.
            continue;
        }
        let advice = if region.flags() & libc::MAP_SHARED != 0 {
            libc::MADV_REMOVE
        } else {
            libc::MADV_DONTNEED
        };
        // SAFETY: the range lies inside this mapping (checked above) and the
        // guest gave these pages up; discarding their content is the point.
        let rc = unsafe {
            libc::madvise(
                region.as_ptr().add(offset as usize).cast(),
                r.len as usize,
                advice,
            )
        };
        if rc != 0 && first_error.is_none() {
            first_error = Some(std::io::Error::last_os_error());
        }
    }
    first_error.map_or(Ok(()), Err)
}

#[cfg(test)]
impl BalloonWorker {
    /// A worker over the given queues, for tests that drive it by hand.
    pub(super) fn for_test(ctx: ActivateContext, handle: &BalloonHandle) -> Self {
        let w = Self::new(ctx, handle.0.clone()).expect("queues ready");
        lock(&handle.0.state).interrupt = Some(w.interrupt.clone());
        w
    }

    pub(super) fn queue(&self, index: u64) -> &Queue {
        match index {
            Q_INFLATE => &self.inflate.queue,
            Q_DEFLATE => &self.deflate.queue,
            Q_STATS => &self.stats.as_ref().expect("stats queue").queue,
            _ => &self.report.as_ref().expect("report queue").queue,
        }
    }
}
