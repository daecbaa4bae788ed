//! The API server: a thread running a single-threaded tokio runtime that
//! accepts HTTP/1.1 connections on the API socket and hands each request to
//! the [`ApiHandler`].
//!
//! Handler calls run directly on the server thread, so requests are handled
//! strictly one at a time, in arrival order, whatever the number of clients:
//! a VMM must never configure, start and pause itself concurrently.
//! Connections are independent tasks, so a client that stalls, sends garbage
//! or disconnects mid-request costs only its own connection. Bodies are
//! bounded ([`MAX_BODY_BYTES`]), headers too ([`MAX_HEADER_BYTES`]), and so
//! is time: a client gets [`HEADER_TIMEOUT`] to send a request's head (idle
//! keep-alive connections included) before its connection is closed, then
//! [`BODY_TIMEOUT`] for its body, else it is answered 408 and the
//! connection closed. A slow client never holds a connection slot (of
//! [`MAX_CONNECTIONS`]) for long, and never delays another client.

use std::convert::Infallible;
use std::io;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::{Body, Bytes, Incoming};
use hyper::header::CONTENT_LENGTH;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{HeaderMap, Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::UnixListener;
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};

use super::request::{allowed_methods, parse_request};
use super::response::{failure, success, ResponseBody};
use super::socket::{bind_private, SocketFile};
use super::{ApiError, ApiHandler, ApiRequest, ApiResponse};

/// Largest request body accepted (413 beyond). Every API body is a few
/// hundred bytes; this leaves room for long kernel command lines.
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// Largest request head (request line and headers) accepted (431 beyond).
pub const MAX_HEADER_BYTES: usize = 16 * 1024;
/// Time a client has to send a request's head, idle time included: long
/// enough that a client keeping its connection alive between requests (as
/// Firecracker's SDKs do) is not cut off; a slow head holds only its own
/// connection, never the handler.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// Time a client has to send a request's body once its head has arrived.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections served at once; more are closed on accept. The socket is
/// owner-only, so this guards against a buggy client, not an attacker.
pub const MAX_CONNECTIONS: usize = 64;

/// Why the API server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ApiServerError {
    #[error("{} exists and is not a socket; refusing to replace it (remove it or choose another --api-sock)", path.display())]
    NotASocket { path: PathBuf },
    #[error("another process is serving an API on {}; choose another --api-sock", path.display())]
    InUse { path: PathBuf },
    #[error("cannot inspect the API socket path {}: {source}", path.display())]
    Inspect { path: PathBuf, source: io::Error },
    #[error("cannot remove the stale API socket {}: {source}", path.display())]
    RemoveStale { path: PathBuf, source: io::Error },
    #[error(
        "API socket path {:?} is empty, contains a NUL byte or is longer than {max} bytes",
        path
    )]
    BadPath { path: PathBuf, max: usize },
    #[error("cannot create the API socket {}: {source}", path.display())]
    Bind { path: PathBuf, source: io::Error },
    #[error("cannot restrict the API socket {} to its owner: {source}", path.display())]
    Permissions { path: PathBuf, source: io::Error },
    #[error("cannot start the API runtime: {0}")]
    Runtime(io::Error),
    #[error("cannot start the API thread: {0}")]
    Thread(io::Error),
}

/// A running API server. Dropping it (or [`ApiServer::shutdown`]) stops the
/// server thread, closes every connection and removes the socket file.
#[derive(Debug)]
pub struct ApiServer {
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
    // Dropped after the thread has stopped (fields drop after `Drop::drop`),
    // so no connection can arrive on a file that is being removed.
    socket: SocketFile,
}

impl ApiServer {
    /// Binds `socket_path` (owner-only, replacing a stale socket) and serves
    /// the API on it from a new thread until the server is dropped.
    pub fn start(
        socket_path: &Path,
        handler: Arc<dyn ApiHandler>,
    ) -> Result<ApiServer, ApiServerError> {
        Self::start_with_limit(socket_path, handler, MAX_BODY_BYTES)
    }

    /// [`ApiServer::start`] with another request body limit (Firecracker's
    /// `--http-api-max-payload-size`).
    pub fn start_with_limit(
        socket_path: &Path,
        handler: Arc<dyn ApiHandler>,
        max_body: usize,
    ) -> Result<ApiServer, ApiServerError> {
        let (listener, socket) = bind_private(socket_path)?;
        listener
            .set_nonblocking(true)
            .map_err(ApiServerError::Runtime)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(ApiServerError::Runtime)?;
        let listener = {
            let _ctx = runtime.enter();
            UnixListener::from_std(listener).map_err(ApiServerError::Runtime)?
        };
        let (stop, stopped) = oneshot::channel();
        let thread = crate::seccomp::spawn(
            crate::seccomp::ThreadKind::Api,
            "spore-api".into(),
            move || {
                runtime.block_on(serve(listener, handler, stopped, max_body));
                // Dropping the runtime here cancels every connection task.
            },
        )
        .map_err(ApiServerError::Thread)?;
        tracing::debug!("API listening on {}", socket.path().display());
        Ok(ApiServer {
            stop: Some(stop),
            thread: Some(thread),
            socket,
        })
    }

