//! The daemon's side of a sandbox's envd: reached over the VMM's
//! hybrid-vsock socket (`CONNECT <port>` → `OK <port>`, as Firecracker's
//! vsock device answers), then plain HTTP/1.1. Used to wait for a sandbox's
//! envd to answer and to give it its settings (`/init`); the proxy
//! (`super::proxy`) opens its connections the same way.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

/// envd's port in the guest (E2B's, which the SDK names).
pub const ENVD_PORT: u16 = 49983;

/// The envd version spore-envd reports (the SDK enables features by it).
pub const ENVD_VERSION: &str = "0.5.7";

/// How long connecting may take in all, retries included (a guest that does
/// not accept on the port leaves the handshake unanswered). A guest starved
/// of CPU (a loaded host; nested emulation, where a clone's clock was seen
/// 13 s behind after such a stretch) misses several of the VMM's 2 s
/// windows and then answers; one that is gone fails after this.
const CONNECT_LIMIT: Duration = Duration::from_secs(20);

/// The pause before envd's port is tried again after the VMM closed a
/// handshake. The VMM gives the guest 2 s to accept a connection, as
/// Firecracker does; a guest busy past that (a loaded host) or an envd
/// being restarted by the guest's PID 1 (200 ms) is worth another try.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// A stream to `port` in the guest behind the VMM's vsock socket `uds`.
/// For envd's port a handshake the VMM closed is tried again until
/// [`CONNECT_LIMIT`]: envd always listens, so a refusal is passing. Other
/// ports answer at once: a closed one is the user's to open (502).
pub async fn connect(uds: &Path, port: u16) -> anyhow::Result<UnixStream> {
    tokio::time::timeout(CONNECT_LIMIT, connect_retrying(uds, port))
        .await
        .map_err(|_| anyhow!("the guest did not accept a connection to port {port}"))?
}

async fn connect_retrying(uds: &Path, port: u16) -> anyhow::Result<UnixStream> {
    loop {
        match handshake(uds, port).await {
            Err(Handshake::Closed(e)) if port == ENVD_PORT => {
                tracing::debug!("vsock port {port}: {e:#}; trying again");
                tokio::time::sleep(RETRY_PAUSE).await;
            }
            Err(Handshake::Closed(e) | Handshake::Failed(e)) => return Err(e),
            Ok(stream) => return Ok(stream),
        }
    }
}

/// Why a handshake failed.
enum Handshake {
    /// The VMM closed the connection before its answer: the guest refused
    /// the port or did not answer in time.
    Closed(anyhow::Error),
    /// Anything else: the VMM is gone, or answered what it should not.
    Failed(anyhow::Error),
}

async fn handshake(uds: &Path, port: u16) -> Result<UnixStream, Handshake> {
    let mut stream = UnixStream::connect(uds)
        .await
        .with_context(|| format!("connecting to {}", uds.display()))
        .map_err(Handshake::Failed)?;
    stream
        .write_all(format!("CONNECT {port}\n").as_bytes())
        .await
        .context("vsock handshake")
        .map_err(Handshake::Failed)?;
    // Byte by byte up to the newline: what follows it is the guest's.
    let mut line = Vec::with_capacity(16);
    loop {
        let b = match stream.read_u8().await {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && line.is_empty() => {
                return Err(Handshake::Closed(
                    anyhow::Error::new(e).context("vsock handshake"),
                ))
            }
            Err(e) => {
                return Err(Handshake::Failed(
                    anyhow::Error::new(e).context("vsock handshake"),
                ))
            }
        };
        if b == b'\n' {
            break;
        }
        line.push(b);
        if line.len() > 64 {
            return Err(Handshake::Failed(anyhow!(
                "vsock handshake: an answer too long for the VMM's"
            )));
        }
    }
    if !line.starts_with(b"OK ") {
        return Err(Handshake::Failed(anyhow!(
            "vsock handshake: {:?}",
            String::from_utf8_lossy(&line).trim()
        )));
    }
    Ok(stream)
}

/// One request to envd; its status and body.
pub async fn request(
    uds: &Path,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&serde_json::Value>,
) -> anyhow::Result<(hyper::StatusCode, Bytes)> {
    let stream = connect(uds, ENVD_PORT).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "envd");
    if let Some(t) = token {
        req = req.header("x-access-token", t);
    }
    let payload = match body {
        Some(v) => {
            req = req.header("content-type", "application/json");
            Bytes::from(v.to_string())
        }
        None => Bytes::new(),
    };
    let resp = sender.send_request(req.body(Full::new(payload))?).await?;
    let status = resp.status();
    let bytes = resp.into_body().collect().await?.to_bytes();
    Ok((status, bytes))
}

