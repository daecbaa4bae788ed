//! spore-envd: E2B's in-guest daemon (`envd`) rebuilt for spore's Linux
//! sandboxes, so that the `e2b` SDK works against spore unmodified. It runs in
//! the guest (started by spore-agent in sandbox mode) and is reached from the
//! host over vsock; for tests it also listens on TCP on the host.
//!
//! - [`proto`]: the envd messages, generated from `proto/` (derived from the
//!   e2b SDK's own descriptors);
//! - [`connect`]: the Connect protocol (unary, server and client streams);
//! - [`server`]: routes, the access token, the listeners;
//! - [`query`]: a request's query parameters;
//! - [`state`]: `/init`'s settings and who a request acts as;
//! - [`api`]: `/health`, `/init`, `/envs`, `/metrics`;
//! - [`files`]: `/files` downloads and uploads;
//! - [`process`]: the `process.Process` service (commands, PTYs, stdin, signals);
//! - [`ports`]: the guest's TCP servers forwarded to vsock (what the sandbox
//!   proxy reaches);
//! - [`filesystem`]: the `filesystem.Filesystem` service and its watchers.

pub mod api;
pub mod clock;
pub mod connect;
pub mod files;
pub mod filesystem;
pub mod metrics;
pub mod ports;
pub mod process;
pub mod query;
pub mod server;
pub mod state;

/// The envd messages (generated at build time).
#[allow(clippy::all, clippy::pedantic, missing_docs, reason = "generated code")]
pub mod proto {
    pub mod process {
        include!(concat!(env!("OUT_DIR"), "/process.rs"));
        include!(concat!(env!("OUT_DIR"), "/process.serde.rs"));
    }
    pub mod filesystem {
        include!(concat!(env!("OUT_DIR"), "/filesystem.rs"));
        include!(concat!(env!("OUT_DIR"), "/filesystem.serde.rs"));
    }
}
