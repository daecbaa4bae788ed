//! The AWS Lambda Runtime API the runtime talks to (HTTP/1.1, keep-alive;
//! requests parsed by `httparse`), one thread per connection:
//!
//! - `GET  /2018-06-01/runtime/invocation/next` (long poll)
//! - `POST /2018-06-01/runtime/invocation/{id}/response`
//! - `POST /2018-06-01/runtime/invocation/{id}/error`
//! - `POST /2018-06-01/runtime/init/error`
//! - `GET  /2018-06-01/runtime/spore/function`: spore's pre-init extension,
//!   blocks until the agent is configured and returns the function's JSON.
//!
//! The runtime is the function's code, so it is not trusted: header block
//! and body sizes are bounded, ids are matched against the invocation in
//! flight.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;

use spore_abi::function::MAX_PAYLOAD;

use super::runtime::error_json;
use super::state::{Agent, ApiRefusal};

const PREFIX: &str = "/2018-06-01/runtime/";
/// Largest request line plus headers.
const MAX_HEAD: usize = 64 * 1024;
const MAX_HEADERS: usize = 64;

/// Accepts Runtime API connections forever.
pub fn serve(agent: Arc<Agent>, listener: TcpListener) {
    for conn in listener.incoming() {
        match conn {
            Ok(stream) => {
                let agent = Arc::clone(&agent);
                std::thread::spawn(move || {
                    let _ = stream.set_nodelay(true);
                    if let Err(e) = Conn::new(stream).serve(&agent) {
                        if e.kind() != io::ErrorKind::UnexpectedEof {
                            eprintln!("spore-agent: runtime API connection: {e}");
                        }
                    }
                });
            }
            Err(e) => eprintln!("spore-agent: runtime API accept: {e}"),
        }
    }
}

/// One parsed request head.
#[derive(Debug)]
struct Head {
    method: String,
    path: String,
    keep_alive: bool,
    content_length: Option<usize>,
    chunked: bool,
    /// `Expect: 100-continue` (curl sends it with large bodies, and waits
    /// a second for the go-ahead before sending anyway).
    expect_continue: bool,
    error_type: Option<String>,
}

/// A response.
struct Reply {
    status: u16,
    body: Vec<u8>,
    headers: Vec<(&'static str, String)>,
    close: bool,
}

impl Reply {
    fn json(status: u16, body: Vec<u8>) -> Self {
        Self {
            status,
            body,
            headers: Vec::new(),
            close: false,
        }
    }

    fn error(status: u16, error_type: &str, message: &str) -> Self {
        Self::json(status, error_json(error_type, message))
    }

    fn accepted() -> Self {
        Self::json(202, br#"{"status":"OK"}"#.to_vec())
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        202 => "Accepted",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        413 => "Payload Too Large",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        _ => "Unknown",
    }
}

/// Why a body could not be read.
enum BodyError {
    TooLarge,
    Malformed(&'static str),
    Io(io::Error),
}

impl From<io::Error> for BodyError {
    fn from(e: io::Error) -> Self {
        Self::Io(e)
    }
}

struct Conn {
    stream: TcpStream,
    /// Bytes read past the last request.
    buf: Vec<u8>,
}

impl Conn {
    fn new(stream: TcpStream) -> Self {
        Self {
            stream,
            buf: Vec::with_capacity(8192),
        }
    }

    /// Reads more bytes into `buf`; EOF is an error.
    fn fill(&mut self) -> io::Result<()> {
        let mut chunk = [0u8; 16 * 1024];
        let n = self.stream.read(&mut chunk)?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(())
    }