/// Writes `bytes` to `path` in the guest (envd's `POST /files`, as root).
pub async fn upload(uds: &Path, path: &str, bytes: &[u8]) -> anyhow::Result<()> {
    let stream = connect(uds, ENVD_PORT).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let query = format!("/files?path={}&username=root", crate::percent::encode(path));
    let req = hyper::Request::builder()
        .method("POST")
        .uri(query)
        .header("host", "envd")
        .header("content-type", "application/octet-stream")
        .body(Full::new(Bytes::copy_from_slice(bytes)))?;
    let resp = sender.send_request(req).await?;
    let status = resp.status();
    if !status.is_success() {
        let body = resp.into_body().collect().await?.to_bytes();
        bail!(
            "envd answered {status} to the upload of {path}: {}",
            String::from_utf8_lossy(&body).trim()
        );
    }
    Ok(())
}

/// Waits until envd answers `/health` (a booting or restored guest), up to
/// `limit`.
pub async fn wait_healthy(uds: &Path, limit: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        let last = match request(uds, "GET", "/health", None, None).await {
            Ok((s, _)) if s.is_success() => return Ok(()),
            Ok((s, _)) => format!("answered {s}"),
            Err(e) => format!("{e:#}"),
        };
        if Instant::now() >= deadline {
            bail!("envd did not answer within {limit:?} ({last})");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `POST /init`: `current` is the access token envd holds now (a clone
/// holds its source's), `settings` the fields to set.
pub async fn init(
    uds: &Path,
    current: Option<&str>,
    settings: &serde_json::Value,
) -> anyhow::Result<()> {
    let (status, body) = request(uds, "POST", "/init", current, Some(settings)).await?;
    if !status.is_success() {
        bail!(
            "envd refused /init: {status}: {}",
            String::from_utf8_lossy(&body)
        );
    }
    Ok(())
}

/// Most bytes of a command's answer [`run`] reads.
const RUN_ANSWER_LIMIT: usize = 1 << 20;

/// What a command run in the guest ended with.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Ran {
    /// `-1` when a signal ended it.
    pub exit_code: i32,
    /// The end of its stdout and stderr (at most 2 KiB), for messages.
    pub output: String,
    /// All it wrote to each (within the answer's 1 MiB limit).
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// Runs `cmd` in the guest as `user` (`/bin/bash -l -c CMD` with `env`
/// added to its environment, through envd's `process.Process/Start`, a
/// Connect JSON server stream) to its end.
pub async fn run(uds: &Path, user: &str, cmd: &str, env: &[(&str, &str)]) -> anyhow::Result<Ran> {
    run_with_token(uds, user, cmd, env, None).await
}

/// [`run`] on an envd that holds an access token (`/init` gave it one).
pub async fn run_with_token(
    uds: &Path,
    user: &str,
    cmd: &str,
    env: &[(&str, &str)],
    token: Option<&str>,
) -> anyhow::Result<Ran> {
    use base64::Engine as _;
    let envs: serde_json::Map<String, serde_json::Value> = env
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).into()))
        .collect();
    let msg = serde_json::json!({
        "process": { "cmd": "/bin/bash", "args": ["-l", "-c", cmd], "envs": envs }
    })
    .to_string();
    let mut body = vec![0u8];
    body.extend_from_slice(&u32::try_from(msg.len())?.to_be_bytes());
    body.extend_from_slice(msg.as_bytes());
    let stream = connect(uds, ENVD_PORT).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("{user}:"));
    let mut req = hyper::Request::builder()
        .method("POST")
        .uri("/process.Process/Start")
        .header("host", "envd")
        .header("content-type", "application/connect+json")
        .header("connect-protocol-version", "1")
        .header("authorization", format!("Basic {basic}"));
    if let Some(t) = token {
        req = req.header("x-access-token", t);
    }
    let resp = sender
        .send_request(req.body(Full::new(Bytes::from(body)))?)
        .await?;
    let status = resp.status();
    let answer = http_body_util::Limited::new(resp.into_body(), RUN_ANSWER_LIMIT)
        .collect()
        .await
        .map_err(|e| anyhow!("reading the command's stream: {e}"))?
        .to_bytes();
    if !status.is_success() {
        bail!(
            "envd refused to start the command: {status}: {}",
            String::from_utf8_lossy(&answer)
        );
    }
    parse_run(&answer)
}

/// [`run_with_token`] from synchronous code (`spore sandbox exec`), given
/// up after `limit`.
pub fn run_blocking(
    uds: &Path,
    user: &str,
    cmd: &str,
    token: Option<&str>,
    limit: Duration,
) -> anyhow::Result<Ran> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting an async runtime")?;
    rt.block_on(async {
        tokio::time::timeout(limit, run_with_token(uds, user, cmd, &[], token))
            .await
            .map_err(|_| anyhow!("the command did not end within {limit:?}"))?
    })
}

