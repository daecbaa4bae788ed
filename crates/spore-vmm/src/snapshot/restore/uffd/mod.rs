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
//! snapshot's [`MemoryLayers`](crate::memory::layers::MemoryLayers) (newest
//! layer wins, holes are zero pages), optionally recording the order in
//! which pages were first touched; and an
//! external process reached over a Unix socket, sent the uffd and the
//! memory layout as Firecracker does ([`send_to_handler`]).
//!
//! Raw ioctls rather than the `userfaultfd` crate: its `-sys` crate runs
//! bindgen (libclang) at build time, which the static musl build and CI
//! would need, for five ioctls and two structs that are stable kernel ABI.
//!
//! Files: this one (the userfaultfd itself: its ioctls, registering RAM),
//! `handshake.rs` (the layout message and fd passing an external handler
//! gets, Firecracker's), `handler.rs` (the built-in handler: where pages
//! come from, the serving loop and its thread).

mod handler;
mod handshake;
#[cfg(test)]
mod tests;

use std::fs::File;
use std::io::ErrorKind;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};

pub use handler::{serve_loop, PageSource, ServeLog, UffdServer};
pub use handshake::{receive_from_vmm, send_to_handler, RegionMapping};

use crate::memory::GuestRam;
use crate::snapshot::restore::spans;

const PAGE: u64 = 4096;
/// The page of hugetlbfs guest RAM (`huge_pages: "2M"`).
const HUGE_PAGE: u64 = crate::memory::hugetlb::HUGE_PAGE;

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
        #[allow(
            clippy::cast_possible_truncation,
            reason = "the syscall returns an fd or -1, both fit an i32"
        )]
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
            // A VMM that dropped its privileges opened it before.
            let held = crate::privilege::userfaultfd_device();
            let opened = match held {
                Some(_) => None,
                None => File::open("/dev/userfaultfd").ok(),
            };
            match held.or(opened.as_ref().map(AsRawFd::as_raw_fd)) {
                Some(dev) => {
                    // SAFETY: USERFAULTFD_IOC_NEW takes the flags by value.
                    let r = unsafe {
                        libc::ioctl(
                            dev,
                            USERFAULTFD_IOC_NEW as _,
                            libc::O_CLOEXEC | libc::O_NONBLOCK,
                        )
                    };
                    if r < 0 {
                        return Err(UffdError::Unavailable(first));
                    }
                    r
                }
                None => return Err(UffdError::Unavailable(first)),
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
                    std::ptr::from_mut(&mut msg).cast::<libc::c_void>(),
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

/// The layout of guest RAM for a handler: each region's host address,
/// size and memory-file offset (regions back to back in the file).
pub fn regions_of(ram: &GuestRam) -> Vec<RegionMapping> {
    let page = page_size_of(ram);
    spans(ram)
        .into_iter()
        .map(|(off, ptr, len)| RegionMapping::new(ptr as u64, len as u64, off, page))
        .collect()
}

/// The page size faults in `ram` are filled with.
pub fn page_size_of(ram: &GuestRam) -> u64 {
    if ram.is_hugetlb() {
        HUGE_PAGE
    } else {
        PAGE
    }
}

/// Registers every region of `ram` with a new uffd.
pub fn register_ram(ram: &GuestRam) -> Result<Uffd, UffdError> {
    let uffd = Uffd::new()?;
    for (_, ptr, len) in spans(ram) {
        uffd.register(ptr as u64, len as u64, ram.is_hugetlb())?;
    }
    Ok(uffd)
}
