//! Firecracker's `RateLimiter` and `TokenBucket` shapes, as a request body
//! gives them: drives, the entropy device, the serial console and network
//! interfaces (rx and tx) take them. The limiter itself is
//! `crate::rate_limiter`.
//!
//! Firecracker refuses no values here: a bucket of `size` 0 or `refill_time`
//! 0 is a disabled bucket, so these types only check the JSON shape.

use serde::{Deserialize, Serialize};

/// `{"bandwidth": {...}, "ops": {...}}`: either bucket may be left out (or
/// `null`); in a `PATCH`, a bucket left out keeps its current setting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimiterConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth: Option<TokenBucketConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ops: Option<TokenBucketConfig>,
}

/// One bucket: `size` tokens (bytes or operations), refilled in full every
/// `refill_time` ms, plus an initial `one_time_burst` that never refills.
/// A size or refill time of 0 means no limit (Firecracker's meaning).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenBucketConfig {
    pub size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
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
