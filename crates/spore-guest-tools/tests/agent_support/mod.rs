//! The host side of spore-agent's tests: starts the agent in host mode
//! (`--no-pid1`, the host link on a Unix socket, the Runtime API on a free
//! port) and speaks the real frames of `spore_abi::function` to it.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use spore_abi::function::{FrameHeader, Kind, HEADER_SIZE};

pub const TIMEOUT: Duration = Duration::from_secs(30);

pub struct Agent {
    child: Child,
    pub dir: PathBuf,
    sock: PathBuf,
}

/// The host's Python interpreter (a real path: a pyenv shim needs its own
/// environment, which the agent clears for the runtime).
fn python() -> String {
    let out = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python3 on the host");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

impl Agent {
    /// Starts `spore-agent --runtime RUNTIME`; the code dir (`self.code_dir()`)
    /// exists and is empty.
    pub fn start(runtime: &str) -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "spore-agent-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("task")).unwrap();
        let sock = dir.join("link.sock");
        let log = std::fs::File::create(dir.join("agent.log")).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_spore-agent"))
            .arg("--no-pid1")
            .args(["--host-link", &format!("unix:{}", sock.display())])
            .args(["--runtime", runtime])
            .args(["--runtime-api", "127.0.0.1:0"])
            .args(["--runtime-dir", &dir.join("runtime").display().to_string()])
            .args(["--python", &python()])
            .arg("--python-bootstrap")
            .arg(repo_root().join("guest/runtimes/python3/bootstrap.py"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spore-agent starts");
        Agent { child, dir, sock }
    }

    pub fn code_dir(&self) -> PathBuf {
        self.dir.join("task")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("agent.log")).unwrap_or_default()
    }

    /// The Runtime API's address, from the agent's first log line.
    pub fn api_addr(&self) -> String {
        let until = Instant::now() + TIMEOUT;
        loop {
            let log = self.log();
            if let Some(rest) = log.split("Runtime API on ").nth(1) {
                return rest.split(',').next().unwrap().to_string();
            }
            assert!(
                Instant::now() < until,
                "no Runtime API address in the log:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Connects to the host link (retrying while the agent starts).
    pub fn connect(&self) -> Host {
        let until = Instant::now() + TIMEOUT;
        loop {
            match UnixStream::connect(&self.sock) {
                Ok(s) => {
                    s.set_read_timeout(Some(TIMEOUT)).unwrap();
                    return Host { s };
                }
                Err(e) => {
                    assert!(
                        Instant::now() < until,
                        "cannot connect: {e}\n{}",
                        self.log()
                    );
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
    }

    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("---- agent log ----\n{}", self.log());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

pub struct Frame {
    pub kind: Kind,
    pub arg: u64,
    pub a: Vec<u8>,
    pub b: Vec<u8>,
}

impl Frame {
    pub fn a_str(&self) -> String {
        String::from_utf8_lossy(&self.a).into_owned()
    }
    pub fn b_str(&self) -> String {
        String::from_utf8_lossy(&self.b).into_owned()
    }
    pub fn a_json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.a).unwrap_or_else(|e| panic!("{e}: {}", self.a_str()))
    }
}

/// The host end of one connection.
pub struct Host {
    pub s: UnixStream,
}

impl Host {
    pub fn send(&mut self, kind: Kind, a: &[u8], b: &[u8], arg: u64) {
        let h = FrameHeader {
            kind,
            len_a: u32::try_from(a.len()).unwrap(),
            len_b: u32::try_from(b.len()).unwrap(),
            arg,
        };
        let mut msg = h.encode().to_vec();
        msg.extend_from_slice(a);
        msg.extend_from_slice(b);
        self.s.write_all(&msg).unwrap();
    }

    /// The next frame, or None when the agent closed the connection.
    pub fn try_read(&mut self) -> Option<Frame> {
        let mut raw = [0u8; HEADER_SIZE];
        match self.s.read_exact(&mut raw) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return None,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return None,
            Err(e) => panic!("reading a frame: {e}"),
        }
        let h = FrameHeader::decode(&raw).expect("a valid frame from the agent");
        let mut a = vec![0u8; h.len_a as usize];
        self.s.read_exact(&mut a).unwrap();
        let mut b = vec![0u8; h.len_b as usize];
        self.s.read_exact(&mut b).unwrap();
        Some(Frame {
            kind: h.kind,
            arg: h.arg,
            a,
            b,
        })
    }

    pub fn read(&mut self) -> Frame {
        self.try_read()
            .expect("a frame, not the end of the connection")
    }

    pub fn expect(&mut self, kind: Kind) -> Frame {
        let f = self.read();
        assert_eq!(
            f.kind,
            kind,
            "got {:?}: {} / {}",
            f.kind,
            f.a_str(),
            f.b_str()
        );
        f
    }

    /// The agent closes the connection (no more frames).
    pub fn expect_closed(&mut self) {
        if let Some(f) = self.try_read() {
            panic!("expected the end, got {:?} {}", f.kind, f.a_str());
        }
    }

    pub fn configure(&mut self, json: &str) {
        self.send(Kind::Configure, json.as_bytes(), b"", 0);
    }

    /// Invokes with a deadline `timeout` from now; returns the result frame.
    pub fn invoke_with(&mut self, id: &str, payload: &str, timeout: Duration) -> Frame {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        let deadline = u64::try_from(now.as_millis() + timeout.as_millis()).unwrap();
        self.send(Kind::Invoke, id.as_bytes(), payload.as_bytes(), deadline);
        let f = self.read();
        assert!(
            matches!(f.kind, Kind::ResultOk | Kind::ResultError),
            "got {:?}",
            f.kind
        );
        f
    }

    pub fn invoke(&mut self, id: &str, payload: &str) -> Frame {
        self.invoke_with(id, payload, Duration::from_secs(20))
    }
}

/// A Configure JSON for a function in `code_dir`.
pub fn config_json(handler: &str, code_dir: &Path) -> String {
    serde_json::json!({
        "function_name": "test-fn",
        "function_version": "$LATEST",
        "handler": handler,
        "memory_mib": 256,
        "timeout_s": 10,
        "region": "eu-west-1",
        "env": {"GREETING": "hello"},
        "code_device": null,
        "code_dir": code_dir.display().to_string(),
    })
    .to_string()
}
