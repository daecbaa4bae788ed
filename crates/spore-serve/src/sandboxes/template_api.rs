//! E2B's template-build API on the sandbox listener ([`super::builds`]):
//! its routes, and the file uploads its links name.

use std::sync::Arc;
use std::time::Duration;

use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use hyper::{Method, Request, Response};

use super::reply::{empty, json, Body};
use super::request::{form_pairs, parse};
use super::{events, SandboxError, Sandboxes};

/// E2B's template-build API ([`super::builds`]) and its tags
/// ([`super::builds::tags`]).
pub async fn template_route(
    sbx: &Arc<Sandboxes>,
    account: &str,
    method: &Method,
    parts: &[&str],
    query: &str,
    body: &[u8],
    base_url: &str,
) -> Result<Response<Body>, SandboxError> {
    match (method, parts) {
        (&Method::POST, ["v3", "templates"]) => {
            let asked: super::builds::BuildRequest = parse(body)?;
            Ok(json(202, sbx.request_build(account, asked)?))
        }
        // `Template.exists(name)`: 404 for a name this account cannot use
        // (another account's templates are as unknown as missing ones).
        (&Method::GET, ["templates", "aliases", alias]) => {
            let alias = crate::api::percent_decode(alias).ok_or_else(|| {
                SandboxError::BadRequest("alias: invalid percent-encoding".into())
            })?;
            Ok(json(200, sbx.template_alias(account, &alias)?))
        }
        (&Method::POST, ["templates", "tags"]) => {
            let asked: super::builds::tags::AssignRequest = parse(body)?;
            Ok(json(201, sbx.assign_tags(account, asked).await?))
        }
        (&Method::DELETE, ["templates", "tags"]) => {
            let asked: super::builds::tags::RemoveRequest = parse(body)?;
            sbx.remove_tags(account, asked).await?;
            Ok(empty(204))
        }
        (&Method::GET, ["templates", template_id, "tags"]) => {
            let id = crate::api::percent_decode(template_id).ok_or_else(|| {
                SandboxError::BadRequest("template: invalid percent-encoding".into())
            })?;
            Ok(json(200, sbx.list_tags(account, &id)?))
        }
        (&Method::GET, ["templates", template_id, "files", hash]) => Ok(json(
            201,
            sbx.file_upload_link(account, template_id, hash, base_url)?,
        )),
        (&Method::POST, ["v2", "templates", template_id, "builds", build_id]) => {
            let start: super::builds::BuildStart = parse(body)?;
            sbx.start_build(account, template_id, build_id, start)?;
            Ok(empty(202))
        }
        (&Method::GET, ["templates", template_id, "builds", build_id, "status"]) => {
            let pairs = form_pairs(query).ok_or_else(|| {
                SandboxError::BadRequest("invalid query: not form-encoded".into())
            })?;
            let mut offset = 0;
            let mut level = None;
            for (k, v) in pairs {
                match k.as_str() {
                    "logsOffset" => {
                        offset = v.parse().map_err(|_| {
                            SandboxError::BadRequest(format!("logsOffset: not a number: {v:?}"))
                        })?;
                    }
                    "level" => {
                        level =
                            Some(events::Level::parse(&v).ok_or_else(|| {
                                SandboxError::BadRequest(format!("level: {v:?}"))
                            })?);
                    }
                    _ => {}
                }
            }
            Ok(json(
                200,
                sbx.build_status(account, template_id, build_id, offset, level)?,
            ))
        }
        _ => Err(SandboxError::NotFound(format!(
            "no route for {method} /{}",
            parts.join("/")
        ))),
    }
}

/// A template build's file upload: the body (a tar, at most
/// [`super::builds::MAX_UPLOAD`]) streamed to a temporary file, synced and
/// renamed into place.
pub async fn receive_upload(
    sbx: &Sandboxes,
    template_id: &str,
    hash: &str,
    token: &str,
    req: Request<Incoming>,
    body_timeout: Duration,
) -> Result<(), SandboxError> {
    use std::io::Write as _;
    let dest = sbx.upload_destination(template_id, hash, token)?;
    let tmp = dest.with_extension(format!("tmp-{}", std::process::id()));
    let internal = |e: std::io::Error| SandboxError::Internal(format!("storing the upload: {e}"));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)
        .map_err(internal)?;
    let mut body = req.into_body();
    let mut size: u64 = 0;
    let received = async {
        while let Some(frame) = tokio::time::timeout(body_timeout, body.frame())
            .await
            .map_err(|_| SandboxError::BadRequest("the upload stalled".into()))?
        {
            let frame =
                frame.map_err(|e| SandboxError::BadRequest(format!("reading the upload: {e}")))?;
            if let Ok(data) = frame.into_data() {
                size += data.len() as u64;
                if size > super::builds::MAX_UPLOAD {
                    return Err(SandboxError::BadRequest(format!(
                        "the upload is over {} MiB",
                        super::builds::MAX_UPLOAD >> 20
                    )));
                }
                file.write_all(&data).map_err(internal)?;
            }
        }
        file.sync_all().map_err(internal)?;
        std::fs::rename(&tmp, &dest).map_err(internal)
    }
    .await;
    if received.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    received
}
