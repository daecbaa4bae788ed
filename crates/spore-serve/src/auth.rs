//! AWS Signature Version 4 verification, for `spore serve --auth keys.toml`.
//!
//! Without `--auth` every request is accepted, signed or not (what a local
//! endpoint for the AWS CLI needs). With it, a request must carry a SigV4
//! `Authorization` header made with one of the configured access keys, dated
//! within 15 minutes; anything else is refused with 403. The canonical request
//! is built as AWS's clients build it (path encoded once more, as botocore
//! does for every service but S3; query sorted; signed headers lower-cased
//! and trimmed; the body's SHA-256).
//!
//! ```toml
//! [[keys]]
//! access_key_id = "AKIDEXAMPLE"
//! secret_access_key = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
//! account_id = "111122223333"   # optional: the default account 000000000000
//! concurrency = 100              # optional account limits, on any of its keys
//! memory = "8G"
//! code_storage = "10G"
//! functions = 50
//! sandbox_api_key = "e2b_0123456789abcdef0123456789abcdef01234567"  # optional: the sandbox API's X-API-Key
//! ```
//!
//! A key's signature proves its account: every request is served as that
//! account's (see [`crate::accounts`]).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use hmac::{Hmac, KeyInit, Mac};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::accounts::{valid_account_id, Account, Limits, DEFAULT_ACCOUNT};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeysFile {
    keys: Vec<Key>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Key {
    access_key_id: String,
    secret_access_key: String,
    account_id: Option<String>,
    concurrency: Option<u32>,
    memory: Option<Size>,
    code_storage: Option<Size>,
    functions: Option<u32>,
    /// The sandbox API's `X-API-Key` for this key's account (E2B's form:
    /// `e2b_` and hex digits).
    sandbox_api_key: Option<String>,
}

/// A size as a number of bytes or a string with a unit (`"8G"`).
#[derive(Deserialize, Clone)]
#[serde(untagged)]
enum Size {
    Bytes(u64),
    Text(String),
}

impl Size {
    fn bytes(&self, what: &str) -> anyhow::Result<u64> {
        match self {
            Size::Bytes(n) => Ok(*n),
            Size::Text(t) => crate::accounts::parse_size(t)
                .ok_or_else(|| anyhow::anyhow!("{what} = {t:?} is not a size (such as \"512M\")")),
        }
    }
}

impl Key {
    /// The limits this key states, over the defaults.
    fn limits(&self) -> anyhow::Result<Limits> {
        let d = Limits::default();
        Ok(Limits {
            concurrency: self.concurrency.unwrap_or(d.concurrency),
            memory: self
                .memory
                .as_ref()
                .map(|m| m.bytes("memory"))
                .transpose()?,
            code_storage: match &self.code_storage {
                Some(c) => c.bytes("code_storage")?,
                None => d.code_storage,
            },
            functions: self.functions,
        })
    }

    fn states_limits(&self) -> bool {
        self.concurrency.is_some()
            || self.memory.is_some()
            || self.code_storage.is_some()
            || self.functions.is_some()
    }
}

/// E2B's API key form: `e2b_` then hex digits.
fn valid_sandbox_api_key(key: &str) -> bool {
    key.strip_prefix("e2b_").is_some_and(|hex| {
        (20..=128).contains(&hex.len()) && hex.bytes().all(|b| b.is_ascii_hexdigit())
    })
}

/// The configured access keys, each with its account.
pub struct Keys {
    secrets: HashMap<String, (String, Arc<Account>)>,
    /// `sandbox_api_key` → its account.
    sandbox_keys: HashMap<String, Arc<Account>>,
}

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("Missing Authentication Token")]
    Missing,
    #[error("The request signature is malformed: {0}")]
    Malformed(&'static str),
    #[error("The security token included in the request is invalid.")]
    UnknownKey,
    #[error("Signature expired: the request's X-Amz-Date is more than 15 minutes from now")]
    Expired,
    #[error("The request signature we calculated does not match the signature you provided.")]
    Mismatch,
}

impl AuthError {
    /// The Lambda exception name for `x-amzn-ErrorType`.
    pub fn kind(&self) -> &'static str {
        match self {
            AuthError::Missing => "MissingAuthenticationTokenException",
            AuthError::UnknownKey => "UnrecognizedClientException",
            _ => "InvalidSignatureException",
        }
    }
}

