//! [`ApiResponse`] and [`ApiError`] → HTTP responses.
//!
//! Success is 204 with no body or 200 with JSON; every error is its status
//! with `{"fault_message": "..."}`, as Firecracker answers. Building a
//! response never fails and never panics.

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::header::{HeaderValue, ALLOW, CONTENT_TYPE};
use hyper::{Response, StatusCode};

use super::{ApiError, ApiResponse};

/// The body type of every response the server sends.
pub type ResponseBody = Full<Bytes>;

impl ApiError {
    /// The HTTP status this error is answered with.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::RequestTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// The response to a handled request.
pub fn success(resp: ApiResponse) -> Response<ResponseBody> {
    match resp {
        ApiResponse::NoContent => {
            let mut r = Response::new(ResponseBody::default());
            *r.status_mut() = StatusCode::NO_CONTENT;
            r
        }
        ApiResponse::Json(value) => json(StatusCode::OK, value.to_string()),
    }
}

/// The response to a failed request. `allow` lists the methods the path
/// answers; HTTP wants it in an `Allow` header on a 405.
pub fn failure(err: &ApiError, allow: Option<&[&str]>) -> Response<ResponseBody> {
    let body = serde_json::json!({ "fault_message": err.to_string() }).to_string();
    let mut r = json(err.status(), body);
    if let Some(value) = allow.and_then(|m| HeaderValue::from_str(&m.join(", ")).ok()) {
        r.headers_mut().insert(ALLOW, value);
    }
    r
}

fn json(status: StatusCode, body: String) -> Response<ResponseBody> {
    let mut r = Response::new(ResponseBody::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;

    fn body_of(r: Response<ResponseBody>) -> Vec<u8> {
        // Full is ready at once, so polling it without a runtime is fine.
        let fut = r.into_body().collect();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(fut).unwrap().to_bytes().to_vec()
    }

    #[test]
    fn statuses() {
        let cases = [
            (ApiError::BadRequest("x".into()), 400),
            (ApiError::NotFound("x".into()), 404),
            (ApiError::MethodNotAllowed("x".into()), 405),
            (ApiError::PayloadTooLarge("x".into()), 413),
            (ApiError::Internal("x".into()), 500),
        ];
        for (e, code) in cases {
            assert_eq!(e.status().as_u16(), code);
            assert_eq!(failure(&e, None).status().as_u16(), code);
        }
    }

    #[test]
    fn error_body_is_fault_message() {
        let r = failure(
            &ApiError::MethodNotAllowed("say \"no\"".into()),
            Some(&["GET", "PUT"]),
        );
        assert_eq!(r.headers()[ALLOW], "GET, PUT");
        assert_eq!(r.headers()[CONTENT_TYPE], "application/json");
        let v: serde_json::Value = serde_json::from_slice(&body_of(r)).unwrap();
        assert_eq!(v, serde_json::json!({"fault_message": "say \"no\""}));
    }

    #[test]
    fn success_bodies() {
        let r = success(ApiResponse::NoContent);
        assert_eq!(r.status(), StatusCode::NO_CONTENT);
        assert!(body_of(r).is_empty());
        let r = success(ApiResponse::Json(serde_json::json!({"a": 1})));
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(body_of(r), br#"{"a":1}"#);
    }
}
