//! The host side of `spore bench net`: four measurements against the `httpd`
//! unikernel over std `TcpStream`s (no external client). Each function runs
//! once and returns its figure; `net.rs` repeats and summarises.
//!
//! Every read and write has a timeout, so a guest that stops answering fails
//! the bench instead of hanging it.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};

/// The guest's `/bytes` and the bench's `/sink` body: byte i is `i % 251`.
const PATTERN_PERIOD: usize = 251;
/// A `/bytes` length the guest never reaches in a measurement window.
const ENDLESS: u64 = 1 << 50;
/// One `POST /sink` body.
pub const SINK_POST_BYTES: usize = 64 << 20;
/// No single read or write waits longer.
const IO_TIMEOUT: Duration = Duration::from_secs(30);

fn connect(addr: SocketAddr) -> anyhow::Result<TcpStream> {
    let s = TcpStream::connect_timeout(&addr, IO_TIMEOUT)
        .with_context(|| format!("connecting to {addr}"))?;
    s.set_read_timeout(Some(IO_TIMEOUT))?;
    s.set_write_timeout(Some(IO_TIMEOUT))?;
    s.set_nodelay(true)?;
    Ok(s)
}

/// A request head in one write: `write!` would make a syscall per piece,
/// and with TCP_NODELAY a segment per piece, which the guest would see as
/// several round trips' worth of partial heads.
fn send_head(s: &mut TcpStream, head: &str) -> std::io::Result<()> {
    s.write_all(head.as_bytes())
}

/// `len` bytes of the pattern from stream offset 0.
#[allow(
    clippy::cast_possible_truncation,
    reason = "i % PATTERN_PERIOD is below 251, so it fits a u8"
)]
fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % PATTERN_PERIOD) as u8).collect()
}

