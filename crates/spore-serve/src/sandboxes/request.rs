//! What the sandbox API reads from requests: JSON bodies and form-encoded
//! queries, refused with E2B's 400 when malformed.

use super::SandboxError;

/// `a=b&c=d`, each part percent-decoded ('+' a space).
pub fn form_pairs(s: &str) -> Option<Vec<(String, String)>> {
    let decode = |p: &str| crate::api::percent_decode(&p.replace('+', " "));
    s.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            Some((decode(k)?, decode(v)?))
        })
        .collect()
}

pub fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, SandboxError> {
    serde_json::from_slice(body)
        .map_err(|e| SandboxError::BadRequest(format!("invalid request body: {e}")))
}

/// An empty body is every field's default.
pub fn parse_or_default<T: serde::de::DeserializeOwned + Default>(
    body: &[u8],
) -> Result<T, SandboxError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    parse(body)
}
