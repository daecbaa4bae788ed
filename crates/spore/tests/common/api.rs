//! The VMM's API over its Unix socket: one HTTP/1.1 client, and the
//! shorthands the scenarios configure VMs with.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// How the answer to a request is read.
#[derive(Clone, Copy)]
enum Answer {
    /// The request says `Connection: close`; the answer is everything up
    /// to the server closing the connection (spore does).
    UntilClosed,
    /// The answer is read by its Content-Length: Firecracker keeps the
    /// connection open whatever `Connection: close` says.
    ByLength,
}

/// One HTTP/1.1 request over the API socket; returns (status, body).
pub fn http(sock: &Path, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    exchange(sock, method, path, body, Answer::UntilClosed)
}

/// [`http`] for a server that may keep the connection open (the reference
/// Firecracker, and spore answering in its place): the answer is read by
/// its Content-Length.
pub fn http_by_length(sock: &Path, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    exchange(sock, method, path, body, Answer::ByLength)
}

fn exchange(
    sock: &Path,
    method: &str,
    path: &str,
    body: Option<&str>,
    answer: Answer,
) -> (u16, String) {
    let mut s = connect(sock);
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let body = body.unwrap_or("");
    let (accept, connection) = match answer {
        Answer::UntilClosed => ("", "Connection: close\r\n"),
        Answer::ByLength => ("Accept: application/json\r\n", ""),
    };
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n{accept}Content-Length: {}\r\n{connection}\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    match answer {
        Answer::UntilClosed => {
            let mut resp = String::new();
            s.read_to_string(&mut resp).unwrap();
            status_and_body(&resp)
        }
        Answer::ByLength => read_by_length(s, method, path),
    }
}

/// The status and the Content-Length bytes of body of one answer.
fn read_by_length(s: UnixStream, method: &str, path: &str) -> (u16, String) {
    let mut r = BufReader::new(s);
    let mut head = String::new();
    let mut len = 0usize;
    loop {
        let mut line = String::new();
        let n = r
            .read_line(&mut line)
            .unwrap_or_else(|e| panic!("{method} {path}: no answer: {e}"));
        if n == 0 || line == "\r\n" {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                len = v.trim().parse().unwrap_or(0);
            }
        }
        head.push_str(&line);
    }
    let mut b = vec![0u8; len];
    r.read_exact(&mut b)
        .unwrap_or_else(|e| panic!("{method} {path}: short body: {e}"));
    let (code, _) = status_and_body(&head);
    (code, String::from_utf8_lossy(&b).into_owned())
}

/// The status code (0 if none) and body of a whole HTTP/1.1 response.
pub fn status_and_body(resp: &str) -> (u16, String) {
    let status = resp
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = resp
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// A request with a body: [`http`] with `Some(body)`.
pub fn call(sock: &Path, method: &str, path: &str, body: &str) -> (u16, String) {
    http(sock, method, path, Some(body))
}

/// A request that must answer 204 No Content (what configuring a VM answers).
#[track_caller]
pub fn api_ok(sock: &Path, method: &str, path: &str, body: &str) {
    let (code, reply) = call(sock, method, path, body);
    assert_eq!(code, 204, "{method} {path} {body}: {reply}");
}

/// `PUT path body`, which must answer 204.
#[track_caller]
pub fn put(sock: &Path, path: &str, body: &str) {
    api_ok(sock, "PUT", path, body);
}

/// Connects to an API socket. A socket file appears at bind(2), a moment
/// before its process listens: a loaded host can show the file to a test
/// that then finds nobody listening yet, so a refused connection is tried
/// again for a few seconds.
fn connect(sock: &Path) -> UnixStream {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        match UnixStream::connect(sock) {
            Ok(s) => return s,
            Err(e)
                if e.kind() == std::io::ErrorKind::ConnectionRefused
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("connect to API socket {}: {e}", sock.display()),
        }
    }
}
