//! The command line the VMM passed, as a `&str`, and `key=value` lookup.

use crate::BootInfo;

static CMDLINE: spin::Once<&'static str> = spin::Once::new();

/// The longest valid UTF-8 prefix of `bytes` up to the first NUL: a command
/// line with a stray byte still yields its readable part.
pub fn from_bytes(bytes: &[u8]) -> &str {
    let bytes = match bytes.iter().position(|&b| b == 0) {
        Some(n) => &bytes[..n],
        None => bytes,
    };
    match core::str::from_utf8(bytes) {
        Ok(s) => s,
        // valid_up_to marks a UTF-8 boundary, so this cannot fail.
        Err(e) => core::str::from_utf8(&bytes[..e.valid_up_to()]).unwrap_or(""),
    }
}

/// The value of the first `key=value` word in `cmdline`; `Some("")` for a
/// bare `key`.
pub fn find_arg<'a>(cmdline: &'a str, key: &str) -> Option<&'a str> {
    cmdline
        .split_ascii_whitespace()
        .find_map(|word| match word.split_once('=') {
            Some((k, v)) if k == key => Some(v),
            None if word == key => Some(""),
            _ => None,
        })
}

/// # Safety
/// `info` must be validated (cmdline_len clamped) and its command line
/// readable, as the protocol guarantees.
pub(crate) unsafe fn init(info: &BootInfo) {
    let len = info.cmdline_len as usize;
    let s = if info.cmdline_addr == 0 || len == 0 {
        ""
    } else {
        // SAFETY: the caller guarantees the range is readable; the VMM never
        // writes it again, so a 'static shared borrow is sound.
        from_bytes(unsafe { core::slice::from_raw_parts(info.cmdline_addr as *const u8, len) })
    };
    CMDLINE.call_once(|| s);
}

/// The command line ("" if there is none).
pub fn cmdline() -> &'static str {
    CMDLINE.get().copied().unwrap_or("")
}

/// The value of `key=value` on the command line.
pub fn arg(key: &str) -> Option<&'static str> {
    find_arg(cmdline(), key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_words() {
        let c = "exit=3  secs=2 verbose x=";
        assert_eq!(find_arg(c, "exit"), Some("3"));
        assert_eq!(find_arg(c, "secs"), Some("2"));
        assert_eq!(find_arg(c, "verbose"), Some(""));
        assert_eq!(find_arg(c, "x"), Some(""));
        assert_eq!(find_arg(c, "ex"), None);
    }

    #[test]
    fn bytes_to_str() {
        assert_eq!(from_bytes(b"a=1\0junk"), "a=1");
        assert_eq!(from_bytes(b"ok\xffbad"), "ok");
        assert_eq!(from_bytes(b""), "");
    }
}
