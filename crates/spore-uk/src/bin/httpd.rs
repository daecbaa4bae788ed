//! httpd: an HTTP/1.1 server over virtio-net (smoltcp TCP/IP).
//!
//! Routes: `GET /` (`hello from spore-httpd generation=G clone=N`, N the clone number), `GET /req/N`
//! (`req N generation=G clone=C`), `GET /bytes/N` (N bytes of the pattern
//! `i % 251`, streamed), `POST /sink` (reads a Content-Length body,
//! answers `received LEN sum SUM`, the byte sum mod 2^32); anything else
//! 404. Keep-alive and pipelining; malformed heads 400, heads over 8 KiB
//! 431, both closing the connection.
//!
//! `conns` listening sockets serve at once; each goes back to listening
//! when its connection ends. A clone re-addresses itself (new MAC and, with
//! an identity block, a new address) and drops the source's connections.
//!
//! With `echo=PORT`, [`ECHO_CONNS`] more sockets on that port echo every
//! byte back as soon as it arrives (a TCP ping-pong for latency
//! measurements, `spore bench net`); they share the HTTP sessions' loop.
//!
//! Command line: `ip=A.B.C.D/P` (required), `gw=A.B.C.D`, `port=N` (80),
//! `conns=N` (8), `echo=PORT` (off; not the HTTP port). Lines: `httpd: listening on IP:PORT mac MAC`, and after
//! a clone `httpd: readdressed generation=G ip IP/P mac MAC`.
//! Exit: 1 = no usable virtio-net device, 2 = bad or missing settings.
#![no_std]
#![no_main]

extern crate alloc;

use alloc::vec::Vec;
use core::fmt::Write;

use smoltcp::iface::SocketHandle;
use smoltcp::socket::tcp;
use spore_uk::http::{self, Parse};
use spore_uk::net::{DisplayIpv4, DisplayMac, NetError, NetStack};
use spore_uk::{arg, clone_index, generation, println};

spore_uk::entry!(main);

/// Longest request head accepted (431 above).
const MAX_HEAD: usize = 8 * 1024;
const DEFAULT_CONNS: usize = 8;
const SOCKET_RX: usize = 64 * 1024;
const SOCKET_TX: usize = 128 * 1024;
/// The longest sleep in `wait` when nothing is due.
const IDLE_WAIT_US: u32 = 1_000_000;
/// `/bytes/N` pattern: byte i is `i % PATTERN_PERIOD`.
const PATTERN_PERIOD: usize = 251;
/// Echo connections served at once (a ping-pong client needs one).
const ECHO_CONNS: usize = 2;
/// An echo socket's buffers: it never holds more than one round's bytes.
const ECHO_BUF: usize = 4 * 1024;

enum Phase {
    /// Reading a request head.
    Head,
    /// Reading a `/sink` body.
    Sink { remaining: u64, len: u64, sum: u32 },
    /// Sending a `/bytes` body.
    Stream { sent: u64, total: u64 },
    /// Close once the output is sent.
    Close,
    /// Closed by this side; waiting for the socket to finish.
    Closed,
}

/// What a request asks for, decided before its head is dropped.
enum Route {
    Hello,
    Req(u64),
    Bytes(u64),
    Sink,
    NotFound,
}

struct Session {
    handle: SocketHandle,
    /// Received bytes not yet parsed (one byte over MAX_HEAD tells "too long").
    input: Vec<u8>,
    in_len: usize,
    out: Vec<u8>,
    out_pos: usize,
    phase: Phase,
    keep_alive: bool,
}

/// A period of the pattern, repeated, to copy from.
struct Pattern([u8; PATTERN_PERIOD * 16]);

impl Pattern {
    fn new() -> Self {
        Pattern(core::array::from_fn(|i| (i % PATTERN_PERIOD) as u8))
    }

    /// Fills `buf` with the pattern bytes from stream offset `from`.
    fn fill(&self, buf: &mut [u8], from: u64) {
        let mut phase = (from % PATTERN_PERIOD as u64) as usize;
        for chunk in buf.chunks_mut(self.0.len() - PATTERN_PERIOD) {
            chunk.copy_from_slice(&self.0[phase..phase + chunk.len()]);
            phase = (phase + chunk.len()) % PATTERN_PERIOD;
        }
    }
}

