//! The VMM's REST API: HTTP/1.1 + JSON on a Unix socket, Firecracker-compatible.
//!
//! Where Firecracker has an endpoint, spore accepts the same method, path and
//! body, so existing Firecracker clients work. The module is split by question:
//!
//! - [`request`]: HTTP method + path + body → a typed [`ApiRequest`]; all
//!   validation of what a client sent happens there, in one place.
//! - [`body`]: JSON bodies that exist only in the API (actions, VM state,
//!   machine-config patch, instance info). Configuration bodies live in
//!   [`crate::config`].
//! - [`response`]: [`ApiResponse`] / [`ApiError`] → HTTP status and body.
//! - [`server`]: the socket, the HTTP connection handling and the thread.
//! - [`client`]: the other end, one blocking request from a host program
//!   (the `spore` command, the benchmarks).
//!
//! The API never touches the VM itself: it hands each typed request to an
//! [`ApiHandler`] that the VMM implements, one request at a time. Nothing a
//! client sends may panic the VMM; every error reaches the client as a 4xx
//! (or 500) with `{"fault_message": "..."}`.
//!
//! Unknown paths get **404** (Firecracker answers 400 there); a known path with
//! the wrong method gets **405** with an `Allow` header. Firecracker's
//! endpoints that spore does not serve yet ([`unsupported`]) get **400**: a
//! method Firecracker serves there with "spore does not support ... yet",
//! any other with Firecracker's own "Invalid request method and/or path".

pub mod body;
pub mod client;
pub mod request;
pub mod response;
pub mod server;
pub mod snapshot_body;
mod socket;
mod unsupported;

#[cfg(test)]
mod clone_route_tests;

pub use body::{
    ActionType, BalloonHintingStart, BalloonStatsUpdate, BalloonUpdate, HotplugMemoryUpdate,
    InstanceInfo, InstanceState, MachineConfigPatch, PartialDrive, TmemInfo, TmemUpdate,
    VersionInfo, VmState,
};
pub use request::parse_request;
pub use server::{ApiServer, ApiServerError};

use crate::config::{
    BalloonConfig, BootSourceConfig, ConfigError, DriveConfig, MachineConfig, MemoryHotplugConfig,
    VsockConfig,
};

