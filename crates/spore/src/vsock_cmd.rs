//! `spore vsock`: the host end of a VM's vsock device, from the shell.
//!
//! `connect` dials a guest port through the device's Unix socket (the
//! `CONNECT <port>` handshake) and `listen` accepts one guest-initiated
//! connection on `<uds>_<port>`; both then copy stdin to the peer and the
//! peer to stdout until both directions end (`connect`'s handshake is in
//! `spore_vmm::devices::virtio::vsock::host_connect`, shared with `forward` and
//! the benchmarks). `forward` (in `vsock_forward.rs`) exposes a guest
//! port as a local TCP or Unix socket.

use std::io::{BufRead, BufReader, Write};
use std::net::Shutdown;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;

use anyhow::Context;
use clap::Subcommand;
use spore_vmm::devices::virtio::vsock::host_connect::connect;

#[derive(Subcommand, Debug)]
pub enum VsockCommand {
    /// Connect to a guest port through the VM's vsock Unix socket.
    Connect {
        /// The `uds_path` given in /vsock (or `spore run --vsock`).
        #[arg(long)]
        uds: PathBuf,
        #[arg(long)]
        port: u32,
        /// Give up if the guest has not accepted within this many seconds.
        #[arg(long, default_value_t = 10)]
        timeout: u64,
    },
    /// Accept one connection the guest makes to host port PORT.
    Listen {
        #[arg(long)]
        uds: PathBuf,
        #[arg(long)]
        port: u32,
    },
    /// Expose a guest port as a local TCP or Unix socket: each client that
    /// connects there gets its own connection to the guest port.
    Forward {
        #[arg(long)]
        uds: PathBuf,
        #[arg(long)]
        port: u32,
        /// tcp:HOST:PORT or unix:PATH
        #[arg(long, value_name = "tcp:HOST:PORT|unix:PATH")]
        listen: crate::vsock_forward::ListenAddr,
        /// Per client: give up if the guest has not accepted within this many seconds.
        #[arg(long, default_value_t = 10)]
        timeout: u64,
    },
}

pub fn run(cmd: VsockCommand) -> anyhow::Result<u8> {
    let stream = match cmd {
        VsockCommand::Connect { uds, port, timeout } => connect(&uds, port, timeout)?,
        VsockCommand::Forward {
            uds,
            port,
            listen,
            timeout,
        } => return crate::vsock_forward::run(&uds, port, &listen, timeout),
        VsockCommand::Listen { uds, port } => {
            let mut path = uds.into_os_string();
            path.push(format!("_{port}"));
            let path = PathBuf::from(path);
            let _ = std::fs::remove_file(&path);
            let listener = UnixListener::bind(&path)
                .with_context(|| format!("listening on {}", path.display()))?;
            let accepted = listener.accept().map(|(s, _)| s);
            let _ = std::fs::remove_file(&path);
            accepted.context("accepting the guest's connection")?
        }
    };
    pipe_stdio(stream)?;
    Ok(0)
}

/// Copies stdin → stream (then half-closes) and stream → stdout.
fn pipe_stdio(stream: UnixStream) -> anyhow::Result<()> {
    let mut to_peer = stream.try_clone()?;
    let writer = std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let _ = std::io::copy(&mut stdin, &mut to_peer);
        let _ = to_peer.shutdown(Shutdown::Write);
    });
    let mut from_peer = BufReader::new(stream);
    let mut stdout = std::io::stdout().lock();
    loop {
        let buf = from_peer.fill_buf()?;
        if buf.is_empty() {
            break;
        }
        stdout.write_all(buf)?;
        stdout.flush()?;
        let n = buf.len();
        from_peer.consume(n);
    }
    // Finish sending what stdin holds (a pipe or file ends), but do not wait
    // on a terminal, which may never close.
    // SAFETY: isatty only inspects the descriptor.
    if unsafe { libc::isatty(libc::STDIN_FILENO) } == 0 {
        let _ = writer.join();
    }
    Ok(())
}