/// Reads one response (status line, headers, Content-Length body); returns
/// the status and the body.
fn read_response(r: &mut impl BufRead) -> anyhow::Result<(u16, String)> {
    let mut line = String::new();
    r.read_line(&mut line).context("reading a status line")?;
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .with_context(|| format!("not an HTTP status line: {line:?}"))?;
    let mut length = 0usize;
    loop {
        line.clear();
        ensure!(
            r.read_line(&mut line)? > 0,
            "the connection closed in a head"
        );
        let h = line.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((name, value)) = h.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().context("Content-Length")?;
            }
        }
    }
    let mut body = vec![0u8; length];
    r.read_exact(&mut body).context("reading a body")?;
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// `GET /` until the guest answers (its ARP and listening sockets settle).
pub fn wait_until_up(addr: SocketAddr, timeout: Duration) -> anyhow::Result<()> {
    let start = Instant::now();
    loop {
        let attempt = (|| -> anyhow::Result<()> {
            let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
            s.set_read_timeout(Some(Duration::from_secs(2)))?;
            s.write_all(b"GET / HTTP/1.1\r\nHost: bench\r\n\r\n")?;
            let (status, body) = read_response(&mut BufReader::new(s))?;
            ensure!(status == 200, "GET /: {status} {body}");
            Ok(())
        })();
        match attempt {
            Ok(()) => return Ok(()),
            Err(e) if start.elapsed() > timeout => {
                return Err(e.context(format!("httpd at {addr} never answered")))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// Guest → host: reads an endless `GET /bytes` for `window`, then drops the
/// connection. MiB/s of body bytes from the first body byte on.
pub fn guest_to_host(addr: SocketAddr, window: Duration) -> anyhow::Result<f64> {
    let mut s = connect(addr)?;
    send_head(
        &mut s,
        &format!("GET /bytes/{ENDLESS} HTTP/1.1\r\nHost: bench\r\n\r\n"),
    )?;
    let mut r = BufReader::with_capacity(1 << 20, s);
    let (mut line, mut status) = (String::new(), None);
    loop {
        line.clear();
        ensure!(
            r.read_line(&mut line)? > 0,
            "the connection closed in a head"
        );
        if status.is_none() {
            status = line.split_whitespace().nth(1).map(str::to_string);
            ensure!(status.as_deref() == Some("200"), "GET /bytes: {line:?}");
        }
        if line.trim_end().is_empty() {
            break;
        }
    }
    // The first MiB is checked against the pattern; the rest only counted
    // (checking every byte would take host CPU from the VMM).
    let expected = pattern(1 << 20);
    let mut buf = vec![0u8; 1 << 20];
    let (mut bytes, start) = (0usize, Instant::now());
    while start.elapsed() < window {
        let n = r.read(&mut buf).context("reading /bytes")?;
        ensure!(n > 0, "the guest ended /bytes after {bytes} bytes");
        if bytes < expected.len() {
            let end = (bytes + n).min(expected.len());
            ensure!(
                buf[..end - bytes] == expected[bytes..end],
                "/bytes differs from the pattern within its first MiB"
            );
        }
        bytes += n;
    }
    Ok(mib_per_s(bytes, start.elapsed()))
}

/// Host → guest: 64 MiB `POST /sink` requests on one keep-alive connection
/// until `window` has passed; MiB/s of the bodies the guest confirmed
/// (`received N sum S`, both checked), up to the last confirmation.
pub fn host_to_guest(addr: SocketAddr, window: Duration) -> anyhow::Result<Sink> {
    let mut s = connect(addr)?;
    let mut r = BufReader::new(s.try_clone()?);
    let body = pattern(SINK_POST_BYTES);
    let sum = body.iter().fold(0u32, |s, &b| s.wrapping_add(u32::from(b)));
    let want = format!("received {SINK_POST_BYTES} sum {sum}\n");
    let start = Instant::now();
    let (mut posts, mut last) = (0, Duration::ZERO);
    while last < window {
        send_head(
            &mut s,
            &format!(
                "POST /sink HTTP/1.1\r\nHost: bench\r\nContent-Length: {SINK_POST_BYTES}\r\n\r\n"
            ),
        )?;
        s.write_all(&body).context("writing a /sink body")?;
        let (status, reply) = read_response(&mut r)?;
        ensure!(
            status == 200 && reply == want,
            "POST /sink: {status} {reply:?}, expected {want:?}"
        );
        posts += 1;
        last = start.elapsed();
    }
    Ok(Sink {
        mib_s: mib_per_s(posts * SINK_POST_BYTES, last),
        posts,
    })
}

/// One host → guest run.
pub struct Sink {
    pub mib_s: f64,
    /// Completed 64 MiB posts.
    pub posts: usize,
}

/// Round-trip times in µs of `pings` 1-byte ping-pongs over the echo port,
/// after `warmup` untimed ones.
pub fn ping_pong(addr: SocketAddr, warmup: usize, pings: usize) -> anyhow::Result<Vec<f64>> {
    let mut s = connect(addr)?;
    let mut rtts = Vec::with_capacity(pings);
    let mut reply = [0u8; 1];
    for i in 0..warmup + pings {
        // The low byte of the count: 0, 1, …, 255, 0, …
        let byte = [i.to_le_bytes()[0]];
        let t = Instant::now();
        s.write_all(&byte)?;
        s.read_exact(&mut reply).context("reading an echo")?;
        let rtt = t.elapsed();
        ensure!(
            reply == byte,
            "the echo of {} came back as {}",
            byte[0],
            reply[0]
        );
        if i >= warmup {
            rtts.push(rtt.as_nanos() as f64 / 1e3);
        }
    }
    Ok(rtts)
}

/// Keep-alive `GET /req/N` one at a time for `window`; requests/s.
pub fn http_requests(addr: SocketAddr, window: Duration) -> anyhow::Result<f64> {
    let mut s = connect(addr)?;
    let mut r = BufReader::new(s.try_clone()?);
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < window {
        send_head(
            &mut s,
            &format!("GET /req/{n} HTTP/1.1\r\nHost: bench\r\n\r\n"),
        )?;
        let (status, body) = read_response(&mut r)?;
        if status != 200 || !body.starts_with(&format!("req {n} ")) {
            bail!("GET /req/{n}: {status} {body:?}");
        }
        n += 1;
    }
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

fn mib_per_s(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / (1u64 << 20) as f64 / d.as_secs_f64().max(1e-9)
}

/// What one `Instant::now()` costs here, in ns (some hosts trap the clock,
/// which adds to every ping-pong sample).
pub fn clock_read_ns() -> f64 {
    let n = 100_000;
    let t = Instant::now();
    let mut last = t;
    for _ in 0..n {
        last = std::hint::black_box(Instant::now());
    }
    (last - t).as_nanos() as f64 / n as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_are_read_by_content_length() {
        let wire = b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\nConnection: keep-alive\r\n\r\nreq 1\nHTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n";
        let mut r = &wire[..];
        assert_eq!(read_response(&mut r).unwrap(), (200, "req 1\n".into()));
        assert_eq!(read_response(&mut r).unwrap(), (404, String::new()));
        assert!(read_response(&mut r).is_err());
    }

    #[test]
    fn the_pattern_is_the_guests() {
        let p = pattern(600);
        assert_eq!((p[0], p[250], p[251], p[502]), (0, 250, 0, 0));
    }
}
