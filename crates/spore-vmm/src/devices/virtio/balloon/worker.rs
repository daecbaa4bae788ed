//! The balloon's worker thread: serves inflate, deflate, statistics, free
//! page hinting and free page reporting queues, woken by the queues' ioeventfds, the stats
//! timer and the "settings changed" eventfd, and releases guest memory on
//! the host ([`release`]).

use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use virtio_queue::{DescriptorChain, Queue, QueueT};
use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryRegion};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::timerfd::TimerFd;

use super::request::{
    count_pfns, parse_pfns, parse_report, parse_stats, read_readable, read_readable_into,
    GuestRange, MAX_PFN_BYTES, MAX_STATS_BYTES,
};
use super::{
    Shared, CMD_ID_DONE, CMD_ID_STOP, F_FREE_PAGE_HINT, F_MUST_TELL_HOST, F_REPORTING, F_STATS_VQ,
};
use crate::devices::virtio::queue_server::{drain_queue, Served};
use crate::devices::virtio::{ActivateContext, ActivateError, GuestMemoryMmap, VirtioInterrupt};
use crate::host::lock;

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
const Q_HINT: u64 = 4;

/// What a stopped worker hands back.
pub(super) struct Stopped {
    pub(super) queues: Vec<Queue>,
    /// The statistics buffer the device was holding (its head index).
    pub(super) held_stats: Option<u16>,
}

/// Serves the balloon's queues; runs on the device's worker thread.
pub(super) struct BalloonWorker {
    mem: GuestMemoryMmap,
    interrupt: Arc<VirtioInterrupt>,
    shared: Arc<Shared>,
    inflate: QueueSlot,
    deflate: QueueSlot,
    stats: Option<QueueSlot>,
    hint: Option<QueueSlot>,
    report: Option<QueueSlot>,
    /// The stats buffer the device holds until the next poll.
    held_stats: Option<u16>,
    timer: TimerFd,
    /// The driver promised to deflate before reusing a page.
    must_tell_host: bool,
    /// The last PFN array read, its allocation reused by the next.
    pfn_bytes: Vec<u8>,
}

impl BalloonWorker {
    /// Maps the driver's queues: inflate, deflate, then stats, hinting and
    /// reporting if negotiated. Linux (and Firecracker) number only the
    /// queues in use, so the index of the later ones depends on which of
    /// the earlier ones were negotiated.
    pub(super) fn new(ctx: ActivateContext, shared: Arc<Shared>) -> Result<Self, ActivateError> {
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
        let hint = (acked_features & F_FREE_PAGE_HINT != 0)
            .then(|| take("free page hinting"))
            .transpose()?;
        let report = (acked_features & F_REPORTING != 0)
            .then(|| take("free page reporting"))
            .transpose()?;
        let timer = TimerFd::new().map_err(|e| ActivateError::Worker(e.into()))?;
        // A buffer held when a snapshot was taken is held again.
        let held_stats = lock(&shared.state).restored_held_stats.take();
        let mut w = Self {
            mem,
            interrupt,
            shared,
            inflate,
            deflate,
            stats,
            hint,
            report,
            held_stats,
            timer,
            must_tell_host: acked_features & F_MUST_TELL_HOST != 0,
            pfn_bytes: Vec::with_capacity(MAX_PFN_BYTES as usize),
        };
        w.arm_timer();
        Ok(w)
    }

    pub(super) fn interrupt(&self) -> &Arc<VirtioInterrupt> {
        &self.interrupt
    }

    pub(super) fn epoll(&self) -> std::io::Result<Epoll> {
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
        if let Some(h) = &self.hint {
            fds.push((h.evt.as_raw_fd(), Q_HINT));
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

    /// Serves until `stop` is signalled; hands back the queues (in the
    /// driver's order) and the held statistics buffer, for a snapshot.
    pub(super) fn run(mut self, epoll: Epoll, stop: EventFd) -> Stopped {
        if let Err(e) = epoll.ctl(
            ControlOperation::Add,
            stop.as_raw_fd(),
            EpollEvent::new(EventSet::IN, TOKEN_STOP),
        ) {
            tracing::error!("virtio-balloon: cannot watch the stop event: {e}");
            return self.stopped();
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
                    return self.stopped();
                }
            };
            for ev in &events[..n] {
                match ev.data() {
                    TOKEN_STOP => return self.stopped(),
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
                    Q_HINT => {
                        if let Some(h) = &self.hint {
                            let _ = h.evt.read();
                        }
                        self.serve_hint();
                    }
                    _ => {}
                }
            }
        }
    }

