//! spore-vmm: everything one spore VMM process does.
//!
//! One process runs one microVM. [`config`] holds what the user asked for,
//! [`arch`] knows how to boot x86_64 guests, [`devices`] models the hardware,
//! [`vm`] drives KVM.

pub mod api;
pub mod arch;
pub mod boot_timer;
pub mod builder;
pub mod clone;
pub mod config;
pub mod device_manager;
pub mod devices;
pub mod files;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzz_api;
pub mod host;
pub mod host_usize;
pub mod log_limit;
pub mod logger;
pub mod memory;
pub mod metrics;
pub mod mmds;
pub mod own_exe;
pub mod persist;
pub mod phase;
pub mod privilege;
pub mod rate_limiter;
pub mod seccomp;
pub mod snapshot;
pub mod vm;
pub mod vmm;
