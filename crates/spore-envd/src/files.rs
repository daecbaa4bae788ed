//! `/files`: downloads and uploads, as E2B's envd serves them.
//!
//! - `GET /files?path=P`: the file, streamed from disk (a single byte range
//!   if asked; gzip if the client accepts it), `Content-Disposition` naming it.
//! - `POST /files[?path=P]`: `multipart/form-data` (each part named `file`,
//!   its filename the destination unless `path` is given) or
//!   `application/octet-stream` with `path`, either optionally gzip-encoded.
//!   Each file is streamed to a temporary file, synced and renamed into place
//!   (see [`crate::filesystem::atomic`]); parents are created. The answer is
//!   the JSON list `[{"name", "type": "file", "path"}]` the e2b SDK reads.
//!
//! Errors are E2B's JSON: 400 bad request, 401 unknown user (the server
//! checks), 404 missing, 507 disk full.

use std::convert::Infallible;
use std::io::{self, Read, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::pin::Pin;

use bytes::{Buf, Bytes};
use futures_util::{Stream, StreamExt};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{self, HeaderValue};
use hyper::{Request, Response, StatusCode};
use tokio::io::AsyncSeekExt;
use tokio::sync::mpsc;

use crate::api;
use crate::connect::{Body, Code, RpcError};
use crate::filesystem::atomic::AtomicFile;
use crate::filesystem::paths::{ensure_dirs, io_text, new_owner, resolve, EnsureDirsError};
use crate::query::query_param;
use crate::state::Ctx;

/// Bytes read from disk at a time for a download.
const CHUNK: usize = 64 << 10;

/// A failed request, as the HTTP API answers it.
#[derive(Debug)]
struct HttpError {
    status: StatusCode,
    message: String,
}

impl HttpError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        HttpError {
            status,
            message: message.into(),
        }
    }

    fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    /// A filesystem error about `what`: 507 for a full disk, 403 for a
    /// refusal, 404 for a missing path, else 500.
    fn io(what: &str, e: &io::Error) -> Self {
        let status = match e.raw_os_error() {
            Some(libc::ENOSPC | libc::EDQUOT) => {
                return Self::new(
                    StatusCode::INSUFFICIENT_STORAGE,
                    format!("{what}: not enough disk space available"),
                )
            }
            _ if e.kind() == io::ErrorKind::PermissionDenied => StatusCode::FORBIDDEN,
            _ if e.kind() == io::ErrorKind::NotFound => StatusCode::NOT_FOUND,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Self::new(status, format!("{what}: {}", io_text(e)))
    }

    fn from_rpc(e: &RpcError) -> Self {
        let status = match e.code {
            Code::InvalidArgument => StatusCode::BAD_REQUEST,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            Code::ResourceExhausted => StatusCode::INSUFFICIENT_STORAGE,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Self::new(status, e.message.clone())
    }

    fn response(self) -> Response<Body> {
        api::error(self.status, self.message)
    }
}

// ---- downloads ----

/// `GET /files`.
pub async fn download(ctx: Ctx, req: Request<Incoming>) -> Response<Body> {
    match serve_file(&ctx, &req).await {
        Ok(response) => response,
        Err(e) => e.response(),
    }
}

async fn serve_file(ctx: &Ctx, req: &Request<Incoming>) -> Result<Response<Body>, HttpError> {
    let asked = query_param(req, "path").unwrap_or_default();
    let path = resolve(ctx, &asked).map_err(|e| HttpError::bad_request(e.message))?;
    let metadata = tokio::fs::metadata(&path)
        .await
        .map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => HttpError::new(
                StatusCode::NOT_FOUND,
                format!("path '{}' does not exist", path.display()),
            ),
            _ => HttpError::io(
                &format!("error checking if path exists '{}'", path.display()),
                &e,
            ),
        })?;
    if metadata.is_dir() {
        return Err(HttpError::bad_request(format!(
            "path '{}' is a directory",
            path.display()
        )));
    }
    let mut file = tokio::fs::File::open(&path)
        .await
        .map_err(|e| HttpError::io(&format!("error opening file '{}'", path.display()), &e))?;
    let len = metadata.len();
    let headers = req.headers();
    let range = match headers.get(header::IF_RANGE) {
        // Without validators to compare, a conditional range is served whole.
        Some(_) => Range::Full,
        None => parse_range(
            headers.get(header::RANGE).and_then(|v| v.to_str().ok()),
            len,
        ),
    };
    let gzip = range == Range::Full && accepts_gzip(headers.get(header::ACCEPT_ENCODING));
    let mut response = match range {
        Range::Unsatisfiable => {
            let mut response =
                api::error(StatusCode::RANGE_NOT_SATISFIABLE, "range not satisfiable");
            insert(
                &mut response,
                header::CONTENT_RANGE,
                &format!("bytes */{len}"),
            );
            return Ok(response);
        }
        Range::Full if gzip => {
            let mut response = Response::new(gzip_body(file.into_std().await));
            insert(&mut response, header::CONTENT_ENCODING, "gzip");
            response
        }
        Range::Full => {
            let mut response = Response::new(file_body(file, len));
            insert(&mut response, header::CONTENT_LENGTH, &len.to_string());
            response
        }
        Range::Partial(start, end) => {
            file.seek(SeekFrom::Start(start)).await.map_err(|e| {
                HttpError::io(&format!("error reading file '{}'", path.display()), &e)
            })?;
            let mut response = Response::new(file_body(file, end - start + 1));
            *response.status_mut() = StatusCode::PARTIAL_CONTENT;
            insert(
                &mut response,
                header::CONTENT_LENGTH,
                &(end - start + 1).to_string(),
            );
            insert(
                &mut response,
                header::CONTENT_RANGE,
                &format!("bytes {start}-{end}/{len}"),
            );
            response
        }
    };
    insert(
        &mut response,
        header::CONTENT_TYPE,
        "application/octet-stream",
    );
    insert(&mut response, header::ACCEPT_RANGES, "bytes");
    insert(&mut response, header::VARY, "Accept-Encoding");
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    insert(
        &mut response,
        header::CONTENT_DISPOSITION,
        &content_disposition(&name),
    );
    Ok(response)
}