    fn serve(&mut self, agent: &Agent) -> io::Result<()> {
        loop {
            let head = match self.read_head()? {
                Ok(h) => h,
                Err(reply) => return self.send(&reply),
            };
            let body = match self.read_body(&head) {
                Ok(b) => b,
                Err(BodyError::Io(e)) => return Err(e),
                Err(BodyError::TooLarge) => {
                    // Too large for Lambda: say so, and end the invocation
                    // with the error Lambda reports for it.
                    if let Some(id) = invocation_id(&head.path, "response") {
                        let _ = agent.post_result(
                            id,
                            false,
                            error_json(
                                "Function.ResponseSizeTooLarge",
                                &format!(
                                    "Response payload size exceeded maximum allowed payload size ({MAX_PAYLOAD} bytes)."
                                ),
                            ),
                        );
                    }
                    let mut r = Reply::error(
                        413,
                        "RequestEntityTooLarge",
                        &format!("request body over {MAX_PAYLOAD} bytes"),
                    );
                    r.close = true;
                    return self.send(&r);
                }
                Err(BodyError::Malformed(what)) => {
                    let mut r = Reply::error(400, "InvalidRequest", what);
                    r.close = true;
                    return self.send(&r);
                }
            };
            let close = match route(agent, &head, body, self)? {
                Some(mut reply) => {
                    reply.close |= !head.keep_alive;
                    self.send(&reply)?;
                    reply.close
                }
                // `/next` sends its own reply.
                None => !head.keep_alive,
            };
            if close {
                return Ok(());
            }
        }
    }

    /// The next request head, or the reply refusing it.
    fn read_head(&mut self) -> io::Result<Result<Head, Reply>> {
        loop {
            let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
            let mut req = httparse::Request::new(&mut headers);
            match req.parse(&self.buf) {
                Ok(httparse::Status::Complete(n)) => {
                    let head = head_of(&req);
                    self.buf.drain(..n);
                    return Ok(head.map_err(|m| {
                        let mut r = Reply::error(400, "InvalidRequest", m);
                        r.close = true;
                        r
                    }));
                }
                Ok(httparse::Status::Partial) if self.buf.len() < MAX_HEAD => self.fill()?,
                Ok(httparse::Status::Partial) | Err(httparse::Error::TooManyHeaders) => {
                    let mut r = Reply::error(431, "InvalidRequest", "request head too large");
                    r.close = true;
                    return Ok(Err(r));
                }
                Err(e) => {
                    let mut r = Reply::error(400, "InvalidRequest", &format!("bad request: {e}"));
                    r.close = true;
                    return Ok(Err(r));
                }
            }
        }
    }

    fn read_body(&mut self, head: &Head) -> Result<Vec<u8>, BodyError> {
        let limit = MAX_PAYLOAD as usize;
        if head.chunked {
            return self.read_chunked(limit, head.expect_continue);
        }
        let len = head.content_length.unwrap_or(0);
        if len > limit {
            return Err(BodyError::TooLarge);
        }
        if head.expect_continue && self.buf.len() < len {
            self.stream.write_all(b"HTTP/1.1 100 Continue\r\n\r\n")?;
        }
        while self.buf.len() < len {
            self.fill()?;
        }
        Ok(self.buf.drain(..len).collect())
    }

    /// A chunked body (hyper sends one for a streamed response).
    fn read_chunked(&mut self, limit: usize, expect_continue: bool) -> Result<Vec<u8>, BodyError> {
        if expect_continue && self.buf.is_empty() {
            self.stream.write_all(b"HTTP/1.1 100 Continue\r\n\r\n")?;
        }
        let mut body = Vec::new();
        loop {
            let (start, size) = loop {
                match httparse::parse_chunk_size(&self.buf) {
                    Ok(httparse::Status::Complete((start, size))) => break (start, size),
                    Ok(httparse::Status::Partial) if self.buf.len() < MAX_HEAD => self.fill()?,
                    _ => return Err(BodyError::Malformed("bad chunk size")),
                }
            };
            let size = usize::try_from(size).map_err(|_| BodyError::TooLarge)?;
            if body.len().saturating_add(size) > limit {
                return Err(BodyError::TooLarge);
            }
            if size == 0 {
                self.buf.drain(..start);
                // Trailers, if any, up to the empty line.
                loop {
                    let mut trailers = [httparse::EMPTY_HEADER; MAX_HEADERS];
                    match httparse::parse_headers(&self.buf, &mut trailers) {
                        Ok(httparse::Status::Complete((n, _))) => {
                            self.buf.drain(..n);
                            return Ok(body);
                        }
                        Ok(httparse::Status::Partial) if self.buf.len() < MAX_HEAD => {
                            self.fill()?
                        }
                        _ => return Err(BodyError::Malformed("bad chunked trailer")),
                    }
                }
            }
            while self.buf.len() < start + size + 2 {
                self.fill()?;
            }
            if &self.buf[start + size..start + size + 2] != b"\r\n" {
                return Err(BodyError::Malformed("chunk not followed by CRLF"));
            }
            body.extend_from_slice(&self.buf[start..start + size]);
            self.buf.drain(..start + size + 2);
        }
    }

