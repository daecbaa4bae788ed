//! spore-agent against a misbehaving host and a misbehaving runtime: bad
//! frames close the connection and the agent goes on; the Runtime API
//! refuses what Lambda's does.

#![allow(
    clippy::tests_outside_test_module,
    reason = "an integration-test crate is built for tests only: no cfg(test) module needed"
)]

mod agent_support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use agent_support::{config_json, Agent};
use spore_abi::function::{FrameHeader, Kind, HEADER_SIZE, MAX_CONFIG};

#[test]
fn malformed_frames_close_the_connection_and_the_agent_survives() {
    let mut agent = Agent::start("provided");
    // Garbage instead of a header.
    let mut host = agent.connect();
    host.expect(Kind::Standby);
    host.s.write_all(&[0xAB; HEADER_SIZE]).unwrap();
    host.expect_closed();
    // A header of the wrong version.
    let mut host = agent.connect();
    host.expect(Kind::Standby);
    let mut raw = FrameHeader {
        kind: Kind::Configure,
        len_a: 2,
        len_b: 0,
        arg: 0,
    }
    .encode();
    raw[4] = 9;
    host.s.write_all(&raw).unwrap();
    host.expect_closed();
    // An oversized Configure: refused before anything is read or allocated.
    let mut host = agent.connect();
    host.expect(Kind::Standby);
    let raw = FrameHeader {
        kind: Kind::Configure,
        len_a: MAX_CONFIG + 1,
        len_b: 0,
        arg: 0,
    }
    .encode();
    host.s.write_all(&raw).unwrap();
    host.expect_closed();
    // An Invoke before any Configure.
    let mut host = agent.connect();
    host.expect(Kind::Standby);
    host.send(Kind::Invoke, b"id", b"{}", 0);
    host.expect_closed();
    // A frame the guest sends, from the host.
    let mut host = agent.connect();
    host.expect(Kind::Standby);
    host.send(Kind::Ready, b"", b"", 0);
    host.expect_closed();
    // A Configure that is not valid JSON: said with InitError; the agent stays unconfigured.
    let mut host = agent.connect();
    host.expect(Kind::Standby);
    host.configure("{not json");
    let v = host.expect(Kind::InitError).a_json();
    assert_eq!(v["errorType"], "Spore.InvalidConfigure");
    host.expect_closed();
    // A header cut short.
    let mut host = agent.connect();
    host.expect(Kind::Standby);
    host.s.write_all(&raw[..10]).unwrap();
    drop(host);
    assert!(agent.is_running());

    // After all that, a real configuration works.
    let bootstrap = agent.code_dir().join("bootstrap");
    std::fs::write(
        &bootstrap,
        "#!/bin/sh\nset -eu\napi=\"http://$AWS_LAMBDA_RUNTIME_API/2018-06-01/runtime\"\nh=$(mktemp)\n\
         while :; do e=$(curl -sS -D $h $api/invocation/next); \
         id=$(grep -i '^lambda-runtime-aws-request-id:' $h | cut -d' ' -f2 | tr -d '\\r'); \
         curl -sS -d \"$e\" $api/invocation/$id/response >/dev/null; done\n",
    )
    .unwrap();
    std::fs::set_permissions(&bootstrap, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut host = agent.connect();
    host.expect(Kind::Standby);
    host.configure(&config_json("x.y", &agent.code_dir()));
    host.expect(Kind::Ready);
    // A request id that cannot go into an HTTP header.
    host.send(Kind::Invoke, b"bad\r\nid", b"{}", 0);
    host.expect_closed();
    let mut host = agent.connect();
    host.expect(Kind::Ready);
    let r = host.invoke("ok-1", r#"{"a":1}"#);
    assert_eq!(r.kind, Kind::ResultOk);
    assert_eq!(r.a_str(), r#"{"a":1}"#);
    assert!(agent.is_running());
}

/// One HTTP exchange on a fresh connection; returns (status, body).
fn http(addr: &str, request: &[u8]) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(request).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status in {text:?}"));
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (status, body)
}

#[test]
fn runtime_api_refusals_and_keep_alive() {
    let agent = Agent::start("provided");
    let addr = agent.api_addr();
    let (status, body) = http(
        &addr,
        b"POST /2018-06-01/runtime/invocation/nope/response HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
    );
    assert_eq!(status, 400);
    assert!(body.contains("InvalidRequestID"), "{body}");
    let (status, _) = http(
        &addr,
        b"GET /2018-06-01/runtime/bogus HTTP/1.1\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 404);
    let (status, _) = http(
        &addr,
        b"GET /2018-06-01/runtime/invocation/x/response HTTP/1.1\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 405);
    let (status, body) = http(
        &addr,
        b"POST /2018-06-01/runtime/invocation/x/response HTTP/1.1\r\nContent-Length: 7000000\r\n\r\n",
    );
    assert_eq!(status, 413, "{body}");
    let (status, _) = http(&addr, b"NOT HTTP AT ALL\r\n\r\n");
    assert_eq!(status, 400);
    // A chunked body is read (and refused by id, not by framing).
    let (status, body) = http(
        &addr,
        b"POST /2018-06-01/runtime/invocation/nope/error HTTP/1.1\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    );
    assert_eq!(status, 400);
    assert!(body.contains("InvalidRequestID"), "{body}");
    // Expect: 100-continue gets its go-ahead before the body is sent.
    let mut s = TcpStream::connect(&addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(
        b"POST /2018-06-01/runtime/invocation/nope/response HTTP/1.1\r\nContent-Length: 2\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n",
    )
    .unwrap();
    let mut buf = [0u8; 64];
    let n = s.read(&mut buf).unwrap();
    assert!(
        buf[..n].starts_with(b"HTTP/1.1 100 Continue\r\n\r\n"),
        "{:?}",
        String::from_utf8_lossy(&buf[..n])
    );
    s.write_all(b"{}").unwrap();
    let mut rest = String::new();
    let _ = s.read_to_string(&mut rest);
    assert!(rest.contains("400"), "{rest}");
    // Keep-alive: three requests on one connection, three answers.
    let mut s = TcpStream::connect(&addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut seen = String::new();
    for _ in 0..3 {
        s.write_all(b"GET /2018-06-01/runtime/bogus HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut buf = [0u8; 4096];
        let n = s.read(&mut buf).unwrap();
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    assert_eq!(seen.matches("HTTP/1.1 404").count(), 3, "{seen}");
}