fn insert(response: &mut Response<Body>, name: header::HeaderName, value: &str) {
    if let Ok(value) = HeaderValue::from_str(value) {
        response.headers_mut().insert(name, value);
    }
}

/// `count` bytes of `file` from where it stands. A read error ends the body
/// early, which (with the length announced) the client sees as a failure.
fn file_body(file: tokio::fs::File, count: u64) -> Body {
    use tokio::io::AsyncReadExt;
    let reader = tokio_util::io::ReaderStream::with_capacity(file.take(count), CHUNK);
    let frames = reader
        .scan((), |(), chunk| std::future::ready(chunk.ok()))
        .map(|chunk| Ok::<_, Infallible>(Frame::data(chunk)));
    BodyExt::boxed(StreamBody::new(frames))
}

/// Writes into a channel, for a compressor on the blocking pool.
struct ChannelWriter(mpsc::Sender<Bytes>);

impl Write for ChannelWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0
            .blocking_send(Bytes::copy_from_slice(buf))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the client went away"))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The file, gzip-compressed on the blocking pool as the client reads.
fn gzip_body(mut file: std::fs::File) -> Body {
    let (tx, rx) = mpsc::channel::<Bytes>(4);
    tokio::task::spawn_blocking(move || {
        let mut encoder =
            flate2::write::GzEncoder::new(ChannelWriter(tx), flate2::Compression::default());
        let mut buf = vec![0u8; CHUNK];
        loop {
            match file.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    if encoder.write_all(&buf[..n]).is_err() {
                        return;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // Without its trailer the client cannot take the stream for whole.
                Err(_) => return,
            }
        }
        let _ = encoder.finish();
    });
    let frames = futures_util::stream::unfold(rx, |mut rx| async move {
        let chunk = rx.recv().await?;
        Some((Ok::<_, Infallible>(Frame::data(chunk)), rx))
    });
    BodyExt::boxed(StreamBody::new(frames))
}

/// What a `Range` header asks for (one range; several are served whole).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Range {
    Full,
    /// First and last byte, inclusive.
    Partial(u64, u64),
    Unsatisfiable,
}

