//! The API's connections cannot hold the daemon: idle ones are closed, the
//! open ones capped (the longest idle closed to make room), a request whose
//! headers or body stall is ended. No KVM needed: no function runs.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::common::serve::Daemon;
use crate::common::Scratch;

/// Reads until the peer closes (or `limit` passes); returns what came.
fn read_to_close(s: &mut TcpStream, limit: Duration) -> Result<Vec<u8>, String> {
    s.set_read_timeout(Some(limit)).map_err(|e| e.to_string())?;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return Ok(got),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Ok(got),
            Err(e) => return Err(format!("{e} after {} bytes", got.len())),
        }
    }
}

#[test]
fn serve_idle_and_stalled_connections_are_closed_and_capped() {
    let dir = Scratch::new("serve-conns");
    let d = Daemon::start(
        &dir.path("state"),
        &[
            "--max-connections",
            "20",
            "--idle-timeout-ms",
            "1500",
            "--request-timeout-ms",
            "1500",
        ],
    );
    // Three times the cap in idle connections: a real client still gets in.
    let mut idle: Vec<TcpStream> = (0..60)
        .map(|_| TcpStream::connect(&d.addr).unwrap())
        .collect();
    let t = Instant::now();
    let r = d.request("GET", "/2015-03-31/functions", b"", &[]);
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    // Every idle connection is closed: to make room, or once idle too long.
    for (i, s) in idle.iter_mut().enumerate() {
        let got = read_to_close(s, Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("idle connection {i} still open: {e}"));
        assert!(got.is_empty(), "an idle connection got {got:?}");
    }
    assert!(
        d.metric("spore_api_connections_evicted_total") >= 40.0,
        "at least 40 closed to make room"
    );

    // A body shorter than its Content-Length: 408 once it paused too long.
    let mut s = TcpStream::connect(&d.addr).unwrap();
    s.write_all(
        b"POST /2015-03-31/functions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"a\":",
    )
    .unwrap();
    let got = read_to_close(&mut s, Duration::from_secs(10)).unwrap();
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("RequestTimeoutException"), "{text}");

    // Headers that never end: the connection is closed.
    let mut s = TcpStream::connect(&d.addr).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost").unwrap();
    let t = Instant::now();
    read_to_close(&mut s, Duration::from_secs(10)).unwrap();
    assert!(t.elapsed() < Duration::from_secs(8), "{:?}", t.elapsed());

    // Keep-alive: a served connection left idle is closed too.
    let mut s = TcpStream::connect(&d.addr).unwrap();
    s.write_all(b"GET /2015-03-31/functions HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let got = read_to_close(&mut s, Duration::from_secs(10)).unwrap();
    assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200"));
    assert_eq!(
        d.request("GET", "/2015-03-31/functions", b"", &[]).status,
        200
    );
}

/// A burst of clients fits the listen backlog (`spore_serve::server::
/// LISTEN_BACKLOG`, up to `net.core.somaxconn`): with the usual 1024, a
/// 1,000-client burst under load overflowed into SYN cookies and 2–10 % of
/// the clients were reset. The backlog of the daemon's listening socket is
/// what `ss` shows as its Send-Q; then 1,500 clients at once all get in.
#[test]
fn serve_a_burst_of_clients_fits_the_listen_backlog() {
    let dir = Scratch::new("serve-backlog");
    let d = Daemon::start(&dir.path("state"), &["--max-connections", "4096"]);
    let port = d.addr.rsplit(':').next().unwrap_or_default().to_string();
    let out = std::process::Command::new("ss")
        .args(["-Hltn", &format!("sport = :{port}")])
        .output()
        .expect("ss (iproute2) runs");
    let text = String::from_utf8_lossy(&out.stdout);
    // State Recv-Q Send-Q Local Peer: Send-Q is the backlog.
    let backlog: u64 = text
        .split_whitespace()
        .nth(2)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no listening socket in ss: {text:?}"));
    let somaxconn: u64 = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(4096);
    assert_eq!(
        backlog,
        u64::from(spore_serve::server::LISTEN_BACKLOG).min(somaxconn),
        "the listen backlog"
    );
    assert!(backlog > 1024 || somaxconn <= 1024, "backlog {backlog}");

    // 1,500 clients connect at once (fewer if this process may not open
    // that many descriptors), then each asks for the function list.
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit on this process with a valid struct.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        lim.rlim_cur = lim.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
    }
    let n = usize::try_from(lim.rlim_cur.saturating_sub(256))
        .unwrap_or(1500)
        .min(1500);
    let clients: Vec<_> = (0..n)
        .map(|_| TcpStream::connect(&d.addr).expect("connect"))
        .collect();
    let mut answered = 0;
    for mut s in clients {
        s.write_all(b"GET /2015-03-31/functions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .expect("write");
        let got = read_to_close(&mut s, Duration::from_secs(30)).expect("read");
        if got.starts_with(b"HTTP/1.1 200") {
            answered += 1;
        }
    }
    assert_eq!(answered, n);
}
