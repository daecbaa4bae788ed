//! AF_VSOCK stream sockets through libc (std has no vsock support).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// A connected vsock stream.
pub struct VsockStream(OwnedFd);

fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn socket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2) call; the fd is owned right away.
    let fd =
        cvt(unsafe { libc::socket(libc::AF_VSOCK, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: fd is a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn addr(cid: u32, port: u32) -> libc::sockaddr_vm {
    // SAFETY: sockaddr_vm is plain data; zero is a valid starting value.
    let mut a: libc::sockaddr_vm = unsafe { std::mem::zeroed() };
    a.svm_family = AF_VSOCK_FAMILY;
    a.svm_cid = cid;
    a.svm_port = port;
    a
}

// Constants of the socket calls in their C types: AF_VSOCK is 40, the two
// structs are 16 bytes; nothing is truncated.
#[allow(clippy::cast_possible_truncation, reason = "AF_VSOCK is 40")]
const AF_VSOCK_FAMILY: libc::sa_family_t = libc::AF_VSOCK as libc::sa_family_t;
#[allow(clippy::cast_possible_truncation, reason = "sockaddr_vm is 16 bytes")]
const ADDR_LEN: libc::socklen_t = std::mem::size_of::<libc::sockaddr_vm>() as libc::socklen_t;
#[allow(clippy::cast_possible_truncation, reason = "timeval is 16 bytes")]
const TIMEVAL_LEN: libc::socklen_t = std::mem::size_of::<libc::timeval>() as libc::socklen_t;

impl VsockStream {
    pub fn connect(cid: u32, port: u32) -> io::Result<Self> {
        let fd = socket()?;
        let a = addr(cid, port);
        // SAFETY: a is a valid sockaddr_vm of ADDR_LEN bytes.
        cvt(unsafe {
            libc::connect(
                fd.as_raw_fd(),
                std::ptr::from_ref(&a).cast::<libc::sockaddr>(),
                ADDR_LEN,
            )
        })?;
        Ok(Self(fd))
    }

    /// Listens on `port` (any CID) and accepts one connection.
    pub fn accept_one(port: u32) -> io::Result<Self> {
        VsockListener::bind(port)?.accept()
    }

    /// Sets a receive timeout (`None`: block).
    pub fn set_read_timeout(&self, t: Option<std::time::Duration>) -> io::Result<()> {
        let tv = t.map_or(
            libc::timeval {
                tv_sec: 0,
                tv_usec: 0,
            },
            |d| libc::timeval {
                tv_sec: d.as_secs() as _,
                tv_usec: d.subsec_micros() as _,
            },
        );
        // SAFETY: tv is a valid timeval for the call.
        cvt(unsafe {
            libc::setsockopt(
                self.0.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                std::ptr::from_ref(&tv).cast::<libc::c_void>(),
                TIMEVAL_LEN,
            )
        })
        .map(|_| ())
    }

    pub fn try_clone(&self) -> io::Result<Self> {
        Ok(Self(self.0.try_clone()?))
    }

    /// Shuts both directions down: a thread blocked reading it wakes with EOF.
    pub fn shutdown(&self) -> io::Result<()> {
        // SAFETY: shutdown on our own fd.
        cvt(unsafe { libc::shutdown(self.0.as_raw_fd(), libc::SHUT_RDWR) }).map(|_| ())
    }

    pub fn shutdown_write(&self) -> io::Result<()> {
        // SAFETY: shutdown on our own fd.
        cvt(unsafe { libc::shutdown(self.0.as_raw_fd(), libc::SHUT_WR) }).map(|_| ())
    }
}

/// A listening vsock socket (any CID).
pub struct VsockListener(OwnedFd);

impl VsockListener {
    pub fn bind(port: u32) -> io::Result<Self> {
        let fd = socket()?;
        let a = addr(libc::VMADDR_CID_ANY, port);
        // SAFETY: a is a valid sockaddr_vm of ADDR_LEN bytes; listen on our own fd.
        unsafe {
            cvt(libc::bind(
                fd.as_raw_fd(),
                std::ptr::from_ref(&a).cast::<libc::sockaddr>(),
                ADDR_LEN,
            ))?;
            cvt(libc::listen(fd.as_raw_fd(), 4))?;
        }
        Ok(Self(fd))
    }

    /// Blocks until a peer connects.
    pub fn accept(&self) -> io::Result<VsockStream> {
        // SAFETY: accept on our own fd; the new fd is owned right away.
        unsafe {
            let conn = cvt(libc::accept4(
                self.0.as_raw_fd(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_CLOEXEC,
            ))?;
            Ok(VsockStream(OwnedFd::from_raw_fd(conn)))
        }
    }
}

impl io::Read for VsockStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: buf is valid for buf.len() bytes.
        let n = unsafe { libc::read(self.0.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }
}

impl io::Write for VsockStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // SAFETY: buf is valid for buf.len() bytes; MSG_NOSIGNAL avoids SIGPIPE.
        let n = unsafe {
            libc::send(
                self.0.as_raw_fd(),
                buf.as_ptr().cast(),
                buf.len(),
                libc::MSG_NOSIGNAL,
            )
        };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
