//! The Connect protocol (connectrpc.com/docs/protocol) over HTTP/1.1 and
//! HTTP/2, as much of it as envd's clients use: unary calls (`application/json`
//! or `application/proto` bodies), server streams and client streams
//! (`application/connect+json|proto`, each message in a 5-byte envelope, the
//! stream closed by an end-of-stream envelope that carries the error, if any).
//! No compression: the e2b SDK turns it off, and a request asking for it is
//! refused with `unimplemented`.
//!
//! Written here rather than taken from a crate: the Rust Connect servers on
//! crates.io are young and tied to their own code generators, and this is the
//! protocol's whole server side for the codecs envd needs.

use std::convert::Infallible;
use std::future::Future;
use std::marker::PhantomData;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::mpsc;

/// The largest message accepted in a request (an envelope or a unary body).
pub const MAX_MESSAGE_BYTES: usize = 16 << 20;
/// Messages a server stream buffers before its producer waits for the client.
const STREAM_DEPTH: usize = 16;
/// How long a finished server stream waits for the end of its request.
const BODY_END_WAIT: std::time::Duration = std::time::Duration::from_secs(1);
/// Envelope flag: the end-of-stream message (JSON, with the error if any).
const FLAG_END_STREAM: u8 = 0x02;
/// Envelope flag: the message is compressed.
const FLAG_COMPRESSED: u8 = 0x01;

/// A response body: whole, or streamed as it is produced.
pub type Body = BoxBody<Bytes, Infallible>;

/// A message envd sends or receives, in either codec.
pub trait RpcMessage:
    prost::Message + Default + Serialize + DeserializeOwned + Send + Sync + 'static
{
}
impl<T> RpcMessage for T where
    T: prost::Message + Default + Serialize + DeserializeOwned + Send + Sync + 'static
{
}

/// Connect's error codes (the subset envd answers with, spelled as on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    Canceled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Unimplemented,
    Internal,
    Unavailable,
    Unauthenticated,
}

impl Code {
    pub fn as_str(self) -> &'static str {
        match self {
            Code::Canceled => "canceled",
            Code::Unknown => "unknown",
            Code::InvalidArgument => "invalid_argument",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::PermissionDenied => "permission_denied",
            Code::ResourceExhausted => "resource_exhausted",
            Code::FailedPrecondition => "failed_precondition",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
            Code::Unauthenticated => "unauthenticated",
        }
    }

    /// The HTTP status of a unary error with this code (the protocol's table).
    pub fn http_status(self) -> StatusCode {
        match self {
            Code::Canceled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
            Code::Unknown | Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            Code::InvalidArgument => StatusCode::BAD_REQUEST,
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::AlreadyExists => StatusCode::CONFLICT,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::FailedPrecondition => StatusCode::PRECONDITION_FAILED,
            Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        }
    }
}

/// An RPC's failure, as the client sees it.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}: {message}", code.as_str())]
pub struct RpcError {
    pub code: Code,
    pub message: String,
}

impl RpcError {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        RpcError {
            code,
            message: message.into(),
        }
    }
    pub fn invalid_argument(message: impl Into<String>) -> Self {
        Self::new(Code::InvalidArgument, message)
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(Code::NotFound, message)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(Code::Internal, message)
    }

    /// An I/O error about `what` (a path, a process), by its kind.
    pub fn io(what: &str, e: &std::io::Error) -> Self {
        use std::io::ErrorKind;
        let code = match e.kind() {
            ErrorKind::NotFound => Code::NotFound,
            ErrorKind::AlreadyExists => Code::AlreadyExists,
            ErrorKind::PermissionDenied => Code::PermissionDenied,
            ErrorKind::InvalidInput | ErrorKind::InvalidData => Code::InvalidArgument,
            ErrorKind::StorageFull => Code::ResourceExhausted,
            _ => Code::Internal,
        };
        Self::new(code, format!("{what}: {e}"))
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({ "code": self.code.as_str(), "message": self.message })
    }
}

pub type RpcResult<T> = Result<T, RpcError>;

/// How a call's messages are encoded, from its `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    Json,
    Proto,
}

impl Codec {
    /// The codec a request names; `streaming` for the `connect+` types.
    fn of(req: &Request<Incoming>, streaming: bool) -> Option<Codec> {
        let content_type = req
            .headers()
            .get(hyper::header::CONTENT_TYPE)?
            .to_str()
            .ok()?;
        let media = content_type.split(';').next()?.trim().to_ascii_lowercase();
        let name = if streaming {
            media.strip_prefix("application/connect+")?
        } else {
            media.strip_prefix("application/")?
        };
        match name {
            "json" => Some(Codec::Json),
            "proto" => Some(Codec::Proto),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Codec::Json => "json",
            Codec::Proto => "proto",
        }
    }