fn parse_range(header: Option<&str>, len: u64) -> Range {
    let Some(spec) = header.and_then(|h| h.trim().strip_prefix("bytes=")) else {
        return Range::Full;
    };
    if spec.contains(',') {
        return Range::Full;
    }
    let Some((first, last)) = spec.trim().split_once('-') else {
        return Range::Full;
    };
    let (first, last) = (first.trim(), last.trim());
    let parsed = match (first.parse::<u64>(), last.parse::<u64>()) {
        (Ok(a), Ok(b)) if a <= b => Some((a, b.min(len.saturating_sub(1)))),
        (Ok(a), Err(_)) if last.is_empty() => Some((a, len.saturating_sub(1))),
        (Err(_), Ok(n)) if first.is_empty() => {
            if n == 0 || len == 0 {
                return Range::Unsatisfiable;
            }
            Some((len - n.min(len), len - 1))
        }
        _ => None,
    };
    match parsed {
        None => Range::Full,
        Some((a, _)) if a >= len => Range::Unsatisfiable,
        Some((a, b)) => Range::Partial(a, b),
    }
}

/// Whether `Accept-Encoding` takes gzip over identity. Anything unusual
/// gets identity, which every client accepts.
fn accepts_gzip(header: Option<&HeaderValue>) -> bool {
    let Some(value) = header.and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let (mut gzip, mut identity) = (None, None);
    for item in value.split(',') {
        let mut parts = item.split(';');
        let coding = parts.next().unwrap_or_default().trim().to_ascii_lowercase();
        let q = parts
            .filter_map(|p| p.trim().strip_prefix("q="))
            .find_map(|q| q.trim().parse::<f32>().ok())
            .unwrap_or(1.0);
        match coding.as_str() {
            "gzip" | "x-gzip" => gzip = Some(q),
            "identity" => identity = Some(q),
            _ => {}
        }
    }
    matches!(gzip, Some(q) if q > 0.0 && q >= identity.unwrap_or(0.0))
}

/// `inline; filename=...` as Go's `mime.FormatMediaType` writes it: a token
/// bare, other ASCII quoted, anything else RFC 2231-encoded.
fn content_disposition(name: &str) -> String {
    const SPECIALS: &[u8] = b"()<>@,;:\\\"/[]?= ";
    let is_token = !name.is_empty()
        && name
            .bytes()
            .all(|b| (0x21..0x7f).contains(&b) && !SPECIALS.contains(&b));
    if is_token {
        return format!("inline; filename={name}");
    }
    if name
        .bytes()
        .all(|b| (0x20..0x7f).contains(&b) || b == b'\t')
    {
        let escaped = name.replace('\\', "\\\\").replace('"', "\\\"");
        return format!("inline; filename=\"{escaped}\"");
    }
    let mut encoded = String::new();
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b"!#$&+-.^_`|~".contains(&b) {
            encoded.push(char::from(b));
        } else {
            encoded.push_str(&format!("%{b:02X}"));
        }
    }
    format!("inline; filename*=utf-8''{encoded}")
}

// ---- uploads ----

type ByteStream = Pin<Box<dyn Stream<Item = io::Result<Bytes>> + Send>>;

/// `POST /files`.
pub async fn upload(ctx: Ctx, req: Request<Incoming>) -> Response<Body> {
    match receive(&ctx, req).await {
        Ok(entries) => api::json_response(StatusCode::OK, &serde_json::Value::Array(entries)),
        Err(e) => e.response(),
    }
}

