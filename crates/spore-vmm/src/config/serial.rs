//! `PUT /serial`: where the guest's serial console goes.

use serde::{Deserialize, Serialize};

use super::rate_limiter::TokenBucketConfig;

/// Firecracker's `SerialDevice` body. Without `serial_out_path` the console
/// goes to the VMM's stdout; with it, to that file or FIFO (created 0600 if
/// missing, appended to, never blocking the vCPU).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SerialConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial_out_path: Option<String>,
    /// Bytes per refill period the guest may write; what exceeds it is
    /// dropped (and counted), as in Firecracker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limiter: Option<TokenBucketConfig>,
}
