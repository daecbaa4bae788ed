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
            network: None,
        }))
    );
    // The network object: namespaces per clone, optional new addresses.
    let Ok(ApiRequest::PutClone(r)) = parse_request(
        &Method::PUT,
        "/clone",
        br#"{"count": 2, "network": {"netns_template": "/run/netns/spore-{n}",
             "interfaces": [{"iface_id": "eth0", "guest_mac_template": "06:00:ac:10:{n}",
                             "ipv4": "10.0.0.{n}/24", "gateway": "10.0.0.1"}]}}"#,
    ) else {
        panic!("PUT /clone with network refused");
    };
    let n = r.network.unwrap();
    assert_eq!(n.netns_path(2).to_str(), Some("/run/netns/spore-2"));
    assert_eq!(
        n.identities(2).unwrap()[0].ipv4.unwrap().0.octets(),
        [10, 0, 0, 2]
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
        ("/clone", br#"{"count": 1, "network": {"interfaces": []}}"#),
        ("/clone", br#"{"count": 1, "network": {"netns_template": "/n/{n}", "interfaces": [{"iface_id": "eth0", "gateway": "x"}]}}"#),
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
