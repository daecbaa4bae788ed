//! fn-fetch: a `spore serve` function (see `function`) with network: each
//! invocation `{"url":"http://A.B.C.D[:PORT][/PATH]"}` does one HTTP/1.1
//! GET over virtio-net (smoltcp TCP) and answers
//! `{"status":"HTTP/1.1 200 OK","body":"…","bytes":N,"truncated":false}`:
//! the status line, and the body (its first 64 KiB, as text, JSON-escaped).
//!
//! Hosts are IPv4 literals only (no DNS); the path is printable ASCII. An
//! optional `"timeout_ms":M` (default 2500, under Lambda's default function
//! timeout of 3 s; at most 60000, keep it under the function's `Timeout`)
//! bounds the whole exchange: a host that does not answer, or answers too
//! slowly, gives a `FetchError` result instead of a hung instance. Connection problems are
//! `FetchError` too; a bad payload is `BadRequest`.
//!
//! Command line: `ip=A.B.C.D/P gw=G` (`spore serve` gives them to a
//! function with `SporeNetwork`). Without a network device every
//! invocation answers a `NoNetwork` error. A clone (or a restore) starts
//! with its source's stack: [`NetStack::check_generation`] re-addresses it
//! before each use.
#![no_std]
#![no_main]

extern crate alloc;

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use smoltcp::iface::SocketHandle;
use smoltcp::socket::tcp;
use smoltcp::wire::{IpAddress, Ipv4Address};
use spore_uk::function::{
    self, json_field, json_number_field, push_json_string, Context, FunctionError, Response,
};
use spore_uk::net::config::parse_ipv4;
use spore_uk::net::NetStack;
use spore_uk::{clock, flog, BootInfo};

spore_uk::entry!(main);

/// The most body bytes answered; the rest is read and dropped.
const MAX_BODY: usize = 64 * 1024;
/// The longest response head accepted.
const MAX_HEAD: usize = 8 * 1024;
const DEFAULT_TIMEOUT_MS: u64 = 2_500;
const MAX_TIMEOUT_MS: u64 = 60_000;
const MAX_URL: usize = 2048;
const SOCKET_RX: usize = 64 * 1024;
const SOCKET_TX: usize = 4 * 1024;
/// The longest sleep between polls while waiting for the peer.
const POLL_WAIT_US: u32 = 10_000;

struct Fetcher {
    net: NetStack,
    socket: SocketHandle,
}

fn main(info: &BootInfo) -> i32 {
    let mut fetcher = match NetStack::new(info) {
        Ok(mut net) => {
            let socket = net.add_tcp_socket(SOCKET_RX, SOCKET_TX);
            Ok(Fetcher { net, socket })
        }
        Err(e) => Err(format!("{e}")),
    };
    function::serve(info, |event, ctx| match &mut fetcher {
        Ok(f) => f.handle(event, ctx),
        Err(e) => Err(FunctionError::new("NoNetwork", e)),
    })
}

/// What the payload asks for.
struct Target {
    addr: [u8; 4],
    port: u16,
    /// Starts with `/`.
    path: String,
    host_header: String,
}

/// `http://A.B.C.D[:PORT][/PATH]`.
fn parse_url(url: &str) -> Result<Target, &'static str> {
    if url.len() > MAX_URL {
        return Err("url too long");
    }
    let rest = url
        .strip_prefix("http://")
        .ok_or("url must start with http:// (no https)")?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let (host, port) = match authority.split_once(':') {
        Some((h, p)) => {
            let port = p
                .parse::<u16>()
                .ok()
                .filter(|&p| p != 0)
                .ok_or("bad port")?;
            (h, port)
        }
        None => (authority, 80),
    };
    let addr = parse_ipv4(host).ok_or("the host must be an IPv4 address A.B.C.D")?;
    if !path.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("the path must be printable ASCII without spaces");
    }
    Ok(Target {
        addr,
        port,
        path: path.into(),
        host_header: authority.into(),
    })
}

/// The response read so far.
struct Reply {
    head: Vec<u8>,
    /// Set once the head ended: its status line and Content-Length.
    status: Option<String>,
    content_length: Option<u64>,
    body: Vec<u8>,
    body_bytes: u64,
}

impl Reply {
    fn new() -> Self {
        Reply {
            head: Vec::new(),
            status: None,
            content_length: None,
            body: Vec::new(),
            body_bytes: 0,
        }
    }

    /// Takes received bytes; Err if the head is malformed or too long.
    fn push(&mut self, data: &[u8]) -> Result<(), &'static str> {
        if self.status.is_some() {
            self.take_body(data);
            return Ok(());
        }
        self.head.extend_from_slice(data);
        let Some(end) = self.head.windows(4).position(|w| w == b"\r\n\r\n") else {
            if self.head.len() > MAX_HEAD {
                return Err("response head over 8 KiB");
            }
            return Ok(());
        };
        let rest = self.head.split_off(end + 4);
        let head = core::str::from_utf8(&self.head).map_err(|_| "response head is not text")?;
        let mut lines = head.split("\r\n");
        let status = lines.next().unwrap_or_default();
        if !status.starts_with("HTTP/1.") {
            return Err("not an HTTP/1.x response");
        }
        self.content_length = lines.find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<u64>().ok())?
        });
        self.status = Some(status.into());
        self.take_body(&rest);
        Ok(())
    }

    fn take_body(&mut self, data: &[u8]) {
        self.body_bytes += data.len() as u64;
        let room = MAX_BODY.saturating_sub(self.body.len());
        self.body.extend_from_slice(&data[..data.len().min(room)]);
    }

    /// The whole body is in (by Content-Length).
    fn complete(&self) -> bool {
        self.status.is_some() && self.content_length.is_some_and(|n| self.body_bytes >= n)
    }
}

