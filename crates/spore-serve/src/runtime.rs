//! Runtimes: how an instance of a function is booted. The instance manager
//! asks a runtime for the VMM API requests that configure a fresh VMM; the
//! start paths (warm, clone, cold) are the same for every runtime. `spore-uk`
//! is the only one today; Linux runtimes (a kernel, a root filesystem, the
//! agent as PID 1) are one more implementation.

use std::path::Path;

use crate::catalog::Function;

/// One request to a VMM's API.
pub struct ApiCall {
    pub method: &'static str,
    pub path: &'static str,
    pub body: String,
}

pub trait Runtime: Send + Sync {
    /// The `Runtime` name of the Lambda API.
    fn name(&self) -> &'static str;

    /// The API calls that configure a fresh VMM for `function` (before
    /// `InstanceStart`): its image, memory and vsock.
    fn configure(&self, function: &Function, image: &Path, vsock_uds: &Path) -> Vec<ApiCall>;
}

/// Every runtime the daemon knows.
pub fn find(name: &str) -> Option<&'static dyn Runtime> {
    match name {
        "spore-uk" => Some(&SporeUk),
        _ => None,
    }
}

/// Names of the runtimes, for error messages.
pub const NAMES: &[&str] = &["spore-uk"];

/// A spore unikernel: the zip's handler file is the image; the environment
/// goes on its command line.
pub struct SporeUk;

impl Runtime for SporeUk {
    fn name(&self) -> &'static str {
        "spore-uk"
    }

    fn configure(&self, f: &Function, image: &Path, vsock_uds: &Path) -> Vec<ApiCall> {
        let boot = serde_json::json!({
            "kernel_image_path": image,
            "boot_args": command_line(f),
            "boot_protocol": "unikernel",
        });
        let machine = serde_json::json!({ "vcpu_count": 1, "mem_size_mib": f.memory_mib });
        let vsock = serde_json::json!({ "guest_cid": 3, "uds_path": vsock_uds });
        let mut calls = vec![
            ApiCall {
                method: "PUT",
                path: "/boot-source",
                body: boot.to_string(),
            },
            ApiCall {
                method: "PUT",
                path: "/machine-config",
                body: machine.to_string(),
            },
            ApiCall {
                method: "PUT",
                path: "/vsock",
                body: vsock.to_string(),
            },
        ];
        if f.network {
            // `tap0` of the instance's own namespace (the VMM runs in it).
            let iface = serde_json::json!({
                "iface_id": "eth0",
                "host_dev_name": crate::network::TAP_NAME,
            });
            calls.push(ApiCall {
                method: "PUT",
                path: "/network-interfaces/eth0",
                body: iface.to_string(),
            });
        }
        calls
    }
}

/// `env.KEY=VALUE` words (VALUE percent-encoded) for the function's
/// environment and Lambda's `AWS_LAMBDA_*` variables.
pub fn command_line(f: &Function) -> String {
    let mut words = vec![
        format!("env.AWS_LAMBDA_FUNCTION_NAME={}", percent_encode(&f.name)),
        "env.AWS_LAMBDA_FUNCTION_VERSION=%24LATEST".to_string(),
        format!("env.AWS_LAMBDA_FUNCTION_MEMORY_SIZE={}", f.memory_mib),
    ];
    for (k, v) in &f.env {
        words.push(format!("env.{k}={}", percent_encode(v)));
    }
    if f.network {
        words.push(crate::network::guest_cmdline());
    }
    words.join(" ")
}

fn percent_encode(s: &str) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environment_is_percent_encoded() {
        assert_eq!(percent_encode("a b/ü"), "a%20b%2F%C3%BC");
        assert_eq!(percent_encode("A-z_0.~"), "A-z_0.~");
    }
}
