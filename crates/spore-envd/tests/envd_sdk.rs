//! spore-envd driven by the e2b SDK (pinned in tests/serve/requirements.txt,
//! installed into the cache by scripts/ensure-pyclients.sh): each scenario in
//! tests/sandbox/envd_*.py runs against a fresh envd on the host, listening on
//! loopback, its users' homes in a temporary directory.
#![allow(
    clippy::tests_outside_test_module,
    reason = "an integration test crate"
)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The virtualenv with the pinned clients.
fn venv() -> PathBuf {
    let out = Command::new("bash")
        .arg(repo().join("scripts/ensure-pyclients.sh"))
        .stderr(Stdio::inherit())
        .output()
        .expect("run ensure-pyclients.sh");
    assert!(out.status.success(), "ensure-pyclients.sh failed");
    PathBuf::from(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .expect("a venv path")
            .trim(),
    )
}

/// An envd on loopback; killed when dropped.
struct Envd {
    child: Child,
    url: String,
}

impl Drop for Envd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_envd(home: &Path, token: &str) -> Envd {
    let mut child = Command::new(env!("CARGO_BIN_EXE_spore-envd"))
        .args(["--listen", "tcp:127.0.0.1:0", "--access-token", token])
        .arg("--home")
        .arg(home)
        .arg("--default-workdir")
        .arg(home)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start spore-envd");
    let stdout = child.stdout.take().expect("envd's stdout");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("envd's first line");
    let addr = line
        .trim()
        .strip_prefix("listening on tcp:")
        .unwrap_or_else(|| panic!("envd said {line:?}"));
    Envd {
        child,
        url: format!("http://{addr}"),
    }
}

fn scenario(name: &str) {
    let venv = venv();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let home = dir.path().join("home");
    std::fs::create_dir(&home).expect("create home");
    let token = "spore-envd-test-token";
    let envd = start_envd(&home, token);
    let script = repo().join("tests/sandbox").join(format!("{name}.py"));
    let status = Command::new(venv.join("bin/python"))
        .arg(&script)
        .env("E2B_SANDBOX_URL", &envd.url)
        .env("ENVD_TOKEN", token)
        .env("ENVD_HOME", &home)
        .env("PYTHONPATH", repo().join("tests/sandbox"))
        .env("PYTHONUNBUFFERED", "1")
        .status()
        .expect("run the scenario");
    assert!(status.success(), "{} failed", script.display());
}

#[test]
fn envd_process() {
    scenario("envd_process");
}

#[test]
fn envd_files() {
    scenario("envd_files");
}

/// A request refused before its body was read (here: a wrong access token)
/// is answered with `Connection: close`, so that no client reuses a
/// connection whose unread body hyper is about to drop it for.
#[test]
fn envd_refusal_closes_the_connection() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().expect("a temporary directory");
    let envd = start_envd(dir.path(), "right");
    let addr = envd.url.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).expect("connect to envd");
    let body = b"\x00\x00\x00\x00\x02{}";
    let head = format!(
        "POST /process.Process/Start HTTP/1.1\r\nHost: x\r\nX-Access-Token: wrong\r\n\
         Content-Type: application/connect+json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).expect("send the head");
    s.write_all(body).expect("send the body");
    let mut answer = String::new();
    s.read_to_string(&mut answer)
        .expect("read until envd closes");
    let lower = answer.to_ascii_lowercase();
    assert!(lower.starts_with("http/1.1 401"), "{answer}");
    assert!(lower.contains("connection: close"), "{answer}");
}
