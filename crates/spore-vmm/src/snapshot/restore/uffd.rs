//! userfaultfd: guest RAM whose missing pages are served by a handler.
//!
//! Guest RAM for these paths is the ordinary shared memfd (`GuestRam::new`),
//! or the 2 MiB hugetlbfs memfd of a `huge_pages: "2M"` VM
//! (`GuestRam::new_hugetlb`), empty, registered in `MISSING` mode: the first access to a page, by a
//! vCPU (KVM's get_user_pages faults on our behalf, so guest accesses are
//! delivered like the VMM's own) or by the VMM, blocks until a handler
//! fills it with `UFFDIO_COPY` (data) or `UFFDIO_ZEROPAGE` (holes). Pages
//! filled before registration (a working-set prefetch) never fault.
//!
//! On hugetlbfs the kernel fills only whole huge pages: every `UFFDIO_COPY`
//! is one 2 MiB-aligned, 2 MiB-long page, and there is no `UFFDIO_ZEROPAGE`
//! (holes are copied from a zeroed buffer). Each region says its page size
//! ([`RegionMapping::page_size`]), so an external handler knows it too.
//!
//! Two handlers: [`UffdServer`], a thread in this process serving from the
//! snapshot's [`MemoryLayers`] (newest layer wins, holes are zero pages),
//! optionally recording the order in which pages were first touched; and an
//! external process reached over a Unix socket, sent the uffd and the
//! memory layout as Firecracker does ([`send_to_handler`]).
//!
//! Raw ioctls rather than the `userfaultfd` crate: its `-sys` crate runs
//! bindgen (libclang) at build time, which the static musl build and CI
//! would need, for five ioctls and two structs that are stable kernel ABI.

use std::fs::File;
use std::io::ErrorKind;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use serde::{Deserialize, Serialize};
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

use crate::memory::layers::{Extent, MemoryLayers};

const PAGE: u64 = 4096;
/// The page of hugetlbfs guest RAM (`huge_pages: "2M"`).
const HUGE_PAGE: u64 = crate::memory::hugetlb::HUGE_PAGE;
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
            bits: vec![0; pages.div_ceil(64) as usize],
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

