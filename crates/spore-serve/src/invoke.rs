//! The host end of the function invoke protocol ([`spore_abi::function`]):
//! one connection to a function instance through its VMM's vsock Unix
//! socket. The guest is untrusted: every frame header is checked with
//! `FrameHeader::decode` and its lengths bounded before anything is read.

use std::path::Path;
use std::time::{Duration, Instant};

use spore_abi::function::{FrameHeader, Kind, HEADER_SIZE, INVOKE_VSOCK_PORT};
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
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}

/// What the guest answered.
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
}

impl InstanceConn {
    /// Connects through the hybrid-vsock socket (`CONNECT <port>` → `OK`),
    /// retrying while the guest is not listening yet, and waits for `Ready`.
    pub async fn connect(uds: &Path, limit: Duration) -> Result<Self, InvokeError> {
        let deadline = Instant::now() + limit;
        loop {
            match Self::try_connect(uds).await {
                Ok(c) => return Ok(c),
                Err(e) if Instant::now() >= deadline => {
                    return Err(InvokeError::Connect(format!("{e} (after {limit:?})")))
                }
                Err(_) => tokio::time::sleep(Duration::from_micros(500)).await,
            }
        }
    }

    async fn try_connect(uds: &Path) -> Result<Self, InvokeError> {
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
        let header = read_header(&mut stream).await?;
        if header.kind != Kind::Ready {
            return Err(InvokeError::Protocol(format!(
                "expected Ready, got {:?}",
                header.kind
            )));
        }
        Ok(InstanceConn {
            stream,
            init_us: header.arg,
        })
    }

    /// Sends one invocation and reads its result.
    pub async fn invoke(
        &mut self,
        request_id: &str,
        payload: &[u8],
        deadline_unix_ms: u64,
    ) -> Result<InvokeResult, InvokeError> {
        let header = FrameHeader {
            kind: Kind::Invoke,
            len_a: request_id.len() as u32,
            len_b: payload.len() as u32,
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
        let s = self.stream.get_mut();
        s.write_all(&frame).await.map_err(closed)?;
        let header = read_header(&mut self.stream).await?;
        let ok = match header.kind {
            Kind::ResultOk => true,
            Kind::ResultError => false,
            k => {
                return Err(InvokeError::Protocol(format!(
                    "expected a result, got {k:?}"
                )))
            }
        };
        let mut body = vec![0u8; header.len_a as usize];
        self.stream.read_exact(&mut body).await.map_err(closed)?;
        let mut log = vec![0u8; header.len_b as usize];
        self.stream.read_exact(&mut log).await.map_err(closed)?;
        Ok(InvokeResult {
            ok,
            body,
            log,
            handler_ns: header.arg,
        })
    }
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