impl Keys {
    pub fn load(path: &Path) -> anyhow::Result<Keys> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
        let file: KeysFile =
            toml::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        Keys::from_file(file).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
    }

    fn from_file(file: KeysFile) -> anyhow::Result<Keys> {
        if file.keys.is_empty() {
            anyhow::bail!("no [[keys]]");
        }
        // Each account's limits, from whichever of its keys states them
        // (two keys stating different ones is an error, not a guess).
        let mut limits: HashMap<String, (Limits, bool)> = HashMap::new();
        for k in &file.keys {
            let account = k.account_id.as_deref().unwrap_or(DEFAULT_ACCOUNT);
            if !valid_account_id(account) {
                anyhow::bail!(
                    "key {}: account_id {account:?} is not 12 digits",
                    k.access_key_id
                );
            }
            let stated = k.limits()?;
            match limits.get(account) {
                Some((l, true)) if k.states_limits() && *l != stated => anyhow::bail!(
                    "key {}: account {account}'s limits differ from those another of its keys states",
                    k.access_key_id
                ),
                Some((_, true)) => {}
                _ => {
                    limits.insert(account.to_string(), (stated, k.states_limits()));
                }
            }
        }
        let accounts: HashMap<String, Arc<Account>> = limits
            .into_iter()
            .map(|(id, (l, _))| (id.clone(), Account::new(&id, l)))
            .collect();
        let mut secrets = HashMap::new();
        let mut sandbox_keys = HashMap::new();
        for k in file.keys {
            if k.access_key_id.is_empty() || k.secret_access_key.is_empty() {
                anyhow::bail!("a key has an empty access_key_id or secret_access_key");
            }
            let account = accounts[k.account_id.as_deref().unwrap_or(DEFAULT_ACCOUNT)].clone();
            if let Some(api_key) = k.sandbox_api_key {
                if !valid_sandbox_api_key(&api_key) {
                    anyhow::bail!(
                        "key {}: sandbox_api_key is not e2b_ and 20 to 128 hex digits",
                        k.access_key_id
                    );
                }
                if sandbox_keys.insert(api_key, account.clone()).is_some() {
                    anyhow::bail!(
                        "key {}: its sandbox_api_key is given twice",
                        k.access_key_id
                    );
                }
            }
            if secrets
                .insert(k.access_key_id.clone(), (k.secret_access_key, account))
                .is_some()
            {
                anyhow::bail!("access key {} is given twice", k.access_key_id);
            }
        }
        Ok(Keys {
            secrets,
            sandbox_keys,
        })
    }

    /// The account a sandbox API key (`X-API-Key`) belongs to, if any.
    pub fn sandbox_account(&self, api_key: &str) -> Option<Arc<Account>> {
        // Compared in constant time: a key's prefix must not be guessable
        // from how long a refusal took.
        self.sandbox_keys
            .iter()
            .find(|(k, _)| constant_time_eq(k.as_bytes(), api_key.as_bytes()))
            .map(|(_, a)| a.clone())
    }

    /// Every account the keys name.
    pub fn accounts(&self) -> Vec<Arc<Account>> {
        let mut seen: HashMap<&str, Arc<Account>> = HashMap::new();
        for (_, a) in self.secrets.values() {
            seen.entry(&a.id).or_insert_with(|| a.clone());
        }
        seen.into_values().collect()
    }

    /// Checks a request's signature. `headers` are (name, value) pairs as
    /// received; `now_unix` the current time.
    pub fn verify(
        &self,
        method: &str,
        raw_path: &str,
        raw_query: &str,
        headers: &[(String, String)],
        body: &[u8],
        now_unix: u64,
    ) -> Result<Arc<Account>, AuthError> {
        let header = |name: &str| {
            headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_str())
        };
        let auth = header("authorization").ok_or(AuthError::Missing)?;
        let rest = auth
            .strip_prefix("AWS4-HMAC-SHA256 ")
            .ok_or(AuthError::Malformed("not AWS4-HMAC-SHA256"))?;
        let mut credential = None;
        let mut signed_headers = None;
        let mut signature = None;
        for part in rest.split(',') {
            match part.trim().split_once('=') {
                Some(("Credential", v)) => credential = Some(v),
                Some(("SignedHeaders", v)) => signed_headers = Some(v),
                Some(("Signature", v)) => signature = Some(v),
                _ => {}
            }
        }
        let (credential, signed_headers, signature) = match (credential, signed_headers, signature)
        {
            (Some(c), Some(h), Some(s)) => (c, h, s),
            _ => {
                return Err(AuthError::Malformed(
                    "Credential, SignedHeaders and Signature are required",
                ))
            }
        };
        let mut scope = credential.splitn(5, '/');
        let (key_id, date, region, service, terminal) = (
            scope.next().unwrap_or(""),
            scope.next().unwrap_or(""),
            scope.next().unwrap_or(""),
            scope.next().unwrap_or(""),
            scope.next().unwrap_or(""),
        );
        if terminal != "aws4_request" || date.len() != 8 {
            return Err(AuthError::Malformed("bad credential scope"));
        }
        let (secret, account) = self.secrets.get(key_id).ok_or(AuthError::UnknownKey)?;
        let amz_date =
            header("x-amz-date").ok_or(AuthError::Malformed("X-Amz-Date is required"))?;
        if !amz_date.starts_with(date) {
            return Err(AuthError::Malformed(
                "X-Amz-Date does not match the credential's date",
            ));
        }
        let when = parse_amz_date(amz_date).ok_or(AuthError::Malformed("bad X-Amz-Date"))?;
        if when.abs_diff(now_unix) > 15 * 60 {
            return Err(AuthError::Expired);
        }
        if !signed_headers.split(';').any(|h| h == "host") {
            return Err(AuthError::Malformed("the host header must be signed"));
        }

        let mut canonical_headers = String::new();
        for name in signed_headers.split(';') {
            let values: Vec<String> = headers
                .iter()
                .filter(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.split_whitespace().collect::<Vec<_>>().join(" "))
                .collect();
            if values.is_empty() {
                return Err(AuthError::Malformed("a signed header is missing"));
            }
            canonical_headers.push_str(&format!("{name}:{}\n", values.join(",")));
        }
        let payload_hash = match header("x-amz-content-sha256") {
            Some(h) if h != "UNSIGNED-PAYLOAD" => h.to_string(),
            _ => hex(&Sha256::digest(body)),
        };
        let canonical = format!(
            "{method}\n{}\n{}\n{canonical_headers}\n{signed_headers}\n{payload_hash}",
            canonical_path(raw_path),
            canonical_query(raw_query)
        );
        let to_sign = format!(
            "AWS4-HMAC-SHA256\n{amz_date}\n{date}/{region}/{service}/aws4_request\n{}",
            hex(&Sha256::digest(canonical.as_bytes()))
        );
        let mut key = hmac(format!("AWS4{secret}").as_bytes(), date.as_bytes());
        for part in [region, service, "aws4_request"] {
            key = hmac(&key, part.as_bytes());
        }
        let expected = hex(&hmac(&key, to_sign.as_bytes()));
        if constant_time_eq(expected.as_bytes(), signature.as_bytes()) {
            Ok(account.clone())
        } else {
            Err(AuthError::Mismatch)
        }
    }
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut mac =
        <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// RFC 3986 encoding of everything but unreserved characters (and `/` when
