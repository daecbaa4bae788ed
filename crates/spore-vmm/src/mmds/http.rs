//! The guest's side of MMDS: one HTTP/1.x request in, one response out,
//! answered as Firecracker answers (statuses, messages, formats), so a guest
//! written for Firecracker's MMDS reads the same bytes from spore.
//!
//! - `GET <JSON pointer>`: the value there; `Accept: application/json`
//!   gives JSON, anything else (or `imds_compat`) the IMDS format: an
//!   object's keys one per line (`key/` for an object), a string as is.
//!   With V2 a valid token (`X-metadata-token` or
//!   `X-aws-ec2-metadata-token`) is required; V1 takes a GET without one.
//! - `PUT /latest/api/token` with `X-metadata-token-ttl-seconds` (or the
//!   `X-aws-ec2-…` name): a session token; refused with `X-Forwarded-For`.
//! - PATCH, DELETE: 405 with `Allow: GET, PUT`; a method Firecracker's
//!   HTTP parser does not know (POST, HEAD, ...): 501.
//!
//! A request that cannot be read is answered as Firecracker's parser
//! answers it (its content type says JSON, its body is text, as there) and
//! the connection closes.

use serde_json::Value;

use super::Mmds;
use crate::config::MmdsVersion;

/// The largest request (headers and body) a connection may send; more is
/// answered with 413 and the connection closed.
pub const MAX_REQUEST_BYTES: usize = 4096;
const MAX_HEADERS: usize = 32;
const PATH_TO_TOKEN: &str = "/latest/api/token";
const TOKEN_HEADERS: [&str; 2] = ["x-metadata-token", "x-aws-ec2-metadata-token"];
const TTL_HEADERS: [&str; 2] = [
    "x-metadata-token-ttl-seconds",
    "x-aws-ec2-metadata-token-ttl-seconds",
];

/// What a connection's bytes so far amount to.
#[derive(Debug, PartialEq, Eq)]
pub enum Exchange {
    /// Not a whole request yet.
    Incomplete,
    /// The first `consumed` bytes were a request; `response` answers it.
    Answered {
        response: Vec<u8>,
        consumed: usize,
        /// The connection ends after the response (HTTP/1.0, `Connection:
        /// close`, or a request that could not be read).
        close: bool,
    },
}

struct Response {
    status: u16,
    json: bool,
    body: String,
    extra: Vec<(String, String)>,
}

impl Response {
    fn text(status: u16, body: impl Into<String>) -> Self {
        Self {
            status,
            json: false,
            body: body.into(),
            extra: Vec::new(),
        }
    }

    fn encode(&self, http_10: bool, close: bool) -> Vec<u8> {
        let reason = match self.status {
            200 => "OK",
            400 => "Bad Request",
            401 => "Unauthorized",
            404 => "Not Found",
            405 => "Method Not Allowed",
            413 => "Payload Too Large",
            _ => "Not Implemented",
        };
        let mut head = format!(
            "HTTP/1.{} {} {reason}\r\nServer: spore\r\nConnection: {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n",
            if http_10 { 0 } else { 1 },
            self.status,
            if close { "close" } else { "keep-alive" },
            if self.json { "application/json" } else { "text/plain" },
            self.body.len()
        );
        for (k, v) in &self.extra {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        let mut out = head.into_bytes();
        out.extend_from_slice(self.body.as_bytes());
        out
    }
}

/// Reads one request from the start of `buf` and answers it.
pub fn exchange(mmds: &Mmds, buf: &[u8]) -> Exchange {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let head_len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() < MAX_REQUEST_BYTES => {
            return Exchange::Incomplete
        }
        Ok(httparse::Status::Partial) => return refuse(413, "Request too large.", buf.len()),
        Err(_) => return refuse(400, "Invalid request.", buf.len()),
    };
    let headers: Vec<(&str, String)> = req
        .headers
        .iter()
        .map(|h| (h.name, String::from_utf8_lossy(h.value).trim().to_string()))
        .collect();
    let header = |name: &str| find(&headers, name);
    let body_len = match header("content-length") {
        None => 0,
        Some((_, v)) => match v.parse::<usize>() {
            Ok(n) => n,
            Err(_) => {
                let msg =
                    format!("Invalid header. Reason: Invalid value. Key:Content-Length; Value:{v}");
                return refuse(400, &msg, buf.len());
            }
        },
    };
    if header("transfer-encoding").is_some_and(|(_, v)| !v.eq_ignore_ascii_case("identity")) {
        return refuse(400, "Invalid request.", buf.len());
    }
    let consumed = head_len.saturating_add(body_len);
    if consumed > MAX_REQUEST_BYTES {
        return refuse(413, "Request too large.", buf.len());
    }
    if buf.len() < consumed {
        return Exchange::Incomplete;
    }
    let http_10 = req.version == Some(0);
    let close =
        http_10 || header("connection").is_some_and(|(_, v)| v.eq_ignore_ascii_case("close"));
    let path = abs_path(req.path.unwrap_or(""));
    let token = TOKEN_HEADERS.iter().find_map(|h| header(h)).map(|(_, v)| v);
    let response = match req.method.unwrap_or("") {
        _ if path.is_empty() => Response::text(400, "Invalid URI."),
        "GET" => get(
            mmds,
            path,
            token.as_deref(),
            accepts_json(&header("accept")),
        ),
        "PUT" => put_token(mmds, path, &headers),
        "PATCH" | "DELETE" => {
            let mut r = Response::text(405, "Not allowed HTTP method.");
            r.extra.push(("Allow".into(), "GET, PUT".into()));
            r
        }
        _ => Response {
            json: true,
            ..Response::text(501, "Unsupported HTTP method.")
        },
    };
    Exchange::Answered {
        response: response.encode(http_10, close),
        consumed,
        close,
    }
}