    fn decode<M: RpcMessage>(self, data: &[u8]) -> RpcResult<M> {
        match self {
            Codec::Json if data.iter().all(u8::is_ascii_whitespace) => Ok(M::default()),
            Codec::Json => serde_json::from_slice(data)
                .map_err(|e| RpcError::invalid_argument(format!("malformed JSON message: {e}"))),
            Codec::Proto => M::decode(data).map_err(|e| {
                RpcError::invalid_argument(format!("malformed protobuf message: {e}"))
            }),
        }
    }

    fn encode<M: RpcMessage>(self, message: &M) -> Bytes {
        match self {
            // A generated message always serializes; an empty object is the
            // safe answer should that ever change.
            Codec::Json => serde_json::to_vec(message)
                .unwrap_or_else(|_| b"{}".to_vec())
                .into(),
            Codec::Proto => message.encode_to_vec().into(),
        }
    }
}

fn envelope(flags: u8, payload: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(5 + payload.len());
    out.put_u8(flags);
    // Payloads are bounded well below 4 GiB (MAX_MESSAGE_BYTES, or our own
    // output chunks).
    out.put_u32(u32::try_from(payload.len()).unwrap_or(u32::MAX));
    out.put_slice(payload);
    out.freeze()
}

fn full(status: StatusCode, content_type: &str, body: Bytes) -> Response<Body> {
    let mut response = Response::new(Full::new(body).boxed());
    *response.status_mut() = status;
    if let Ok(value) = content_type.parse() {
        response
            .headers_mut()
            .insert(hyper::header::CONTENT_TYPE, value);
    }
    response
}

/// A unary error, or any error before a stream's response has started.
pub fn error_response(error: &RpcError) -> Response<Body> {
    full(
        error.code.http_status(),
        "application/json",
        error.json().to_string().into(),
    )
}

fn unsupported_media() -> Response<Body> {
    let mut response = full(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "text/plain",
        Bytes::from_static(b"envd speaks Connect with the json or proto codec\n"),
    );
    if let Ok(value) = "application/json, application/proto".parse() {
        response.headers_mut().insert(hyper::header::ACCEPT, value);
    }
    response
}

/// Refuses a compressed request: envd's clients do not compress.
fn compression_refused(req: &Request<Incoming>, header: &str) -> Option<RpcError> {
    let encoding = req.headers().get(header)?.to_str().unwrap_or("?");
    (encoding != "identity").then(|| {
        RpcError::new(
            Code::Unimplemented,
            format!("compression {encoding:?} is not supported"),
        )
    })
}

/// Why a call's request is refused before it is read.
enum Refusal {
    /// Not a codec envd speaks (415).
    MediaType,
    /// Compressed (Connect's `unimplemented`).
    Compressed(RpcError),
}

impl Refusal {
    fn response(self) -> Response<Body> {
        match self {
            Refusal::MediaType => unsupported_media(),
            Refusal::Compressed(e) => error_response(&e),
        }
    }
}

/// The codec a call's request names, unless it is refused.
fn accept(req: &Request<Incoming>, streaming: bool) -> Result<Codec, Refusal> {
    let codec = Codec::of(req, streaming).ok_or(Refusal::MediaType)?;
    let header = if streaming {
        "connect-content-encoding"
    } else {
        "content-encoding"
    };
    match compression_refused(req, header) {
        Some(e) => Err(Refusal::Compressed(e)),
        None => Ok(codec),
    }
}

/// Reads a whole body, refusing one over `limit` bytes.
pub async fn read_body(body: Incoming, limit: usize) -> RpcResult<Bytes> {
    let limited = http_body_util::Limited::new(body, limit);
    match limited.collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(RpcError::new(
            Code::ResourceExhausted,
            format!("message larger than {limit} bytes"),
        )),
        Err(e) => Err(RpcError::new(
            Code::Canceled,
            format!("reading the request: {e}"),
        )),
    }
}

