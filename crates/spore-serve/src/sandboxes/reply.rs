//! The sandbox listener's responses: E2B's JSON bodies and errors, or a
//! sandbox's own answer streamed through the proxy.

use bytes::Bytes;
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper::{Response, StatusCode};

/// A response: the API's own JSON, or a sandbox's streamed answer.
pub type Body = Either<Full<Bytes>, Incoming>;

pub fn json(status: u16, value: serde_json::Value) -> Response<Body> {
    let mut resp = Response::new(Either::Left(Full::new(Bytes::from(value.to_string()))));
    *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    resp
}

pub fn empty(status: u16) -> Response<Body> {
    let mut resp = Response::new(Either::Left(Full::new(Bytes::new())));
    *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
    resp
}

/// E2B's error body: `{"code": 404, "message": "..."}`.
pub fn error(status: u16, message: &str) -> Response<Body> {
    json(
        status,
        serde_json::json!({ "code": status, "message": message }),
    )
}