#[derive(Debug, thiserror::Error)]
pub enum UffdError {
    #[error(
        "userfaultfd is not available: {0} (as non-root it needs the sysctl \
         vm.unprivileged_userfaultfd=1 or access to /dev/userfaultfd; the kernel \
         needs CONFIG_USERFAULTFD); use the File backend instead"
    )]
    Unavailable(#[source] std::io::Error),
    #[error("userfaultfd {what} failed: {source}")]
    Ioctl {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("the kernel's userfaultfd cannot {0}")]
    Missing(&'static str),
    #[error("cannot start the page-fault handler thread: {0}")]
    Thread(#[source] std::io::Error),
    #[error("cannot reach the page-fault handler at {path}: {source} (mem_backend Uffd: backend_path must name the Unix socket a handler listens on)")]
    Connect {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot send the userfaultfd to the handler at {path}: {source}")]
    Send {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

// From <linux/userfaultfd.h>.
const UFFD_API: u64 = 0xAA;
const UFFDIO_REGISTER_MODE_MISSING: u64 = 1;
const UFFD_EVENT_PAGEFAULT: u8 = 0x12;
const UFFD_FEATURE_MISSING_HUGETLBFS: u64 = 1 << 4;
const UFFD_FEATURE_MISSING_SHMEM: u64 = 1 << 5;
const UFFDIO_COPY_BIT: u64 = 1 << 0x03;
const UFFDIO_ZEROPAGE_BIT: u64 = 1 << 0x04;
/// `_IO(0xAA, 0x00)` on /dev/userfaultfd (the request type differs between libcs).
const USERFAULTFD_IOC_NEW: u32 = 0xAA00;

#[repr(C)]
#[derive(Default)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
#[derive(Default)]
struct UffdioRange {
    start: u64,
    len: u64,
}

#[repr(C)]
#[derive(Default)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}

#[repr(C)]
#[derive(Default)]
struct UffdioCopy {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    copy: i64,
}

#[repr(C)]
#[derive(Default)]
struct UffdioZeropage {
    range: UffdioRange,
    mode: u64,
    zeropage: i64,
}

/// `struct uffd_msg` (32 bytes); only the page-fault arm is read.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct UffdMsg {
    event: u8,
    reserved1: u8,
    reserved2: u16,
    reserved3: u32,
    flags: u64,
    address: u64,
    feat: u64,
}

vmm_sys_util::ioctl_iowr_nr!(UFFDIO_API, 0xAA, 0x3F, UffdioApi);
vmm_sys_util::ioctl_iowr_nr!(UFFDIO_REGISTER, 0xAA, 0x00, UffdioRegister);
vmm_sys_util::ioctl_iowr_nr!(UFFDIO_COPY, 0xAA, 0x03, UffdioCopy);
vmm_sys_util::ioctl_iowr_nr!(UFFDIO_ZEROPAGE, 0xAA, 0x04, UffdioZeropage);
vmm_sys_util::ioctl_ior_nr!(UFFDIO_WAKE, 0xAA, 0x02, UffdioRange);

/// A userfaultfd.
pub struct Uffd {
    fd: File,
    /// What the API handshake offered (0 for a uffd received from a VMM).
    features: u64,
}

/// How a fill ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Fill {
    Done,
    /// The page was already there (another fault or a prefetch won).
    Exists,
    /// A fill of several pages stopped at one already there, after this
    /// many bytes (the kernel filled and woke those, not the rest).
    Partial(u64),
}

impl Uffd {
    /// Opens a non-blocking userfaultfd that also sees faults taken in the
    /// kernel (KVM's accesses), and checks it can serve shared memory.
    pub fn new() -> Result<Self, UffdError> {
        // SAFETY: the syscall takes flags only and returns a new fd or -1.
        let raw =
            unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK) }
                as RawFd;
        let raw = if raw >= 0 {
            raw
        } else {
            let first = std::io::Error::last_os_error();
            // Kernels ≥ 6.1 also hand them out through /dev/userfaultfd,
            // governed by its file permissions instead of the sysctl.
            match File::open("/dev/userfaultfd") {
                Ok(dev) => {
                    // SAFETY: USERFAULTFD_IOC_NEW takes the flags by value.
                    let r = unsafe {
                        libc::ioctl(
                            dev.as_raw_fd(),
                            USERFAULTFD_IOC_NEW as _,
                            libc::O_CLOEXEC | libc::O_NONBLOCK,
                        )
                    };
                    if r < 0 {
                        return Err(UffdError::Unavailable(first));
                    }
                    r
                }
                Err(_) => return Err(UffdError::Unavailable(first)),
            }
        };
        // SAFETY: raw is a new fd owned by nobody else.
        let fd = unsafe { File::from_raw_fd(raw) };
        let mut api = UffdioApi {
            api: UFFD_API,
            ..Default::default()
        };
        // SAFETY: UFFDIO_API reads and writes a UffdioApi.
        let r = unsafe { vmm_sys_util::ioctl::ioctl_with_mut_ref(&fd, UFFDIO_API(), &mut api) };
        if r < 0 {
            return Err(UffdError::Ioctl {
                what: "API handshake",
                source: std::io::Error::last_os_error(),
            });
        }
        if api.features & UFFD_FEATURE_MISSING_SHMEM == 0 {
            return Err(UffdError::Missing("serve shared memory (MISSING_SHMEM)"));
        }
        Ok(Self {
            fd,
            features: api.features,
        })
    }

    /// Registers `[addr, addr + len)` for missing-page faults; `huge` for
    /// a hugetlbfs mapping (which has no `UFFDIO_ZEROPAGE`).
    pub fn register(&self, addr: u64, len: u64, huge: bool) -> Result<(), UffdError> {
        if huge && self.features & UFFD_FEATURE_MISSING_HUGETLBFS == 0 {
            return Err(UffdError::Missing(
                "serve hugetlbfs memory (MISSING_HUGETLBFS)",
            ));
        }
        let mut reg = UffdioRegister {
            range: UffdioRange { start: addr, len },
            mode: UFFDIO_REGISTER_MODE_MISSING,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_REGISTER reads and writes a UffdioRegister; the
        // range is a live mapping of guest RAM.
        let r = unsafe {
            vmm_sys_util::ioctl::ioctl_with_mut_ref(&self.fd, UFFDIO_REGISTER(), &mut reg)
        };
        if r < 0 {
            return Err(UffdError::Ioctl {
                what: "REGISTER",
                source: std::io::Error::last_os_error(),
            });
        }
        let needed = if huge {
            UFFDIO_COPY_BIT
        } else {
            UFFDIO_COPY_BIT | UFFDIO_ZEROPAGE_BIT
        };
        if reg.ioctls & needed != needed {
            return Err(UffdError::Missing("copy or zero pages into guest memory"));
        }
        Ok(())
    }

    /// Copies `len` bytes at `src` into the registered page(s) at `dst`
    /// and wakes the faulting threads.
    pub fn copy(&self, dst: u64, src: *const u8, len: u64) -> std::io::Result<Fill> {
        let mut c = UffdioCopy {
            dst,
            src: src as u64,
            len,
            mode: 0,
            copy: 0,
        };
        loop {
            // SAFETY: UFFDIO_COPY reads `len` bytes at `src` (the caller's
            // buffer) and writes only registered guest memory at `dst`.
            let r =
                unsafe { vmm_sys_util::ioctl::ioctl_with_mut_ref(&self.fd, UFFDIO_COPY(), &mut c) };
            if r >= 0 {
                return Ok(Fill::Done);
            }
            match std::io::Error::last_os_error() {
                e if e.raw_os_error() == Some(libc::EEXIST) => return Ok(Fill::Exists),
                // The mapping changed under the copy: try again.
                e if e.raw_os_error() == Some(libc::EAGAIN) && c.copy <= 0 => continue,
                // A run that met a page already there: EAGAIN with the
                // bytes done (the kernel's way of saying "partial").
                e if e.raw_os_error() == Some(libc::EAGAIN) => {
                    return Ok(Fill::Partial(c.copy as u64))
                }
                e => return Err(e),
            }
        }
    }

    /// Maps zeroes into the registered page(s) at `dst` and wakes.
    pub fn zero(&self, dst: u64, len: u64) -> std::io::Result<Fill> {
        let mut z = UffdioZeropage {
            range: UffdioRange { start: dst, len },
            ..Default::default()
        };
        loop {
            // SAFETY: UFFDIO_ZEROPAGE writes only registered guest memory.
            let r = unsafe {
                vmm_sys_util::ioctl::ioctl_with_mut_ref(&self.fd, UFFDIO_ZEROPAGE(), &mut z)
            };
            if r >= 0 {
                return Ok(Fill::Done);
            }
            match std::io::Error::last_os_error() {
                e if e.raw_os_error() == Some(libc::EEXIST) => return Ok(Fill::Exists),
                e if e.raw_os_error() == Some(libc::EAGAIN) && z.zeropage <= 0 => continue,
                e if e.raw_os_error() == Some(libc::EAGAIN) => {
                    return Ok(Fill::Partial(z.zeropage as u64))
                }
                e => return Err(e),
            }
        }
    }

    /// Wakes threads waiting on faults in `[addr, addr + len)` (after a
    /// fill found the page already there).
    pub fn wake(&self, addr: u64, len: u64) -> std::io::Result<()> {
        let range = UffdioRange { start: addr, len };
        // SAFETY: UFFDIO_WAKE reads a UffdioRange.
        let r = unsafe { vmm_sys_util::ioctl::ioctl_with_ref(&self.fd, UFFDIO_WAKE(), &range) };
        if r < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Reads the next page-fault address, None when no event is pending.
    fn next_fault(&self) -> std::io::Result<Option<u64>> {
        loop {
            let mut msg = UffdMsg::default();
            // SAFETY: reads at most one uffd_msg into `msg`.
            let n = unsafe {
                libc::read(
                    self.fd.as_raw_fd(),
                    &mut msg as *mut UffdMsg as *mut libc::c_void,
                    std::mem::size_of::<UffdMsg>(),
                )
            };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == ErrorKind::WouldBlock {
                    return Ok(None);
                }
                if e.kind() == ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if n as usize != std::mem::size_of::<UffdMsg>() {
                return Ok(None);
            }
            if msg.event == UFFD_EVENT_PAGEFAULT {
                return Ok(Some(msg.address));
            }
            // Other events are not requested; skip anything unexpected.
        }
    }

    pub fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Another handle on the same userfaultfd (for a second thread that
    /// fills pages, such as a working-set load).
    pub fn try_clone(&self) -> std::io::Result<Self> {
        Ok(Self {
            fd: self.fd.try_clone()?,
            features: self.features,
        })
    }

    /// Takes a uffd received from a VMM.
    pub fn from_file(fd: File) -> Self {
        Self { fd, features: 0 }
    }
}

/// One guest RAM region as a handler sees it, in Firecracker's message
/// shape (`GuestRegionUffdMapping`): host address in the VMM, size, and
/// offset in the memory file, and the page size the handler must fill in
/// (4 KiB, or 2 MiB for hugetlbfs RAM).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionMapping {
    pub base_host_virt_addr: u64,
    pub size: u64,
    pub offset: u64,
    /// Bytes per page: every fill is one whole, aligned page of this size.
    pub page_size: u64,
    /// Firecracker's older name for `page_size`, in KiB.
    pub page_size_kib: u64,
}

impl RegionMapping {
    pub fn new(base_host_virt_addr: u64, size: u64, offset: u64, page_size: u64) -> Self {
        Self {
            base_host_virt_addr,
            size,
            offset,
            page_size,
            page_size_kib: page_size / 1024,
        }
    }

    /// A layout from a VMM is outside input: only 4 KiB and 2 MiB pages,
    /// with the region's address, size and file offset on page boundaries.
    fn check(&self) -> std::io::Result<()> {
        let p = self.page_size;
        if p != PAGE && p != HUGE_PAGE {
            return Err(std::io::Error::other(format!(
                "region at {:#x}: page_size {p} is neither 4096 nor 2 MiB",
                self.base_host_virt_addr
            )));
        }
        if (self.base_host_virt_addr | self.size | self.offset) & (p - 1) != 0 {
            return Err(std::io::Error::other(format!(
                "region at {:#x} (size {}, offset {}) is not aligned to its {p}-byte pages",
                self.base_host_virt_addr, self.size, self.offset
            )));
        }
        Ok(())
    }
}

/// Hands the uffd and the layout to an external handler listening on
/// `sock`. The connection is returned to be kept open while the VM lives:
/// the handler may take its closing as the VMM's exit.
pub fn send_to_handler(
    sock: &Path,
    uffd: &Uffd,
    regions: &[RegionMapping],
) -> Result<UnixStream, UffdError> {
    let path = sock.display().to_string();
    let stream = UnixStream::connect(sock).map_err(|source| UffdError::Connect {
        path: path.clone(),
        source,
    })?;
    let body = serde_json::to_vec(regions).map_err(|e| UffdError::Send {
        path: path.clone(),
        source: std::io::Error::other(e),
    })?;
    stream
        .send_with_fd(&body[..], uffd.as_raw_fd())
        .map_err(|e| UffdError::Send {
            path,
            source: std::io::Error::from_raw_os_error(e.errno()),
        })?;
    Ok(stream)
}

/// Receives a uffd and layout sent by [`send_to_handler`] (or Firecracker).
pub fn receive_from_vmm(stream: &UnixStream) -> std::io::Result<(Uffd, Vec<RegionMapping>)> {
    let mut buf = vec![0u8; 64 * 1024];
    let (n, fd) = stream
        .recv_with_fd(&mut buf)
        .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))?;
    let fd = fd.ok_or_else(|| std::io::Error::other("the VMM sent no userfaultfd"))?;
    let regions: Vec<RegionMapping> = serde_json::from_slice(&buf[..n])
        .map_err(|e| std::io::Error::other(format!("bad memory layout message: {e}")))?;
    Ok((Uffd::from_file(fd), regions))
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
    fn page_of(&self, addr: u64) -> Option<(u64, u64, u64)> {
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
    fn read_range(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        let end = offset + buf.len() as u64;
        buf.fill(0);
        let first = self.extents.partition_point(|e| e.offset + e.len <= offset);
        for e in self.extents[first..].iter().take_while(|e| e.offset < end) {
            let lo = e.offset.max(offset);
            let hi = (e.offset + e.len).min(end);
            let part = &mut buf[(lo - offset) as usize..(hi - offset) as usize];
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
            let page = &mut buf[..page_size as usize];
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
        let page = &mut buf[..PAGE as usize];
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
                let b = &mut buf[..len as usize];
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
    pub fn fault_in_all(&self, ram: &crate::memory::GuestRam) -> std::io::Result<u64> {
        let spans = super::spans(ram);
        // One touch per page of the mapping (a huge page fills whole).
        let step = page_size_of(ram) as usize;
        let mut n = 0u64;
        for e in &self.source.extents {
            for &(span_off, ptr, span_len) in &spans {
                let lo = e.offset.max(span_off);
                let hi = (e.offset + e.len).min(span_off + span_len as u64);
                if lo >= hi {
                    continue;
                }
                let start = ((lo - span_off) as usize) & !(step - 1);
                let end = (hi - span_off) as usize;
                let pages = (end - start).div_ceil(step);
                // mincore reports per 4 KiB page, huge mappings included.
                let per = step / PAGE as usize;
                let mut resident = vec![0u8; pages * per];
                // SAFETY: mincore over part of one live guest-RAM mapping
                // (whole pages of it: spans are page multiples).
                let r = unsafe {
                    libc::mincore(
                        ptr.add(start) as *mut libc::c_void,
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
    let mut buf = vec![0u8; (served.run * PAGE).max(source.max_page()) as usize];
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

/// The layout of guest RAM for a handler: each region's host address,
/// size and memory-file offset (regions back to back in the file).
pub fn regions_of(ram: &crate::memory::GuestRam) -> Vec<RegionMapping> {
    let page = page_size_of(ram);
    super::spans(ram)
        .into_iter()
        .map(|(off, ptr, len)| RegionMapping::new(ptr as u64, len as u64, off, page))
        .collect()
}

/// The page size faults in `ram` are filled with.
pub fn page_size_of(ram: &crate::memory::GuestRam) -> u64 {
    if ram.is_hugetlb() {
        HUGE_PAGE
    } else {
        PAGE
    }
}

/// Registers every region of `ram` with a new uffd.
pub fn register_ram(ram: &crate::memory::GuestRam) -> Result<Uffd, UffdError> {
    let uffd = Uffd::new()?;
    for (_, ptr, len) in super::spans(ram) {
        uffd.register(ptr as u64, len as u64, ram.is_hugetlb())?;
    }
    Ok(uffd)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::GuestRam;
    use vm_memory::{Bytes, GuestAddress};

    fn layer_file(name: &str, size: u64, pages: &[(u64, u8)]) -> File {
        let path = std::env::temp_dir().join(format!("spore-uffd-{}-{name}", std::process::id()));
        let f = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        f.set_len(size).unwrap();
        for &(p, v) in pages {
            f.write_all_at(&[v; 4096], p * PAGE).unwrap();
        }
        let _ = std::fs::remove_file(&path);
        f
    }

    #[test]
    fn built_in_handler_serves_newest_layer_and_zero_holes_and_records_order() {
        let uffd = match Uffd::new() {
            Ok(u) => u,
            Err(e) => panic!("userfaultfd must be available on the test host: {e}"),
        };
        drop(uffd);
        let size = 8u64 << 20;
        let base = layer_file("base", size, &[(0, 1), (1, 2), (300, 3)]);
        let diff = layer_file("diff", size, &[(1, 9)]);
        let ram = GuestRam::new(size).unwrap();
        let uffd = register_ram(&ram).unwrap();
        let source =
            PageSource::new(MemoryLayers::new(vec![base, diff], size), regions_of(&ram)).unwrap();
        let mut server = UffdServer::start(uffd, Arc::new(source), true).unwrap();
        let m = ram.memory();
        let v: u8 = m.read_obj(GuestAddress(300 * PAGE + 7)).unwrap();
        assert_eq!(v, 3);
        let v: u8 = m.read_obj(GuestAddress(PAGE)).unwrap();
        assert_eq!(v, 9, "the diff layer wins");
        let v: u8 = m.read_obj(GuestAddress(0)).unwrap();
        assert_eq!(v, 1);
        let v: u8 = m.read_obj(GuestAddress(100 * PAGE)).unwrap();
        assert_eq!(v, 0, "a hole reads as zero");
        m.write_obj(5u8, GuestAddress(200 * PAGE)).unwrap();
        let v: u8 = m.read_obj(GuestAddress(200 * PAGE)).unwrap();
        assert_eq!(v, 5);
        let order = server.log().order.lock().unwrap().clone().unwrap();
        assert_eq!(order, vec![300, 1, 0, 100, 200]);
        assert_eq!(server.log().faults.load(Ordering::Relaxed), 5);
        assert!(server.stop().is_none());
    }

    #[test]
    fn a_layout_from_a_vmm_is_checked_and_huge_pages_read_whole() {
        let size = 4u64 << 20;
        let base = layer_file("huge", size, &[(1, 7), (600, 8)]);
        let layers = MemoryLayers::single(base, size);
        // Page sizes other than 4 KiB and 2 MiB, and unaligned regions.
        for bad in [
            RegionMapping::new(0x4000_0000, size, 0, 8192),
            RegionMapping::new(0x4000_1000, size, 0, HUGE_PAGE),
            RegionMapping::new(0x4000_0000, size, PAGE, HUGE_PAGE),
        ] {
            let layers = MemoryLayers::single(layers.files()[0].try_clone().unwrap(), size);
            assert!(PageSource::new(layers, vec![bad]).is_err(), "{bad:?}");
        }
        let good = RegionMapping::new(0x4000_0000, size, 0, HUGE_PAGE);
        assert_eq!(good.page_size_kib, 2048);
        let source = PageSource::new(layers, vec![good]).unwrap();
        assert_eq!(source.max_page(), HUGE_PAGE);
        assert_eq!(
            source.page_of(0x4000_0000 + HUGE_PAGE + 5),
            Some((0x4000_0000 + HUGE_PAGE, HUGE_PAGE, HUGE_PAGE))
        );
        // A huge page spanning data and holes reads as one buffer.
        let mut buf = vec![0xffu8; HUGE_PAGE as usize];
        source.read_range(0, &mut buf).unwrap();
        assert!(buf[..4096].iter().all(|&b| b == 0));
        assert!(buf[4096..8192].iter().all(|&b| b == 7));
        assert!(buf[8192..].iter().all(|&b| b == 0));
        source.read_range(HUGE_PAGE, &mut buf).unwrap();
        let at = (600 * PAGE - HUGE_PAGE) as usize;
        assert!(buf[at..at + 4096].iter().all(|&b| b == 8));
        assert_eq!(buf.iter().filter(|&&b| b != 0).count(), 4096);
    }

    /// Runs `f` on a thread and fails the test if it does not end in
    /// time (a fault nobody serves would hang the test for ever).
    fn within(secs: u64, f: impl FnOnce() + Send + 'static) {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            f();
            let _ = tx.send(());
        });
        rx.recv_timeout(std::time::Duration::from_secs(secs))
            .expect("guest memory accesses hung or failed: a fault was never served right");
    }

    /// RAM holding pages 5 and 100 (value 0xee) before registration, the
    /// snapshot's data on every page of 0..40.
    fn prefilled_ram(name: &str) -> (GuestRam, PageSource, u64) {
        let size = 4u64 << 20;
        let pages: Vec<(u64, u8)> = (0..40).map(|p| (p, p as u8 + 1)).collect();
        let base = layer_file(name, size, &pages);
        let ram = GuestRam::new(size).unwrap();
        for p in [5u64, 100] {
            ram.memory()
                .write_slice(&[0xee; 4096], GuestAddress(p * PAGE))
                .unwrap();
        }
        let source = PageSource::new(MemoryLayers::single(base, size), regions_of(&ram)).unwrap();
        (ram, source, size)
    }

    fn check_prefilled(m: crate::memory::GuestMemoryMmap) {
        within(20, move || {
            let read = |p: u64| -> u8 { m.read_obj(GuestAddress(p * PAGE)).unwrap() };
            assert_eq!(read(3), 4);
            assert_eq!(read(5), 0xee, "a prefilled page keeps its data");
            for p in [0u64, 4, 6, 10, 39] {
                assert_eq!(read(p), p as u8 + 1);
            }
            assert_eq!(read(99), 0);
            assert_eq!(read(100), 0xee);
            assert_eq!(read(101), 0);
            assert_eq!(read(300), 0);
        });
    }

    #[test]
    fn runs_stop_at_pages_read_in_before_registration() {
        // The handler is told what is there (a working set's runs).
        let (ram, source, _) = prefilled_ram("told");
        let uffd = register_ram(&ram).unwrap();
        let mut server =
            UffdServer::start_over(uffd, Arc::new(source), &[(5, 1), (100, 1)]).unwrap();
        check_prefilled(ram.memory().clone());
        assert!(server.stop().is_none());
    }

    #[test]
    fn a_run_that_meets_a_page_already_there_still_serves_the_fault() {
        // Not told: the run's copy stops part way (EAGAIN with the bytes
        // done), which must neither end the handler nor leave the fault.
        let (ram, source, _) = prefilled_ram("untold");
        let uffd = register_ram(&ram).unwrap();
        let mut server = UffdServer::start(uffd, Arc::new(source), false).unwrap();
        check_prefilled(ram.memory().clone());
        assert!(server.stop().is_none());
    }

    #[test]
    fn outside_recording_a_fault_fills_its_run() {
        let size = 4u64 << 20;
        let pages: Vec<(u64, u8)> = (0..40).map(|p| (p, p as u8 + 1)).collect();
        let base = layer_file("block", size, &pages);
        let ram = GuestRam::new(size).unwrap();
        let uffd = register_ram(&ram).unwrap();
        let source = PageSource::new(MemoryLayers::single(base, size), regions_of(&ram)).unwrap();
        let mut server = UffdServer::start(uffd, Arc::new(source), false).unwrap();
        let m = ram.memory();
        let faults = || server.log().faults.load(Ordering::Relaxed);
        let read = |p: u64| -> u8 { m.read_obj(GuestAddress(p * PAGE)).unwrap() };
        // The data extent 0..40 in one copy.
        assert_eq!(read(3), 4);
        assert_eq!(faults(), 1);
        for p in [0u64, 10, 20, 39] {
            assert_eq!(read(p), p as u8 + 1, "served with page 3's run");
        }
        assert_eq!(faults(), 1);
        // The hole 40..256 (the rest of the aligned block) in one zero fill.
        assert_eq!(read(45), 0);
        assert_eq!(read(255), 0);
        assert_eq!(faults(), 2);
        // The next block: one fill for all of it.
        assert_eq!(read(700), 0);
        assert_eq!(faults(), 3);
        for p in [512u64, 600, 767] {
            assert_eq!(read(p), 0);
        }
        assert_eq!(faults(), 3);
        assert!(server.stop().is_none());
    }
}