/// The exit code and output of a `process.Process/Start` stream's
/// messages (5-byte envelopes: flags, big-endian length).
fn parse_run(mut answer: &[u8]) -> anyhow::Result<Ran> {
    use base64::Engine as _;
    let mut output = Vec::new();
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let mut exit_code = None;
    while answer.len() >= 5 {
        let flags = answer[0];
        let len = u32::from_be_bytes([answer[1], answer[2], answer[3], answer[4]]) as usize;
        let Some(payload) = answer.get(5..5 + len) else {
            bail!("the command's stream ended inside a message");
        };
        answer = &answer[5 + len..];
        let v: serde_json::Value = serde_json::from_slice(payload)?;
        if flags & 0x02 != 0 {
            // The stream's end: an error, or nothing.
            if let Some(e) = v.get("error") {
                bail!("envd: {}", e["message"].as_str().unwrap_or("an error"));
            }
            break;
        }
        let event = &v["event"];
        for (key, all) in [("stdout", &mut stdout), ("stderr", &mut stderr)] {
            if let Some(b) = event["data"][key].as_str() {
                let bytes = base64::engine::general_purpose::STANDARD.decode(b)?;
                output.extend_from_slice(&bytes);
                all.extend(bytes);
            }
        }
        if event["end"].is_object() {
            // proto3 JSON leaves a zero exit code out.
            let code = event["end"]["exitCode"].as_i64().unwrap_or(0);
            exit_code = Some(i32::try_from(code).unwrap_or(-1));
        }
    }
    let exit_code = exit_code.context("the command's stream had no end")?;
    let tail = output.len().saturating_sub(2048);
    Ok(Ran {
        exit_code,
        output: String::from_utf8_lossy(&output[tail..]).trim().to_string(),
        stdout,
        stderr,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envelope(flags: u8, v: &serde_json::Value) -> Vec<u8> {
        let p = v.to_string();
        let mut out = vec![flags];
        out.extend_from_slice(&u32::try_from(p.len()).unwrap().to_be_bytes());
        out.extend_from_slice(p.as_bytes());
        out
    }

    #[test]
    fn a_commands_stream_gives_its_exit_code_and_output() {
        let mut s = envelope(0, &serde_json::json!({"event": {"start": {"pid": 7}}}));
        s.extend(envelope(
            0,
            &serde_json::json!({"event": {"data": {"stdout": "aGkK"}}}),
        ));
        s.extend(envelope(
            0,
            &serde_json::json!({"event": {"end": {"exitCode": 3, "exited": true}}}),
        ));
        s.extend(envelope(2, &serde_json::json!({})));
        assert_eq!(
            parse_run(&s).unwrap(),
            Ran {
                exit_code: 3,
                output: "hi".into(),
                stdout: b"hi\n".to_vec(),
                stderr: Vec::new(),
            }
        );
        // A zero exit code is left out.
        let ok = envelope(0, &serde_json::json!({"event": {"end": {"exited": true}}}));
        assert_eq!(parse_run(&ok).unwrap().exit_code, 0);
        // An error ending the stream, a stream cut short, no end at all.
        let err = envelope(
            2,
            &serde_json::json!({"error": {"code": "internal", "message": "boom"}}),
        );
        assert!(format!("{:#}", parse_run(&err).unwrap_err()).contains("boom"));
        // (The end message cut short: 7 bytes are the final envelope.)
        assert!(parse_run(&s[..s.len() - 7 - 3]).is_err());
        assert!(parse_run(&[]).is_err());
    }

    /// A directory of its own for one test, removed after it.
    struct Scratch(std::path::PathBuf);

    impl Scratch {
        fn new() -> Scratch {
            static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let dir =
                std::env::temp_dir().join(format!("spore-envd-test-{}-{n}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            Scratch(dir)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A fake VMM socket: closes the first `refusals` connections after
    /// reading the CONNECT line, then answers `OK`.
    fn fake_vmm(refusals: usize) -> (Scratch, std::path::PathBuf) {
        let dir = Scratch::new();
        let uds = dir.0.join("v.sock");
        let listener = std::os::unix::net::UnixListener::bind(&uds).unwrap();
        std::thread::spawn(move || {
            for (n, stream) in listener.incoming().enumerate() {
                let Ok(mut stream) = stream else { return };
                let mut line = String::new();
                let _ = std::io::BufRead::read_line(
                    &mut std::io::BufReader::new(&mut stream),
                    &mut line,
                );
                if n >= refusals {
                    let _ = std::io::Write::write_all(&mut stream, b"OK 1024\n");
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        });
        (dir, uds)
    }

    #[tokio::test]
    async fn envds_port_is_tried_again_when_the_vmm_closes_the_handshake() {
        let (_dir, uds) = fake_vmm(2);
        assert!(connect(&uds, ENVD_PORT).await.is_ok());
    }

    #[tokio::test]
    async fn another_port_the_guest_refuses_fails_at_once() {
        let (_dir, uds) = fake_vmm(1);
        let err = connect(&uds, 8000).await.unwrap_err();
        assert!(format!("{err:#}").contains("vsock handshake"), "{err:#}");
    }

    #[tokio::test]
    async fn a_vmm_that_is_gone_fails_at_once() {
        let dir = Scratch::new();
        let started = Instant::now();
        assert!(connect(&dir.0.join("none.sock"), ENVD_PORT).await.is_err());
        assert!(started.elapsed() < Duration::from_secs(1));
    }
}