fn route(method: &str, target: &str) -> Route {
    let number = |rest: &str| http::parse_decimal(rest);
    match (method, target) {
        ("GET", "/") => Route::Hello,
        ("GET", t) if t.starts_with("/req/") => number(&t[5..]).map_or(Route::NotFound, Route::Req),
        ("GET", t) if t.starts_with("/bytes/") => {
            number(&t[7..]).map_or(Route::NotFound, Route::Bytes)
        }
        ("POST", "/sink") => Route::Sink,
        _ => Route::NotFound,
    }
}

/// Formats into a Vec (the session's output; never fails).
struct VecWriter<'a>(&'a mut Vec<u8>);

impl Write for VecWriter<'_> {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

impl Session {
    fn new(handle: SocketHandle) -> Self {
        Session {
            handle,
            input: alloc::vec![0u8; MAX_HEAD + 1],
            in_len: 0,
            out: Vec::with_capacity(512),
            out_pos: 0,
            phase: Phase::Head,
            keep_alive: true,
        }
    }

    fn reset(&mut self) {
        self.in_len = 0;
        self.out.clear();
        self.out_pos = 0;
        self.phase = Phase::Head;
        self.keep_alive = true;
    }

    fn after_response(&self) -> Phase {
        if self.keep_alive {
            Phase::Head
        } else {
            Phase::Close
        }
    }

    fn head(&mut self, status: u16, content_length: u64) {
        let connection = if self.keep_alive {
            "keep-alive"
        } else {
            "close"
        };
        let _ = write!(
            VecWriter(&mut self.out),
            "HTTP/1.1 {status} {}\r\nServer: spore-httpd\r\nContent-Type: text/plain\r\nContent-Length: {content_length}\r\nConnection: {connection}\r\n\r\n",
            http::reason(status)
        );
    }

    /// A whole small response; `body` is formatted twice (length, then text).
    fn respond(&mut self, status: u16, body: core::fmt::Arguments) {
        let mut counter = Counter(0);
        let _ = counter.write_fmt(body);
        self.head(status, counter.0 as u64);
        let _ = VecWriter(&mut self.out).write_fmt(body);
    }

    /// An error: answer and close.
    fn fail(&mut self, status: u16) {
        self.keep_alive = false;
        self.respond(status, format_args!("{}\n", http::reason(status)));
        self.phase = Phase::Close;
    }

    /// Drops the first `n` parsed bytes of the input.
    fn consume_input(&mut self, n: usize) {
        let n = n.min(self.in_len);
        self.input.copy_within(n..self.in_len, 0);
        self.in_len -= n;
    }

