//! `spore vsock forward`: exposes a guest vsock port as a plain local TCP or
//! Unix socket. Each local client gets its own vsock connection (the
//! `CONNECT <port>` handshake through the VM's Unix socket), and two threads
//! copy bytes both ways until either side ends. SIGINT/SIGTERM/SIGHUP stop
//! the forwarder: the listener closes (a Unix socket file is removed) and
//! live connections are shut down.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};
use spore_vmm::devices::virtio::vsock::host_connect::connect;

/// Where local clients connect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListenAddr {
    Tcp(String),
    Unix(PathBuf),
}

impl std::str::FromStr for ListenAddr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(a) = s.strip_prefix("tcp:") {
            a.parse::<std::net::SocketAddr>().map_err(|e| {
                format!("tcp:{a}: {e} (expected tcp:HOST:PORT, e.g. tcp:127.0.0.1:6379)")
            })?;
            Ok(ListenAddr::Tcp(a.to_string()))
        } else if let Some(p) = s.strip_prefix("unix:") {
            if p.is_empty() {
                return Err("unix: needs a path, e.g. unix:/tmp/kv.sock".into());
            }
            Ok(ListenAddr::Unix(PathBuf::from(p)))
        } else {
            Err(format!("{s:?}: expected tcp:HOST:PORT or unix:PATH"))
        }
    }
}

/// A local client socket of either kind.
enum Client {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Client {
    fn try_clone(&self) -> std::io::Result<Client> {
        Ok(match self {
            Client::Tcp(s) => Client::Tcp(s.try_clone()?),
            Client::Unix(s) => Client::Unix(s.try_clone()?),
        })
    }
    fn shutdown(&self, how: Shutdown) {
        let _ = match self {
            Client::Tcp(s) => s.shutdown(how),
            Client::Unix(s) => s.shutdown(how),
        };
    }
}

impl Read for Client {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Client::Tcp(s) => s.read(buf),
            Client::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Client {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Client::Tcp(s) => s.write(buf),
            Client::Unix(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener, PathBuf),
}

impl Listener {
    fn bind(addr: &ListenAddr) -> anyhow::Result<Listener> {
        let l = match addr {
            ListenAddr::Tcp(a) => Listener::Tcp(
                TcpListener::bind(a).with_context(|| format!("listening on tcp:{a}"))?,
            ),
            ListenAddr::Unix(p) => {
                let _ = std::fs::remove_file(p);
                let l = UnixListener::bind(p)
                    .with_context(|| format!("listening on unix:{}", p.display()))?;
                Listener::Unix(l, p.clone())
            }
        };
        match &l {
            Listener::Tcp(t) => t.set_nonblocking(true)?,
            Listener::Unix(u, _) => u.set_nonblocking(true)?,
        }
        Ok(l)
    }

    fn accept(&self) -> std::io::Result<Client> {
        let c = match self {
            Listener::Tcp(t) => {
                let (s, _) = t.accept()?;
                s.set_nonblocking(false)?;
                let _ = s.set_nodelay(true);
                Client::Tcp(s)
            }
            Listener::Unix(u, _) => {
                let (s, _) = u.accept()?;
                s.set_nonblocking(false)?;
                Client::Unix(s)
            }
        };
        Ok(c)
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Unix(_, p) = self {
            let _ = std::fs::remove_file(p);
        }
    }
}

static STOP: AtomicBool = AtomicBool::new(false);

/// Blocks the stop signals in every thread (call before spawning any) and
/// waits for one on a dedicated thread.
fn stop_on_signals() -> anyhow::Result<()> {
    // SAFETY: plain sigset manipulation on a local set.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        if libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            bail!("cannot block signals: {}", std::io::Error::last_os_error());
        }
        set
    };
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let mut sig = 0;
            // SAFETY: set is a valid, initialised sigset.
            if unsafe { libc::sigwait(&set, &mut sig) } == 0 {
                STOP.store(true, Ordering::SeqCst);
            }
        })?;
    Ok(())
}

/// Runs the forwarder until a stop signal; returns the exit status.
pub fn run(uds: &Path, port: u32, listen: &ListenAddr, timeout: u64) -> anyhow::Result<u8> {
    stop_on_signals()?;
    let listener = Listener::bind(listen)?;
    eprintln!(
        "spore vsock forward: {} -> guest port {port} via {}",
        match listen {
            ListenAddr::Tcp(a) => format!("tcp:{a}"),
            ListenAddr::Unix(p) => format!("unix:{}", p.display()),
        },
        uds.display()
    );
    let live: Arc<Mutex<Vec<Client>>> = Arc::default();
    while !STOP.load(Ordering::SeqCst) {
        let client = match listener.accept() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            Err(e) => {
                eprintln!("spore vsock forward: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
        };
        if let Ok(c) = client.try_clone() {
            if let Ok(mut l) = live.lock() {
                l.push(c);
            }
        }
        let uds = uds.to_path_buf();
        let _ = std::thread::Builder::new()
            .name("forward".into())
            .spawn(move || {
                if let Err(e) = forward_one(client, &uds, port, timeout) {
                    eprintln!("spore vsock forward: {e:#}");
                }
            });
    }
    // Unblock every copying thread; the process then exits with them.
    if let Ok(l) = live.lock() {
        for c in l.iter() {
            c.shutdown(Shutdown::Both);
        }
    }
    drop(listener);
    eprintln!("spore vsock forward: stopped");
    Ok(0)
}

fn forward_one(mut client: Client, uds: &Path, port: u32, timeout: u64) -> anyhow::Result<()> {
    let guest = match connect(uds, port, timeout) {
        Ok(g) => g,
        Err(e) => {
            client.shutdown(Shutdown::Both);
            return Err(e.into());
        }
    };
    let mut guest_w = guest.try_clone()?;
    let mut client_r = client.try_clone()?;
    let up = std::thread::Builder::new()
        .name("forward-up".into())
        .spawn(move || {
            let _ = std::io::copy(&mut client_r, &mut guest_w);
            let _ = guest_w.shutdown(Shutdown::Write);
        })?;
    let mut guest_r = guest;
    let _ = std::io::copy(&mut guest_r, &mut client);
    client.shutdown(Shutdown::Write);
    let _ = up.join();
    client.shutdown(Shutdown::Both);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_listen_addresses() {
        assert_eq!(
            "tcp:127.0.0.1:6379".parse::<ListenAddr>(),
            Ok(ListenAddr::Tcp("127.0.0.1:6379".into()))
        );
        assert_eq!(
            "unix:/tmp/x.sock".parse::<ListenAddr>(),
            Ok(ListenAddr::Unix("/tmp/x.sock".into()))
        );
        assert!("tcp:nope".parse::<ListenAddr>().is_err());
        assert!("unix:".parse::<ListenAddr>().is_err());
        assert!("6379".parse::<ListenAddr>().is_err());
    }
}