impl Fetcher {
    fn handle(&mut self, event: &[u8], ctx: &Context) -> Response {
        let url = string_field(event, "url").ok_or_else(|| {
            FunctionError::new("BadRequest", "want {\"url\":\"http://A.B.C.D:PORT/path\"}")
        })?;
        let target = parse_url(&url).map_err(|e| FunctionError::new("BadRequest", e))?;
        let timeout_ms = json_number_field(event, "timeout_ms")
            .unwrap_or(DEFAULT_TIMEOUT_MS)
            .clamp(1, MAX_TIMEOUT_MS);
        // A clone or restore: new identity, and the source's connections
        // are not ours.
        if let Some(r) = self.net.check_generation() {
            flog!(
                "fn-fetch: network re-addressed (generation {})",
                r.generation
            );
        }
        flog!("fn-fetch: request {} GET {url}", ctx.request_id);
        // A fresh socket per fetch: the last one may still be closing.
        self.net.sockets.remove(self.socket);
        self.socket = self.net.add_tcp_socket(SOCKET_RX, SOCKET_TX);
        let result = self.fetch(&target, timeout_ms);
        let sock = self.net.sockets.get_mut::<tcp::Socket>(self.socket);
        sock.abort();
        self.net.poll();
        let reply = result.map_err(|e| FunctionError::new("FetchError", &e))?;
        let mut out = String::from("{\"status\":");
        push_json_string(&mut out, reply.status.as_deref().unwrap_or_default());
        out.push_str(",\"body\":");
        push_json_string(&mut out, &String::from_utf8_lossy(&reply.body));
        out.push_str(&format!(
            ",\"bytes\":{},\"truncated\":{}}}",
            reply.body_bytes,
            reply.body_bytes > reply.body.len() as u64
        ));
        Ok(out.into_bytes())
    }

    fn fetch(&mut self, t: &Target, timeout_ms: u64) -> Result<Reply, String> {
        let started = clock::since_start_us();
        let deadline = started + timeout_ms * 1000;
        let local_port = 49152 + (spore_uk::random::random_u64() % 16384) as u16;
        let [a, b, c, d] = t.addr;
        let remote = (IpAddress::Ipv4(Ipv4Address::new(a, b, c, d)), t.port);
        {
            let cx = self.net.iface.context();
            let sock = self.net.sockets.get_mut::<tcp::Socket>(self.socket);
            sock.set_timeout(Some(smoltcp::time::Duration::from_millis(timeout_ms)));
            sock.connect(cx, remote, local_port)
                .map_err(|e| format!("connect: {e}"))?;
        }
        let request = format!(
            "GET {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: spore-fn-fetch\r\nAccept: */*\r\nConnection: close\r\n\r\n",
            t.path, t.host_header
        );
        let mut sent = 0;
        let mut reply = Reply::new();
        let mut buf = alloc::vec![0u8; 16 * 1024];
        loop {
            self.net.poll();
            let sock = self.net.sockets.get_mut::<tcp::Socket>(self.socket);
            if sent < request.len() && sock.can_send() {
                sent += sock
                    .send_slice(&request.as_bytes()[sent..])
                    .map_err(|e| format!("send: {e}"))?;
            }
            while sock.can_recv() {
                let n = sock
                    .recv_slice(&mut buf)
                    .map_err(|e| format!("receive: {e}"))?;
                if n == 0 {
                    break;
                }
                reply.push(&buf[..n])?;
            }
            if reply.complete() {
                return Ok(reply);
            }
            if !sock.may_recv() && sock.state() != tcp::State::SynSent {
                // The peer closed (or the connection failed).
                return match (&reply.status, sock.state()) {
                    (Some(_), _) => Ok(reply),
                    (None, tcp::State::Closed) if sent == 0 => Err(format!(
                        "connection to {}:{} refused or timed out",
                        DisplayAddr(t.addr),
                        t.port
                    )),
                    (None, _) => Err("the server closed before a whole response head".into()),
                };
            }
            let now = clock::since_start_us();
            if now >= deadline {
                return Err(format!(
                    "no complete answer from {}:{} within {timeout_ms} ms ({})",
                    DisplayAddr(t.addr),
                    t.port,
                    if sent == 0 {
                        "connecting"
                    } else {
                        "waiting for the response"
                    }
                ));
            }
            self.net
                .wait(((deadline - now).min(u64::from(POLL_WAIT_US))) as u32);
        }
    }
}

struct DisplayAddr([u8; 4]);

impl core::fmt::Display for DisplayAddr {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let [a, b, c, d] = self.0;
        write!(f, "{a}.{b}.{c}.{d}")
    }
}

/// A string value without escapes (a URL needs none).
fn string_field(event: &[u8], key: &str) -> Option<String> {
    let v = json_field(event, key)?.strip_prefix(b"\"")?;
    let end = v.iter().position(|&b| b == b'"')?;
    let s = core::str::from_utf8(&v[..end]).ok()?;
    (!s.contains('\\')).then(|| s.into())
}
