//! Firecracker's rate limiter shapes (`TokenBucket`, `RateLimiter`), as the
//! entropy device and the serial console take them.
//!
//! Firecracker refuses no values here: a bucket of `size` 0 or `refill_time`
//! 0 is a disabled bucket, so these types only check the JSON shape.

use serde::{Deserialize, Serialize};

/// One token bucket: `size` tokens, refilled over `refill_time` ms, with an
/// extra `one_time_burst` spent first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenBucketConfig {
    pub size: u64,
    #[serde(default)]
    pub one_time_burst: Option<u64>,
    pub refill_time: u64,
}

impl TokenBucketConfig {
    /// Firecracker treats a bucket that can never hold or regain a token as
    /// no limit at all.
    pub fn is_active(&self) -> bool {
        self.size > 0 && self.refill_time > 0
    }
}

/// A bandwidth (bytes) bucket and an operations bucket, each optional.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimiterConfig {
    #[serde(default)]
    pub bandwidth: Option<TokenBucketConfig>,
    #[serde(default)]
    pub ops: Option<TokenBucketConfig>,
}
