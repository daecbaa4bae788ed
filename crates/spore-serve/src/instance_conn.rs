//! The host end of the function invoke protocol ([`spore_abi::function`]):
//! one connection to a function instance through its VMM's vsock Unix
//! socket. The guest is untrusted: every frame header is checked with
//! `FrameHeader::decode` and its lengths bounded before anything is read.
//!
//! A connection starts with `Ready` (a spore-uk guest, or a Linux guest that
//! is configured: a clone or a restore), or with `Standby` (a freshly booted
//! Linux guest): the host then sends `Configure` and gets `Ready`, or
//! `InitError` when the function's init failed (Lambda's init error, which
//! becomes the invocation's answer).
//!
//! While it waits for a result the host takes `Log` frames, the parts of the
//! invocation's log a spore-uk guest sends before its result (a Linux guest
//! sends none): kept in the connection, bounded like a result's log, so that
//! an invocation whose instance dies before answering still has what the
//! function logged ([`InstanceConn::take_streamed_log`]).

use std::path::Path;
use std::time::{Duration, Instant};

use spore_abi::function::{FrameHeader, Kind, HEADER_SIZE, INVOKE_VSOCK_PORT, MAX_LOG};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

#[derive(Debug, thiserror::Error)]
pub enum InvokeError {
    #[error("cannot reach the instance: {0}")]
    Connect(String),
    /// The connection ended (the guest exited, crashed or reset it).
    #[error("the instance closed the connection")]
    Closed,
    #[error("the instance broke the protocol: {0}")]
    Protocol(String),
    /// The guest waits in `Standby` for a Configure its runtime has not:
    /// asking again cannot help.
    #[error(
        "the instance broke the protocol: the guest sent Standby, and its runtime has no Configure"
    )]
    Unconfigured,
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    /// The function's init failed (`InitError`): `ok` is false, the body is
    /// Lambda's error JSON, the log the init's.
    #[error("the function's init failed: {}", String::from_utf8_lossy(&.0.body))]
    Init(InvokeResult),
}

/// What the guest answered.
#[derive(Clone, Debug)]
pub struct InvokeResult {
    /// False for a function error (body = Lambda's error JSON).
    pub ok: bool,
    pub body: Vec<u8>,
    pub log: Vec<u8>,
    pub handler_ns: u64,
}

/// An open connection to a ready instance.
pub struct InstanceConn {
    stream: BufReader<UnixStream>,
    /// The guest's init time (µs) from its `Ready`.
    pub init_us: u64,
    /// The `Log` frames of the current (or last, unanswered) invocation,
    /// their last `MAX_LOG` bytes. Here rather than in `invoke`'s future,
    /// so that an invocation that timed out (its future dropped) keeps them
    /// too.
    streamed_log: Vec<u8>,
}

