//! An HTTP/1.x request-head parser for small servers: request line, the
//! headers a server needs for framing (`Content-Length`,
//! `Transfer-Encoding`, `Connection`), keep-alive rules. No allocation; it
//! never panics on input, it answers with the status to send instead.

/// Outcome of [`parse_head`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Parse<'a> {
    /// The head is not complete yet: read more.
    Incomplete,
    /// A request whose head took the first `head_len` bytes.
    Request {
        request: Request<'a>,
        head_len: usize,
    },
    /// Answer with this status and close the connection.
    Error(u16),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request<'a> {
    pub method: &'a str,
    pub target: &'a str,
    /// 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub minor_version: u8,
    /// Body length; 0 without `Content-Length`.
    pub content_length: u64,
    pub has_content_length: bool,
    /// Whether the connection stays open after the response.
    pub keep_alive: bool,
}

/// 400 Bad Request.
pub const BAD_REQUEST: u16 = 400;
/// 431 Request Header Fields Too Large.
pub const HEADERS_TOO_LARGE: u16 = 431;
/// 501 Not Implemented (a transfer coding).
pub const NOT_IMPLEMENTED: u16 = 501;
/// 505 HTTP Version Not Supported.
pub const VERSION_NOT_SUPPORTED: u16 = 505;

/// The reason phrase of the statuses servers here send.
pub fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        411 => "Length Required",
        431 => "Request Header Fields Too Large",
        501 => "Not Implemented",
        505 => "HTTP Version Not Supported",
        _ => "Unknown",
    }
}

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Where the head ends (after its empty line) in `buf`, accepting bare LF
/// line ends as RFC 9112 §2.2 allows.
fn head_end(buf: &[u8]) -> Option<usize> {
    let mut i = 0;
    while let Some(off) = buf[i..].iter().position(|&b| b == b'\n') {
        let nl = i + off;
        let next = nl + 1;
        match buf.get(next) {
            Some(b'\n') => return Some(next + 1),
            Some(b'\r') if buf.get(next + 1) == Some(&b'\n') => return Some(next + 2),
            _ => i = next,
        }
        if i >= buf.len() {
            break;
        }
    }
    None
}

/// Parses the request head at the start of `buf`. Heads longer than
/// `max_head` bytes are refused with 431 (also while incomplete, so a
/// server never buffers more).
pub fn parse_head(buf: &[u8], max_head: usize) -> Parse<'_> {
    // A server should ignore empty lines before a request line (§2.2).
    let skip = buf
        .iter()
        .position(|&b| b != b'\r' && b != b'\n')
        .unwrap_or(buf.len());
    let Some(end) = head_end(&buf[skip..]) else {
        return if buf.len() > max_head {
            Parse::Error(HEADERS_TOO_LARGE)
        } else {
            Parse::Incomplete
        };
    };
    let head_len = skip + end;
    if head_len > max_head {
        return Parse::Error(HEADERS_TOO_LARGE);
    }
    let Ok(head) = core::str::from_utf8(&buf[skip..head_len]) else {
        return Parse::Error(BAD_REQUEST);
    };
    let mut lines = head.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l));
    let Some(request_line) = lines.next() else {
        return Parse::Error(BAD_REQUEST);
    };
    let mut request = match parse_request_line(request_line) {
        Ok(r) => r,
        Err(status) => return Parse::Error(status),
    };
    let mut connection_close = false;
    let mut connection_keep_alive = false;
    for line in lines {
        if line.is_empty() {
            break;
        }
        let Some((name, value)) = line.split_once(':') else {
            return Parse::Error(BAD_REQUEST);
        };
        // No whitespace between name and colon (§5.1), no obs-fold.
        if name.is_empty() || !name.bytes().all(is_tchar) {
            return Parse::Error(BAD_REQUEST);
        }
        let value = value.trim_matches(|c| c == ' ' || c == '\t');
        if value.bytes().any(|b| b < 0x20 && b != b'\t' || b == 0x7f) {
            return Parse::Error(BAD_REQUEST);
        }
        if name.eq_ignore_ascii_case("content-length") {
            let Some(n) = parse_decimal(value) else {
                return Parse::Error(BAD_REQUEST);
            };
            if request.has_content_length && n != request.content_length {
                return Parse::Error(BAD_REQUEST);
            }
            request.content_length = n;
            request.has_content_length = true;
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            return Parse::Error(NOT_IMPLEMENTED);
        } else if name.eq_ignore_ascii_case("connection") {
            for token in value.split(',') {
                let token = token.trim();
                connection_close |= token.eq_ignore_ascii_case("close");
                connection_keep_alive |= token.eq_ignore_ascii_case("keep-alive");
            }
        }
    }
    request.keep_alive = match request.minor_version {
        0 => connection_keep_alive && !connection_close,
        _ => !connection_close,
    };
    Parse::Request { request, head_len }
}

