//! The client side of this API, for host programs that drive a VMM from a
//! plain thread: one blocking request per connection on the API socket,
//! written and read on the calling thread. `spore api`, `spore clone`,
//! `spore mem`, `spore snapshot` and the benchmarks (which time requests
//! such as `PUT /clone` from the host clock, so nothing may sit between the
//! clock read and the socket) all use it. It lives beside the server because
//! it speaks the server's wire format and parses its [`CloneReport`]; it
//! imports nothing else of the VMM.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::clone::CloneReport;

/// How long a reply may take: a `PUT /snapshot/create` of a large guest or
/// a `PUT /clone` of many clones answers only when done.
const REPLY_TIMEOUT: Duration = Duration::from_secs(600);

/// Why a request got no usable answer.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("connecting to {}", path.display())]
    Connect {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("reading the response")]
    Read(#[source] io::Error),
    #[error("malformed HTTP response")]
    Malformed,
    #[error(transparent)]
    Io(#[from] io::Error),
    /// `PUT /clone` answered with an error status; `message` is the API's
    /// `fault_message` (or the whole body when there is none).
    #[error("clone refused (HTTP {status}): {message}")]
    CloneRefused { status: u16, message: String },
    #[error("the VMM's clone report does not parse")]
    CloneReport(#[source] serde_json::Error),
}

/// Sends one request; returns the HTTP status and the response body.
pub fn request(
    socket: &Path,
    method: &str,
    path: &str,
    body: &str,
) -> Result<(u16, String), ClientError> {
    let mut s = UnixStream::connect(socket).map_err(|source| ClientError::Connect {
        path: socket.to_path_buf(),
        source,
    })?;
    s.set_read_timeout(Some(REPLY_TIMEOUT))?;
    // One write: a request written piece by piece (as `write!` on the
    // socket would) wakes the server for each piece.
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nAccept: application/json\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(request.as_bytes())?;
    read_response(&mut s)
}

/// The largest response head (status line and headers) read.
const MAX_HEAD: usize = 64 * 1024;

/// Reads one response: its head, then exactly the body it announces
/// (`Content-Length`, chunked, none for 1xx/204/304), or up to EOF when it
/// announces nothing. A server may keep the connection open after the
/// response whatever the request said (Firecracker does), so the end of the
/// body, not of the connection, ends the read.
fn read_response(s: &mut impl Read) -> Result<(u16, String), ClientError> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        if buf.len() > MAX_HEAD {
            return Err(ClientError::Malformed);
        }
        let n = s.read(&mut chunk).map_err(ClientError::Read)?;
        if n == 0 {
            return Err(ClientError::Malformed);
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut rest = buf.split_off(head_end + 4);
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or(ClientError::Malformed)?;
    let header = |name: &str| {
        head.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    };
    let body = if (100..200).contains(&status) || status == 204 || status == 304 {
        Vec::new()
    } else if header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        read_chunked(s, rest)?
    } else if let Some(len) = header("content-length") {
        let len: usize = len.parse().map_err(|_| ClientError::Malformed)?;
        while rest.len() < len {
            let n = s.read(&mut chunk).map_err(ClientError::Read)?;
            if n == 0 {
                return Err(ClientError::Malformed);
            }
            rest.extend_from_slice(&chunk[..n]);
        }
        rest.truncate(len);
        rest
    } else {
        s.read_to_end(&mut rest).map_err(ClientError::Read)?;
        rest
    };
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// A chunked body, `have` being what was read past the head already.
fn read_chunked(s: &mut impl Read, mut have: Vec<u8>) -> Result<Vec<u8>, ClientError> {
    let mut body = Vec::new();
    let mut chunk = [0u8; 8192];
    let mut more = |have: &mut Vec<u8>| -> Result<(), ClientError> {
        let n = s.read(&mut chunk).map_err(ClientError::Read)?;
        if n == 0 {
            return Err(ClientError::Malformed);
        }
        have.extend_from_slice(&chunk[..n]);
        Ok(())
    };
    loop {
        let line_end = loop {
            if let Some(i) = have.windows(2).position(|w| w == b"\r\n") {
                break i;
            }
            if have.len() > MAX_HEAD {
                return Err(ClientError::Malformed);
            }
            more(&mut have)?;
        };
        let size_text = String::from_utf8_lossy(&have[..line_end]).into_owned();
        let size_hex = size_text.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_hex, 16).map_err(|_| ClientError::Malformed)?;
        have.drain(..line_end + 2);
        if size == 0 {
            return Ok(body);
        }
        let need = size.checked_add(2).ok_or(ClientError::Malformed)?;
        while have.len() < need {
            more(&mut have)?;
        }
        body.extend_from_slice(&have[..size]);
        have.drain(..need);
    }
}

/// One `PUT /clone` with `body` (a [`crate::clone::CloneRequest`] as JSON);
/// an error status becomes [`ClientError::CloneRefused`] with the API's
/// fault message.
pub fn put_clone(socket: &Path, body: &str) -> Result<CloneReport, ClientError> {
    let (status, reply) = request(socket, "PUT", "/clone", body)?;
    if status >= 400 {
        let message = fault_message(&reply).unwrap_or(reply);
        return Err(ClientError::CloneRefused {
            status,
            message: message.trim().to_string(),
        });
    }
    serde_json::from_str(&reply).map_err(ClientError::CloneReport)
}

/// The `fault_message` of an error body, if it is one.
fn fault_message(reply: &str) -> Option<String> {
    serde_json::from_str::<serde_json::Value>(reply)
        .ok()
        .and_then(|v| v["fault_message"].as_str().map(str::to_string))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fault_message_is_taken_from_the_error_body() {
        assert_eq!(
            fault_message(r#"{"fault_message":"no template"}"#).as_deref(),
            Some("no template")
        );
        assert_eq!(fault_message("not json"), None);
        let e = ClientError::CloneRefused {
            status: 400,
            message: "no template".into(),
        };
        assert_eq!(e.to_string(), "clone refused (HTTP 400): no template");
    }

    #[test]
    fn a_response_ends_with_its_body_not_with_the_connection() {
        // A reader that would block (here: fail) after the response, as a
        // server keeping the connection open does.
        struct Then<'a>(&'a [u8]);
        impl Read for Then<'_> {
            fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
                if self.0.is_empty() {
                    return Err(io::Error::new(io::ErrorKind::WouldBlock, "kept open"));
                }
                let n = out.len().min(self.0.len()).min(7);
                out[..n].copy_from_slice(&self.0[..n]);
                self.0 = &self.0[n..];
                Ok(n)
            }
        }
        let got = |raw: &[u8]| read_response(&mut Then(raw)).map_err(|e| e.to_string());
        assert_eq!(
            got(b"HTTP/1.1 204 No Content\r\nServer: Firecracker API\r\n\r\n"),
            Ok((204, String::new()))
        );
        assert_eq!(
            got(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"),
            Ok((200, "hello".into()))
        );
        assert_eq!(
            got(b"HTTP/1.1 400 Bad\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n"),
            Ok((400, "abcde".into()))
        );
        // Up to EOF when the response announces no length.
        let mut eof: &[u8] = b"HTTP/1.0 200 OK\r\n\r\nall of it";
        assert_eq!(
            read_response(&mut eof).ok(),
            Some((200, "all of it".into()))
        );
        // Short or malformed: an error, never a hang or a panic.
        assert!(got(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nabc").is_err());
        assert!(got(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n").is_err());
        assert!(got(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n").is_err());
        assert!(got(b"garbage").is_err());
    }

    #[test]
    fn a_missing_socket_names_the_path() {
        let e = request(Path::new("/nonexistent/spore.sock"), "GET", "/", "").unwrap_err();
        assert_eq!(e.to_string(), "connecting to /nonexistent/spore.sock");
        assert!(std::error::Error::source(&e).is_some());
    }
}
