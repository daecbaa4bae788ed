//! Pseudo-terminals for processes started with a `pty`: envd keeps the
//! master (output, input, resizes); the slave becomes the child's stdio and
//! controlling terminal.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use tokio::io::unix::AsyncFd;

/// The master side, non-blocking and driven by tokio's reactor.
pub struct PtyMaster {
    fd: AsyncFd<OwnedFd>,
}

/// Both sides of a new terminal of `rows` × `cols`.
pub fn open(rows: u16, cols: u16) -> io::Result<(PtyMaster, OwnedFd)> {
    // Close-on-exec from the start: a child spawned concurrently must not
    // inherit either side, or the terminal would outlive its process.
    // SAFETY: no pointers; the result is checked.
    let raw = unsafe { libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a descriptor just opened and owned by nobody else.
    let master = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: `master` is an open pty master; no pointers.
    let unlocked = unsafe {
        libc::grantpt(master.as_raw_fd()) == 0 && libc::unlockpt(master.as_raw_fd()) == 0
    };
    if !unlocked {
        return Err(io::Error::last_os_error());
    }
    let slave = open_slave(&master)?;
    set_size(&master, rows, cols)?;
    set_nonblocking(&master)?;
    // SAFETY: an OwnedFd always returns its own descriptor, open until the
    // AsyncFd (its owner from here) drops it.
    let fd = unsafe { AsyncFd::register(master) }?;
    Ok((PtyMaster { fd }, slave))
}

/// Opens the slave of `master`: by the master itself where the kernel can
/// (no path, so no race with devpts), else by its name.
fn open_slave(master: &OwnedFd) -> io::Result<OwnedFd> {
    let flags = libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC;
    // SAFETY: TIOCGPTPEER takes the open flags as its argument.
    let raw = unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCGPTPEER, flags) };
    if raw >= 0 {
        // SAFETY: a new descriptor, owned by nobody else.
        return Ok(unsafe { OwnedFd::from_raw_fd(raw) });
    }
    let mut name = [0 as libc::c_char; 128];
    // SAFETY: `name` is writable for its whole length, which is passed.
    let rc = unsafe { libc::ptsname_r(master.as_raw_fd(), name.as_mut_ptr(), name.len()) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    // SAFETY: ptsname_r wrote a NUL-terminated path into `name`.
    let raw = unsafe { libc::open(name.as_ptr(), flags) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

fn set_nonblocking(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: plain fcntl calls on an open descriptor; no pointers.
    let rc = unsafe {
        match libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) {
            flags if flags < 0 => flags,
            flags => libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK),
        }
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn set_size(fd: &OwnedFd, rows: u16, cols: u16) -> io::Result<()> {
    let size = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one winsize from the pointer, valid here.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCSWINSZ, &raw const size) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl PtyMaster {
    /// Resizes the terminal (the kernel tells its foreground processes).
    pub fn resize(&self, rows: u16, cols: u16) -> io::Result<()> {
        set_size(self.fd.get_ref(), rows, cols)
    }

    /// Reads what the terminal's processes wrote; `Err(EIO)` once no process
    /// holds the slave any more.
    pub async fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let mut guard = self.fd.readable().await?;
            let result = guard.try_io(|fd| {
                // SAFETY: `buf` is writable for `buf.len()` bytes.
                let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
                usize::try_from(n).map_err(|_| io::Error::last_os_error())
            });
            if let Ok(result) = result {
                return result;
            }
        }
    }

    /// Writes all of `data` as typed input.
    pub async fn write_all(&self, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            let mut guard = self.fd.writable().await?;
            let result = guard.try_io(|fd| {
                // SAFETY: `data` is readable for `data.len()` bytes.
                let n = unsafe { libc::write(fd.as_raw_fd(), data.as_ptr().cast(), data.len()) };
                usize::try_from(n).map_err(|_| io::Error::last_os_error())
            });
            match result {
                Ok(Ok(n)) => data = data.get(n..).unwrap_or_default(),
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => {}
            }
        }
        Ok(())
    }
}
