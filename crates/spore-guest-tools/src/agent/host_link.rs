//! The link to the host: a listening socket (vsock in a guest, a Unix socket
//! in host mode) and the framed protocol of `spore_abi::function` on each
//! accepted connection. The host is checked like any peer: every header goes
//! through `FrameHeader::decode` (magic, version, kind, length limits) before
//! its body is read.

use std::io::{self, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};

use spore_abi::function::{FrameError, FrameHeader, Kind, HEADER_SIZE};

use super::config::LinkAddr;
use crate::vsock::{VsockListener, VsockStream};

pub enum Listener {
    Vsock(VsockListener),
    Unix(UnixListener),
}

impl Listener {
    pub fn bind(addr: &LinkAddr) -> io::Result<Self> {
        match addr {
            LinkAddr::Vsock(port) => VsockListener::bind(*port).map(Self::Vsock),
            LinkAddr::Unix(path) => {
                // A socket file left by an earlier run would make bind fail.
                if std::fs::symlink_metadata(path)
                    .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()))
                {
                    let _ = std::fs::remove_file(path);
                }
                UnixListener::bind(path).map(Self::Unix)
            }
        }
    }

    pub fn accept(&self) -> io::Result<Link> {
        match self {
            Self::Vsock(l) => l.accept().map(Link::Vsock),
            Self::Unix(l) => l.accept().map(|(s, _)| Link::Unix(s)),
        }
    }
}

/// One host connection.
pub enum Link {
    Vsock(VsockStream),
    Unix(UnixStream),
}

impl Link {
    pub fn try_clone(&self) -> io::Result<Self> {
        match self {
            Self::Vsock(s) => s.try_clone().map(Self::Vsock),
            Self::Unix(s) => s.try_clone().map(Self::Unix),
        }
    }

    /// Ends the connection both ways (a newer one replaces it).
    pub fn shutdown(&self) {
        let _ = match self {
            Self::Vsock(s) => s.shutdown(),
            Self::Unix(s) => s.shutdown(std::net::Shutdown::Both),
        };
    }
}

impl Read for Link {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Self::Vsock(s) => s.read(buf),
            Self::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Link {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Self::Vsock(s) => s.write(buf),
            Self::Unix(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Why reading a frame failed.
#[derive(Debug)]
pub enum ReadError {
    /// The host closed the connection between frames.
    Closed,
    Io(io::Error),
    Frame(FrameError),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Closed => f.write_str("closed"),
            Self::Io(e) => write!(f, "{e}"),
            Self::Frame(e) => write!(f, "bad frame header: {e:?}"),
        }
    }
}

/// A frame from the host: its header and its two bodies.
pub struct Frame {
    pub header: FrameHeader,
    pub a: Vec<u8>,
    pub b: Vec<u8>,
}

/// Reads one frame; its lengths were checked before anything is allocated.
pub fn read_frame(r: &mut impl Read) -> Result<Frame, ReadError> {
    let mut raw = [0u8; HEADER_SIZE];
    let mut got = 0;
    while got < HEADER_SIZE {
        match r.read(&mut raw[got..]) {
            Ok(0) if got == 0 => return Err(ReadError::Closed),
            Ok(0) => return Err(ReadError::Io(io::ErrorKind::UnexpectedEof.into())),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(ReadError::Io(e)),
        }
    }
    let header = FrameHeader::decode(&raw).map_err(ReadError::Frame)?;
    let mut a = vec![0u8; header.len_a as usize];
    r.read_exact(&mut a).map_err(ReadError::Io)?;
    let mut b = vec![0u8; header.len_b as usize];
    r.read_exact(&mut b).map_err(ReadError::Io)?;
    Ok(Frame { header, a, b })
}

/// Writes one frame (header and bodies in one write where possible). The
/// header is checked like a received one, so the agent never sends a frame
/// the host must refuse: an oversized body or log is cut first by the caller.
pub fn write_frame(w: &mut impl Write, kind: Kind, a: &[u8], b: &[u8], arg: u64) -> io::Result<()> {
    let header = FrameHeader {
        kind,
        len_a: u32::try_from(a.len()).map_err(|_| io::ErrorKind::InvalidInput)?,
        len_b: u32::try_from(b.len()).map_err(|_| io::ErrorKind::InvalidInput)?,
        arg,
    };
    let raw = header.encode();
    FrameHeader::decode(&raw)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{e:?}")))?;
    let mut msg = Vec::with_capacity(HEADER_SIZE + a.len() + b.len());
    msg.extend_from_slice(&raw);
    msg.extend_from_slice(a);
    msg.extend_from_slice(b);
    w.write_all(&msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_refuse_garbage() {
        let mut wire = Vec::new();
        write_frame(&mut wire, Kind::Invoke, b"id-1", b"{}", 42).unwrap();
        let f = read_frame(&mut wire.as_slice()).unwrap();
        assert_eq!(f.header.kind, Kind::Invoke);
        assert_eq!(
            (f.a.as_slice(), f.b.as_slice(), f.header.arg),
            (&b"id-1"[..], &b"{}"[..], 42)
        );
        assert!(matches!(read_frame(&mut &[][..]), Err(ReadError::Closed)));
        assert!(matches!(
            read_frame(&mut &wire[..10]),
            Err(ReadError::Io(_))
        ));
        assert!(matches!(
            read_frame(&mut &wire[..HEADER_SIZE + 2]),
            Err(ReadError::Io(_))
        ));
        assert!(matches!(
            read_frame(&mut &[0u8; HEADER_SIZE][..]),
            Err(ReadError::Frame(FrameError::BadMagic))
        ));
        // A Ready with a body is refused on the way out.
        assert!(write_frame(&mut Vec::new(), Kind::Ready, b"x", b"", 0).is_err());
    }
}
