//! The clone routes of the API: parsed into typed requests, bad bodies
//! refused (the clone module itself knows nothing of HTTP).

use hyper::Method;

use super::{parse_request, ApiError, ApiRequest};
use crate::clone::{CloneConfig, CloneMode, CloneRequest};

#[test]
fn clone_routes_parse_and_refuse_bad_bodies() {
    let r = parse_request(
        &Method::PUT,
        "/clone",
        br#"{"count": 3, "mode": "continue"}"#,
    );
    assert_eq!(
        r,
        Ok(ApiRequest::PutClone(CloneRequest {
            count: 3,
            mode: Some(CloneMode::Continue),
            socket_dir: None,
        }))
    );
    assert_eq!(
        parse_request(&Method::GET, "/clone", b""),
        Ok(ApiRequest::GetClone)
    );
    let c = parse_request(&Method::PUT, "/clone/config", br#"{"max_clones": 5}"#);
    assert_eq!(
        c,
        Ok(ApiRequest::PutCloneConfig(CloneConfig {
            max_clones: 5,
            ..Default::default()
        }))
    );
    for (path, body) in [
        ("/clone", &br#"{"count": -1}"#[..]),
        ("/clone", br#"{"count": 1, "mode": "sideways"}"#),
        ("/clone", br#"{"mode": "zygote"}"#),
        ("/clone", br#"{"count": 1, "extra": 1}"#),
        ("/clone/config", br#"{"max_clones": "many"}"#),
    ] {
        assert!(
            matches!(
                parse_request(&Method::PUT, path, body),
                Err(ApiError::BadRequest(_))
            ),
            "{path} {}",
            String::from_utf8_lossy(body)
        );
    }
    assert!(matches!(
        parse_request(&Method::PATCH, "/clone", b"{}"),
        Err(ApiError::MethodNotAllowed(_))
    ));
}
