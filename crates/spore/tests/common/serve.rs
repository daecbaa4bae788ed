//! Helpers for `spore serve` tests: a daemon on a free port with its own
//! state directory, a plain HTTP/1.1 client, function zips, and the VMM
//! processes a daemon left.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

use base64::Engine;

/// A running `spore serve`, killed on drop.
pub struct Daemon {
    pub child: Child,
    pub addr: String,
    /// Where function URLs are served, with `--url-listen`.
    pub url_addr: Option<String>,
    /// The sandbox API's address, with `--sandbox-listen`.
    pub sandbox_addr: Option<String>,
    pub state_dir: PathBuf,
}

impl Daemon {
    /// Starts `spore serve --listen 127.0.0.1:0 --state-dir DIR EXTRA...`
    /// and reads the address it prints.
    pub fn start(state_dir: &Path, extra: &[&str]) -> Daemon {
        Self::start_on("127.0.0.1:0", state_dir, extra)
    }

    /// [`Daemon::start`] listening on `listen`.
    pub fn start_on(listen: &str, state_dir: &Path, extra: &[&str]) -> Daemon {
        Self::start_in(None, listen, state_dir, extra)
    }

    /// [`Daemon::start_on`] in network namespace `netns` (`nsenter`, which
    /// becomes the daemon: the child is the daemon's process; unlike `ip
    /// netns exec` it leaves /sys, and so the cgroup mounts, as they are).
    pub fn start_in(netns: Option<&str>, listen: &str, state_dir: &Path, extra: &[&str]) -> Daemon {
        let mut cmd = match netns {
            Some(ns) => {
                let mut c = std::process::Command::new("nsenter");
                c.arg(format!("--net=/var/run/netns/{ns}"))
                    .arg(env!("CARGO_BIN_EXE_spore"));
                c
            }
            None => super::spore(),
        };
        let mut child = cmd
            .args(["serve", "--listen", listen, "--state-dir"])
            .arg(state_dir)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting spore serve");
        let mut out = child.stdout.take().expect("stdout");
        let mut line = Vec::new();
        let mut byte = [0u8; 1];
        while out.read(&mut byte).map(|n| n == 1).unwrap_or(false) && byte[0] != b'\n' {
            line.push(byte[0]);
        }
        let v: serde_json::Value = serde_json::from_slice(&line).unwrap_or_else(|e| {
            panic!(
                "spore serve printed {:?}: {e}",
                String::from_utf8_lossy(&line)
            )
        });
        let addr = v["listen"].as_str().expect("listen address").to_string();
        Daemon {
            child,
            addr,
            url_addr: v["url_listen"].as_str().map(str::to_string),
            sandbox_addr: v["sandbox_listen"].as_str().map(str::to_string),
            state_dir: state_dir.to_path_buf(),
        }
    }

    pub fn request(
        &self,
        method: &str,
        path: &str,
        body: &[u8],
        headers: &[(&str, &str)],
    ) -> Response {
        http(&self.addr, method, path, body, headers)
    }