    fn send(&mut self, r: &Reply) -> io::Result<()> {
        let mut out = format!(
            "HTTP/1.1 {} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
            r.status,
            reason(r.status),
            r.body.len()
        );
        for (k, v) in &r.headers {
            out.push_str(&format!("{k}: {v}\r\n"));
        }
        if r.close {
            out.push_str("Connection: close\r\n");
        }
        out.push_str("\r\n");
        let mut msg = out.into_bytes();
        msg.extend_from_slice(&r.body);
        self.stream.write_all(&msg)
    }
}

/// The parts of a request the routes need.
fn head_of(req: &httparse::Request<'_, '_>) -> Result<Head, &'static str> {
    let method = req.method.ok_or("no method")?.to_string();
    let path = req.path.ok_or("no path")?.to_string();
    let http10 = req.version == Some(0);
    let mut keep_alive = !http10;
    let mut content_length = None;
    let mut chunked = false;
    let mut error_type = None;
    let mut expect_continue = false;
    for h in req.headers.iter() {
        let value = std::str::from_utf8(h.value).map_err(|_| "header not UTF-8")?;
        if h.name.eq_ignore_ascii_case("content-length") {
            let n: usize = value.trim().parse().map_err(|_| "bad Content-Length")?;
            if content_length.is_some_and(|m| m != n) {
                return Err("conflicting Content-Length");
            }
            content_length = Some(n);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value.to_ascii_lowercase().contains("chunked");
        } else if h.name.eq_ignore_ascii_case("connection") {
            let v = value.to_ascii_lowercase();
            if v.contains("close") {
                keep_alive = false;
            } else if v.contains("keep-alive") {
                keep_alive = true;
            }
        } else if h.name.eq_ignore_ascii_case("expect") {
            expect_continue = value.trim().eq_ignore_ascii_case("100-continue");
        } else if h
            .name
            .eq_ignore_ascii_case("lambda-runtime-function-error-type")
        {
            error_type = Some(value.to_string());
        }
    }
    if chunked && content_length.is_some() {
        // RFC 9112 6.1: ambiguous framing; refuse rather than guess.
        return Err("both Content-Length and chunked");
    }
    Ok(Head {
        method,
        path,
        keep_alive,
        content_length,
        chunked,
        expect_continue,
        error_type,
    })
}

/// The id in `invocation/{id}/{what}`.
fn invocation_id<'a>(path: &'a str, what: &str) -> Option<&'a str> {
    let rest = path.strip_prefix(PREFIX)?.strip_prefix("invocation/")?;
    let id = rest.strip_suffix(what)?.strip_suffix('/')?;
    (!id.is_empty() && !id.contains('/')).then_some(id)
}

/// The error body a runtime posted, or one made from its header when the
/// body is not an error JSON object.
fn error_body(body: Vec<u8>, error_type: Option<&str>) -> Vec<u8> {
    let is_object = serde_json::from_slice::<serde_json::Value>(&body)
        .map(|v| v.is_object())
        .unwrap_or(false);
    if is_object {
        return body;
    }
    let text = String::from_utf8_lossy(&body);
    error_json(
        error_type.unwrap_or("Unhandled"),
        if text.is_empty() {
            "the runtime reported an error without a body"
        } else {
            &text
        },
    )
}