impl InstanceConn {
    /// Connects through the hybrid-vsock socket (`CONNECT <port>` → `OK`),
    /// retrying while the guest is not listening yet, and waits for `Ready`;
    /// a guest that sends `Standby` gets `configure` first (a runtime
    /// without one makes that a protocol error). All of it, the function's
    /// init included, within `limit`; an init error ends it at once.
    pub async fn connect(
        uds: &Path,
        limit: Duration,
        configure: Option<&[u8]>,
    ) -> Result<Self, InvokeError> {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            // A guest that accepts and then never answers must not hold the
            // start forever.
            let attempt = tokio::time::timeout(left, Self::try_connect(uds, configure)).await;
            match attempt {
                Ok(Ok(c)) => return Ok(c),
                Ok(Err(e @ (InvokeError::Init(_) | InvokeError::Unconfigured))) => return Err(e),
                Ok(Err(e)) if Instant::now() >= deadline => {
                    return Err(InvokeError::Connect(format!("{e} (after {limit:?})")))
                }
                Err(_) => return Err(InvokeError::Connect(format!("no Ready within {limit:?}"))),
                Ok(Err(_)) => tokio::time::sleep(Duration::from_micros(500)).await,
            }
        }
    }

    /// Connects to a freshly booted Linux guest and waits (at most `limit`)
    /// for its `Standby`: the runtime initialised, no function attached. The
    /// connection is returned open, so the guest stays waiting for
    /// `Configure` while the host snapshots it (a base snapshot).
    pub async fn standby(uds: &Path, limit: Duration) -> Result<StandbyConn, InvokeError> {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let attempt = tokio::time::timeout(left, async {
                let mut stream = handshake(uds).await?;
                let header = read_header(&mut stream).await?;
                match header.kind {
                    Kind::Standby => Ok(StandbyConn {
                        _stream: stream,
                        since_start_us: header.arg,
                    }),
                    k => Err(InvokeError::Protocol(format!(
                        "expected Standby, got {k:?}"
                    ))),
                }
            })
            .await;
            match attempt {
                Ok(Ok(c)) => return Ok(c),
                Ok(Err(e @ InvokeError::Protocol(_))) => return Err(e),
                Ok(Err(e)) if Instant::now() >= deadline => {
                    return Err(InvokeError::Connect(format!("{e} (after {limit:?})")))
                }
                Err(_) => return Err(InvokeError::Connect(format!("no Standby within {limit:?}"))),
                Ok(Err(_)) => tokio::time::sleep(Duration::from_millis(1)).await,
            }
        }
    }

    async fn try_connect(uds: &Path, configure: Option<&[u8]>) -> Result<Self, InvokeError> {
        let mut stream = handshake(uds).await?;
        let mut header = read_header(&mut stream).await?;
        if header.kind == Kind::Standby {
            let Some(config) = configure else {
                return Err(InvokeError::Unconfigured);
            };
            send_configure(stream.get_mut(), config).await?;
            header = read_header(&mut stream).await?;
        }
        match header.kind {
            Kind::Ready => Ok(InstanceConn {
                stream,
                init_us: header.arg,
                streamed_log: Vec::new(),
            }),
            Kind::InitError => {
                let (body, log) = read_body_and_log(&mut stream, &header).await?;
                Err(InvokeError::Init(InvokeResult {
                    ok: false,
                    body,
                    log,
                    handler_ns: header.arg,
                }))
            }
            k => Err(InvokeError::Protocol(format!("expected Ready, got {k:?}"))),
        }
    }

    /// Sends one invocation and reads its result; its log is what the guest
    /// sent in `Log` frames before it, then the result's log.
    pub async fn invoke(
        &mut self,
        request_id: &str,
        payload: &[u8],
        deadline_unix_ms: u64,
    ) -> Result<InvokeResult, InvokeError> {
        let header = FrameHeader {
            kind: Kind::Invoke,
            len_a: u32::try_from(request_id.len())
                .map_err(|_| InvokeError::Protocol("request id too large".into()))?,
            len_b: u32::try_from(payload.len())
                .map_err(|_| InvokeError::Protocol("payload too large".into()))?,
            arg: deadline_unix_ms,
        };
        // Checked like any frame, so the daemon never sends one the guest
        // must refuse.
        FrameHeader::decode(&header.encode())
            .map_err(|e| InvokeError::Protocol(format!("invoke frame: {e:?}")))?;
        let mut frame = Vec::with_capacity(HEADER_SIZE + request_id.len() + payload.len());
        frame.extend_from_slice(&header.encode());
        frame.extend_from_slice(request_id.as_bytes());
        frame.extend_from_slice(payload);
        self.streamed_log.clear();
        let s = self.stream.get_mut();
        s.write_all(&frame).await.map_err(closed)?;
        let header = loop {
            let header = read_header(&mut self.stream).await?;
            if header.kind != Kind::Log {
                break header;
            }
            // At most MAX_LOG bytes (FrameHeader::decode), then only the
            // tail is kept: a guest that streams forever is bounded in
            // memory here and in time by the invocation's timeout.
            let mut part = vec![0u8; header.len_b as usize];
            self.stream.read_exact(&mut part).await.map_err(closed)?;
            append_tail(&mut self.streamed_log, &part);
        };
        let ok = match header.kind {
            Kind::ResultOk => true,
            Kind::ResultError => false,
            k => {
                return Err(InvokeError::Protocol(format!(
                    "expected a result, got {k:?}"
                )))
            }
        };
        let (body, rest) = read_body_and_log(&mut self.stream, &header).await?;
        let mut log = std::mem::take(&mut self.streamed_log);
        append_tail(&mut log, &rest);
        Ok(InvokeResult {
            ok,
            body,
            log,
            handler_ns: header.arg,
        })
    }

    /// What the guest sent in `Log` frames during the last invocation, if
    /// that invocation got no result (the connection broke, or it timed
    /// out): the function's log up to then.
    pub fn take_streamed_log(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.streamed_log)
    }
}