/// The request target as Firecracker reads it: an absolute-form URI loses
/// its scheme and host; anything not starting with `/` is empty (refused);
/// a query stays part of the path (and so names no value).
fn abs_path(target: &str) -> &str {
    if let Some(rest) = target.strip_prefix("http://") {
        return rest.find('/').map_or("", |i| &rest[i..]);
    }
    if target.starts_with('/') {
        target
    } else {
        ""
    }
}

fn refuse(status: u16, msg: &str, consumed: usize) -> Exchange {
    let response = Response {
        json: true,
        ..Response::text(status, msg)
    };
    Exchange::Answered {
        response: response.encode(false, true),
        consumed,
        close: true,
    }
}

/// Firecracker's rule: exactly `application/json` asks for JSON.
fn accepts_json(accept: &Option<(&str, String)>) -> bool {
    accept
        .as_ref()
        .is_some_and(|(_, v)| v.as_str() == "application/json")
}

fn get(mmds: &Mmds, path: &str, token: Option<&str>, json: bool) -> Response {
    if mmds.version == MmdsVersion::V2 {
        match token {
            None => return Response::text(401, "No MMDS token provided. Use `X-metadata-token` or `X-aws-ec2-metadata-token` header to specify the session token."),
            Some(t) if !mmds.tokens.is_valid(t) => {
                return Response::text(401, "MMDS token not valid.")
            }
            Some(_) => {}
        }
    }
    let pointer = collapse_slashes(path);
    let pointer = pointer.strip_suffix('/').unwrap_or(&pointer);
    // A store nobody put is JSON null, as in Firecracker.
    let null = Value::Null;
    let root = if mmds.initialized { &mmds.data } else { &null };
    let Some(value) = root.pointer(pointer) else {
        return Response::text(404, format!("Resource not found: {path}."));
    };
    let body = if mmds.imds_compat || !json {
        match imds(value) {
            Some(b) => b,
            None => {
                return Response::text(
                    501,
                    "Cannot retrieve value. The value has an unsupported type.",
                )
            }
        }
    } else {
        sorted(value).to_string()
    };
    Response {
        status: 200,
        json,
        body,
        extra: Vec::new(),
    }
}

/// The first header called `name` (any case): its name as sent, its value.
fn find<'h>(headers: &'h [(&'h str, String)], name: &str) -> Option<(&'h str, String)> {
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(n, v)| (*n, v.clone()))
}

fn put_token(mmds: &Mmds, path: &str, headers: &[(&str, String)]) -> Response {
    let header = |name: &str| find(headers, name);
    if let Some((name, _)) = header("x-forwarded-for") {
        return Response::text(
            400,
            format!("Invalid header. Reason: Unsupported header name. Key: {name}"),
        );
    }
    if collapse_slashes(path) != PATH_TO_TOKEN {
        return Response::text(404, format!("Resource not found: {path}."));
    }
    let Some((name, value)) = TTL_HEADERS.iter().find_map(|h| header(h)) else {
        return Response::text(400, "Token time to live value not found. Use `X-metadata-token-ttl-seconds` or `X-aws-ec2-metadata-token-ttl-seconds` header to specify the token's lifetime.");
    };
    let Ok(ttl) = value.parse::<u32>() else {
        return Response::text(
            400,
            format!("Invalid header. Reason: Invalid value. Key:{name}; Value:{value}"),
        );
    };
    match mmds.tokens.issue(ttl) {
        Ok(token) => {
            let mut r = Response::text(200, token);
            r.extra.push((name.to_string(), ttl.to_string()));
            r
        }
        Err(e) => Response::text(400, e.to_string()),
    }
}

