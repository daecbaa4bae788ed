//! Firecracker endpoints spore does not serve yet, answered as clearly as
//! Firecracker answers what it does not serve.
//!
//! A method Firecracker serves on such a path gets 400 with a
//! `fault_message` saying spore does not support it yet (not 404: the
//! client asked for something real, and should learn it is missing here);
//! any other method gets Firecracker's own answer for an invalid request,
//! 400 `Invalid request method and/or path: GET entropy.`

use super::{printable, ApiError};

/// `(path, methods Firecracker serves, what spore offers instead)`; a path
/// ending in `/` takes one more segment (an id).
const ENDPOINTS: &[(&str, &[&str], &str)] =
    &[("/pmem/", &["PUT", "PATCH"], "spore has no pmem device yet")];

/// The answer to `method path` if the path is one of [`ENDPOINTS`].
pub fn firecracker_only(method: &str, path: &str) -> Option<ApiError> {
    let trimmed = match path.strip_suffix('/') {
        Some(p) if p.len() > 1 => p,
        _ => path,
    };
    let (name, methods, instead) =
        ENDPOINTS
            .iter()
            .find(|(p, _, _)| match p.strip_suffix('/') {
                Some(prefix) => {
                    trimmed
                        .strip_prefix(p)
                        .is_some_and(|id| !id.is_empty() && !id.contains('/'))
                        || trimmed == prefix
                }
                None => trimmed == *p,
            })?;
    let with_id = name.ends_with('/') && trimmed.len() > name.len();
    if methods.contains(&method) && with_id == name.ends_with('/') {
        return Some(ApiError::BadRequest(format!(
            "spore does not support {method} {} yet: {instead}",
            printable(trimmed)
        )));
    }
    // Firecracker names the path without its leading `/` here.
    Some(ApiError::BadRequest(format!(
        "Invalid request method and/or path: {} {}.",
        printable(method),
        printable(trimmed.trim_start_matches('/'))
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(method: &str, path: &str) -> String {
        match firecracker_only(method, path) {
            Some(ApiError::BadRequest(m)) => m,
            other => panic!("{method} {path}: {other:?}"),
        }
    }

    #[test]
    fn served_methods_say_spore_does_not_support_them() {
        for (method, path) in [("PATCH", "/pmem/p0"), ("PUT", "/pmem/p0/")] {
            let m = message(method, path);
            assert!(m.starts_with("spore does not support"), "{m}");
            assert!(m.contains(path.trim_end_matches('/')), "{m}");
        }
    }

    #[test]
    fn other_methods_get_firecrackers_invalid_request() {
        assert_eq!(
            message("GET", "/pmem/p0"),
            "Invalid request method and/or path: GET pmem/p0."
        );
        // Served now: not answered here.
        for (m, p) in [
            ("PATCH", "/balloon/hinting/start"),
            ("GET", "/balloon/hinting/status"),
            ("PATCH", "/balloon/hinting/stop"),
        ] {
            assert!(firecracker_only(m, p).is_none(), "{m} {p}");
        }
        // Served now: not answered here.
        for p in [
            "/entropy",
            "/serial",
            "/cpu-config",
            "/mmds",
            "/mmds/config",
        ] {
            assert!(firecracker_only("PUT", p).is_none(), "{p}");
        }
        // Served now (answered by the router).
        assert!(firecracker_only("PUT", "/network-interfaces/eth0").is_none());
        assert!(firecracker_only("GET", "/balloon").is_none());
        assert!(firecracker_only("PUT", "/network-interfaces/a/b").is_none());
        assert!(firecracker_only("GET", "/version").is_none());
    }
}