/// Answers one request; `None` when it was answered already (`/next`, which
/// must know whether its reply went out).
fn route(agent: &Agent, head: &Head, body: Vec<u8>, conn: &mut Conn) -> io::Result<Option<Reply>> {
    let path = head.path.split('?').next().unwrap_or("");
    let method = head.method.as_str();
    let known = |m: &str| {
        if method == m {
            None
        } else {
            Some(Reply::error(
                405,
                "MethodNotAllowed",
                &format!("{path} takes {m}"),
            ))
        }
    };
    let gone = || Reply {
        close: true,
        ..Reply::error(500, "RuntimeGone", "this runtime has exited")
    };
    if path == format!("{PREFIX}invocation/next") {
        if let Some(r) = known("GET") {
            return Ok(Some(r));
        }
        let (inv, arn) = match agent.next() {
            Ok(x) => x,
            Err(_) => return Ok(Some(gone())),
        };
        let trace = format!(
            "Root=1-{:08x}-{};Parent={};Sampled=0",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            super::runtime::random_hex(12),
            super::runtime::random_hex(8)
        );
        let reply = Reply {
            status: 200,
            body: inv.payload,
            headers: vec![
                ("Lambda-Runtime-Aws-Request-Id", inv.id.clone()),
                ("Lambda-Runtime-Deadline-Ms", inv.deadline_ms.to_string()),
                ("Lambda-Runtime-Invoked-Function-Arn", arn),
                ("Lambda-Runtime-Trace-Id", trace),
            ],
            close: false,
        };
        if let Err(e) = conn.send(&reply) {
            // Not delivered: the next /next gets it.
            agent.requeue(&inv.id);
            return Err(e);
        }
        return Ok(None);
    }
    if path == format!("{PREFIX}spore/function") {
        if let Some(r) = known("GET") {
            return Ok(Some(r));
        }
        return Ok(Some(match agent.wait_function() {
            Ok(json) => Reply::json(200, json),
            Err(_) => gone(),
        }));
    }
    if path == format!("{PREFIX}init/error") {
        if let Some(r) = known("POST") {
            return Ok(Some(r));
        }
        let body = error_body(body, head.error_type.as_deref());
        return Ok(Some(match agent.post_init_error(body) {
            Ok(()) => Reply::accepted(),
            Err(_) => Reply::error(
                403,
                "InvalidStateTransition",
                "init/error after the runtime's init",
            ),
        }));
    }
    for (what, ok) in [("response", true), ("error", false)] {
        if let Some(id) = invocation_id(path, what) {
            if let Some(r) = known("POST") {
                return Ok(Some(r));
            }
            let body = if ok {
                body
            } else {
                error_body(body, head.error_type.as_deref())
            };
            return Ok(Some(match agent.post_result(id, ok, body) {
                Ok(()) => Reply::accepted(),
                Err(
                    ApiRefusal::UnknownRequest | ApiRefusal::NotInInit | ApiRefusal::RuntimeGone,
                ) => Reply::error(
                    400,
                    "InvalidRequestID",
                    &format!("Invalid request ID: {id:?}"),
                ),
            }));
        }
    }
    Ok(Some(Reply::error(
        404,
        "NotFound",
        &format!("no route {method} {path}"),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invocation_ids() {
        let p = "/2018-06-01/runtime/invocation/abc-1/response";
        assert_eq!(invocation_id(p, "response"), Some("abc-1"));
        assert_eq!(invocation_id(p, "error"), None);
        assert_eq!(
            invocation_id("/2018-06-01/runtime/invocation//response", "response"),
            None
        );
        assert_eq!(
            invocation_id("/2018-06-01/runtime/invocation/a/b/response", "response"),
            None
        );
        assert_eq!(invocation_id("/x/invocation/a/response", "response"), None);
    }

    #[test]
    fn error_bodies() {
        let j = br#"{"errorMessage":"m","errorType":"T"}"#.to_vec();
        assert_eq!(error_body(j.clone(), Some("X")), j);
        let made: serde_json::Value =
            serde_json::from_slice(&error_body(b"oops".to_vec(), Some("Runtime.X"))).unwrap();
        assert_eq!(made["errorType"], "Runtime.X");
        assert_eq!(made["errorMessage"], "oops");
        let made: serde_json::Value =
            serde_json::from_slice(&error_body(Vec::new(), None)).unwrap();
        assert_eq!(made["errorType"], "Unhandled");
    }
}