/// One API call, parsed and type-checked (but not yet validated against the
/// VM's state: that is the handler's job).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ApiRequest {
    /// `GET /`: answer with [`InstanceInfo`].
    GetInstanceInfo,
    /// `GET /machine-config`.
    GetMachineConfig,
    /// `GET /vm/config`: the whole configuration ([`crate::config::VmConfig`]).
    GetVmConfig,
    /// `PUT /boot-source`.
    PutBootSource(BootSourceConfig),
    /// `PUT /machine-config`.
    PutMachineConfig(MachineConfig),
    /// `PATCH /machine-config` (at least one field is set).
    PatchMachineConfig(MachineConfigPatch),
    /// `PUT /drives/{id}`; the path id equals `drive_id` (checked).
    PutDrive(DriveConfig),
    /// `PATCH /drives/{id}`; the path id equals `drive_id` (checked).
    PatchDrive(PartialDrive),
    /// `PUT /network-interfaces/{iface_id}` (before boot).
    PutNetworkInterface(crate::config::NetworkInterfaceConfig),
    /// `PATCH /network-interfaces/{iface_id}`: new rate limits (after boot).
    PatchNetworkInterface(crate::config::PartialNetworkInterface),
    /// `PUT /vsock`.
    PutVsock(VsockConfig),
    /// `PUT /actions`.
    Action(ActionType),
    /// `PATCH /vm`.
    PatchVm(VmState),
    /// `GET /tmem`: answer with [`TmemInfo`].
    GetTmem,
    /// `PUT /tmem` (at least one field is set).
    PutTmem(TmemUpdate),
    /// `PUT /balloon` (before InstanceStart).
    PutBalloon(BalloonConfig),
    /// `PATCH /balloon`: a new target.
    PatchBalloon(BalloonUpdate),
    /// `GET /balloon`.
    GetBalloon,
    /// `GET /balloon/statistics`.
    GetBalloonStatistics,
    /// `PATCH /balloon/statistics`: a new polling interval.
    PatchBalloonStatistics(BalloonStatsUpdate),
    /// `PATCH /balloon/hinting/start`: a free page hinting run.
    StartBalloonHinting(BalloonHintingStart),
    /// `GET /balloon/hinting/status`.
    GetBalloonHintingStatus,
    /// `PATCH /balloon/hinting/stop`.
    StopBalloonHinting,
    /// `PUT /hotplug/memory`: configure the virtio-mem region (before boot).
    PutHotplugMemory(MemoryHotplugConfig),
    /// `PATCH /hotplug/memory`: set the target plugged size (running VM).
    PatchHotplugMemory(HotplugMemoryUpdate),
    /// `GET /hotplug/memory`: configuration and plugged size.
    GetHotplugMemory,
    /// `PUT /snapshot/create`.
    CreateSnapshot(crate::snapshot::params::SnapshotCreateParams),
    /// `PUT /snapshot/load`.
    LoadSnapshot(snapshot_body::SnapshotLoadParams),
    /// `PUT /clone`: start clones of this VM.
    PutClone(crate::clone::CloneRequest),
    /// `PUT /clone/config`: clone mode, fork count, cap, socket directory, standby processes.
    PutCloneConfig(crate::clone::CloneConfig),
    /// `GET /clone`: the clone configuration and template status.
    GetClone,
    /// `PUT /snapshot/guest-triggered`: where guest snapshot points go.
    PutGuestSnapshots(crate::config::GuestSnapshotConfig),
    /// `GET /snapshot/guest-triggered`.
    GetGuestSnapshots,
    /// `GET /version`: answer with [`VersionInfo`].
    GetVersion,
    /// `GET /snapshot/last` (spore): the manifest of the last snapshot this
    /// VMM wrote (`PUT /snapshot/create` answers 204, as Firecracker does).
    GetLastSnapshot,
    /// `PUT /logger`.
    PutLogger(crate::config::LoggerConfig),
    /// `PUT /metrics`.
    PutMetrics(crate::config::MetricsConfig),
    PutEntropy(crate::config::EntropyConfig),
    PutSerial(crate::config::SerialConfig),
    PutCpuConfig(crate::config::CpuConfig),
    GetMmds,
    PutMmds(serde_json::Value),
    PatchMmds(serde_json::Value),
    PutMmdsConfig(crate::config::MmdsConfig),
}

/// What a successful request answers.
#[derive(Clone, Debug, PartialEq)]
pub enum ApiResponse {
    /// 204 No Content.
    NoContent,
    /// 200 OK with a JSON body.
    Json(serde_json::Value),
}

impl ApiResponse {
    /// A 200 response carrying `value` as JSON.
    pub fn json<T: serde::Serialize>(value: &T) -> Result<ApiResponse, ApiError> {
        serde_json::to_value(value)
            .map(ApiResponse::Json)
            .map_err(|e| ApiError::Internal(format!("cannot encode the response: {e}")))
    }
}

/// Why a request failed. Each variant maps to one HTTP status; the message
/// becomes the `fault_message` the client sees, so say what to change.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// 400: the request is malformed or not valid now.
    #[error("{0}")]
    BadRequest(String),
    /// 404: no such resource.
    #[error("{0}")]
    NotFound(String),
    /// 405: the resource exists but not with this method.
    #[error("{0}")]
    MethodNotAllowed(String),
    /// 408: the client did not send the request in time.
    #[error("{0}")]
    RequestTimeout(String),
    /// 413: the body is larger than the API accepts.
    #[error("{0}")]
    PayloadTooLarge(String),
    /// 500: the VMM failed to do something it should have been able to do.
    #[error("{0}")]
    Internal(String),
}

/// A client-supplied string made safe to echo in a message and a log line:
/// control characters escaped, length bounded.
fn printable(s: &str) -> String {
    const MAX: usize = 128;
    let mut out: String = s.chars().take(MAX).flat_map(char::escape_debug).collect();
    if s.chars().nth(MAX).is_some() {
        out.push('…');
    }
    out
}

impl From<ConfigError> for ApiError {
    /// A configuration a user sent that does not validate is their error.
    fn from(e: ConfigError) -> Self {
        ApiError::BadRequest(e.to_string())
    }
}

/// The VMM's side of the API. Called on the API thread, one request at a
/// time, so an implementation never sees two requests at once.
pub trait ApiHandler: Send + Sync + 'static {
    fn handle(&self, req: ApiRequest) -> Result<ApiResponse, ApiError>;
}