fn collapse_slashes(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for c in path.chars() {
        if !(c == '/' && out.ends_with('/')) {
            out.push(c);
        }
    }
    out
}

/// EC2's IMDS format: an object's keys (sorted, `key/` for objects) one per
/// line, a string as is; other values have none.
fn imds(v: &Value) -> Option<String> {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<String> = m
                .iter()
                .map(|(k, v)| {
                    if v.is_object() {
                        format!("{k}/")
                    } else {
                        k.clone()
                    }
                })
                .collect();
            keys.sort_by(|a, b| a.trim_end_matches('/').cmp(b.trim_end_matches('/')));
            Some(keys.join("\n"))
        }
        Value::String(s) => Some(s.clone()),
        _ => None,
    }
}

/// `v` with every object's keys in order (serde_json's map may keep
/// insertion order, depending on its features; Firecracker's is sorted).
fn sorted(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            let mut entries: Vec<_> = m.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            Value::Object(
                entries
                    .into_iter()
                    .map(|(k, v)| (k.clone(), sorted(v)))
                    .collect(),
            )
        }
        Value::Array(a) => Value::Array(a.iter().map(sorted).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::config::MmdsConfig;

    fn store(version: MmdsVersion, imds_compat: bool) -> Mmds {
        let mut m = Mmds::default();
        m.configure(&MmdsConfig {
            version,
            network_interfaces: vec!["eth0".into()],
            ipv4_address: None,
            imds_compat,
        });
        m.put(json!({"latest": {"meta-data": {"ami-id": "ami-1", "reservation-id": "r-2", "net": {"a": 1}}}, "n": 3}))
            .unwrap();
        m
    }

    /// (status, content type, body, the whole head)
    fn ask(m: &Mmds, req: &str) -> (u16, String, String, String) {
        let Exchange::Answered {
            response, consumed, ..
        } = exchange(m, req.as_bytes())
        else {
            panic!("incomplete: {req:?}");
        };
        assert_eq!(consumed, req.len());
        let text = String::from_utf8(response).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        let status = head[9..12].parse().unwrap();
        let ct = head
            .lines()
            .find_map(|l| l.strip_prefix("Content-Type: "))
            .unwrap()
            .to_string();
        (status, ct, body.to_string(), head.to_string())
    }

    #[test]
    fn v1_answers_in_imds_and_json_formats() {
        let m = store(MmdsVersion::V1, false);
        let (s, ct, body, _) = ask(&m, "GET /latest/meta-data HTTP/1.1\r\nAccept: */*\r\n\r\n");
        assert_eq!(
            (s, ct.as_str(), body.as_str()),
            (200, "text/plain", "ami-id\nnet/\nreservation-id")
        );
        let (s, _, body, _) = ask(&m, "GET //latest//meta-data/ami-id HTTP/1.1\r\n\r\n");
        assert_eq!((s, body.as_str()), (200, "ami-1"));
        let (s, ct, body, _) = ask(
            &m,
            "GET /latest/meta-data/ HTTP/1.1\r\nAccept: application/json\r\n\r\n",
        );
        assert_eq!(s, 200);
        assert_eq!(ct, "application/json");
        assert_eq!(
            body,
            r#"{"ami-id":"ami-1","net":{"a":1},"reservation-id":"r-2"}"#
        );
        let (s, _, body, _) = ask(&m, "GET /n HTTP/1.1\r\n\r\n");
        assert_eq!(
            (s, body.as_str()),
            (
                501,
                "Cannot retrieve value. The value has an unsupported type."
            )
        );
        let (s, _, body, _) = ask(&m, "GET /nope HTTP/1.1\r\n\r\n");
        assert_eq!((s, body.as_str()), (404, "Resource not found: /nope."));
        let (s, _, body, _) = ask(&m, "GET /n?x=1 HTTP/1.1\r\n\r\n");
        assert_eq!((s, body.as_str()), (404, "Resource not found: /n?x=1."));
        let (s, _, body, _) = ask(&m, "GET http://169.254.169.254/latest HTTP/1.1\r\n\r\n");
        assert_eq!((s, body.as_str()), (200, "meta-data/"));
        let (s, _, body, _) = ask(&m, "GET * HTTP/1.1\r\n\r\n");
        assert_eq!((s, body.as_str()), (400, "Invalid URI."));
        let (s, _, _, head) = ask(&m, "DELETE / HTTP/1.1\r\n\r\n");
        assert_eq!(s, 405);
        assert!(head.contains("Allow: GET, PUT"), "{head}");
        let (s, ct, body, _) = ask(&m, "POST / HTTP/1.1\r\n\r\n");
        assert_eq!(
            (s, ct.as_str(), body.as_str()),
            (501, "application/json", "Unsupported HTTP method.")
        );
    }

    #[test]
    fn imds_compat_ignores_accept() {
        let m = store(MmdsVersion::V1, true);
        let (s, _, body, _) = ask(
            &m,
            "GET /latest HTTP/1.1\r\nAccept: application/json\r\n\r\n",
        );
        assert_eq!((s, body.as_str()), (200, "meta-data/"));
    }

    #[test]
    fn v2_needs_a_session_token() {
        let m = store(MmdsVersion::V2, false);
        let (s, _, body, _) = ask(&m, "GET /latest HTTP/1.1\r\n\r\n");
        assert_eq!(s, 401);
        assert!(body.starts_with("No MMDS token provided."), "{body}");
        let (s, _, body, _) = ask(&m, "GET /latest HTTP/1.1\r\nX-metadata-token: abc\r\n\r\n");
        assert_eq!((s, body.as_str()), (401, "MMDS token not valid."));
        let (s, _, token, head) = ask(
            &m,
            "PUT /latest/api/token HTTP/1.1\r\nX-metadata-token-ttl-seconds: 60\r\n\r\n",
        );
        assert_eq!(s, 200);
        assert!(head.contains("X-metadata-token-ttl-seconds: 60"), "{head}");
        let req = format!("GET /latest HTTP/1.1\r\nX-aws-ec2-metadata-token: {token}\r\n\r\n");
        let (s, _, body, _) = ask(&m, &req);
        assert_eq!((s, body.as_str()), (200, "meta-data/"));
        for (req, status, start) in [
            ("PUT /latest/api/token HTTP/1.1\r\n\r\n", 400, "Token time to live value not found."),
            ("PUT /latest/api/token HTTP/1.1\r\nX-metadata-token-ttl-seconds: x\r\n\r\n", 400, "Invalid header. Reason: Invalid value. Key:X-metadata-token-ttl-seconds; Value:x"),
            ("PUT /latest/api/token HTTP/1.1\r\nX-metadata-token-ttl-seconds: 0\r\n\r\n", 400, "Invalid time to live value provided for token: 0."),
            ("PUT /latest/api/token HTTP/1.1\r\nX-Forwarded-For: 1.2.3.4\r\nX-metadata-token-ttl-seconds: 5\r\n\r\n", 400, "Invalid header. Reason: Unsupported header name. Key: X-Forwarded-For"),
            ("PUT /latest HTTP/1.1\r\nX-metadata-token-ttl-seconds: 5\r\n\r\n", 404, "Resource not found: /latest."),
        ] {
            let (s, _, body, _) = ask(&m, req);
            assert_eq!(s, status, "{req:?}: {body}");
            assert!(body.starts_with(start), "{req:?}: {body}");
        }
    }

    #[test]
    fn partial_oversized_and_malformed_requests() {
        let m = store(MmdsVersion::V1, false);
        assert_eq!(
            exchange(&m, b"GET /latest HTTP/1.1\r\n"),
            Exchange::Incomplete
        );
        assert_eq!(
            exchange(
                &m,
                b"PUT /latest/api/token HTTP/1.1\r\nContent-Length: 5\r\n\r\nab"
            ),
            Exchange::Incomplete
        );
        let Exchange::Answered {
            response, close, ..
        } = exchange(&m, &vec![b'A'; 5000])
        else {
            panic!()
        };
        assert!(close);
        assert!(response.starts_with(b"HTTP/1.1 400") || response.starts_with(b"HTTP/1.1 413"));
        let mut big = b"GET /latest HTTP/1.1\r\nX-Pad: ".to_vec();
        big.extend(vec![b'a'; 5000]);
        let Exchange::Answered {
            response, close, ..
        } = exchange(&m, &big)
        else {
            panic!()
        };
        assert!(close && response.starts_with(b"HTTP/1.1 413"));
        let Exchange::Answered {
            response, close, ..
        } = exchange(&m, b"GET /latest HTTP/1.1\r\nContent-Length: 99999\r\n\r\n")
        else {
            panic!()
        };
        assert!(close && response.starts_with(b"HTTP/1.1 413"));
        // Two requests in one read: the first is answered, the rest kept.
        let two = b"GET /n HTTP/1.0\r\n\r\nGET /latest HTTP/1.1\r\n\r\n";
        let Exchange::Answered {
            consumed, close, ..
        } = exchange(&m, two)
        else {
            panic!()
        };
        assert_eq!(consumed, 19);
        assert!(close, "HTTP/1.0 closes");
    }

    #[test]
    fn a_store_nobody_put_is_null() {
        let m = Mmds::default();
        let (s, _, body, _) = ask(&m, "GET / HTTP/1.1\r\nAccept: application/json\r\n\r\n");
        assert_eq!((s, body.as_str()), (200, "null"));
    }
}
