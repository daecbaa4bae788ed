//! The built-in page-fault handler: a thread serving guest RAM from the
//! snapshot's [`MemoryLayers`] (newest layer wins, holes are zero pages),
//! a run of pages per fault, optionally logging the first-touch order for
//! a working set. Also what `spore`'s external handler command runs
//! ([`serve_loop`]).

use std::io::ErrorKind;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use vmm_sys_util::eventfd::EventFd;

use super::{page_size_of, Fill, RegionMapping, Uffd, UffdError, PAGE};
use crate::memory::layers::{Extent, MemoryLayers};
use crate::memory::GuestRam;
use crate::snapshot::restore::spans;

/// Pages the built-in handler fills per fault at most: the aligned block
/// of this many pages around the fault, cut to the pages not served yet
/// and to the extent (or hole) holding the fault. A fault costs a round
/// trip of tens of µs here; copying 1 MiB costs less than a few of them.
/// `SPORE_UFFD_RUN` (pages, a power of two) changes it, for measuring.
const RUN: u64 = 256;

fn run_pages() -> u64 {
    std::env::var("SPORE_UFFD_RUN")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .filter(|n| n.is_power_of_two() && *n <= 4096)
        .unwrap_or(RUN)
}

/// The pages a handler has filled, by memory-file page number: a run is
/// cut at the first page already there (`UFFDIO_COPY` would fail on it).
struct Served {
    bits: Vec<u64>,
    run: u64,
}

impl Served {
    fn new(source: &PageSource) -> Self {
        let pages = source
            .regions
            .iter()
            .map(|r| (r.offset + r.size) / PAGE)
            .max()
            .unwrap_or(0);
        Self {
            bits: vec![0; crate::host_usize::from_u64(pages.div_ceil(64))],
            run: run_pages(),
        }
    }

    fn get(&self, p: u64) -> bool {
        self.bits
            .get((p / 64) as usize)
            .is_some_and(|w| w & (1 << (p % 64)) != 0)
    }

    fn set(&mut self, lo: u64, hi: u64) {
        for p in lo..hi {
            if let Some(w) = self.bits.get_mut((p / 64) as usize) {
                *w |= 1 << (p % 64);
            }
        }
    }
}

/// Serves faults from snapshot layers: finds which layer holds a page and
/// copies it in, or maps zeroes for holes.
pub struct PageSource {
    layers: MemoryLayers,
    extents: Vec<Extent>,
    regions: Vec<RegionMapping>,
}

impl PageSource {
    pub fn new(layers: MemoryLayers, regions: Vec<RegionMapping>) -> std::io::Result<Self> {
        for r in &regions {
            r.check()?;
        }
        let extents = layers.extents()?;
        Ok(Self {
            layers,
            extents,
            regions,
        })
    }

    /// The page holding a host address in guest RAM: its host address,
    /// memory-file offset and size.
    pub(super) fn page_of(&self, addr: u64) -> Option<(u64, u64, u64)> {
        self.regions.iter().find_map(|r| {
            let d = addr.checked_sub(r.base_host_virt_addr)?;
            let p = r.page_size;
            (d < r.size).then(|| {
                (
                    r.base_host_virt_addr + (d & !(p - 1)),
                    r.offset + (d & !(p - 1)),
                    p,
                )
            })
        })
    }

    /// The largest page any region has: the handler's buffer holds one.
    pub fn max_page(&self) -> u64 {
        self.regions
            .iter()
            .map(|r| r.page_size)
            .max()
            .unwrap_or(PAGE)
    }

    /// Reads `buf.len()` bytes of the chain at `offset`: each extent from
    /// its layer, holes as zeroes (a huge page may span several).
    pub(super) fn read_range(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        let end = offset + buf.len() as u64;
        buf.fill(0);
        let first = self.extents.partition_point(|e| e.offset + e.len <= offset);
        for e in self.extents[first..].iter().take_while(|e| e.offset < end) {
            let lo = e.offset.max(offset);
            let hi = (e.offset + e.len).min(end);
            let part = &mut buf[crate::host_usize::from_u64(lo - offset)
                ..crate::host_usize::from_u64(hi - offset)];
            self.layers.files()[e.layer].read_exact_at(part, lo)?;
        }
        Ok(())
    }

