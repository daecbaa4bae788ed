//! The host end of a guest vsock connection: dial a guest port through the
//! VM's vsock Unix socket with the device's `CONNECT <port>` handshake
//! (Firecracker's hybrid vsock). Used by `spore vsock connect` and by each
//! client of `spore vsock forward`.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context};

/// Connects to guest port `port` through the vsock socket `uds`, waiting up
/// to `timeout` seconds for the guest's answer; the stream then carries the
/// guest connection's bytes only.
pub(crate) fn connect(uds: &Path, port: u32, timeout: u64) -> anyhow::Result<UnixStream> {
    let mut stream =
        UnixStream::connect(uds).with_context(|| format!("connecting to {}", uds.display()))?;
    stream.write_all(format!("CONNECT {port}\n").as_bytes())?;
    stream.set_read_timeout(Some(Duration::from_secs(timeout.max(1))))?;
    // Read the reply byte by byte so that no guest data after it is consumed.
    let mut reply = Vec::new();
    let mut byte = [0u8];
    while reply.len() < 64 {
        match stream.read(&mut byte) {
            Ok(0) => bail!("guest port {port}: connection refused (nobody listening)"),
            Ok(_) if byte[0] == b'\n' => break,
            Ok(_) => reply.push(byte[0]),
            Err(e) => bail!("guest port {port}: no answer: {e}"),
        }
    }
    let reply = String::from_utf8_lossy(&reply);
    if !reply.starts_with("OK ") {
        bail!("guest port {port}: unexpected handshake reply {reply:?}");
    }
    stream.set_read_timeout(None)?;
    Ok(stream)
}