async fn receive(ctx: &Ctx, req: Request<Incoming>) -> Result<Vec<serde_json::Value>, HttpError> {
    let path = query_param(&req, "path");
    let content_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .unwrap_or_default();
    let media = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    let gzip = match req.headers().get(header::CONTENT_ENCODING).map(|v| v.to_str().unwrap_or("?").trim()) {
        None | Some("" | "identity") => false,
        Some(e) if e.eq_ignore_ascii_case("gzip") || e.eq_ignore_ascii_case("x-gzip") => true,
        Some(other) => {
            return Err(HttpError::bad_request(format!(
                "error decompressing request body: unsupported Content-Encoding: {other}, supported: [gzip]"
            )))
        }
    };
    let body: ByteStream = Box::pin(
        req.into_body()
            .into_data_stream()
            .map(|r| r.map_err(io::Error::other)),
    );
    let body = if gzip { gunzip(body) } else { body };
    if media == "application/octet-stream" {
        let Some(path) = path else {
            return Err(HttpError::bad_request(
                "path query parameter is required for raw body upload",
            ));
        };
        let dest = resolve(ctx, &path).map_err(|e| HttpError::bad_request(e.message))?;
        let mut file = open_destination(ctx, &dest).await?;
        let mut body = body;
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| read_error(&e))?;
            file.write(&chunk)
                .await
                .map_err(|e| write_error(&dest, &e))?;
        }
        file.commit().await.map_err(|e| write_error(&dest, &e))?;
        return Ok(vec![written(&dest)]);
    }
    if media.starts_with("multipart/") {
        let boundary = multer::parse_boundary(&content_type)
            .map_err(|e| HttpError::bad_request(format!("error parsing multipart form: {e}")))?;
        return receive_parts(ctx, multer::Multipart::new(body, boundary), path).await;
    }
    Err(HttpError::bad_request(format!(
        "unsupported content type: {content_type}, expected multipart/form-data or application/octet-stream"
    )))
}

async fn receive_parts(
    ctx: &Ctx,
    mut form: multer::Multipart<'static>,
    path: Option<String>,
) -> Result<Vec<serde_json::Value>, HttpError> {
    let form_error = |e: multer::Error| HttpError::bad_request(format!("error reading form: {e}"));
    let mut done: Vec<PathBuf> = Vec::new();
    while let Some(mut field) = form.next_field().await.map_err(form_error)? {
        // Other parts are skipped, as E2B's envd does.
        if field.name() != Some("file") {
            continue;
        }
        let asked = match &path {
            Some(path) => path.clone(),
            None => part_file_name(field.headers()).ok_or_else(|| {
                HttpError::bad_request("filename not found in Content-Disposition header")
            })?,
        };
        let dest = resolve(ctx, &asked).map_err(|e| HttpError::bad_request(e.message))?;
        if done.contains(&dest) {
            return Err(HttpError::bad_request(format!(
                "you cannot upload multiple files to the same path '{}' in one upload request, only the first specified file was uploaded",
                dest.display()
            )));
        }
        let mut file = open_destination(ctx, &dest).await?;
        while let Some(chunk) = field.chunk().await.map_err(form_error)? {
            file.write(&chunk)
                .await
                .map_err(|e| write_error(&dest, &e))?;
        }
        file.commit().await.map_err(|e| write_error(&dest, &e))?;
        done.push(dest);
    }
    Ok(done.iter().map(|p| written(p)).collect())
}

fn written(path: &Path) -> serde_json::Value {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    serde_json::json!({ "name": name, "type": "file", "path": path.to_string_lossy() })
}

fn read_error(e: &io::Error) -> HttpError {
    HttpError::bad_request(format!("error reading the request body: {e}"))
}

fn write_error(dest: &Path, e: &io::Error) -> HttpError {
    HttpError::io(&format!("error writing file {}", dest.display()), e)
}

/// Makes `dest`'s parents and starts the file that will replace it. A
/// symlink is written through (as an in-place write would), unless it dangles.
async fn open_destination(ctx: &Ctx, dest: &Path) -> Result<AtomicFile, HttpError> {
    let owner = new_owner(&ctx.user);
    let dest_owned = dest.to_path_buf();
    let target = tokio::task::spawn_blocking(move || -> Result<PathBuf, HttpError> {
        let dest = dest_owned;
        if let Some(parent) = dest.parent() {
            ensure_dirs(parent, owner).map_err(|e| match e {
                EnsureDirsError::NotADirectory(p) => HttpError::bad_request(format!(
                    "error ensuring directories: path is a file: {}",
                    p.display()
                )),
                e @ EnsureDirsError::Io(..) => HttpError::from_rpc(&e.into_rpc()),
            })?;
        }
        let target = match std::fs::symlink_metadata(&dest) {
            Ok(m) if m.file_type().is_symlink() => {
                std::fs::canonicalize(&dest).unwrap_or_else(|_| dest.clone())
            }
            _ => dest.clone(),
        };
        if std::fs::metadata(&target).is_ok_and(|m| m.is_dir()) {
            return Err(HttpError::bad_request(format!(
                "path is a directory: {}",
                dest.display()
            )));
        }
        Ok(target)
    })
    .await
    .map_err(|e| {
        HttpError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("upload task failed: {e}"),
        )
    })??;
    AtomicFile::create(target, owner)
        .await
        .map_err(|e| HttpError::io(&format!("error opening file {}", dest.display()), &e))
}

