//! Server tests over a real Unix socket, with HTTP/1.1 written by hand so that
//! malformed and partial requests can be sent too.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::UnixStream as StdStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use vmm_sys_util::tempdir::TempDir;

use super::*;
use crate::api::{ActionType, InstanceInfo, InstanceState};

const TIMEOUT: Duration = Duration::from_secs(10);

/// Records every request; answers by kind so each status can be reached.
#[derive(Default)]
struct MockHandler {
    seen: Mutex<Vec<ApiRequest>>,
    busy: AtomicBool,
    overlapped: AtomicBool,
}

impl ApiHandler for MockHandler {
    fn handle(&self, req: ApiRequest) -> Result<ApiResponse, ApiError> {
        if self.busy.swap(true, Ordering::SeqCst) {
            self.overlapped.store(true, Ordering::SeqCst);
        }
        if let Ok(mut seen) = self.seen.lock() {
            seen.push(req.clone());
        }
        let result = match req {
            ApiRequest::GetInstanceInfo => {
                ApiResponse::json(&InstanceInfo::new("test", InstanceState::NotStarted))
            }
            ApiRequest::Action(ActionType::FlushMetrics) => {
                Err(ApiError::BadRequest("metrics are not configured".into()))
            }
            ApiRequest::Action(ActionType::SendCtrlAltDel) => {
                self.busy.store(false, Ordering::SeqCst);
                panic!("mock handler panics on purpose");
            }
            ApiRequest::GetMachineConfig => {
                // Slow enough that concurrent clients would overlap.
                thread::sleep(Duration::from_millis(20));
                ApiResponse::json(&crate::config::MachineConfig::default())
            }
            _ => Ok(ApiResponse::NoContent),
        };
        self.busy.store(false, Ordering::SeqCst);
        result
    }
}

struct Fixture {
    _dir: TempDir,
    path: PathBuf,
    handler: Arc<MockHandler>,
    server: Option<ApiServer>,
}

impl Fixture {
    fn new() -> Self {
        let dir = TempDir::new().unwrap();
        let path = dir.as_path().join("api.sock");
        let handler = Arc::new(MockHandler::default());
        let server = ApiServer::start(&path, handler.clone()).unwrap();
        Fixture {
            _dir: dir,
            path,
            handler,
            server: Some(server),
        }
    }

    fn connect(&self) -> Client {
        Client::new(StdStream::connect(&self.path).unwrap())
    }

    fn seen(&self) -> Vec<ApiRequest> {
        self.handler.seen.lock().unwrap().clone()
    }
}

struct Response {
    status: u16,
    headers: HashMap<String, String>,
    body: Vec<u8>,
}

impl Response {
    fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap()
    }

    fn fault(&self) -> String {
        let v = self.json();
        assert_eq!(v.as_object().map(|o| o.len()), Some(1), "{v}");
        v["fault_message"].as_str().unwrap().to_owned()
    }
}

struct Client {
    reader: BufReader<StdStream>,
    writer: StdStream,
}

impl Client {
    fn new(stream: StdStream) -> Self {
        stream.set_read_timeout(Some(TIMEOUT)).unwrap();
        stream.set_write_timeout(Some(TIMEOUT)).unwrap();
        Client {
            writer: stream.try_clone().unwrap(),
            reader: BufReader::new(stream),
        }
    }

    fn send_raw(&mut self, bytes: &[u8]) {
        self.writer.write_all(bytes).unwrap();
    }

    fn request(&mut self, method: &str, path: &str, body: &str) -> Response {
        let raw = format!(
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        );
        self.send_raw(raw.as_bytes());
        self.read_response()
    }

    fn read_response(&mut self) -> Response {
        let mut line = String::new();
        self.reader.read_line(&mut line).unwrap();
        let status = line
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("bad status line {line:?}"));
        let mut headers = HashMap::new();
        loop {
            line.clear();
            self.reader.read_line(&mut line).unwrap();
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            let (k, v) = l.split_once(':').unwrap();
            headers.insert(k.to_ascii_lowercase(), v.trim().to_owned());
        }
        let len = headers
            .get("content-length")
            .map(|v| v.parse().unwrap())
            .unwrap_or(0);
        let mut body = vec![0; len];
        self.reader.read_exact(&mut body).unwrap();
        Response {
            status,
            headers,
            body,
        }
    }

    /// Everything until the server closes the connection.
    fn read_to_close(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        // A reset is as good as a close here.
        let _ = self.reader.read_to_end(&mut out);
        out
    }
}

#[test]
fn no_content_and_json_responses() {
    let f = Fixture::new();
    let mut c = f.connect();
    let r = c.request("PUT", "/boot-source", r#"{"kernel_image_path":"/k"}"#);
    assert_eq!(r.status, 204);
    assert!(r.body.is_empty());
    let r = c.request("GET", "/", "");
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["content-type"], "application/json");
    assert_eq!(r.json()["state"], "Not started");
    assert_eq!(r.json()["app_name"], "spore");
    assert!(matches!(f.seen()[0], ApiRequest::PutBootSource(_)));
    assert_eq!(f.seen()[1], ApiRequest::GetInstanceInfo);
}