    /// Serves one connection as far as the socket allows; true if anything
    /// moved.
    fn serve(&mut self, sock: &mut tcp::Socket, port: u16, pattern: &Pattern, g: u64) -> bool {
        if !sock.is_open() {
            // Closed, or TIME-WAIT after this side closed: listen again at
            // once so that every slot keeps accepting.
            self.reset();
            // A peer that stops acknowledging must not hold a slot forever.
            sock.set_timeout(Some(smoltcp::time::Duration::from_secs(60)));
            return sock.listen(port).is_ok();
        }
        if !sock.is_active() {
            return false; // listening
        }
        if sock.state() == tcp::State::SynReceived {
            // Not established yet: nothing can be read, and `may_recv` is
            // false, which below means "the peer is done".
            return false;
        }
        let mut progress = false;
        loop {
            if self.out_pos < self.out.len() {
                let n = sock.send_slice(&self.out[self.out_pos..]).unwrap_or(0);
                self.out_pos += n;
                progress |= n > 0;
                if self.out_pos < self.out.len() {
                    return progress;
                }
                self.out.clear();
                self.out_pos = 0;
            }
            match self.phase {
                Phase::Closed => return progress,
                Phase::Close => {
                    sock.close();
                    self.phase = Phase::Closed;
                    return true;
                }
                Phase::Stream { sent, total } => {
                    if sent >= total {
                        self.phase = self.after_response();
                        continue;
                    }
                    let n = sock
                        .send(|buf| {
                            let n = buf
                                .len()
                                .min((total - sent).min(usize::MAX as u64) as usize);
                            pattern.fill(&mut buf[..n], sent);
                            (n, n)
                        })
                        .unwrap_or(0);
                    if n == 0 {
                        return progress;
                    }
                    progress = true;
                    self.phase = Phase::Stream {
                        sent: sent + n as u64,
                        total,
                    };
                }
                Phase::Sink {
                    remaining,
                    len,
                    sum,
                } => {
                    if remaining == 0 {
                        self.respond(200, format_args!("received {len} sum {sum}\n"));
                        self.phase = self.after_response();
                        continue;
                    }
                    let (n, add) = if self.in_len > 0 {
                        let n = (self.in_len as u64).min(remaining) as usize;
                        let add = byte_sum(&self.input[..n]);
                        self.consume_input(n);
                        (n, add)
                    } else {
                        sock.recv(|buf| {
                            let n = (buf.len() as u64).min(remaining) as usize;
                            (n, (n, byte_sum(&buf[..n])))
                        })
                        .unwrap_or_default()
                    };
                    if n == 0 {
                        if !sock.may_recv() {
                            // The body was cut short: nothing to answer.
                            self.phase = Phase::Close;
                            continue;
                        }
                        return progress;
                    }
                    progress = true;
                    self.phase = Phase::Sink {
                        remaining: remaining - n as u64,
                        len,
                        sum: sum.wrapping_add(add),
                    };
                }
                Phase::Head => {
                    if !self.next_request(g) {
                        let n = sock.recv_slice(&mut self.input[self.in_len..]).unwrap_or(0);
                        if n == 0 {
                            if !sock.may_recv() {
                                self.phase = Phase::Close;
                                continue;
                            }
                            return progress;
                        }
                        self.in_len += n;
                    }
                    progress = true;
                }
            }
        }
    }

    /// Parses a request from the input and sets up its response; false if
    /// the head is not complete yet.
    fn next_request(&mut self, g: u64) -> bool {
        let (route, keep_alive, body, has_length, head_len) =
            match http::parse_head(&self.input[..self.in_len], MAX_HEAD) {
                Parse::Incomplete => return false,
                Parse::Error(status) => {
                    self.in_len = 0;
                    self.fail(status);
                    return true;
                }
                Parse::Request { request, head_len } => (
                    route(request.method, request.target),
                    request.keep_alive,
                    request.content_length,
                    request.has_content_length,
                    head_len,
                ),
            };
        self.consume_input(head_len);
        self.keep_alive = keep_alive;
        match route {
            Route::Sink if !has_length => self.fail(411),
            Route::Sink => {
                self.phase = Phase::Sink {
                    remaining: body,
                    len: body,
                    sum: 0,
                }
            }
            // A body nobody reads would be taken for the next request.
            _ if body > 0 => self.fail(404),
            Route::Hello => self.respond(
                200,
                format_args!(
                    "hello from spore-httpd generation={g} clone={}\n",
                    clone_index()
                ),
            ),
            Route::Req(n) => self.respond(
                200,
                format_args!("req {n} generation={g} clone={}\n", clone_index()),
            ),
            Route::Bytes(n) => {
                self.head(200, n);
                self.phase = Phase::Stream { sent: 0, total: n };
            }
            Route::NotFound => self.respond(404, format_args!("not found\n")),
        }
        true
    }
}

/// Counts formatted bytes.
struct Counter(usize);

impl Write for Counter {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        self.0 += s.len();
        Ok(())
    }
}

fn byte_sum(bytes: &[u8]) -> u32 {
    bytes
        .iter()
        .fold(0u32, |s, &b| s.wrapping_add(u32::from(b)))
}

/// One echo connection: every received byte is sent straight back.
struct EchoSession {
    handle: SocketHandle,
}

