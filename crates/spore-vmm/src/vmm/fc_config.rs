//! Firecracker's pre-boot settings for the serial console, the entropy
//! device and the CPU template: `PUT /serial`, `PUT /entropy`,
//! `PUT /cpu-config`, and the serial sink they lead to at start or restore.

use super::preboot::configure;
use super::Vmm;
use crate::api::ApiError;
use crate::builder::BuildError;
use crate::config::{CpuConfig, EntropyConfig, SerialConfig, VmConfig};
use crate::devices::legacy::serial::SerialOut;
use crate::devices::legacy::serial_limit::{RateLimitedOut, TokenBucket};

impl Vmm {
    /// `PUT /serial`: used when the VM is built (booted or restored); the
    /// path is opened then, as Firecracker opens it.
    pub fn set_serial(&self, s: SerialConfig) -> Result<(), ApiError> {
        configure(&mut self.lock(), |c| c.serial = Some(s))
    }

    /// `PUT /entropy`: the rng device's rate limiter (every spore VM has
    /// the device).
    pub fn set_entropy(&self, e: EntropyConfig) -> Result<(), ApiError> {
        configure(&mut self.lock(), |c| c.entropy = Some(e))
    }

    /// `PUT /cpu-config`: a custom template replaces a static one.
    pub fn set_cpu_config(&self, t: CpuConfig) -> Result<(), ApiError> {
        configure(&mut self.lock(), |c| {
            c.machine.cpu_template = None;
            c.cpu_config = Some(t);
        })
    }
}

/// The serial sink for a VM built from `config`: `serial_out_path` if set
/// (else `default`, the VMM's stdout), behind the rate limiter if one is
/// set. On failure `default` comes back with the error, to be kept.
pub(super) fn serial_sink(
    config: &VmConfig,
    default: SerialOut,
) -> Result<SerialOut, (SerialOut, BuildError)> {
    let Some(s) = &config.serial else {
        return Ok(default);
    };
    let out: SerialOut = match &s.serial_out_path {
        Some(path) => match crate::files::open_log_target(std::path::Path::new(path)) {
            Ok(f) => Box::new(f),
            Err(source) => {
                return Err((
                    default,
                    BuildError::Open {
                        what: "serial_out_path",
                        path: path.clone(),
                        source,
                    },
                ))
            }
        },
        None => default,
    };
    Ok(match s.rate_limiter.as_ref().and_then(TokenBucket::new) {
        Some(bucket) => Box::new(RateLimitedOut::new(out, bucket)),
        None => out,
    })
}
