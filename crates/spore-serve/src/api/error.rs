//! Errors in the Lambda API's shape: an HTTP status, the `x-amzn-ErrorType`
//! header naming the exception, and a JSON body with `Type` and `message`
//! (what botocore's rest-json parser reads into the exception class).

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Response, StatusCode};

#[derive(Debug)]
pub struct LambdaError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub message: String,
}

impl LambdaError {
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        LambdaError {
            status,
            kind,
            message: message.into(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "InvalidParameterValueException",
            message,
        )
    }

    pub fn bad_content(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "InvalidRequestContentException",
            message,
        )
    }

    pub fn not_found(name: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "ResourceNotFoundException",
            format!("Function not found: {}", crate::config::function_arn(name)),
        )
    }

    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "ResourceConflictException", message)
    }

    pub fn too_large(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "RequestTooLargeException",
            message,
        )
    }

    pub fn throttled(reason: &str) -> Self {
        let mut e = Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "TooManyRequestsException",
            "Rate Exceeded.",
        );
        e.message = format!("Rate Exceeded. ({reason})");
        e
    }

    pub fn service(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "ServiceException",
            message,
        )
    }

    pub fn into_response(self) -> Response<Full<Bytes>> {
        // Lambda's `Type`: whose fault it is.
        let fault = if self.status.is_server_error() {
            "Service"
        } else {
            "User"
        };
        let body = serde_json::json!({ "Type": fault, "message": self.message });
        let mut resp = Response::new(Full::new(Bytes::from(body.to_string())));
        *resp.status_mut() = self.status;
        let h = resp.headers_mut();
        h.insert(
            "x-amzn-errortype",
            hyper::header::HeaderValue::from_static(self.kind),
        );
        h.insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("application/json"),
        );
        resp
    }
}

/// A catalogue failure, as the service error it is to the caller.
/// A catalogue error: a cluster's etcd that cannot take a write is a
/// 503 (try again), anything else a 500.
pub fn catalog_err(e: crate::catalog::CatalogError) -> LambdaError {
    match e {
        crate::catalog::CatalogError::Cluster(_) => LambdaError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceException",
            e.to_string(),
        ),
        e => LambdaError::service(e.to_string()),
    }
}