/// Serves a unary call with `handler`.
pub async fn unary<Req, Res, F, Fut>(req: Request<Incoming>, handler: F) -> Response<Body>
where
    Req: RpcMessage,
    Res: RpcMessage,
    F: FnOnce(Req) -> Fut,
    Fut: Future<Output = RpcResult<Res>>,
{
    let codec = match accept(&req, false) {
        Ok(codec) => codec,
        Err(refusal) => return refusal.response(),
    };
    let result = async {
        let body = read_body(req.into_body(), MAX_MESSAGE_BYTES).await?;
        let request = codec.decode::<Req>(&body)?;
        handler(request).await
    }
    .await;
    match result {
        Ok(message) => full(
            StatusCode::OK,
            &format!("application/{}", codec.name()),
            codec.encode(&message),
        ),
        Err(e) => error_response(&e),
    }
}

/// The sending half of a server stream: what a handler gives its messages to.
pub struct ServerStream<M> {
    tx: mpsc::Sender<Bytes>,
    codec: Codec,
    _message: PhantomData<fn(M)>,
}

/// The client went away: a handler stops producing.
#[derive(Debug, Clone, Copy)]
pub struct StreamClosed;

impl<M: RpcMessage> ServerStream<M> {
    /// Sends one message, waiting while the client is slow to read.
    pub async fn send(&self, message: &M) -> Result<(), StreamClosed> {
        let payload = self.codec.encode(message);
        self.tx
            .send(envelope(0, &payload))
            .await
            .map_err(|_| StreamClosed)
    }

    /// Resolves when the client has gone away.
    pub async fn closed(&self) {
        self.tx.closed().await;
    }
}

/// Reads one envelope (flags, payload) from a request body, buffering in
/// `buf`; `None` at the body's clean end.
async fn next_envelope(body: &mut Incoming, buf: &mut BytesMut) -> Option<RpcResult<(u8, Bytes)>> {
    loop {
        if buf.len() >= 5 {
            let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
            if len > MAX_MESSAGE_BYTES {
                return Some(Err(RpcError::new(
                    Code::ResourceExhausted,
                    format!("message larger than {MAX_MESSAGE_BYTES} bytes"),
                )));
            }
            if buf.len() >= 5 + len {
                let flags = buf[0];
                buf.advance(5);
                return Some(Ok((flags, buf.split_to(len).freeze())));
            }
        }
        match body.frame().await {
            None if buf.is_empty() => return None,
            None => {
                return Some(Err(RpcError::invalid_argument(
                    "the request ended inside a message",
                )))
            }
            Some(Err(e)) => {
                return Some(Err(RpcError::new(
                    Code::Canceled,
                    format!("reading the request: {e}"),
                )))
            }
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    buf.extend_from_slice(&data);
                }
            }
        }
    }
}

/// The receiving half of a client stream.
pub struct ClientStream<M> {
    body: Incoming,
    buf: BytesMut,
    codec: Codec,
    _message: PhantomData<fn() -> M>,
}

impl<M: RpcMessage> ClientStream<M> {
    /// The next message; `None` when the client has closed its side.
    pub async fn next(&mut self) -> Option<RpcResult<M>> {
        match next_envelope(&mut self.body, &mut self.buf).await? {
            Err(e) => Some(Err(e)),
            Ok((flags, _)) if flags & FLAG_COMPRESSED != 0 => Some(Err(RpcError::new(
                Code::Unimplemented,
                "compressed messages",
            ))),
            Ok((flags, _)) if flags & FLAG_END_STREAM != 0 => None,
            Ok((_, payload)) => Some(self.codec.decode(&payload)),
        }
    }
}

fn streaming_response(codec: Codec, rx: mpsc::Receiver<Bytes>) -> Response<Body> {
    let frames = futures_util::stream::unfold(rx, |mut rx| async move {
        let chunk = rx.recv().await?;
        Some((Ok::<_, Infallible>(Frame::data(chunk)), rx))
    });
    let mut response = Response::new(BodyExt::boxed(StreamBody::new(frames)));
    if let Ok(value) = format!("application/connect+{}", codec.name()).parse() {
        response
            .headers_mut()
            .insert(hyper::header::CONTENT_TYPE, value);
    }
    response
}

fn end_of_stream(result: &RpcResult<()>) -> Bytes {
    let body = match result {
        Ok(()) => serde_json::json!({}),
        Err(e) => serde_json::json!({ "error": e.json() }),
    };
    envelope(FLAG_END_STREAM, body.to_string().as_bytes())
}