/// `keep_slash`).
fn uri_encode(s: &str, keep_slash: bool) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) || (keep_slash && b == b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The path as sent (already percent-encoded), encoded once more: what
/// botocore signs for every service but S3.
fn canonical_path(raw: &str) -> String {
    if raw.is_empty() {
        return "/".into();
    }
    uri_encode(raw, true)
}

fn canonical_query(raw: &str) -> String {
    let mut pairs: Vec<(String, String)> = raw
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (uri_encode(&decode(k), false), uri_encode(&decode(v), false))
        })
        .collect();
    pairs.sort();
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&")
}

fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match (b[i], b.get(i + 1..i + 3)) {
            (b'%', Some(h))
                if std::str::from_utf8(h)
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .is_some() =>
            {
                out.push(
                    u8::from_str_radix(std::str::from_utf8(h).unwrap_or("00"), 16).unwrap_or(0),
                );
                i += 3;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `20261124T223000Z` → Unix seconds.
fn parse_amz_date(s: &str) -> Option<u64> {
    if s.len() != 16 || &s[8..9] != "T" || !s.ends_with('Z') {
        return None;
    }
    let n = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, m, d) = (n(0..4)?, n(4..6)?, n(6..8)?);
    let (hh, mm, ss) = (n(9..11)?, n(11..13)?, n(13..15)?);
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) || hh > 23 || mm > 59 || ss > 60 {
        return None;
    }
    // Days from civil (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    u64::try_from(days * 86_400 + hh * 3600 + mm * 60 + ss).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> Keys {
        Keys {
            secrets: HashMap::from([(
                "AKIDEXAMPLE".to_string(),
                (
                    "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY".to_string(),
                    Account::default_account(),
                ),
            )]),
            sandbox_keys: HashMap::new(),
        }
    }

    fn parse(text: &str) -> Result<Keys, String> {
        toml::from_str::<KeysFile>(text)
            .map_err(|e| e.to_string())
            .and_then(|f| Keys::from_file(f).map_err(|e| e.to_string()))
    }

    #[test]
    fn keys_files_give_accounts_and_limits() {
        let k = parse(
            r#"
            [[keys]]
            access_key_id = "A1"
            secret_access_key = "s"
            account_id = "111111111111"
            concurrency = 5
            memory = "1G"
            [[keys]]
            access_key_id = "A2"
            secret_access_key = "s"
            account_id = "111111111111"
            [[keys]]
            access_key_id = "B"
            secret_access_key = "s"
            "#,
        )
        .expect("a valid keys file");
        let a = &k.secrets["A2"].1;
        assert_eq!(a.id, "111111111111");
        assert_eq!(a.limits.concurrency, 5);
        assert_eq!(a.limits.memory, Some(1 << 30));
        assert_eq!(k.secrets["B"].1.id, DEFAULT_ACCOUNT);
        assert_eq!(k.accounts().len(), 2);
    }

    #[test]
    fn bad_keys_files_are_refused_with_the_reason() {
        let dup = parse(
            "[[keys]]\naccess_key_id = \"A\"\nsecret_access_key = \"s\"\n[[keys]]\naccess_key_id = \"A\"\nsecret_access_key = \"t\"\n",
        );
        assert!(dup.err().is_some_and(|e| e.contains("given twice")));
        let bad = parse(
            "[[keys]]\naccess_key_id = \"A\"\nsecret_access_key = \"s\"\naccount_id = \"12ab\"\n",
        );
        assert!(bad.err().is_some_and(|e| e.contains("not 12 digits")));
        let clash = parse(
            "[[keys]]\naccess_key_id = \"A\"\nsecret_access_key = \"s\"\nconcurrency = 1\n[[keys]]\naccess_key_id = \"B\"\nsecret_access_key = \"s\"\nconcurrency = 2\n",
        );
        assert!(clash.err().is_some_and(|e| e.contains("differ")));
        let unknown = parse(
            "[[keys]]\naccess_key_id = \"A\"\nsecret_access_key = \"s\"\nacount_id = \"1\"\n",
        );
        assert!(unknown.is_err());
        let size = parse(
            "[[keys]]\naccess_key_id = \"A\"\nsecret_access_key = \"s\"\nmemory = \"lots\"\n",
        );
        assert!(size.err().is_some_and(|e| e.contains("not a size")));
    }

    #[test]
    fn sandbox_api_keys_name_their_account() {
        let key_a = format!("e2b_{}", "a1".repeat(20));
        let k = parse(&format!(
            "[[keys]]\naccess_key_id = \"A\"\nsecret_access_key = \"s\"\naccount_id = \"111111111111\"\nsandbox_api_key = \"{key_a}\"\n[[keys]]\naccess_key_id = \"B\"\nsecret_access_key = \"s\"\n"
        ))
        .expect("a valid keys file");
        assert_eq!(
            k.sandbox_account(&key_a).map(|a| a.id.clone()),
            Some("111111111111".to_string())
        );
        assert!(k
            .sandbox_account(&format!("e2b_{}", "b2".repeat(20)))
            .is_none());
        assert!(k.sandbox_account("").is_none());
        let bad = parse(
            "[[keys]]\naccess_key_id = \"A\"\nsecret_access_key = \"s\"\nsandbox_api_key = \"sk_123\"\n",
        );
        assert!(bad.err().is_some_and(|e| e.contains("e2b_")));
    }

    /// AWS's published SigV4 test vector `get-vanilla` (service "service").
    #[test]
    fn aws_test_vector() {
        let headers = vec![
            ("Host".to_string(), "example.amazonaws.com".to_string()),
            ("X-Amz-Date".to_string(), "20150830T123600Z".to_string()),
            (
                "Authorization".to_string(),
                "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31".to_string(),
            ),
        ];
        let now = parse_amz_date("20150830T123600Z").unwrap();
        assert_eq!(
            keys()
                .verify("GET", "/", "", &headers, b"", now)
                .map(|a| a.id.clone())
                .map_err(|e| e.to_string()),
            Ok(DEFAULT_ACCOUNT.to_string())
        );
        // Tampered: another method, a late clock, an unknown key, no header.
        assert!(matches!(
            keys().verify("POST", "/", "", &headers, b"", now),
            Err(AuthError::Mismatch)
        ));
        assert!(matches!(
            keys().verify("GET", "/", "", &headers, b"", now + 3600),
            Err(AuthError::Expired)
        ));
        let mut other = headers.clone();
        other[2].1 = other[2].1.replace("AKIDEXAMPLE", "AKIDOTHER");
        assert!(matches!(
            keys().verify("GET", "/", "", &other, b"", now),
            Err(AuthError::UnknownKey)
        ));
        assert!(matches!(
            keys().verify("GET", "/", "", &headers[..2], b"", now),
            Err(AuthError::Missing)
        ));
    }

    #[test]
    fn dates_parse() {
        assert_eq!(parse_amz_date("19700101T000000Z"), Some(0));
        assert_eq!(parse_amz_date("20150830T123600Z"), Some(1_440_938_160));
        assert_eq!(parse_amz_date("2015-08-30T12:36"), None);
    }
}