/// Appends `data` to `log`, keeping its last `MAX_LOG` bytes: an
/// invocation's log is bounded as one result's is.
fn append_tail(log: &mut Vec<u8>, data: &[u8]) {
    let cap = MAX_LOG as usize;
    let data = &data[data.len().saturating_sub(cap)..];
    let overflow = (log.len() + data.len()).saturating_sub(cap);
    log.drain(..overflow.min(log.len()));
    log.extend_from_slice(data);
}

/// A connection held open to a guest in `Standby`.
pub struct StandbyConn {
    _stream: BufReader<UnixStream>,
    /// The guest's `Standby` `arg`: µs since its agent started.
    pub since_start_us: u64,
}

/// Opens the hybrid-vsock socket and asks for the invoke port
/// (`CONNECT <port>` → `OK <port>`).
async fn handshake(uds: &Path) -> Result<BufReader<UnixStream>, InvokeError> {
    let stream = UnixStream::connect(uds).await?;
    let mut stream = BufReader::new(stream);
    stream
        .get_mut()
        .write_all(format!("CONNECT {INVOKE_VSOCK_PORT}\n").as_bytes())
        .await?;
    let mut line = String::new();
    // `OK <port>\n` is short; a peer that sends more is not our VMM.
    let n = (&mut stream).take(64).read_line(&mut line).await?;
    if n == 0 || !line.starts_with("OK ") {
        return Err(InvokeError::Connect(format!(
            "vsock handshake: {:?}",
            line.trim()
        )));
    }
    Ok(stream)
}

/// A `Configure` frame, checked like any frame (its JSON is bounded by
/// `MAX_CONFIG`).
async fn send_configure(stream: &mut UnixStream, config: &[u8]) -> Result<(), InvokeError> {
    let header = FrameHeader {
        kind: Kind::Configure,
        len_a: u32::try_from(config.len())
            .map_err(|_| InvokeError::Protocol("Configure JSON too large".into()))?,
        len_b: 0,
        arg: 0,
    };
    FrameHeader::decode(&header.encode())
        .map_err(|e| InvokeError::Protocol(format!("configure frame: {e:?}")))?;
    let mut frame = Vec::with_capacity(HEADER_SIZE + config.len());
    frame.extend_from_slice(&header.encode());
    frame.extend_from_slice(config);
    stream.write_all(&frame).await.map_err(closed)
}

/// The body and log after a result or `InitError` header (lengths already
/// bounded by `FrameHeader::decode`).
async fn read_body_and_log(
    stream: &mut BufReader<UnixStream>,
    header: &FrameHeader,
) -> Result<(Vec<u8>, Vec<u8>), InvokeError> {
    let mut body = vec![0u8; header.len_a as usize];
    stream.read_exact(&mut body).await.map_err(closed)?;
    let mut log = vec![0u8; header.len_b as usize];
    stream.read_exact(&mut log).await.map_err(closed)?;
    Ok((body, log))
}

async fn read_header(stream: &mut BufReader<UnixStream>) -> Result<FrameHeader, InvokeError> {
    let mut raw = [0u8; HEADER_SIZE];
    stream.read_exact(&mut raw).await.map_err(closed)?;
    FrameHeader::decode(&raw).map_err(|e| InvokeError::Protocol(format!("{e:?}")))
}

fn closed(e: std::io::Error) -> InvokeError {
    match e.kind() {
        std::io::ErrorKind::UnexpectedEof
        | std::io::ErrorKind::ConnectionReset
        | std::io::ErrorKind::BrokenPipe => InvokeError::Closed,
        _ => InvokeError::Io(e),
    }
}

#[cfg(test)]
mod tests {
    use tokio::net::UnixListener;

    use super::*;

    /// What the fake guest does on a connection after the vsock handshake.
    #[derive(Clone, Copy)]
    enum Guest {
        /// A configured guest (spore-uk, a clone, a restore).
        Ready,
        /// A fresh Linux guest whose function initialises.
        StandbyThenReady,
        /// A fresh Linux guest whose function's import fails.
        StandbyThenInitError,
        /// A spore-uk guest whose handler sends `Log` frames, then answers.
        LogsThenAnswers,
        /// A spore-uk guest whose handler sends a `Log` frame, then dies.
        LogsThenDies,
        /// A guest that sends a `Log` frame with a body part.
        BadLog,
    }