impl EchoSession {
    /// Moves what the socket allows; true if anything moved.
    fn serve(&self, sock: &mut tcp::Socket, port: u16) -> bool {
        if !sock.is_open() {
            sock.set_timeout(Some(smoltcp::time::Duration::from_secs(60)));
            // Replies go out at once: a ping-pong peer waits for each one.
            sock.set_nagle_enabled(false);
            return sock.listen(port).is_ok();
        }
        if !sock.is_active() || sock.state() == tcp::State::SynReceived {
            return false;
        }
        let mut progress = false;
        let mut buf = [0u8; ECHO_BUF];
        loop {
            // Take no more than the send buffer can hold now, so that
            // nothing read is ever dropped.
            let room = sock.send_capacity() - sock.send_queue();
            let n = sock.recv_slice(&mut buf[..room.min(ECHO_BUF)]).unwrap_or(0);
            if n == 0 {
                break;
            }
            // Fits whole: `room` was measured just before.
            let _ = sock.send_slice(&buf[..n]);
            progress = true;
        }
        if !sock.may_recv() && sock.recv_queue() == 0 && sock.may_send() {
            // The peer is done: close after the echoed bytes.
            sock.close();
            progress = true;
        }
        progress
    }
}

fn main(info: &spore_uk::BootInfo) -> i32 {
    let port = arg("port")
        .and_then(|v| v.parse::<u16>().ok())
        .filter(|&p| p != 0)
        .unwrap_or(80);
    let conns = arg("conns")
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(DEFAULT_CONNS)
        .clamp(1, 64);
    let echo_port = match arg("echo").map(|v| v.parse::<u16>()) {
        None => None,
        Some(Ok(p)) if p != 0 && p != port => Some(p),
        Some(_) => {
            println!("httpd: echo= needs a port number other than 0 and the HTTP port {port}");
            return 2;
        }
    };
    let mut net = match NetStack::new(info) {
        Ok(n) => n,
        Err(e) => {
            println!("httpd: {e}");
            return match e {
                NetError::Device(_) => 1,
                NetError::Config(_) => 2,
            };
        }
    };
    let Some(ip) = net.ipv4() else {
        println!("httpd: no address: give ip=A.B.C.D/P on the command line");
        return 2;
    };
    let mut sessions: Vec<Session> = (0..conns)
        .map(|_| Session::new(net.add_tcp_socket(SOCKET_RX, SOCKET_TX)))
        .collect();
    let echoes: Vec<EchoSession> = match echo_port {
        Some(_) => (0..ECHO_CONNS)
            .map(|_| EchoSession {
                handle: net.add_tcp_socket(ECHO_BUF, ECHO_BUF),
            })
            .collect(),
        None => Vec::new(),
    };
    let echo_port = echo_port.unwrap_or(0);
    let pattern = Pattern::new();
    // Listen before saying so: a SYN right behind the line must find a socket.
    let g = generation();
    for s in sessions.iter_mut() {
        let sock = net.sockets.get_mut::<tcp::Socket>(s.handle);
        s.serve(sock, port, &pattern, g);
    }
    for e in echoes.iter() {
        e.serve(net.sockets.get_mut::<tcp::Socket>(e.handle), echo_port);
    }
    if !echoes.is_empty() {
        println!("httpd: echo on {}:{echo_port}", DisplayIpv4(ip.addr));
    }
    println!(
        "httpd: listening on {}:{port} mac {}",
        DisplayIpv4(ip.addr),
        DisplayMac(net.mac())
    );
    loop {
        if let Some(r) = net.check_generation() {
            for s in sessions.iter_mut() {
                s.reset();
            }
            match r.ipv4 {
                Some(ip) => println!(
                    "httpd: readdressed generation={} ip {}/{} mac {} ({} connections dropped)",
                    r.generation,
                    DisplayIpv4(ip.addr),
                    ip.prefix_len,
                    DisplayMac(r.mac),
                    r.sockets_reset
                ),
                None => println!(
                    "httpd: readdressed generation={} ip none mac {}",
                    r.generation,
                    DisplayMac(r.mac)
                ),
            }
        }
        let mut progress = net.poll();
        let g = generation();
        for s in sessions.iter_mut() {
            let sock = net.sockets.get_mut::<tcp::Socket>(s.handle);
            progress |= s.serve(sock, port, &pattern, g);
        }
        for e in echoes.iter() {
            progress |= e.serve(net.sockets.get_mut::<tcp::Socket>(e.handle), echo_port);
        }
        if !progress {
            net.wait(IDLE_WAIT_US);
        }
    }
}
