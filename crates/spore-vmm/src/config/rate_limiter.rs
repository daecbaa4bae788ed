//! Firecracker's `RateLimiter` and `TokenBucket` shapes (drives today; the
//! entropy and network devices take the same), as given in a request body.

use serde::{Deserialize, Serialize};

/// `{"bandwidth": {...}, "ops": {...}}`: either bucket may be left out (or
/// `null`); in a `PATCH`, a bucket left out keeps its current setting.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenBucketConfig {
    pub size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub one_time_burst: Option<u64>,
    pub refill_time: u64,
}
