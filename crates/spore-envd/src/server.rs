//! envd's HTTP server: the routes, the access token, and the listeners (TCP
//! for tests on a host, AF_VSOCK in a guest).

use std::sync::Arc;

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncWrite};

use crate::connect::{error_response, Body, Code, RpcError};
use crate::query::query_param;
use crate::state::{Ctx, State};
use crate::{api, files, filesystem, process};

/// Where envd listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listen {
    /// `tcp:HOST:PORT` (port 0 picks one; the address is printed).
    Tcp(String),
    /// `vsock:PORT`, on any CID (the guest's side of spore's vsock device).
    Vsock(u32),
}

impl std::str::FromStr for Listen {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(addr) = s.strip_prefix("tcp:") {
            return Ok(Listen::Tcp(addr.to_owned()));
        }
        if let Some(port) = s.strip_prefix("vsock:") {
            return port
                .parse()
                .map(Listen::Vsock)
                .map_err(|_| format!("invalid vsock port {port:?}"));
        }
        Err(format!(
            "--listen takes tcp:HOST:PORT or vsock:PORT, not {s:?}"
        ))
    }
}

/// Options of one envd.
pub struct Options {
    pub listen: Listen,
    /// Set the guest's clock from `/init`'s timestamp (in a guest, as root).
    pub manage_clock: bool,
}

/// Serves until the process ends.
pub async fn serve(state: Arc<State>, options: Options) -> std::io::Result<()> {
    let manage_clock = options.manage_clock;
    match options.listen {
        Listen::Tcp(addr) => {
            let listener = tokio::net::TcpListener::bind(&addr).await?;
            // The first line on stdout is the address (tests read it).
            println!("listening on tcp:{}", listener.local_addr()?);
            loop {
                let (stream, _) = listener.accept().await?;
                let _ = stream.set_nodelay(true);
                spawn_connection(stream, state.clone(), manage_clock);
            }
        }
        Listen::Vsock(port) => {
            let listener = tokio_vsock::VsockListener::bind(tokio_vsock::VsockAddr::new(
                tokio_vsock::VMADDR_CID_ANY,
                port,
            ))?;
            println!("listening on vsock:{port}");
            // In a guest: its TCP servers reachable from the host too.
            tokio::spawn(crate::ports::forward_listening_ports(
                u16::try_from(port).unwrap_or(u16::MAX),
            ));
            loop {
                let (stream, _) = listener.accept().await?;
                spawn_connection(stream, state.clone(), manage_clock);
            }
        }
    }
}

fn spawn_connection<S>(stream: S, state: Arc<State>, manage_clock: bool)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        let service = service_fn(move |req| {
            let state = state.clone();
            async move { Ok::<_, std::convert::Infallible>(route(state, req, manage_clock).await) }
        });
        let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
        // A client that shuts down its write side once its request is sent
        // (`spore vsock connect`, shell tools) still gets its answer.
        builder.http1().half_close(true);
        // A connection that fails (the client went away) ends here.
        let _ = builder
            .serve_connection(TokioIo::new(stream), service)
            .await;
    });
}

/// How much of a refused request's body is read (and dropped) before the
/// refusal, and for how long: the client finishes sending and then reads the
/// answer, instead of finding its connection closed under its upload.
const REFUSED_BODY_DRAIN_BYTES: usize = 1 << 20;
const REFUSED_BODY_DRAIN_TIME: std::time::Duration = std::time::Duration::from_secs(2);

/// A refusal of a request whose body was not read: the body is drained (up to
/// a bound) and the connection closes after the answer, so that no client
/// reuses a connection with unread bytes on it.
async fn refuse(req: Request<Incoming>, mut response: Response<Body>) -> Response<Body> {
    if !matches!(*req.method(), Method::GET | Method::HEAD) {
        let body = http_body_util::Limited::new(req.into_body(), REFUSED_BODY_DRAIN_BYTES);
        let _ = tokio::time::timeout(REFUSED_BODY_DRAIN_TIME, body.collect()).await;
        response.headers_mut().insert(
            hyper::header::CONNECTION,
            hyper::header::HeaderValue::from_static("close"),
        );
    }
    response
}

async fn route(state: Arc<State>, req: Request<Incoming>, manage_clock: bool) -> Response<Body> {
    let path = req.uri().path().to_owned();
    let is_rpc =
        path.starts_with("/process.Process/") || path.starts_with("/filesystem.Filesystem/");
    if path == "/health" {
        return api::no_content();
    }
    if !state.authorized(req.headers()) {
        let response = if is_rpc {
            error_response(&RpcError::new(
                Code::Unauthenticated,
                "invalid access token",
            ))
        } else {
            api::error(StatusCode::UNAUTHORIZED, "invalid access token")
        };
        return refuse(req, response).await;
    }
    match (req.method(), path.as_str()) {
        (&Method::POST, "/init") => return api::init(&state, req, manage_clock).await,
        (&Method::GET, "/envs") => return api::envs(&state),
        (&Method::GET, "/metrics") => return api::metrics().await,
        _ => {}
    }
    let query_user = query_param(&req, "username");
    let user = match state.user_of(req.headers(), query_user.as_deref()) {
        Ok(user) => user,
        Err(e) if is_rpc => return refuse(req, error_response(&e)).await,
        Err(e) => {
            let response = api::error(StatusCode::UNAUTHORIZED, e.message);
            return refuse(req, response).await;
        }
    };
    let ctx = Ctx {
        state: state.clone(),
        user,
    };
    match (req.method(), path.as_str()) {
        (&Method::GET, "/files") => return files::download(ctx, req).await,
        (&Method::POST, "/files") => return files::upload(ctx, req).await,
        _ => {}
    }
    if req.method() == Method::POST {
        if let Some(method) = path.strip_prefix("/process.Process/") {
            let method = method.to_owned();
            return match process::has_method(&method) {
                true => process::route(ctx, &method, req)
                    .await
                    .unwrap_or_else(|| unknown_method(&path)),
                false => refuse(req, unknown_method(&path)).await,
            };
        }
        if let Some(method) = path.strip_prefix("/filesystem.Filesystem/") {
            let method = method.to_owned();
            return match filesystem::has_method(&method) {
                true => filesystem::route(ctx, &method, req)
                    .await
                    .unwrap_or_else(|| unknown_method(&path)),
                false => refuse(req, unknown_method(&path)).await,
            };
        }
    }
    let response = api::error(
        StatusCode::NOT_FOUND,
        format!("no route {} {path}", req.method()),
    );
    refuse(req, response).await
}

fn unknown_method(path: &str) -> Response<Body> {
    error_response(&RpcError::new(
        Code::Unimplemented,
        format!("{path} is not implemented"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses_parse() {
        assert_eq!(
            "tcp:127.0.0.1:0".parse(),
            Ok(Listen::Tcp("127.0.0.1:0".into()))
        );
        assert_eq!("vsock:49983".parse(), Ok(Listen::Vsock(49983)));
        assert!("vsock:x".parse::<Listen>().is_err());
        assert!("udp:1".parse::<Listen>().is_err());
    }
}