/// Serves a server-streaming call: `handler` runs in its own task and sends
/// its messages on the stream; what it returns ends the stream.
pub async fn server_streaming<Req, Res, F, Fut>(
    req: Request<Incoming>,
    handler: F,
) -> Response<Body>
where
    Req: RpcMessage,
    Res: RpcMessage,
    F: FnOnce(Req, ServerStream<Res>) -> Fut + Send + 'static,
    Fut: Future<Output = RpcResult<()>> + Send + 'static,
{
    let codec = match accept(&req, true) {
        Ok(codec) => codec,
        Err(refusal) => return refusal.response(),
    };
    let mut body = req.into_body();
    let mut buf = BytesMut::new();
    let request = match next_envelope(&mut body, &mut buf).await {
        None => Ok(Req::default()),
        Some(Err(e)) => Err(e),
        Some(Ok((flags, _))) if flags & FLAG_COMPRESSED != 0 => {
            Err(RpcError::new(Code::Unimplemented, "compressed messages"))
        }
        Some(Ok((_, payload))) => codec.decode::<Req>(&payload),
    };
    let (tx, rx) = mpsc::channel(STREAM_DEPTH);
    let end_tx = tx.clone();
    let stream = ServerStream {
        tx,
        codec,
        _message: PhantomData,
    };
    tokio::spawn(async move {
        let result = match request {
            Ok(request) => handler(request, stream).await,
            Err(e) => Err(e),
        };
        // The request read to its end before the response ends: hyper
        // closes an HTTP/1.1 connection whose request body was dropped
        // unread (the client's closing chunk may not have arrived when a
        // short call is done), and the client's next call on it then fails.
        let rest = async { while let Some(Ok(_)) = next_envelope(&mut body, &mut buf).await {} };
        let _ = tokio::time::timeout(BODY_END_WAIT, rest).await;
        // The client may be gone: nothing to tell it then.
        let _ = end_tx.send(end_of_stream(&result)).await;
    });
    streaming_response(codec, rx)
}

/// Serves a client-streaming call: `handler` reads the client's messages and
/// answers with one.
pub async fn client_streaming<Req, Res, F, Fut>(
    req: Request<Incoming>,
    handler: F,
) -> Response<Body>
where
    Req: RpcMessage,
    Res: RpcMessage,
    F: FnOnce(ClientStream<Req>) -> Fut,
    Fut: Future<Output = RpcResult<Res>>,
{
    let codec = match accept(&req, true) {
        Ok(codec) => codec,
        Err(refusal) => return refusal.response(),
    };
    let stream = ClientStream {
        body: req.into_body(),
        buf: BytesMut::new(),
        codec,
        _message: PhantomData,
    };
    let result = handler(stream).await;
    let (tx, rx) = mpsc::channel(2);
    if let Ok(message) = &result {
        let _ = tx.try_send(envelope(0, &codec.encode(message)));
    }
    let _ = tx.try_send(end_of_stream(&result.map(|_| ())));
    drop(tx);
    streaming_response(codec, rx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_carry_flags_and_big_endian_lengths() {
        let e = envelope(FLAG_END_STREAM, b"{}");
        assert_eq!(&e[..], &[2, 0, 0, 0, 2, b'{', b'}']);
    }

    #[test]
    fn end_of_stream_carries_the_error() {
        let e = end_of_stream(&Err(RpcError::not_found("no process 7")));
        let json: serde_json::Value = serde_json::from_slice(&e[5..]).unwrap();
        assert_eq!(json["error"]["code"], "not_found");
        assert_eq!(json["error"]["message"], "no process 7");
        assert_eq!(&end_of_stream(&Ok(()))[5..], b"{}");
    }

    #[test]
    fn codes_map_to_the_protocols_http_statuses() {
        assert_eq!(Code::NotFound.http_status(), StatusCode::NOT_FOUND);
        assert_eq!(
            Code::Unauthenticated.http_status(),
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(Code::InvalidArgument.http_status(), StatusCode::BAD_REQUEST);
    }

    #[test]
    fn json_messages_use_proto3_names() {
        use crate::proto::process::process_selector::Selector;
        use crate::proto::process::ProcessSelector;
        let m: ProcessSelector = Codec::Json.decode(br#"{"pid": 42}"#).unwrap();
        assert_eq!(m.selector, Some(Selector::Pid(42)));
        let empty: ProcessSelector = Codec::Json.decode(b"").unwrap();
        assert_eq!(empty.selector, None);
        assert!(Codec::Json
            .decode::<ProcessSelector>(b"{\"pid\": \"x\"}")
            .is_err());
    }
}