fn parse_request_line(line: &str) -> Result<Request<'_>, u16> {
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(BAD_REQUEST);
    };
    if method.is_empty() || !method.bytes().all(is_tchar) {
        return Err(BAD_REQUEST);
    }
    if target.is_empty() || target.bytes().any(|b| b <= 0x20 || b == 0x7f) {
        return Err(BAD_REQUEST);
    }
    let minor_version = match version {
        "HTTP/1.1" => 1,
        "HTTP/1.0" => 0,
        v if v.len() == 8 && v.starts_with("HTTP/") => return Err(VERSION_NOT_SUPPORTED),
        _ => return Err(BAD_REQUEST),
    };
    Ok(Request {
        method,
        target,
        minor_version,
        content_length: 0,
        has_content_length: false,
        keep_alive: true,
    })
}

/// A decimal without sign that fits a u64 (at most 19 digits).
pub fn parse_decimal(s: &str) -> Option<u64> {
    if s.is_empty() || s.len() > 19 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(buf: &[u8]) -> (Request<'_>, usize) {
        match parse_head(buf, 8192) {
            Parse::Request { request, head_len } => (request, head_len),
            other => panic!("{other:?} for {:?}", core::str::from_utf8(buf)),
        }
    }

    #[test]
    fn parses_a_simple_get() {
        let buf = b"GET /req/7 HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\n";
        let (r, n) = request(buf);
        assert_eq!((r.method, r.target, r.minor_version), ("GET", "/req/7", 1));
        assert!(r.keep_alive);
        assert_eq!(r.content_length, 0);
        assert!(!r.has_content_length);
        assert_eq!(&buf[n..], b"GET / HTTP/1.1\r\n", "pipelined rest stays");
    }

    #[test]
    fn incomplete_until_the_empty_line() {
        for part in [
            &b""[..],
            b"GET",
            b"GET / HTTP/1.1\r\n",
            b"GET / HTTP/1.1\r\nA: b\r\n\r",
        ] {
            assert_eq!(parse_head(part, 8192), Parse::Incomplete, "{part:?}");
        }
        let (_, n) = request(b"\r\n\r\nGET / HTTP/1.1\n\n");
        assert_eq!(n, 20, "leading empty lines skipped; bare LF accepted");
    }

    #[test]
    fn body_length_and_connection() {
        let (r, _) =
            request(b"POST /sink HTTP/1.1\r\ncontent-length:  12 \r\nConnection: close\r\n\r\n");
        assert_eq!(r.content_length, 12);
        assert!(r.has_content_length);
        assert!(!r.keep_alive);
        let (r, _) = request(b"GET / HTTP/1.0\r\n\r\n");
        assert!(!r.keep_alive, "1.0 closes by default");
        let (r, _) = request(b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n");
        assert!(r.keep_alive);
        let (r, _) = request(b"POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n");
        assert_eq!(r.content_length, 5, "repeated equal lengths are one");
    }

    #[test]
    fn malformed_heads_are_400() {
        for bad in [
            &b"GET /\r\n\r\n"[..],
            b"GET  / HTTP/1.1\r\n\r\n",
            b"GET / HTTP/1.1 x\r\n\r\n",
            b"G(T / HTTP/1.1\r\n\r\n",
            b"GET / FTP/1.1\r\n\r\n",
            b"GET / HTTP/1.1\r\nNoColon\r\n\r\n",
            b"GET / HTTP/1.1\r\nBad Name: v\r\n\r\n",
            b"GET / HTTP/1.1\r\n: v\r\n\r\n",
            b"GET / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
            b"GET / HTTP/1.1\r\nContent-Length: 1x\r\n\r\n",
            b"GET / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n",
            b"GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            b"GET / HTTP/1.1\r\nA: b\x01c\r\n\r\n",
            b"GET /\xff HTTP/1.1\r\n\r\n",
        ] {
            assert_eq!(parse_head(bad, 8192), Parse::Error(400), "{bad:?}");
        }
        assert_eq!(
            parse_head(b"GET / HTTP/2.0\r\n\r\n", 8192),
            Parse::Error(505)
        );
        assert_eq!(
            parse_head(
                b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
                8192
            ),
            Parse::Error(501)
        );
    }

    #[test]
    fn oversized_heads_are_431() {
        let mut big = b"GET / HTTP/1.1\r\nX: ".to_vec();
        big.resize(9000, b'a');
        assert_eq!(
            parse_head(&big, 8192),
            Parse::Error(431),
            "incomplete and too long"
        );
        big.extend_from_slice(b"\r\n\r\n");
        assert_eq!(
            parse_head(&big, 8192),
            Parse::Error(431),
            "complete and too long"
        );
        assert!(matches!(parse_head(&big, 10_000), Parse::Request { .. }));
    }

    #[test]
    fn never_panics_on_junk() {
        // Every prefix and every single-byte corruption of a request.
        let good = b"POST /sink HTTP/1.1\r\nContent-Length: 3\r\nConnection: keep-alive\r\n\r\nabc";
        for n in 0..good.len() {
            let _ = parse_head(&good[..n], 64);
            for b in [0u8, b'\r', b'\n', b' ', b':', 0xff] {
                let mut v = good.to_vec();
                v[n] = b;
                let _ = parse_head(&v, 8192);
            }
        }
        assert_eq!(parse_decimal("18446744073709551615"), None, "20 digits");
        assert_eq!(
            parse_decimal("9999999999999999999"),
            Some(9_999_999_999_999_999_999)
        );
    }
}
