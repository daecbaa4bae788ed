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
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).map_err(ClientError::Read)?;
    let resp = String::from_utf8_lossy(&resp);
    let (head, body) = resp.split_once("\r\n\r\n").unwrap_or((&resp, ""));
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or(ClientError::Malformed)?;
    Ok((status, body.to_string()))
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
    fn a_missing_socket_names_the_path() {
        let e = request(Path::new("/nonexistent/spore.sock"), "GET", "/", "").unwrap_err();
        assert_eq!(e.to_string(), "connecting to /nonexistent/spore.sock");
        assert!(std::error::Error::source(&e).is_some());
    }
}
