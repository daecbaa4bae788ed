//! The host side of the hybrid vsock: the Unix socket host clients connect
//! to, and the `CONNECT <port>\n` line they send before their connection is
//! handed to the guest.
//!
//! The socket file belongs to the device: a stale one left by a dead VMM is
//! removed before binding and ours is removed on drop. Any other kind of
//! file at that path is refused, never deleted.

use std::fs;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Longest accepted handshake line, newline included.
pub const MAX_HANDSHAKE_LEN: usize = 32;
/// How long a client has to send its handshake line.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum ListenerError {
    #[error("cannot inspect vsock socket path {}: {source}", .path.display())]
    Stat { path: PathBuf, source: io::Error },
    #[error("vsock socket path {} exists and is not a socket; remove it or choose another uds_path", .0.display())]
    NotASocket(PathBuf),
    #[error("cannot remove stale vsock socket {}: {source}", .path.display())]
    RemoveStale { path: PathBuf, source: io::Error },
    #[error("cannot listen on vsock socket {}: {source}", .path.display())]
    Bind { path: PathBuf, source: io::Error },
}

/// The listening Unix socket at `uds_path`, removed on drop.
pub struct HostListener {
    listener: UnixListener,
    path: PathBuf,
}

impl HostListener {
    pub fn bind(path: &Path) -> Result<Self, ListenerError> {
        match fs::symlink_metadata(path) {
            Ok(meta) if meta.file_type().is_socket() => {
                fs::remove_file(path).map_err(|source| ListenerError::RemoveStale {
                    path: path.to_owned(),
                    source,
                })?;
            }
            Ok(_) => return Err(ListenerError::NotASocket(path.to_owned())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(ListenerError::Stat {
                    path: path.to_owned(),
                    source,
                })
            }
        }
        let bind_err = |source| ListenerError::Bind {
            path: path.to_owned(),
            source,
        };
        let listener = UnixListener::bind(path).map_err(bind_err)?;
        let me = HostListener {
            listener,
            path: path.to_owned(),
        };
        // From here on, drop removes the file even if this fails.
        me.listener.set_nonblocking(true).map_err(bind_err)?;
        Ok(me)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Accepts one pending client, non-blocking. `Ok(None)` when none waits.
    pub fn accept(&self) -> io::Result<Option<UnixStream>> {
        loop {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    stream.set_nonblocking(true)?;
                    return Ok(Some(stream));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

impl AsRawFd for HostListener {
    fn as_raw_fd(&self) -> RawFd {
        self.listener.as_raw_fd()
    }
}

impl Drop for HostListener {
    fn drop(&mut self) {
        if let Err(e) = fs::remove_file(&self.path) {
            if e.kind() != io::ErrorKind::NotFound {
                tracing::warn!("cannot remove vsock socket {}: {e}", self.path.display());
            }
        }
    }
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    #[error("client closed before sending CONNECT")]
    Closed,
    #[error("handshake longer than {MAX_HANDSHAKE_LEN} bytes")]
    TooLong,
    #[error("malformed handshake {0:?}, expected \"CONNECT <port>\\n\"")]
    Malformed(String),
    #[error("socket error: {0}")]
    Io(String),
}

/// A host client that has connected but not yet said where to.
pub struct Handshake {
    stream: UnixStream,
    line: Vec<u8>,
    deadline: Instant,
}

impl Handshake {
    pub fn new(stream: UnixStream, now: Instant) -> Self {
        Handshake {
            stream,
            line: Vec::with_capacity(MAX_HANDSHAKE_LEN),
            deadline: now + HANDSHAKE_TIMEOUT,
        }
    }

    pub fn fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }

    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Reads what the client sent so far. `Ok(Some(port))` once the line is
    /// complete, `Ok(None)` while it is not.
    ///
    /// Reads one byte at a time so that nothing after the newline (data the
    /// client already sent for the guest) is consumed here.
    pub fn advance(&mut self) -> Result<Option<u32>, HandshakeError> {
        let mut byte = [0u8; 1];
        loop {
            match self.stream.read(&mut byte) {
                Ok(0) => return Err(HandshakeError::Closed),
                Ok(_) => {
                    self.line.push(byte[0]);
                    if byte[0] == b'\n' {
                        return parse_connect(&self.line).map(Some);
                    }
                    if self.line.len() >= MAX_HANDSHAKE_LEN {
                        return Err(HandshakeError::TooLong);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(HandshakeError::Io(e.to_string())),
            }
        }
    }

    pub fn into_stream(self) -> UnixStream {
        self.stream
    }
}

/// Parses `CONNECT <port>\n` (a `\r` before the newline is tolerated).
pub fn parse_connect(line: &[u8]) -> Result<u32, HandshakeError> {
    let malformed = || HandshakeError::Malformed(String::from_utf8_lossy(line).into_owned());
    let text = std::str::from_utf8(line).map_err(|_| malformed())?;
    let text = text.strip_suffix('\n').ok_or_else(malformed)?;
    let text = text.strip_suffix('\r').unwrap_or(text);
    let port = text.strip_prefix("CONNECT ").ok_or_else(malformed)?;
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return Err(malformed());
    }
    port.parse::<u32>().map_err(|_| malformed())
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn parses_connect_lines() {
        assert_eq!(parse_connect(b"CONNECT 52\n"), Ok(52));
        assert_eq!(parse_connect(b"CONNECT 4294967295\r\n"), Ok(u32::MAX));
        for bad in [
            &b"CONNECT 4294967296\n"[..],
            b"CONNECT\n",
            b"CONNECT -1\n",
            b"CONNECT +1\n",
            b"connect 52\n",
            b"CONNECT 52",
            b"CONNECT 5 2\n",
            b"\xff\n",
        ] {
            assert!(parse_connect(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn handshake_is_bounded_and_stops_at_newline() {
        let (ours, mut client) = UnixStream::pair().unwrap();
        ours.set_nonblocking(true).unwrap();
        let mut hs = Handshake::new(ours, Instant::now());
        client.write_all(b"CONNECT ").unwrap();
        assert_eq!(hs.advance(), Ok(None));
        client.write_all(b"1234\nguest data").unwrap();
        assert_eq!(hs.advance(), Ok(Some(1234)));
        let mut rest = [0u8; 10];
        hs.into_stream().read_exact(&mut rest).unwrap();
        assert_eq!(&rest, b"guest data");

        let (ours, mut client) = UnixStream::pair().unwrap();
        ours.set_nonblocking(true).unwrap();
        let mut hs = Handshake::new(ours, Instant::now());
        client.write_all(&[b'A'; 100]).unwrap();
        assert_eq!(hs.advance(), Err(HandshakeError::TooLong));
    }

    #[test]
    fn listener_replaces_stale_socket_and_cleans_up() {
        let path = std::env::temp_dir().join(format!("spore-vsock-l-{}", std::process::id()));
        let _ = fs::remove_file(&path);
        drop(UnixListener::bind(&path).unwrap()); // a stale socket file
        let l = HostListener::bind(&path).unwrap();
        assert!(l.accept().unwrap().is_none());
        let _c = UnixStream::connect(&path).unwrap();
        assert!(l.accept().unwrap().is_some());
        drop(l);
        assert!(!path.exists());

        fs::write(&path, b"not a socket").unwrap();
        assert!(matches!(
            HostListener::bind(&path),
            Err(ListenerError::NotASocket(_))
        ));
        fs::remove_file(&path).unwrap();
    }
}
