//! MMDS V2 session tokens: `PUT /latest/api/token` with a lifetime of 1 to
//! 21,600 s. A token carries its expiry and an HMAC-SHA256 of it under a
//! key made when the authority is (each VMM process, each restore and each
//! clone has its own), so nothing is stored per token and a guest that asks
//! for millions of them costs the host no memory.

use std::time::Instant;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

pub const MIN_TOKEN_TTL_SECONDS: u32 = 1;
pub const MAX_TOKEN_TTL_SECONDS: u32 = 21600;
/// Firecracker's limit: longer strings are refused unread.
const TOKEN_LENGTH_LIMIT: usize = 70;
/// Bytes of the HMAC a token keeps.
const TAG_LEN: usize = 16;
const KEY_LEN: usize = 32;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenError {
    #[error("Invalid time to live value provided for token: {0}. Please provide a value between {MIN_TOKEN_TTL_SECONDS} and {MAX_TOKEN_TTL_SECONDS}.")]
    InvalidTtl(u32),
}

pub struct TokenAuthority {
    key: [u8; KEY_LEN],
    /// Expiries count milliseconds from here (monotonic).
    born: Instant,
}

impl std::fmt::Debug for TokenAuthority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenAuthority")
    }
}

impl TokenAuthority {
    pub fn new() -> Self {
        let mut key = [0u8; KEY_LEN];
        if getrandom::fill(&mut key).is_err() {
            // No entropy source: a key from the clock and the address space
            // is still unknown to the guest, which never sees the host.
            let seed = format!("{:?}{:p}", Instant::now(), &key);
            let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(seed.as_bytes())
                .expect("HMAC takes any key length");
            m.update(b"spore-mmds");
            key.copy_from_slice(&m.finalize().into_bytes()[..KEY_LEN]);
        }
        Self {
            key,
            born: Instant::now(),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn mac(&self, expiry: u64) -> Hmac<Sha256> {
        let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.key)
            .expect("HMAC takes any key length");
        m.update(&expiry.to_le_bytes());
        m
    }

    /// A token valid for `ttl_seconds`.
    pub fn issue(&self, ttl_seconds: u32) -> Result<String, TokenError> {
        if !(MIN_TOKEN_TTL_SECONDS..=MAX_TOKEN_TTL_SECONDS).contains(&ttl_seconds) {
            return Err(TokenError::InvalidTtl(ttl_seconds));
        }
        let expiry = self.now_ms() + u64::from(ttl_seconds) * 1000;
        let tag = self.mac(expiry).finalize().into_bytes();
        let mut raw = expiry.to_le_bytes().to_vec();
        raw.extend_from_slice(&tag[..TAG_LEN]);
        Ok(raw.iter().map(|b| format!("{b:02x}")).collect())
    }

    /// Whether `token` was issued by this authority and has not expired.
    pub fn is_valid(&self, token: &str) -> bool {
        if token.len() > TOKEN_LENGTH_LIMIT || token.len() != 2 * (8 + TAG_LEN) {
            return false;
        }
        let Some(raw) = decode_hex(token) else {
            return false;
        };
        let (expiry, tag) = raw.split_at(8);
        let Ok(expiry_bytes) = <[u8; 8]>::try_from(expiry) else {
            return false;
        };
        let expiry = u64::from_le_bytes(expiry_bytes);
        self.mac(expiry).verify_truncated_left(tag).is_ok() && self.now_ms() < expiry
    }
}

impl Default for TokenAuthority {
    fn default() -> Self {
        Self::new()
    }
}

fn decode_hex(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    if !b.len().is_multiple_of(2) {
        return None;
    }
    let digit = |c: u8| char::from(c).to_digit(16);
    b.chunks(2)
        .map(|p| u8::try_from(digit(p[0])? * 16 + digit(p[1])?).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_checked_by_key_and_expiry() {
        let a = TokenAuthority::new();
        let t = a.issue(60).unwrap();
        assert!(a.is_valid(&t));
        assert!(!TokenAuthority::new().is_valid(&t), "another key");
        let mut forged = t.clone().into_bytes();
        forged[0] = if forged[0] == b'f' { b'e' } else { b'f' };
        assert!(!a.is_valid(std::str::from_utf8(&forged).unwrap()));
        assert!(!a.is_valid(""));
        assert!(!a.is_valid(&"z".repeat(48)));
        assert!(!a.is_valid(&"a".repeat(500)));
        assert_eq!(a.issue(0), Err(TokenError::InvalidTtl(0)));
        assert_eq!(a.issue(21601), Err(TokenError::InvalidTtl(21601)));
        let short = a.issue(1).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(1100));
        assert!(!a.is_valid(&short), "expired");
    }
}