/// The destination a multipart part names: its `filename` (RFC 2231's
/// `filename*` first), whole (with its directories, unlike a browser's).
fn part_file_name(headers: &hyper::HeaderMap) -> Option<String> {
    let value = headers.get(header::CONTENT_DISPOSITION)?;
    let value = String::from_utf8_lossy(value.as_bytes());
    let params = disposition_params(&value);
    let extended = params
        .iter()
        .find(|(k, _)| k == "filename*")
        .and_then(|(_, v)| {
            let (charset, rest) = v.split_once('\'')?;
            let (_, encoded) = rest.split_once('\'')?;
            charset
                .eq_ignore_ascii_case("utf-8")
                .then(|| percent_decode(encoded))?
        });
    extended
        .or_else(|| {
            params
                .into_iter()
                .find(|(k, _)| k == "filename")
                .map(|(_, v)| v)
        })
        .filter(|v| !v.is_empty())
}

fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// A `Content-Disposition`'s parameters (lowercased names; quoted values
/// unescaped).
fn disposition_params(value: &str) -> Vec<(String, String)> {
    let mut params = Vec::new();
    let mut rest = match value.split_once(';') {
        Some((_, rest)) => rest,
        None => return params,
    };
    loop {
        rest = rest.trim_start_matches([' ', '\t', ';']);
        let Some(eq) = rest.find('=') else { break };
        let name = rest[..eq].trim().to_ascii_lowercase();
        let after = rest[eq + 1..].trim_start();
        let (param, remaining) = if let Some(quoted) = after.strip_prefix('"') {
            let mut out = String::new();
            let mut chars = quoted.char_indices();
            let mut end = quoted.len();
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => {
                        if let Some((_, escaped)) = chars.next() {
                            out.push(escaped);
                        }
                    }
                    '"' => {
                        end = i + 1;
                        break;
                    }
                    c => out.push(c),
                }
            }
            (out, &quoted[end.min(quoted.len())..])
        } else {
            let end = after.find(';').unwrap_or(after.len());
            (after[..end].trim().to_owned(), &after[end..])
        };
        params.push((name, param));
        rest = remaining;
    }
    params
}

