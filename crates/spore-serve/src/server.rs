//! The API's HTTP/1.1 connections, bounded so that clients cannot hold the
//! daemon: request headers must arrive within the request timeout, an idle
//! connection (keep-alive, or one that never sent a request) is closed
//! after the idle timeout, and at most `max_connections` are open: a new
//! one closes the connection idle the longest, or is refused when none is
//! idle. Accept errors (descriptors exhausted) back off instead of spinning,
//! and the descriptor limit is raised at start with room kept for the
//! instances' VMM sockets.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Either;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};

use crate::api::{self, Daemon};
use crate::connections::{Conn, InFlight};

/// Descriptors kept for everything but API connections (VMM sockets,
/// catalogue, logs, snapshots).
pub const RESERVED_FDS: u64 = 1024;

/// How API connections are bounded (`spore serve --max-connections`,
/// `--idle-timeout-ms`, `--request-timeout-ms`).
#[derive(Clone, Copy, Debug)]
pub struct ConnLimits {
    pub max_connections: usize,
    pub idle_timeout: Duration,
    /// For a request's headers, and between two pieces of its body.
    pub request_timeout: Duration,
}

impl Default for ConnLimits {
    fn default() -> Self {
        Self {
            max_connections: 4096,
            idle_timeout: Duration::from_secs(60),
            request_timeout: Duration::from_secs(30),
        }
    }
}

/// Raises the soft descriptor limit to the hard one; returns the
/// connection cap that leaves [`RESERVED_FDS`] for the rest (at least 16).
pub fn fit_descriptor_limit(wanted: usize) -> usize {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid rlimit struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return wanted;
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim.rlim_cur = lim.rlim_max;
            }
        }
    }
    let room = usize::try_from(lim.rlim_cur.saturating_sub(RESERVED_FDS)).unwrap_or(usize::MAX);
    wanted.min(room).max(16)
}

/// The listen backlog: a burst of clients (a thousand invocations at once)
/// must fit while the accept loop catches up. With the usual 1024, the
/// kernel's SYN queue overflowed into SYN cookies under such a burst, and
/// some cookie ACKs then failed: those clients got a reset (2–10 % of a
/// 1,000-client burst, `TcpExtSyncookiesFailed` = `TcpOutRsts`). The
/// kernel caps it at `net.core.somaxconn` (4096 by default).
pub const LISTEN_BACKLOG: u32 = 8192;

/// A listening socket on `addr` with [`LISTEN_BACKLOG`].
pub fn listen(addr: std::net::SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    // A restarted daemon binds its port again at once (TIME_WAIT sockets
    // of the last one's connections do not block it).
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// What a listener serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// The Lambda API (`--listen`).
    Api,
    /// Function URLs (`--url-listen`): plain HTTP requests to functions.
    FunctionUrls,
    /// The sandbox API and proxy (`--sandbox-listen`).
    Sandboxes,
}

/// The address a request came from (an extension of function URL requests:
/// their event's `sourceIp`).
#[derive(Clone, Copy, Debug)]
pub struct Peer(pub std::net::SocketAddr);

/// Accepts and serves connections until `stop` resolves. Both endpoints
/// share the connection cap.
pub async fn serve(
    listener: tokio::net::TcpListener,
    daemon: Arc<Daemon>,
    limits: ConnLimits,
    endpoint: Endpoint,
    stop: impl std::future::Future<Output = ()>,
) {
    let conns = daemon.connections.clone();
    tokio::pin!(stop);
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = &mut stop => return,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of descriptors or memory: give connections and
                // instances time to close some instead of spinning.
                tracing::warn!("accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Some((id, conn)) = conns.admit(limits.max_connections) else {
            tracing::debug!(
                "connection refused: {} busy connections",
                limits.max_connections
            );
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (daemon, conns) = (daemon.clone(), conns.clone());
        tokio::spawn(async move {
            serve_one(stream, Peer(peer), daemon, &conn, limits, endpoint).await;
            conns.remove(id);
        });
    }
}

async fn serve_one(
    stream: tokio::net::TcpStream,
    peer: Peer,
    daemon: Arc<Daemon>,
    conn: &Arc<Conn>,
    limits: ConnLimits,
    endpoint: Endpoint,
) {
    let tracked = conn.clone();
    let service = service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
        tracked.in_flight.fetch_add(1, Ordering::AcqRel);
        let in_flight = InFlight(tracked.clone());
        let daemon = daemon.clone();
        req.extensions_mut().insert(peer);
        async move {
            let resp = match endpoint {
                Endpoint::Api => api::handle(daemon, req, limits.request_timeout)
                    .await
                    .unwrap_or_else(|never| match never {})
                    .map(Either::Left),
                Endpoint::FunctionUrls => {
                    api::handle_function_url(daemon, req, limits.request_timeout)
                        .await
                        .unwrap_or_else(|never| match never {})
                        .map(Either::Left)
                }
                Endpoint::Sandboxes => match &daemon.sandboxes {
                    Some(sbx) => {
                        crate::sandboxes::api::handle(
                            sbx.clone(),
                            daemon.auth.as_ref(),
                            req,
                            limits.request_timeout,
                        )
                        .await
                    }
                    None => crate::sandboxes::reply::error(404, "no sandbox API here"),
                },
            };
            drop(in_flight);
            Ok::<_, std::convert::Infallible>(resp)
        }
    });
    // With upgrades: the sandbox proxy carries WebSockets.
    let served = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.request_timeout)
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades();
    tokio::pin!(served);
    let mut closing = false;
    loop {
        let idle_check = tokio::time::sleep(limits.idle_timeout.min(Duration::from_secs(1)));
        tokio::select! {
            r = served.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!("connection: {e}");
                }
                return;
            }
            () = conn.close.notified(), if !closing => {
                closing = true;
                served.as_mut().graceful_shutdown();
            }
            () = idle_check, if !closing => {
                if conn.idle_for().is_some_and(|d| d >= limits.idle_timeout) {
                    closing = true;
                    served.as_mut().graceful_shutdown();
                }
            }
        }
    }
}