    fn frame(kind: Kind, a: &[u8], b: &[u8], arg: u64) -> Vec<u8> {
        let h = FrameHeader {
            kind,
            len_a: u32::try_from(a.len()).expect("a test frame's part fits a u32"),
            len_b: u32::try_from(b.len()).expect("a test frame's part fits a u32"),
            arg,
        };
        let mut out = h.encode().to_vec();
        out.extend_from_slice(a);
        out.extend_from_slice(b);
        out
    }

    async fn read_frame(s: &mut BufReader<UnixStream>) -> (FrameHeader, Vec<u8>, Vec<u8>) {
        let h = read_header(s).await.unwrap();
        let mut a = vec![0; h.len_a as usize];
        s.read_exact(&mut a).await.unwrap();
        let mut b = vec![0; h.len_b as usize];
        s.read_exact(&mut b).await.unwrap();
        (h, a, b)
    }

    /// A fake VMM vsock socket with one guest behind it, serving one
    /// connection; returns the Configure JSON it got, if any.
    async fn fake_guest(
        dir: &Path,
        guest: Guest,
    ) -> (std::path::PathBuf, tokio::task::JoinHandle<Option<Vec<u8>>>) {
        let path = dir.join(format!("v{}.sock", guest as u8));
        let listener = UnixListener::bind(&path).unwrap();
        let task = tokio::spawn(async move {
            let (s, _) = listener.accept().await.unwrap();
            let mut s = BufReader::new(s);
            let mut line = String::new();
            s.read_line(&mut line).await.unwrap();
            assert_eq!(line, format!("CONNECT {INVOKE_VSOCK_PORT}\n"));
            s.get_mut().write_all(b"OK 1073741824\n").await.unwrap();
            let mut configured = None;
            if matches!(guest, Guest::StandbyThenReady | Guest::StandbyThenInitError) {
                s.get_mut()
                    .write_all(&frame(Kind::Standby, b"", b"", 5))
                    .await
                    .unwrap();
                let (h, json, _) = read_frame(&mut s).await;
                assert_eq!(h.kind, Kind::Configure);
                configured = Some(json);
            }
            if let Guest::StandbyThenInitError = guest {
                let body = br#"{"errorMessage":"Unable to import module 'app': No module named 'app'","errorType":"Runtime.ImportModuleError"}"#;
                s.get_mut()
                    .write_all(&frame(Kind::InitError, body, b"init log\n", 7))
                    .await
                    .unwrap();
                return configured;
            }
            s.get_mut()
                .write_all(&frame(Kind::Ready, b"", b"", 42))
                .await
                .unwrap();
            let (h, id, payload) = read_frame(&mut s).await;
            assert_eq!(h.kind, Kind::Invoke);
            assert_eq!(id, b"req-1");
            match guest {
                Guest::LogsThenAnswers => {
                    let full = vec![b'x'; MAX_LOG as usize];
                    for part in [&full[..], b"a\n"] {
                        s.get_mut()
                            .write_all(&frame(Kind::Log, b"", part, 0))
                            .await
                            .unwrap();
                    }
                }
                Guest::LogsThenDies => {
                    s.get_mut()
                        .write_all(&frame(Kind::Log, b"", b"before the end\n", 0))
                        .await
                        .unwrap();
                    return configured;
                }
                Guest::BadLog => {
                    s.get_mut()
                        .write_all(&frame(Kind::Log, b"x", b"y", 0))
                        .await
                        .unwrap();
                    return configured;
                }
                _ => {}
            }
            let mut answer = b"echo:".to_vec();
            answer.extend_from_slice(&payload);
            s.get_mut()
                .write_all(&frame(Kind::ResultOk, &answer, b"log\n", 9))
                .await
                .unwrap();
            configured
        });
        (path, task)
    }

    fn scratch() -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "spore-invoke-test-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    const LIMIT: Duration = Duration::from_secs(5);