    /// Creates a `spore-uk` function from a unikernel app.
    pub fn create(&self, name: &str, app: &str, extra: serde_json::Value) -> Response {
        let mut body = serde_json::json!({
            "FunctionName": name,
            "Runtime": "spore-uk",
            "Handler": app,
            "Role": "arn:aws:iam::000000000000:role/test",
            "Code": { "ZipFile": zip_b64(&[(app, &std::fs::read(super::uk_image(app)).unwrap())]) },
            "MemorySize": 64,
        });
        if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
            for (k, v) in e {
                b.insert(k.clone(), v.clone());
            }
        }
        self.request(
            "POST",
            "/2015-03-31/functions",
            body.to_string().as_bytes(),
            &[],
        )
    }

    /// UpdateFunctionCode: the unikernel app `app` stored under the
    /// function's handler name `handler`.
    pub fn update_code(&self, name: &str, handler: &str, app: &str) -> Response {
        let zip = zip_b64(&[(handler, &std::fs::read(super::uk_image(app)).unwrap())]);
        self.request(
            "PUT",
            &format!("/2015-03-31/functions/{name}/code"),
            serde_json::json!({ "ZipFile": zip }).to_string().as_bytes(),
            &[],
        )
    }

    pub fn invoke(&self, name: &str, payload: &[u8]) -> Response {
        self.request(
            "POST",
            &format!("/2015-03-31/functions/{name}/invocations"),
            payload,
            &[],
        )
    }

    /// UpdateFunctionConfiguration: the environment variable `STAGE` (which
    /// fn-echo reports for `{"env":"STAGE"}`) set to `stage`.
    pub fn set_stage(&self, name: &str, stage: &str) {
        let body = serde_json::json!({ "Environment": { "Variables": { "STAGE": stage } } });
        let r = self.request(
            "PUT",
            &format!("/2015-03-31/functions/{name}/configuration"),
            body.to_string().as_bytes(),
            &[],
        );
        assert_eq!(r.status, 200, "{}", r.text());
    }

    /// The value of a Prometheus sample line starting with `prefix`.
    pub fn metric(&self, prefix: &str) -> f64 {
        let m = self.request("GET", "/metrics", b"", &[]);
        m.text()
            .lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    }

    /// Pids of `spore vmm` processes serving sockets under this daemon's state.
    pub fn vmm_pids(&self) -> Vec<i32> {
        vmm_pids_under(&self.state_dir)
    }

    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // SIGTERM: the daemon ends its instances.
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        for _ in 0..100 {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        for pid in vmm_pids_under(&self.state_dir) {
            // SAFETY: a leftover VMM of this test's state directory.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// The pid of the guardian of the daemon of `state_dir` (spore_serve::guardian).
pub fn guardian_pid(state_dir: &Path) -> Option<i32> {
    let marker = state_dir.display().to_string();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()))
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                let c = String::from_utf8_lossy(&c).replace('\0', " ");
                c.contains("--guardian-fd") && c.contains(&marker)
            })
        })
}

pub fn vmm_pids_under(state_dir: &Path) -> Vec<i32> {
    let marker = state_dir.display().to_string();
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        // A clone factory runs no VM (the clones it forked share its command line).
        let comm = std::fs::read(format!("/proc/{pid}/comm")).unwrap_or_default();
        if spore_vmm::clone::factory::is_factory(&cmd, &comm) {
            continue;
        }
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        // Zombies have an empty command line and are not running.
        if cmd.contains(" vmm ") && cmd.contains(&marker) {
            out.push(pid);
        }
    }
    out
}

pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    /// The Lambda exception a 4xx names.
    pub fn error_type(&self) -> Option<&str> {
        self.header("x-amzn-errortype")
    }
}

/// One HTTP/1.1 request with `Connection: close`.
pub fn http(
    addr: &str,
    method: &str,
    path: &str,
    body: &[u8],
    headers: &[(&str, &str)],
) -> Response {
    let mut s = TcpStream::connect(addr).expect("connecting to spore serve");
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    // A request the server refuses early (413) may close before the whole
    // body is sent: a failed write is not the test's failure.
    let _ = s.write_all(req.as_bytes()).and_then(|_| s.write_all(body));
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| {
            panic!(
                "no HTTP response to {method} {path}: {:?}",
                String::from_utf8_lossy(&raw)
            )
        });
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .expect("status line");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    Response {
        status,
        headers,
        body: raw[split + 4..].to_vec(),
    }
}

/// A zip of `(name, bytes)` entries, base64.
pub fn zip_b64(entries: &[(&str, &[u8])]) -> String {
    let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    for (name, data) in entries {
        w.start_file(*name, zip::write::SimpleFileOptions::default())
            .unwrap();
        w.write_all(data).unwrap();
    }
    base64::engine::general_purpose::STANDARD.encode(w.finish().unwrap().into_inner())
}

/// Waits (at most `limit`) for the snapshot the first cold boot of
/// function `f` version `version` writes from its zygote in the background.
pub fn wait_for_snapshot(state: &Path, f: &str, version: u32, limit: Duration) {
    let file = state.join(format!("snapshots/{f}-v{version}/vm.state"));
    let deadline = std::time::Instant::now() + limit;
    while !file.is_file() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(file.is_file(), "no snapshot at {}", file.display());
}