    /// Which layer holds the page at `offset`, None for a hole.
    pub fn layer_of(&self, offset: u64) -> Option<usize> {
        let i = self.extents.partition_point(|e| e.offset + e.len <= offset);
        let e = self.extents.get(i)?;
        (e.offset <= offset).then_some(e.layer)
    }

    pub fn layers(&self) -> &MemoryLayers {
        &self.layers
    }

    /// Reads the chain's page at `offset` into `buf`; false for a hole.
    pub fn read_page(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<bool> {
        match self.layer_of(offset) {
            Some(layer) => {
                let f = &self.layers.files()[layer];
                f.read_exact_at(buf, offset)?;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Fills the page holding `addr`, first logging it if recording (so
    /// the log is complete by the time the faulting thread wakes).
    fn serve(
        &self,
        uffd: &Uffd,
        addr: u64,
        buf: &mut [u8],
        log: &ServeLog,
        served: &mut Served,
    ) -> std::io::Result<()> {
        let (page_addr, offset, page_size) = self.page_of(addr).ok_or_else(|| {
            std::io::Error::other(format!("fault at {addr:#x} outside guest RAM"))
        })?;
        log.faults.fetch_add(1, Ordering::Relaxed);
        if log.recording.load(Ordering::Relaxed) {
            if let Some(order) = log.order.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
                order.push(offset / PAGE);
            }
        }
        if page_size != PAGE {
            // hugetlbfs: one whole huge page per fault, holes included
            // (there is no zero-page ioctl for it).
            let page = &mut buf[..crate::host_usize::from_u64(page_size)];
            self.read_range(offset, page)?;
            if uffd.copy(page_addr, page.as_ptr(), page_size)? != Fill::Done {
                uffd.wake(page_addr, page_size)?;
            }
            return Ok(());
        }
        // While recording, one page per fault, so that every page the
        // guest touches shows up in the log.
        if !log.recording.load(Ordering::Relaxed) && self.serve_run(uffd, offset, buf, served)? {
            return Ok(());
        }
        served.set(offset / PAGE, offset / PAGE + 1);
        let page = &mut buf[..crate::host_usize::from_u64(PAGE)];
        let fill = if self.read_page(offset, page)? {
            uffd.copy(page_addr, page.as_ptr(), PAGE)?
        } else {
            uffd.zero(page_addr, PAGE)?
        };
        if fill != Fill::Done {
            uffd.wake(page_addr, PAGE)?;
        }
        Ok(())
    }

    /// Fills the run of pages around the one at `offset` in one ioctl:
    /// within the aligned block of [`Served::run`] pages, the region and
    /// the extent (data, `UFFDIO_COPY`) or hole (`UFFDIO_ZEROPAGE`) holding
    /// it, and cut at pages already served. The guest's neighbouring
    /// accesses then take no fault. Returns false to fall back to the page.
    fn serve_run(
        &self,
        uffd: &Uffd,
        offset: u64,
        buf: &mut [u8],
        served: &mut Served,
    ) -> std::io::Result<bool> {
        let block = served.run * PAGE;
        let Some(r) = self
            .regions
            .iter()
            .find(|r| r.offset <= offset && offset < r.offset + r.size)
        else {
            return Ok(false);
        };
        let mut lo = (offset & !(block - 1)).max(r.offset);
        let mut hi = ((offset | (block - 1)) + 1).min(r.offset + r.size);
        let i = self.extents.partition_point(|e| e.offset + e.len <= offset);
        let data = match self.extents.get(i) {
            Some(e) if e.offset <= offset => {
                lo = lo.max(e.offset);
                hi = hi.min(e.offset + e.len);
                Some(e.layer)
            }
            next => {
                // A hole: between the previous extent and the next one.
                if let Some(e) = next {
                    hi = hi.min(e.offset);
                }
                if let Some(p) = i.checked_sub(1).and_then(|p| self.extents.get(p)) {
                    lo = lo.max(p.offset + p.len);
                }
                None
            }
        };
        // Extents are page granular in practice; stay on whole pages.
        lo = lo.div_ceil(PAGE) * PAGE;
        hi &= !(PAGE - 1);
        let page = offset & !(PAGE - 1);
        if lo > page || hi <= page {
            return Ok(false);
        }
        let (mut first, mut end) = (page / PAGE, page / PAGE + 1);
        while first > lo / PAGE && !served.get(first - 1) {
            first -= 1;
        }
        while end < hi / PAGE && !served.get(end) {
            end += 1;
        }
        let (start, len) = (first * PAGE, (end - first) * PAGE);
        let addr = r.base_host_virt_addr + (start - r.offset);
        let fill = match data {
            Some(layer) => {
                let b = &mut buf[..crate::host_usize::from_u64(len)];
                self.layers.files()[layer].read_exact_at(b, start)?;
                uffd.copy(addr, b.as_ptr(), len)?
            }
            None => uffd.zero(addr, len)?,
        };
        match fill {
            Fill::Done => {
                served.set(first, end);
                Ok(true)
            }
            // Stopped at a page already there (one the handler did not
            // fill: a working set read in before registration, if the
            // caller did not say so). What was filled is woken; the
            // faulting page may lie beyond it: serve it on its own.
            Fill::Partial(bytes) => {
                served.set(first, first + bytes / PAGE);
                Ok(false)
            }
            Fill::Exists => Ok(false),
        }
    }
}

/// What a handler saw, for reports and the working-set recorder.
#[derive(Default)]
pub struct ServeLog {
    pub faults: AtomicU64,
    /// Recording: memory-file page numbers in first-touch order.
    pub order: Mutex<Option<Vec<u64>>>,
    pub recording: AtomicBool,
}

/// A page-fault handler thread serving guest RAM from snapshot layers.
pub struct UffdServer {
    stop: EventFd,
    thread: Option<JoinHandle<Result<(), String>>>,
    log: Arc<ServeLog>,
    source: Arc<PageSource>,
}

impl UffdServer {
    /// Starts serving `uffd`; with `record`, logs the first-touch order.
    pub fn start(uffd: Uffd, source: Arc<PageSource>, record: bool) -> Result<Self, UffdError> {
        Self::spawn(uffd, source, record, &[])
    }

    /// Starts serving `uffd` over RAM that already holds `prefilled`
    /// (memory-file page runs, written before registration): runs the
    /// handler fills stop short of them.
    pub fn start_over(
        uffd: Uffd,
        source: Arc<PageSource>,
        prefilled: &[(u64, u64)],
    ) -> Result<Self, UffdError> {
        Self::spawn(uffd, source, false, prefilled)
    }

    fn spawn(
        uffd: Uffd,
        source: Arc<PageSource>,
        record: bool,
        prefilled: &[(u64, u64)],
    ) -> Result<Self, UffdError> {
        let mut served = Served::new(&source);
        for &(first, n) in prefilled {
            served.set(first, first.saturating_add(n));
        }
        let stop = EventFd::new(libc::EFD_CLOEXEC).map_err(UffdError::Thread)?;
        let stop2 = stop.try_clone().map_err(UffdError::Thread)?;
        let log = Arc::new(ServeLog::default());
        if record {
            *log.order.lock().unwrap_or_else(|e| e.into_inner()) = Some(Vec::new());
            log.recording.store(true, Ordering::Relaxed);
        }
        let log2 = log.clone();
        let source2 = source.clone();
        let thread =
            crate::seccomp::spawn(crate::seccomp::ThreadKind::Vmm, "uffd".into(), move || {
                let stop = stop2.as_raw_fd();
                let result = serve_with(&uffd, &source2, stop, &log2, served);
                if let (Err(e), false) = (&result, readable(stop)) {
                    // Nothing else can fill guest memory now: every later
                    // fault would wait for ever, a hung VM that looks alive.
                    // End the VMM instead, saying why.
                    tracing::error!("the page-fault handler failed: {e}; the microVM cannot go on");
                    std::process::exit(1);
                }
                result
            })
            .map_err(UffdError::Thread)?;
        Ok(Self {
            stop,
            thread: Some(thread),
            log,
            source,
        })
    }

    pub fn log(&self) -> &Arc<ServeLog> {
        &self.log
    }

    pub fn source(&self) -> &Arc<PageSource> {
        &self.source
    }

    /// Faults in every data page of the snapshot not yet served (through
    /// the mapping, so this thread's faults go to the handler like any
    /// other). Returns the pages faulted in.
    pub fn fault_in_all(&self, ram: &GuestRam) -> std::io::Result<u64> {
        let spans = spans(ram);
        // One touch per page of the mapping (a huge page fills whole).
        let step = crate::host_usize::from_u64(page_size_of(ram));
        let mut n = 0u64;
        for e in &self.source.extents {
            for &(span_off, ptr, span_len) in &spans {
                let lo = e.offset.max(span_off);
                let hi = (e.offset + e.len).min(span_off + span_len as u64);
                if lo >= hi {
                    continue;
                }
                let start = crate::host_usize::from_u64(lo - span_off) & !(step - 1);
                let end = crate::host_usize::from_u64(hi - span_off);
                let pages = (end - start).div_ceil(step);
                // mincore reports per 4 KiB page, huge mappings included.
                let per = step / crate::host_usize::from_u64(PAGE);
                let mut resident = vec![0u8; pages * per];
                // SAFETY: mincore over part of one live guest-RAM mapping
                // (whole pages of it: spans are page multiples).
                let r = unsafe {
                    libc::mincore(
                        ptr.add(start).cast::<libc::c_void>(),
                        pages * step,
                        resident.as_mut_ptr(),
                    )
                };
                if r != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                for i in 0..pages {
                    if resident[i * per] & 1 == 0 {
                        // SAFETY: a byte inside the mapping; the volatile
                        // read faults the page in through the handler.
                        unsafe { ptr.add(start + i * step).read_volatile() };
                        n += 1;
                    }
                }
            }
        }
        Ok(n)
    }

    /// Stops the thread (only once nothing can fault any more: the VM is
    /// gone). Returns the error that ended it early, if any.
    pub fn stop(&mut self) -> Option<String> {
        let _ = self.stop.write(1);
        match self.thread.take().map(|t| t.join()) {
            Some(Ok(Err(e))) => Some(e),
            Some(Err(_)) => Some("the page-fault handler panicked".into()),
            _ => None,
        }
    }
}

impl Drop for UffdServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Whether `fd` (the stop eventfd) has been signalled.
fn readable(fd: RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: polls one fd we own, without waiting.
    unsafe { libc::poll(&mut p, 1, 0) == 1 }
}

/// Serves faults until `stop` becomes readable (an eventfd signalled, or a
/// socket to the VMM closed) or the uffd hangs up. Public for the external
/// handler command.
pub fn serve_loop(
    uffd: &Uffd,
    source: &PageSource,
    stop: RawFd,
    log: &ServeLog,
) -> Result<(), String> {
    serve_with(uffd, source, stop, log, Served::new(source))
}

fn serve_with(
    uffd: &Uffd,
    source: &PageSource,
    stop: RawFd,
    log: &ServeLog,
    mut served: Served,
) -> Result<(), String> {
    let mut buf =
        vec![0u8; crate::host_usize::from_u64((served.run * PAGE).max(source.max_page()))];
    let mut fds = [
        libc::pollfd {
            fd: uffd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: stop,
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    loop {
        // SAFETY: polls two fds we own.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == ErrorKind::Interrupted {
                continue;
            }
            return Err(format!("poll: {e}"));
        }
        if fds[1].revents != 0 {
            return Ok(());
        }
        if fds[0].revents & (libc::POLLERR | libc::POLLHUP) != 0
            && fds[0].revents & libc::POLLIN == 0
        {
            return Ok(());
        }
        while let Some(addr) = uffd
            .next_fault()
            .map_err(|e| format!("reading faults: {e}"))?
        {
            source
                .serve(uffd, addr, &mut buf, log, &mut served)
                .map_err(|e| format!("serving the fault at {addr:#x}: {e}"))?;
        }
    }
}
