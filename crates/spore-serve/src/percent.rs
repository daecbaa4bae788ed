//! Percent-encoding of URL query values and path segments (RFC 3986).

/// `s` with every byte but unreserved ones (RFC 3986) percent-encoded: a
/// query value or a path segment.
pub fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