    fn stopped(self) -> Stopped {
        let mut queues = vec![self.inflate.queue, self.deflate.queue];
        queues.extend(self.stats.map(|s| s.queue));
        queues.extend(self.hint.map(|h| h.queue));
        queues.extend(self.report.map(|r| r.queue));
        Stopped {
            queues,
            held_stats: self.held_stats,
        }
    }

    fn serve_all(&mut self) {
        self.serve_inflate();
        self.serve_deflate();
        self.serve_stats();
        self.serve_hint();
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
        let bytes = &mut self.pfn_bytes;
        let mut pending: Vec<GuestRange> = Vec::new();
        let used = drain(&mut self.inflate.queue, &self.inflate.evt, mem, |chain| {
            let skipped = read_readable_into(mem, chain, MAX_PFN_BYTES, bytes);
            let batch = parse_pfns(mem, bytes);
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
            } else if let Err(e) = release_counted(shared, mem, &batch.ranges) {
                tracing::error!("virtio-balloon: cannot release inflated pages: {e}");
            }
            Some(0)
        });
        notify(&self.interrupt, mem, &mut self.inflate.queue, used);
        if let Err(e) = release_counted(shared, mem, &pending) {
            tracing::error!("virtio-balloon: cannot release inflated pages: {e}");
        }
    }

    pub(super) fn serve_deflate(&mut self) {
        let (mem, shared) = (&self.mem, &self.shared);
        let bytes = &mut self.pfn_bytes;
        // Nothing to do on the host: a deflated page is backed again on the
        // guest's next touch (as a zero page). The guest waits for the
        // answer, so the pages are only counted.
        let used = drain(&mut self.deflate.queue, &self.deflate.evt, mem, |chain| {
            read_readable_into(mem, chain, MAX_PFN_BYTES, bytes);
            let (pages, refused) = count_pfns(mem, bytes);
            let mut st = lock(&shared.state);
            st.counters.deflated_pages += pages;
            st.counters.refused += refused;
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
        let used = drain(&mut slot.queue, &slot.evt, mem, |chain| {
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
        let used = drain(&mut slot.queue, &slot.evt, mem, |chain| {
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
            if let Err(e) = release_counted(shared, mem, &ranges) {
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

impl BalloonWorker {
    /// Serves the hinting queue. A device-readable 4-byte buffer carries a
    /// command id (the run's id when the driver starts, STOP when it is
    /// done); a device-writable buffer is a free range the driver hinted
    /// (Linux sends 4 MiB blocks it has taken from its allocator and keeps
    /// until the host says DONE). A range is released only while the host's
    /// command is the run the driver is answering; the state lock is held
    /// across the release, so a `stop` (DONE, after which the guest reuses
    /// its pages) cannot slip between the check and the release.
    pub(super) fn serve_hint(&mut self) {
        let Some(slot) = &mut self.hint else {
            return;
        };
        let (mem, shared) = (&self.mem, &self.shared);
        // The run the driver last said it finished, if that is its last word.
        let mut finished: Option<u32> = None;
        let used = drain(&mut slot.queue, &slot.evt, mem, |chain| {
            let mut st = lock(&shared.state);
            for d in chain {
                if !d.is_write_only() {
                    let mut id = [0u8; 4];
                    if d.len() != 4 || mem.read_slice(&mut id, d.addr()).is_err() {
                        st.counters.refused += 1;
                        tracing::warn!(
                            "virtio-balloon: hinting command of {} bytes at {:#x} refused",
                            d.len(),
                            d.addr().raw_value()
                        );
                        continue;
                    }
                    let cmd = u32::from_le_bytes(id);
                    let previous = st.hint.guest_cmd.replace(cmd);
                    // DONE is not the driver's to send; take it as STOP.
                    finished = if cmd == CMD_ID_STOP || cmd == CMD_ID_DONE {
                        previous.filter(|&p| p > CMD_ID_DONE).or(finished)
                    } else {
                        None
                    };
                    continue;
                }
                let host = st.hint.host_cmd;
                let active = host != CMD_ID_STOP && host != CMD_ID_DONE;
                if !active || st.hint.guest_cmd != Some(host) {
                    st.counters.hints_ignored += 1;
                    continue;
                }
                let range = match parse_report(mem, &d) {
                    Ok(r) => r,
                    Err(e) => {
                        st.counters.refused += 1;
                        tracing::warn!("virtio-balloon: free page hint refused: {e}");
                        continue;
                    }
                };
                let start = Instant::now();
                if let Err(e) = release(mem, &[range]) {
                    tracing::error!("virtio-balloon: cannot release hinted pages: {e}");
                }
                st.counters.hinted_bytes += range.len;
                st.counters.release_calls += 1;
                st.counters.release_us += micros_since(start);
            }
            Some(0)
        });
        notify(&self.interrupt, mem, &mut slot.queue, used);
        // Acknowledge the end of the run the host asked for; not of an older
        // one (a newer run, started meanwhile, must not be cancelled).
        if let Some(run) = finished {
            let mut st = lock(&shared.state);
            if st.hint.ack_on_stop && st.hint.host_cmd == run {
                st.hint.host_cmd = CMD_ID_DONE;
                drop(st);
                self.interrupt.signal_config_change();
            }
        }
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

/// Serves a queue's available chains; see [`drain_queue`].
fn drain(
    queue: &mut Queue,
    evt: &EventFd,
    mem: &GuestMemoryMmap,
    mut serve: impl FnMut(DescriptorChain<&GuestMemoryMmap>) -> Option<u32>,
) -> bool {
    drain_queue(queue, evt, mem, "virtio-balloon", |chain| {
        match serve(chain) {
            Some(len) => Served::Used(len),
            None => Served::Kept,
        }
    })
}

/// [`release`], counted in the device's host counters.
fn release_counted(
    shared: &Shared,
    mem: &GuestMemoryMmap,
    ranges: &[GuestRange],
) -> std::io::Result<()> {
    let start = Instant::now();
    let result = release(mem, ranges);
    let mut st = lock(&shared.state);
    st.counters.release_calls += ranges.len() as u64;
    st.counters.release_us += micros_since(start);
    result
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
        let discard = |advice| unsafe {
            libc::madvise(
                region
                    .as_ptr()
                    .add(crate::host_usize::from_u64(offset))
                    .cast(),
                crate::host_usize::from_u64(r.len),
                advice,
            )
        };
        let mut rc = discard(advice);
        if rc != 0 && advice == libc::MADV_REMOVE {
            // RAM re-mapped privately over a clone template since it was
            // made (a source that goes on in continue mode): drop the
            // private copies instead; the template is never written.
            rc = discard(libc::MADV_DONTNEED);
        }
        if rc != 0 && first_error.is_none() {
            first_error = Some(std::io::Error::last_os_error());
        }
        // Memfd or anonymous RAM now reads as zeros there: a diff snapshot
        // must say so (its file holds dirty pages, zero ones included), or
        // an older layer's contents would show through on restore, and an
        // eager restore would read them in. RAM mapped privately over
        // snapshot layers (a restored VM) reads the layers' contents again,
        // which a diff on them already has: marking those pages would fill
        // the diff with the guest's free memory (free page reporting hands
        // over most of it), and a page the guest gave up has no content it
        // relies on either way.
        let file_private =
            advice == libc::MADV_DONTNEED && region.flags() & libc::MAP_ANONYMOUS == 0;
        if !file_private {
            let mapping: &vm_memory::MmapRegion<crate::devices::virtio::DirtyBitmap> = region;
            mapping.bitmap().set_addr_range(
                crate::host_usize::from_u64(offset),
                crate::host_usize::from_u64(r.len),
            );
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// Microseconds since `start`, saturating (u64 microseconds last 584,000 years).
fn micros_since(start: Instant) -> u64 {
    u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
impl BalloonWorker {
    /// A worker over the given queues, for tests that drive it by hand.
    pub(super) fn for_test(ctx: ActivateContext, handle: &super::BalloonHandle) -> Self {
        let shared = handle.shared();
        let w = Self::new(ctx, shared.clone()).expect("queues ready");
        lock(&shared.state).interrupt = Some(w.interrupt.clone());
        w
    }

    pub(super) fn queue(&self, index: u64) -> &Queue {
        match index {
            Q_INFLATE => &self.inflate.queue,
            Q_DEFLATE => &self.deflate.queue,
            Q_STATS => &self.stats.as_ref().expect("stats queue").queue,
            Q_HINT => &self.hint.as_ref().expect("hinting queue").queue,
            _ => &self.report.as_ref().expect("report queue").queue,
        }
    }
}