    #[tokio::test]
    async fn ready_guest_needs_no_configure() {
        let dir = scratch();
        let (path, guest) = fake_guest(&dir, Guest::Ready).await;
        // A spore-uk function has no Configure; a Linux one's is unused here.
        let mut conn = InstanceConn::connect(&path, LIMIT, None).await.unwrap();
        assert_eq!(conn.init_us, 42);
        let r = conn.invoke("req-1", b"{}", 0).await.unwrap();
        assert!(r.ok);
        assert_eq!(r.body, b"echo:{}");
        assert_eq!(guest.await.unwrap(), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn standby_gets_configure_then_ready() {
        let dir = scratch();
        let (path, guest) = fake_guest(&dir, Guest::StandbyThenReady).await;
        let config = br#"{"function_name":"f","handler":"app.handler"}"#;
        let mut conn = InstanceConn::connect(&path, LIMIT, Some(config))
            .await
            .unwrap();
        assert_eq!(conn.init_us, 42);
        let r = conn.invoke("req-1", b"[1]", 0).await.unwrap();
        assert_eq!(
            (r.ok, r.body.as_slice(), r.log.as_slice()),
            (true, &b"echo:[1]"[..], &b"log\n"[..])
        );
        assert_eq!(guest.await.unwrap().as_deref(), Some(&config[..]));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn log_frames_come_before_the_result_bounded() {
        let dir = scratch();
        let (path, guest) = fake_guest(&dir, Guest::LogsThenAnswers).await;
        let mut conn = InstanceConn::connect(&path, LIMIT, None).await.unwrap();
        let r = conn.invoke("req-1", b"{}", 0).await.unwrap();
        assert_eq!((r.ok, r.body.as_slice()), (true, &b"echo:{}"[..]));
        // The streamed parts, then the result's log, its last MAX_LOG bytes.
        assert_eq!(r.log.len(), MAX_LOG as usize);
        assert!(r.log.ends_with(b"xa\nlog\n"));
        assert!(conn.take_streamed_log().is_empty());
        guest.await.unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn a_guest_that_dies_leaves_what_it_streamed() {
        let dir = scratch();
        let (path, guest) = fake_guest(&dir, Guest::LogsThenDies).await;
        let mut conn = InstanceConn::connect(&path, LIMIT, None).await.unwrap();
        let err = conn.invoke("req-1", b"{}", 0).await.err().unwrap();
        assert!(matches!(err, InvokeError::Closed), "{err}");
        assert_eq!(conn.take_streamed_log(), b"before the end\n");
        guest.await.unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn a_log_frame_with_a_body_breaks_the_protocol() {
        let dir = scratch();
        let (path, guest) = fake_guest(&dir, Guest::BadLog).await;
        let mut conn = InstanceConn::connect(&path, LIMIT, None).await.unwrap();
        let err = conn.invoke("req-1", b"{}", 0).await.err().unwrap();
        assert!(matches!(err, InvokeError::Protocol(_)), "{err}");
        guest.await.unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn init_error_is_returned_at_once() {
        let dir = scratch();
        let (path, guest) = fake_guest(&dir, Guest::StandbyThenInitError).await;
        let started = Instant::now();
        let err = InstanceConn::connect(&path, LIMIT, Some(b"{}"))
            .await
            .err()
            .unwrap();
        let InvokeError::Init(r) = err else {
            panic!("expected an init error, got {err}");
        };
        assert!(!r.ok);
        assert!(String::from_utf8_lossy(&r.body).contains("Runtime.ImportModuleError"));
        assert_eq!(r.log, b"init log\n");
        // Not retried until the limit.
        assert!(started.elapsed() < LIMIT);
        guest.await.unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn standby_without_configure_is_a_protocol_error() {
        let dir = scratch();
        let path = dir.join("v.sock");
        let listener = UnixListener::bind(&path).unwrap();
        tokio::spawn(async move {
            // Every connection: handshake, Standby, then closed.
            while let Ok((mut s, _)) = listener.accept().await {
                let mut line = [0u8; 64];
                let _ = s.read(&mut line).await;
                let _ = s.write_all(b"OK 1\n").await;
                let _ = s.write_all(&frame(Kind::Standby, b"", b"", 1)).await;
            }
        });
        // The limit only bounds waiting for a guest: this one answers at
        // once (200 ms was too little on a loaded 2-core CI machine).
        let started = Instant::now();
        let err = InstanceConn::connect(&path, Duration::from_secs(10), None)
            .await
            .err()
            .unwrap();
        assert!(err.to_string().contains("Standby"), "{err}");
        assert!(matches!(err, InvokeError::Unconfigured), "{err}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "not retried to the limit"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