    /// The socket the server listens on.
    pub fn socket_path(&self) -> &Path {
        self.socket.path()
    }

    /// Stops the server and removes the socket file (same as dropping it).
    pub fn shutdown(self) {}

    fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            // An error means the thread has already ended.
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            // A handler that drops the server would otherwise wait for itself.
            if thread.thread().id() == thread::current().id() {
                return;
            }
            if thread.join().is_err() {
                tracing::error!("the API server thread panicked");
            }
        }
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Accepts connections until told to stop.
async fn serve(
    listener: UnixListener,
    handler: Arc<dyn ApiHandler>,
    mut stopped: oneshot::Receiver<()>,
    max_body: usize,
) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        tokio::select! {
            // A send or a dropped sender both mean stop.
            _ = &mut stopped => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => match slots.clone().try_acquire_owned() {
                    Ok(permit) => {
                        tokio::spawn(serve_connection(stream, handler.clone(), permit, max_body));
                    }
                    Err(_) => {
                        tracing::warn!("API: {MAX_CONNECTIONS} connections open, closing a new one");
                    }
                },
                Err(e) => {
                    // Typically EMFILE: back off instead of spinning.
                    tracing::warn!("API: cannot accept a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
        }
    }
    tracing::debug!("API server stopped");
}

/// Serves one connection; generic over the stream so the fuzz targets can
/// feed raw bytes through the same code path as the API socket.
pub(crate) async fn serve_connection<S>(
    stream: S,
    handler: Arc<dyn ApiHandler>,
    _permit: OwnedSemaphorePermit,
    max_body: usize,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |req| {
        let handler = handler.clone();
        async move { Ok::<_, Infallible>(respond(req, handler.as_ref(), max_body).await) }
    });
    let result = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .max_header_size(MAX_HEADER_BYTES)
        .serve_connection(TokioIo::new(stream), service)
        .await;
    if let Err(e) = result {
        // Garbage, a timeout or a client gone mid-request: its own problem.
        tracing::debug!("API connection closed: {e}");
    }
}

/// Reads, parses and handles one request.
async fn respond(
    req: Request<Incoming>,
    handler: &dyn ApiHandler,
    max_body: usize,
) -> Response<ResponseBody> {
    let started = Instant::now();
    let (parts, body) = req.into_parts();
    let path = parts.uri.path();
    let result = match read_body(&parts.headers, body, max_body).await {
        Ok(bytes) => parse_request(&parts.method, path, &bytes).and_then(|r| call(handler, r)),
        Err(e) => Err(e),
    };
    let mut response = match result {
        Ok(ok) => success(ok),
        Err(e) => {
            tracing::debug!("API {} {path} failed: {e}", parts.method);
            let allow = match e {
                ApiError::MethodNotAllowed(_) => allowed_methods(path),
                _ => None,
            };
            failure(&e, allow)
        }
    };
    if response.status() == hyper::StatusCode::REQUEST_TIMEOUT {
        // The rest of a late body is not waited for: the connection ends.
        response.headers_mut().insert(
            hyper::header::CONNECTION,
            hyper::header::HeaderValue::from_static("close"),
        );
    }
    crate::metrics::count_api(
        parts.method.as_str(),
        path,
        response.status().as_u16() >= 400,
    );
    tracing::debug!(
        method = %parts.method,
        path,
        status = response.status().as_u16(),
        elapsed_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
        "API request"
    );
    response
}

/// The whole body, at most `max_body` bytes ([`MAX_BODY_BYTES`] by default).
async fn read_body(
    headers: &HeaderMap,
    body: Incoming,
    max_body: usize,
) -> Result<Bytes, ApiError> {
    let too_large =
        || ApiError::PayloadTooLarge(format!("the request body is larger than {max_body} bytes"));
    // Refuse early when the client announces the size, without reading it.
    let announced = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if announced.is_some_and(|n| n > max_body as u64) {
        return Err(too_large());
    }
    // Most requests (every GET) have no body: nothing to wait for, so no
    // timer, limit or buffer is set up for them.
    if body.is_end_stream() {
        return Ok(Bytes::new());
    }
    let collect = Limited::new(body, max_body).collect();
    match tokio::time::timeout(BODY_TIMEOUT, collect).await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.is::<LengthLimitError>() => Err(too_large()),
        Ok(Err(e)) => Err(ApiError::BadRequest(format!(
            "cannot read the request body: {e}"
        ))),
        Err(_) => Err(ApiError::RequestTimeout(format!(
            "the request body did not arrive within {} s",
            BODY_TIMEOUT.as_secs()
        ))),
    }
}

/// Runs the handler; a panic in it becomes a 500 instead of killing the
/// server thread (in builds that unwind).
fn call(handler: &dyn ApiHandler, req: ApiRequest) -> Result<ApiResponse, ApiError> {
    catch_unwind(AssertUnwindSafe(|| handler.handle(req))).unwrap_or_else(|_| {
        tracing::error!("API handler panicked");
        Err(ApiError::Internal(
            "the VMM failed while handling this request; see its log".into(),
        ))
    })
}

#[cfg(test)]
#[path = "server_tests.rs"]
mod tests;
