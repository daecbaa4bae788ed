//! A small Lambda API client over one persistent HTTP/1.1 connection, for
//! `spore bench serve` and `spore fn`: a few requests of known shapes to a
//! local daemon, so no HTTP client crate is pulled in for it (and none sits
//! between a bench's clock and the socket).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;

use anyhow::{bail, Context as _};

/// One persistent HTTP/1.1 connection to `spore serve`.
pub struct Conn {
    stream: BufReader<TcpStream>,
    host: String,
}

pub struct Reply {
    pub status: u16,
    pub body: Vec<u8>,
    /// spore's `X-Spore-Start-Path` (empty if absent).
    pub path: String,
    /// spore's `X-Spore-Duration-Us` (NaN if absent).
    pub server_us: f64,
    /// `X-Amz-Function-Error` was set.
    pub function_error: bool,
    /// `x-amzn-ErrorType` of an error response.
    pub error_type: String,
    /// `X-Amz-Log-Result` (base64 of the log's tail), if the reply has one.
    pub log_result: Option<String>,
    /// spore's `X-Spore-Node`: the cluster node that ran it (empty if absent).
    pub node: String,
}

/// Bodies larger than this are not read (a daemon never sends them).
const MAX_REPLY: usize = 64 * 1024 * 1024;

impl Conn {
    /// Connects to `addr` (`host:port`, or an `http://host:port` URL).
    pub fn open(addr: &str) -> anyhow::Result<Conn> {
        let addr = addr.trim_start_matches("http://").trim_end_matches('/');
        let s = TcpStream::connect(addr)
            .with_context(|| format!("connecting to spore serve at {addr}"))?;
        s.set_nodelay(true)?;
        Ok(Conn {
            stream: BufReader::new(s),
            host: addr.to_string(),
        })
    }

    pub fn request(&mut self, method: &str, path: &str, body: &[u8]) -> anyhow::Result<Reply> {
        self.request_with(method, path, &[], body)
    }

    /// A request with extra headers (`name`, `value`; neither may hold a
    /// line break).
    pub fn request_with(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> anyhow::Result<Reply> {
        let mut extra = String::new();
        for (k, v) in headers {
            if [k, v].iter().any(|x| x.contains(['\r', '\n'])) {
                bail!("header {k:?} holds a line break");
            }
            extra.push_str(&format!("{k}: {v}\r\n"));
        }
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\n{extra}Content-Length: {}\r\n\r\n",
            self.host,
            body.len()
        );
        let s = self.stream.get_mut();
        s.write_all(head.as_bytes())?;
        s.write_all(body)?;
        let mut status_line = String::new();
        self.stream.read_line(&mut status_line)?;
        let status = status_line
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .with_context(|| format!("bad status line {status_line:?}"))?;
        let mut reply = Reply {
            status,
            body: Vec::new(),
            path: String::new(),
            server_us: f64::NAN,
            function_error: false,
            error_type: String::new(),
            log_result: None,
            node: String::new(),
        };
        let mut len = 0usize;
        loop {
            let mut line = String::new();
            if self.stream.read_line(&mut line)? == 0 {
                bail!("the connection closed in the response headers");
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((k, v)) = line.split_once(':') {
                let v = v.trim();
                match k.trim().to_ascii_lowercase().as_str() {
                    "content-length" => len = v.parse().unwrap_or(0),
                    "x-spore-start-path" => reply.path = v.to_string(),
                    "x-spore-duration-us" => reply.server_us = v.parse().unwrap_or(f64::NAN),
                    "x-amz-function-error" => reply.function_error = true,
                    "x-amzn-errortype" => reply.error_type = v.to_string(),
                    "x-amz-log-result" => reply.log_result = Some(v.to_string()),
                    "x-spore-node" => reply.node = v.to_string(),
                    _ => {}
                }
            }
        }
        if len > MAX_REPLY {
            bail!("a {len}-byte response is larger than any spore serve sends");
        }
        reply.body = vec![0u8; len];
        self.stream.read_exact(&mut reply.body)?;
        Ok(reply)
    }

    /// Invoke; an HTTP error (not a function error) is an `Err`.
    pub fn invoke(&mut self, name: &str, payload: &[u8]) -> anyhow::Result<Reply> {
        self.invoke_with_log(name, payload, false)
    }

    /// Invoke; with `log_tail`, asks for `LogType: Tail` (the reply's
    /// `log_result` then holds the base64 of the log's last 4 KB).
    pub fn invoke_with_log(
        &mut self,
        name: &str,
        payload: &[u8],
        log_tail: bool,
    ) -> anyhow::Result<Reply> {
        let headers: &[(&str, &str)] = if log_tail {
            &[("X-Amz-Log-Type", "Tail")]
        } else {
            &[]
        };
        let r = self.request_with(
            "POST",
            &format!("/2015-03-31/functions/{name}/invocations"),
            headers,
            payload,
        )?;
        if r.status != 200 {
            bail!("invoke {name}: {}", error_text(&r));
        }
        Ok(r)
    }
}

/// `STATUS TYPE: message` of an error reply.
pub fn error_text(r: &Reply) -> String {
    let message = serde_json::from_slice::<serde_json::Value>(&r.body)
        .ok()
        .and_then(|v| v.get("message").and_then(|m| m.as_str()).map(String::from))
        .unwrap_or_else(|| String::from_utf8_lossy(&r.body).into_owned());
    format!("{} {}: {message}", r.status, r.error_type)
}