#[test]
fn errors_are_json_fault_messages() {
    let f = Fixture::new();
    let mut c = f.connect();

    let r = c.request(
        "PUT",
        "/machine-config",
        r#"{"vcpu_count":"x","mem_size_mib":1}"#,
    );
    assert_eq!(r.status, 400);
    assert!(r.fault().contains("vcpu_count"), "{}", r.fault());

    let r = c.request("PUT", "/actions", "");
    assert_eq!(r.status, 400);
    assert!(r.fault().contains("needs a JSON body"));

    let r = c.request("GET", "/no/such/thing", "");
    assert_eq!(r.status, 404);
    assert!(r.fault().contains("/no/such/thing"));

    let r = c.request("DELETE", "/machine-config", "");
    assert_eq!(r.status, 405);
    assert_eq!(r.headers["allow"], "GET, PUT, PATCH");
    r.fault();

    // The handler's own error reaches the client unchanged.
    let r = c.request("PUT", "/actions", r#"{"action_type":"FlushMetrics"}"#);
    assert_eq!(r.status, 400);
    assert_eq!(r.fault(), "metrics are not configured");

    // Only the well-formed requests reached the handler.
    assert_eq!(f.seen(), vec![ApiRequest::Action(ActionType::FlushMetrics)]);
}

#[test]
fn handler_panic_is_500_and_server_survives() {
    let f = Fixture::new();
    let mut c = f.connect();
    let r = c.request("PUT", "/actions", r#"{"action_type":"SendCtrlAltDel"}"#);
    assert_eq!(r.status, 500);
    r.fault();
    assert_eq!(c.request("GET", "/", "").status, 200);
}

#[test]
fn oversized_bodies_are_413() {
    let f = Fixture::new();

    // Announced by Content-Length: refused before the body is read.
    let mut c = f.connect();
    let head = format!(
        "PUT /boot-source HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
        MAX_BODY_BYTES + 1
    );
    c.send_raw(head.as_bytes());
    let r = c.read_response();
    assert_eq!(r.status, 413);
    assert!(r.fault().contains("larger than"));

    // Chunked, so only counting the bytes can tell.
    let mut c = f.connect();
    c.send_raw(b"PUT /boot-source HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n");
    let chunk = vec![b' '; 16 * 1024];
    let writer = c.writer.try_clone().unwrap();
    let sender = thread::spawn(move || {
        let mut w = writer;
        for _ in 0..5 {
            let head = format!("{:x}\r\n", chunk.len());
            if w.write_all(head.as_bytes()).is_err()
                || w.write_all(&chunk).is_err()
                || w.write_all(b"\r\n").is_err()
            {
                return;
            }
        }
        let _ = w.write_all(b"0\r\n\r\n");
    });
    let r = c.read_response();
    assert_eq!(r.status, 413);
    sender.join().unwrap();

    // Exactly at the limit is fine (and reaches the JSON parser).
    let mut c = f.connect();
    let body = format!(
        "{{\"kernel_image_path\":\"/k\"}}{}",
        " ".repeat(MAX_BODY_BYTES - 26)
    );
    assert_eq!(body.len(), MAX_BODY_BYTES);
    assert_eq!(c.request("PUT", "/boot-source", &body).status, 204);
    assert!(f.seen().len() == 1);
}

#[test]
fn oversized_headers_are_refused() {
    let f = Fixture::new();
    let mut c = f.connect();
    let head = format!(
        "GET / HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(MAX_HEADER_BYTES)
    );
    c.send_raw(head.as_bytes());
    let out = String::from_utf8_lossy(&c.read_to_close()).into_owned();
    assert!(out.is_empty() || out.starts_with("HTTP/1.1 431"), "{out}");
    assert_eq!(f.connect().request("GET", "/", "").status, 200);
}

#[test]
fn survives_garbage_and_abandoned_requests() {
    let f = Fixture::new();

    let mut c = f.connect();
    c.send_raw(b"\x00\x01\x02\xff garbage \r\n\r\n");
    let out = String::from_utf8_lossy(&c.read_to_close()).into_owned();
    assert!(out.is_empty() || out.starts_with("HTTP/1.1 400"), "{out}");

    let mut c = f.connect();
    c.send_raw(b"GET / HTTP/9.9\r\n\r\n");
    c.read_to_close();

    // Half a request line, then gone.
    let mut c = f.connect();
    c.send_raw(b"PUT /boot-so");
    drop(c);

    // Headers promise a body that never fully arrives.
    let mut c = f.connect();
    c.send_raw(b"PUT /boot-source HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"kern");
    drop(c);

    // Connect and leave without a byte.
    drop(f.connect());

    assert_eq!(f.connect().request("GET", "/", "").status, 200);
    assert_eq!(f.seen(), vec![ApiRequest::GetInstanceInfo]);
}

#[test]
fn keep_alive_serves_several_requests_per_connection() {
    let f = Fixture::new();
    let mut c = f.connect();
    assert_eq!(c.request("GET", "/", "").status, 200);
    assert_eq!(
        c.request("PATCH", "/vm", r#"{"state":"Paused"}"#).status,
        204
    );
    // Pipelined: both requests sent before either answer is read.
    c.send_raw(b"GET / HTTP/1.1\r\nHost: x\r\n\r\nGET /vm/config HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(c.read_response().status, 200);
    assert_eq!(c.read_response().status, 204);
    assert_eq!(f.seen().len(), 4);
}

#[test]
fn idle_connection_does_not_block_others() {
    let f = Fixture::new();
    let mut idle = f.connect();
    idle.send_raw(b"GET / HTTP/1.1\r\n"); // and nothing more
    let _quiet = f.connect();
    for _ in 0..3 {
        assert_eq!(f.connect().request("GET", "/", "").status, 200);
    }
}

#[test]
fn a_slow_body_is_answered_408_and_its_connection_closed() {
    let f = Fixture::new();
    let mut slow = f.connect();
    let t0 = Instant::now();
    slow.send_raw(b"PUT /boot-source HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"kern");
    // Others are served meanwhile.
    assert_eq!(f.connect().request("GET", "/", "").status, 200);
    let out = String::from_utf8_lossy(&slow.read_to_close()).into_owned();
    let took = t0.elapsed();
    assert!(out.starts_with("HTTP/1.1 408"), "{out}");
    assert!(out.contains("fault_message"), "{out}");
    assert!(
        took >= BODY_TIMEOUT && took < BODY_TIMEOUT + Duration::from_secs(3),
        "{took:?}"
    );
    assert_eq!(f.seen(), vec![ApiRequest::GetInstanceInfo]);
}

#[test]
fn requests_are_handled_one_at_a_time() {
    let f = Fixture::new();
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let mut c = f.connect();
            thread::spawn(move || {
                for _ in 0..3 {
                    assert_eq!(c.request("GET", "/machine-config", "").status, 200);
                }
            })
        })
        .collect();
    for t in clients {
        t.join().unwrap();
    }
    assert_eq!(f.seen().len(), 12);
    assert!(!f.handler.overlapped.load(Ordering::SeqCst));
}

#[test]
fn socket_is_private_and_removed_on_shutdown() {
    let mut f = Fixture::new();
    let meta = std::fs::symlink_metadata(&f.path).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let server = f.server.take().unwrap();
    assert_eq!(server.socket_path(), f.path);

    // An open connection must not hold shutdown up.
    let mut open = f.connect();
    assert_eq!(open.request("GET", "/", "").status, 200);
    server.shutdown();
    assert!(!f.path.exists());
    assert!(open.read_to_close().is_empty());
    assert!(StdStream::connect(&f.path).is_err());
}

#[test]
fn refuses_non_sockets_and_live_sockets() {
    let dir = TempDir::new().unwrap();
    let handler: Arc<dyn ApiHandler> = Arc::new(MockHandler::default());

    let file = dir.as_path().join("file");
    std::fs::write(&file, b"keep me").unwrap();
    let e = ApiServer::start(&file, handler.clone()).unwrap_err();
    assert!(matches!(e, ApiServerError::NotASocket { .. }), "{e}");
    assert_eq!(std::fs::read(&file).unwrap(), b"keep me");

    let e = ApiServer::start(dir.as_path(), handler.clone()).unwrap_err();
    assert!(matches!(e, ApiServerError::NotASocket { .. }), "{e}");

    let sock = dir.as_path().join("api.sock");
    let first = ApiServer::start(&sock, handler.clone()).unwrap();
    let e = ApiServer::start(&sock, handler.clone()).unwrap_err();
    assert!(matches!(e, ApiServerError::InUse { .. }), "{e}");
    drop(first);

    let long = dir.as_path().join("x".repeat(200));
    let e = ApiServer::start(&long, handler.clone()).unwrap_err();
    assert!(matches!(e, ApiServerError::BadPath { .. }), "{e}");

    let missing = dir.as_path().join("no/such/dir/api.sock");
    let e = ApiServer::start(&missing, handler).unwrap_err();
    assert!(matches!(e, ApiServerError::Bind { .. }), "{e}");
}

#[test]
fn replaces_a_stale_socket() {
    let dir = TempDir::new().unwrap();
    let sock = dir.as_path().join("api.sock");
    // A listener that is gone leaves its file behind, as a crashed VMM would.
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    assert!(sock.exists());
    let server = ApiServer::start(&sock, Arc::new(MockHandler::default())).unwrap();
    let mut c = Client::new(StdStream::connect(&sock).unwrap());
    assert_eq!(c.request("GET", "/", "").status, 200);
    drop(server);
    assert!(!sock.exists());
}
