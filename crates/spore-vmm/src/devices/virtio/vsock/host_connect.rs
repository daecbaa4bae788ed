//! The host end of a host → guest connection: dial a guest port through the
//! device's Unix socket with the `CONNECT <port>` handshake that
//! [`super::listener`] answers (Firecracker's hybrid vsock). `spore vsock
//! connect`, each client of `spore vsock forward` and the Linux reclaim
//! benchmark use it; it lives beside the device because the two ends of the
//! handshake change together. It imports nothing else of the VMM.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The longest reply line read before giving up (`OK <host_port>` is short).
const MAX_REPLY: usize = 64;

/// Why the guest port could not be reached.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error("connecting to {}", path.display())]
    Connect {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("guest port {port}: connection refused (nobody listening, or the guest did not answer in time)")]
    Refused { port: u32 },
    /// The reply did not come (timeout or read error); the cause is in the
    /// message, as users read it on one line.
    #[error("guest port {port}: no answer: {cause}")]
    NoAnswer { port: u32, cause: io::Error },
    #[error("guest port {port}: unexpected handshake reply {reply:?}")]
    UnexpectedReply { port: u32, reply: String },
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// Connects to guest port `port` through the vsock socket `uds`, waiting up
/// to `timeout_secs` seconds (at least 1) for the guest's answer; the
/// stream then carries the guest connection's bytes only.
pub fn connect(uds: &Path, port: u32, timeout_secs: u64) -> Result<UnixStream, HandshakeError> {
    let mut stream = UnixStream::connect(uds).map_err(|source| HandshakeError::Connect {
        path: uds.to_path_buf(),
        source,
    })?;
    stream.write_all(format!("CONNECT {port}\n").as_bytes())?;
    stream.set_read_timeout(Some(Duration::from_secs(timeout_secs.max(1))))?;
    // Read the reply byte by byte so that no guest data after it is consumed.
    let mut reply = Vec::new();
    let mut byte = [0u8];
    while reply.len() < MAX_REPLY {
        match stream.read(&mut byte) {
            Ok(0) => return Err(HandshakeError::Refused { port }),
            Ok(_) if byte[0] == b'\n' => break,
            Ok(_) => reply.push(byte[0]),
            Err(cause) => return Err(HandshakeError::NoAnswer { port, cause }),
        }
    }
    let reply = String::from_utf8_lossy(&reply);
    if !reply.starts_with("OK ") {
        return Err(HandshakeError::UnexpectedReply {
            port,
            reply: reply.into_owned(),
        });
    }
    stream.set_read_timeout(None)?;
    Ok(stream)
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixListener;

    use vmm_sys_util::tempdir::TempDir;

    use super::*;

    /// A one-connection stand-in for the device's listener answering `reply`.
    fn answer(reply: &'static [u8]) -> (TempDir, PathBuf) {
        let dir = TempDir::new_with_prefix("/tmp/spore-host-connect-").unwrap();
        let path = dir.as_path().join("v.sock");
        let listener = UnixListener::bind(&path).unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut line = [0u8; 13];
            s.read_exact(&mut line).unwrap();
            assert_eq!(&line, b"CONNECT 5000\n");
            s.write_all(reply).unwrap();
        });
        (dir, path)
    }

    #[test]
    fn ok_leaves_the_guest_bytes_on_the_stream() {
        let (_dir, path) = answer(b"OK 1073741824\nhello");
        let mut s = connect(&path, 5000, 5).unwrap();
        let mut rest = String::new();
        s.read_to_string(&mut rest).unwrap();
        assert_eq!(rest, "hello");
    }

    #[test]
    fn a_closed_or_odd_reply_is_an_error_naming_the_port() {
        let (_dir, path) = answer(b"");
        let e = connect(&path, 5000, 5).unwrap_err();
        assert_eq!(
            e.to_string(),
            "guest port 5000: connection refused (nobody listening, or the guest did not answer in time)"
        );
        let (_dir, path) = answer(b"NO\n");
        let e = connect(&path, 5000, 5).unwrap_err();
        assert_eq!(
            e.to_string(),
            "guest port 5000: unexpected handshake reply \"NO\""
        );
    }
}