/// Decompresses a gzip body as it arrives (concatenated members too), in
/// pieces of at most the decoder's 32 KiB buffer: a small body that inflates
/// hugely is still written out bit by bit.
fn gunzip(input: ByteStream) -> ByteStream {
    struct State {
        input: ByteStream,
        decoder: flate2::write::MultiGzDecoder<Vec<u8>>,
        pending: Bytes,
        done: bool,
    }
    let state = State {
        input,
        decoder: flate2::write::MultiGzDecoder::new(Vec::new()),
        pending: Bytes::new(),
        done: false,
    };
    let corrupt = |e: io::Error| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("invalid gzip body: {e}"),
        )
    };
    Box::pin(futures_util::stream::unfold(
        state,
        move |mut s| async move {
            loop {
                if !s.decoder.get_ref().is_empty() {
                    let out = Bytes::from(std::mem::take(s.decoder.get_mut()));
                    return Some((Ok(out), s));
                }
                if s.done {
                    return None;
                }
                if !s.pending.is_empty() {
                    match s.decoder.write(&s.pending) {
                        Ok(n) => s.pending.advance(n),
                        Err(e) => {
                            s.done = true;
                            return Some((Err(corrupt(e)), s));
                        }
                    }
                    continue;
                }
                match s.input.next().await {
                    Some(Ok(chunk)) => s.pending = chunk,
                    Some(Err(e)) => {
                        s.done = true;
                        return Some((Err(e), s));
                    }
                    None => {
                        s.done = true;
                        if let Err(e) = s.decoder.try_finish() {
                            return Some((Err(corrupt(e)), s));
                        }
                    }
                }
            }
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        assert_eq!(parse_range(None, 10), Range::Full);
        assert_eq!(parse_range(Some("bytes=0-3"), 10), Range::Partial(0, 3));
        assert_eq!(parse_range(Some("bytes=5-"), 10), Range::Partial(5, 9));
        assert_eq!(parse_range(Some("bytes=-3"), 10), Range::Partial(7, 9));
        assert_eq!(parse_range(Some("bytes=-30"), 10), Range::Partial(0, 9));
        assert_eq!(parse_range(Some("bytes=2-99"), 10), Range::Partial(2, 9));
        assert_eq!(parse_range(Some("bytes=10-"), 10), Range::Unsatisfiable);
        assert_eq!(parse_range(Some("bytes=0-1,4-5"), 10), Range::Full);
        assert_eq!(parse_range(Some("bytes=x"), 10), Range::Full);
        assert_eq!(parse_range(Some("items=0-1"), 10), Range::Full);
    }

    #[test]
    fn gzip_is_taken_only_when_plainly_preferred() {
        let h = |s: &'static str| HeaderValue::from_static(s);
        assert!(accepts_gzip(Some(&h("gzip"))));
        assert!(accepts_gzip(Some(&h("gzip, deflate, br"))));
        assert!(!accepts_gzip(Some(&h("gzip;q=0"))));
        assert!(!accepts_gzip(Some(&h("identity, gzip;q=0.5"))));
        assert!(!accepts_gzip(Some(&h("br"))));
        assert!(!accepts_gzip(None));
    }

    #[test]
    fn dispositions_match_gos_formatting() {
        assert_eq!(content_disposition("a.txt"), "inline; filename=a.txt");
        assert_eq!(
            content_disposition("a b\"c"),
            "inline; filename=\"a b\\\"c\""
        );
        assert_eq!(
            content_disposition("é.txt"),
            "inline; filename*=utf-8''%C3%A9.txt"
        );
    }

    #[test]
    fn part_file_names_keep_their_directories() {
        let mut headers = hyper::HeaderMap::new();
        let mut set = |v: &str| {
            headers.insert(
                header::CONTENT_DISPOSITION,
                HeaderValue::from_bytes(v.as_bytes()).unwrap(),
            );
            part_file_name(&headers)
        };
        assert_eq!(
            set(r#"form-data; name="file"; filename="/home/u/a/b.txt""#).as_deref(),
            Some("/home/u/a/b.txt")
        );
        assert_eq!(
            set(r#"form-data; name="file"; filename="a\\b\"c""#).as_deref(),
            Some("a\\b\"c")
        );
        assert_eq!(
            set("form-data; name=file; filename=x/y").as_deref(),
            Some("x/y")
        );
        assert_eq!(
            set("form-data; name=\"file\"; filename*=UTF-8''%C3%A9; filename=\"e\"").as_deref(),
            Some("é")
        );
        assert_eq!(
            set("form-data; name=\"file\"; filename=\"caf\u{e9}\"").as_deref(),
            Some("café")
        );
        assert_eq!(set(r#"form-data; name="file""#), None);
    }

    async fn gunzipped(chunks: Vec<Vec<u8>>) -> io::Result<Vec<u8>> {
        let input: ByteStream = Box::pin(futures_util::stream::iter(
            chunks.into_iter().map(|c| Ok(Bytes::from(c))),
        ));
        let mut out = Vec::new();
        let mut stream = gunzip(input);
        while let Some(chunk) = stream.next().await {
            let chunk = chunk?;
            assert!(chunk.len() <= 64 << 10);
            out.extend_from_slice(&chunk);
        }
        Ok(out)
    }

    fn gz(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    #[tokio::test]
    async fn gzip_bodies_inflate_in_bounded_pieces() {
        let data = vec![0u8; 5 << 20];
        let packed = gz(&data);
        let pieces = packed.chunks(1000).map(<[u8]>::to_vec).collect();
        assert_eq!(gunzipped(pieces).await.unwrap(), data);
        let mut two = gz(b"hello ");
        two.extend(gz(b"world"));
        assert_eq!(gunzipped(vec![two]).await.unwrap(), b"hello world");
        let truncated = packed[..packed.len() - 4].to_vec();
        assert!(gunzipped(vec![truncated]).await.is_err());
        assert!(gunzipped(vec![b"not gzip".to_vec()]).await.is_err());
    }
}
