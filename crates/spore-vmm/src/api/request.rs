//! HTTP method + path + body → a typed [`ApiRequest`].
//!
//! Everything the API checks about what a client sent is checked here, in one
//! place: the route, the method, the JSON shape (unknown fields and wrong
//! types are refused with a message naming the field), and the path/body
//! agreement of `/drives/{id}`. Nothing here panics on any input.

use hyper::Method;
use serde::de::DeserializeOwned;

use super::body::{
    BalloonHintingStart, BalloonStatsUpdate, BalloonUpdate, HotplugMemoryUpdate,
    InstanceActionInfo, TmemUpdate, VmStateBody,
};
use super::{printable, ApiError, ApiRequest, MachineConfigPatch, PartialDrive};
use crate::config::{
    BalloonConfig, BootSourceConfig, ConfigError, DriveConfig, GuestSnapshotConfig, MachineConfig,
    MemoryHotplugConfig, NetConfigError, NetworkInterfaceConfig, PartialNetworkInterface,
    VsockConfig,
};

/// A resource the API serves, named by its path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Resource<'a> {
    Root,
    MachineConfig,
    VmConfig,
    BootSource,
    /// `/drives/{id}`; the id is empty for a bare `/drives`.
    Drive(&'a str),
    /// `/network-interfaces/{id}`; the id is empty for a bare `/network-interfaces`.
    NetworkInterface(&'a str),
    Vsock,
    Actions,
    Vm,
    Tmem,
    Balloon,
    BalloonStatistics,
    BalloonHintingStart,
    BalloonHintingStatus,
    BalloonHintingStop,
    HotplugMemory,
    SnapshotCreate,
    SnapshotLoad,
    Clone,
    CloneConfig,
    GuestSnapshots,
    Version,
    SnapshotLast,
    Logger,
    Metrics,
    Entropy,
    Serial,
    CpuConfig,
    Mmds,
    MmdsConfig,
}

impl Resource<'_> {
    /// The methods this resource answers, for 405 messages and `Allow`.
    fn methods(self) -> &'static [&'static str] {
        match self {
            Resource::Root | Resource::VmConfig | Resource::Version | Resource::SnapshotLast => {
                &["GET"]
            }
            Resource::Logger
            | Resource::Metrics
            | Resource::Entropy
            | Resource::Serial
            | Resource::CpuConfig
            | Resource::MmdsConfig => &["PUT"],
            Resource::Mmds => &["GET", "PUT", "PATCH"],
            Resource::MachineConfig | Resource::HotplugMemory => &["GET", "PUT", "PATCH"],
            Resource::Drive(_) | Resource::NetworkInterface(_) => &["PUT", "PATCH"],
            Resource::BootSource | Resource::Vsock | Resource::Actions => &["PUT"],
            Resource::Vm => &["PATCH"],
            Resource::Tmem => &["GET", "PUT"],
            Resource::Balloon => &["GET", "PUT", "PATCH"],
            Resource::BalloonStatistics => &["GET", "PATCH"],
            Resource::BalloonHintingStart | Resource::BalloonHintingStop => &["PATCH"],
            Resource::BalloonHintingStatus => &["GET"],
            Resource::SnapshotCreate | Resource::SnapshotLoad => &["PUT"],
            Resource::Clone => &["GET", "PUT"],
            Resource::CloneConfig => &["PUT"],
            Resource::GuestSnapshots => &["GET", "PUT"],
        }
    }
}

/// Finds the resource a path names. One trailing `/` is tolerated; the query
/// string is not part of `path` (hyper splits it off).
fn resource(path: &str) -> Option<Resource<'_>> {
    let trimmed = match path.strip_suffix('/') {
        Some(p) if p.len() > 1 => p,
        _ => path,
    };
    Some(match trimmed {
        "/" => Resource::Root,
        "/machine-config" => Resource::MachineConfig,
        "/vm/config" => Resource::VmConfig,
        "/boot-source" => Resource::BootSource,
        "/vsock" => Resource::Vsock,
        "/actions" => Resource::Actions,
        "/vm" => Resource::Vm,
        "/tmem" => Resource::Tmem,
        "/balloon" => Resource::Balloon,
        "/balloon/statistics" => Resource::BalloonStatistics,
        "/balloon/hinting/start" => Resource::BalloonHintingStart,
        "/balloon/hinting/status" => Resource::BalloonHintingStatus,
        "/balloon/hinting/stop" => Resource::BalloonHintingStop,
        "/hotplug/memory" => Resource::HotplugMemory,
        "/snapshot/create" => Resource::SnapshotCreate,
        "/snapshot/load" => Resource::SnapshotLoad,
        "/clone" => Resource::Clone,
        "/clone/config" => Resource::CloneConfig,
        "/snapshot/guest-triggered" => Resource::GuestSnapshots,
        "/version" => Resource::Version,
        "/snapshot/last" => Resource::SnapshotLast,
        "/logger" => Resource::Logger,
        "/metrics" => Resource::Metrics,
        "/entropy" => Resource::Entropy,
        "/serial" => Resource::Serial,
        "/cpu-config" => Resource::CpuConfig,
        "/mmds" => Resource::Mmds,
        "/mmds/config" => Resource::MmdsConfig,
        "/drives" => Resource::Drive(""),
        "/network-interfaces" => Resource::NetworkInterface(""),
        p => {
            let res = match p.strip_prefix("/drives/") {
                Some(id) => Resource::Drive(id),
                None => Resource::NetworkInterface(p.strip_prefix("/network-interfaces/")?),
            };
            let (Resource::Drive(id) | Resource::NetworkInterface(id)) = res else {
                return None;
            };
            if id.contains('/') {
                return None;
            }
            res
        }
    })
}

/// The methods a path answers (for an `Allow` header), or `None` if the path
/// names no resource.
pub fn allowed_methods(path: &str) -> Option<&'static [&'static str]> {
    resource(path).map(Resource::methods)
}

/// Turns one HTTP request into an [`ApiRequest`]. `path` is the URI path
/// without the query; `body` is the whole body (the server bounds its size).
/// Bodies of `GET` requests are ignored.
pub fn parse_request(method: &Method, path: &str, body: &[u8]) -> Result<ApiRequest, ApiError> {
    let m = method.as_str();
    if let Some(e) = super::unsupported::firecracker_only(m, path) {
        return Err(e);
    }
    let res = resource(path)
        .ok_or_else(|| ApiError::NotFound(format!("no such resource: {}", printable(path))))?;
    let req = match (res, m) {
        (Resource::Root, "GET") => ApiRequest::GetInstanceInfo,
        (Resource::MachineConfig, "GET") => ApiRequest::GetMachineConfig,
        (Resource::VmConfig, "GET") => ApiRequest::GetVmConfig,
        (Resource::BootSource, "PUT") => {
            ApiRequest::PutBootSource(decode::<BootSourceConfig>(m, path, body)?)
        }
        (Resource::MachineConfig, "PUT") => {
            ApiRequest::PutMachineConfig(decode::<MachineConfig>(m, path, body)?)
        }
        (Resource::MachineConfig, "PATCH") => {
            let patch = decode::<MachineConfigPatch>(m, path, body)?;
            if patch.is_empty() {
                return Err(ApiError::BadRequest(
                    "PATCH /machine-config changes nothing: give at least one field".into(),
                ));
            }
            ApiRequest::PatchMachineConfig(patch)
        }
        (Resource::Drive(id), "PUT") => put_drive(id, m, path, body)?,
        (Resource::Drive(id), "PATCH") => patch_drive(id, m, path, body)?,
        (Resource::NetworkInterface(""), _) => {
            // Firecracker's answer without the id.
            return Err(ApiError::BadRequest(format!(
                "Invalid request method and/or path: {m} network-interfaces."
            )));
        }
        (Resource::NetworkInterface(id), "PUT") => put_network_interface(id, m, path, body)?,
        (Resource::NetworkInterface(id), "PATCH") => patch_network_interface(id, m, path, body)?,
        (Resource::Vsock, "PUT") => ApiRequest::PutVsock(decode::<VsockConfig>(m, path, body)?),
        (Resource::Actions, "PUT") => {
            ApiRequest::Action(decode::<InstanceActionInfo>(m, path, body)?.action_type)
        }
        (Resource::Tmem, "GET") => ApiRequest::GetTmem,
        (Resource::Tmem, "PUT") => {
            let update = decode::<TmemUpdate>(m, path, body)?;
            if update.is_empty() {
                return Err(ApiError::BadRequest(
                    "PUT /tmem changes nothing: give quota_bytes, compression or enabled".into(),
                ));
            }
            ApiRequest::PutTmem(update)
        }
        (Resource::Vm, "PATCH") => ApiRequest::PatchVm(decode::<VmStateBody>(m, path, body)?.state),
        (Resource::Balloon, "GET") => ApiRequest::GetBalloon,
        (Resource::Balloon, "PUT") => {
            ApiRequest::PutBalloon(decode::<BalloonConfig>(m, path, body)?)
        }
        (Resource::Balloon, "PATCH") => {
            ApiRequest::PatchBalloon(decode::<BalloonUpdate>(m, path, body)?)
        }
        (Resource::BalloonStatistics, "GET") => ApiRequest::GetBalloonStatistics,
        (Resource::BalloonStatistics, "PATCH") => {
            ApiRequest::PatchBalloonStatistics(decode::<BalloonStatsUpdate>(m, path, body)?)
        }
        // The body is optional, as in Firecracker.
        (Resource::BalloonHintingStart, "PATCH") => {
            ApiRequest::StartBalloonHinting(if body.iter().all(u8::is_ascii_whitespace) {
                BalloonHintingStart::default()
            } else {
                decode(m, path, body)?
            })
        }
        (Resource::BalloonHintingStatus, "GET") => ApiRequest::GetBalloonHintingStatus,
        // Firecracker ignores a stop's body; so does spore.
        (Resource::BalloonHintingStop, "PATCH") => ApiRequest::StopBalloonHinting,

        (Resource::HotplugMemory, "GET") => ApiRequest::GetHotplugMemory,
        (Resource::HotplugMemory, "PUT") => {
            let c = decode::<MemoryHotplugConfig>(m, path, body)?;
            c.validate()?;
            ApiRequest::PutHotplugMemory(c)
        }
        (Resource::HotplugMemory, "PATCH") => {
            ApiRequest::PatchHotplugMemory(decode::<HotplugMemoryUpdate>(m, path, body)?)
        }
        (Resource::SnapshotCreate, "PUT") => ApiRequest::CreateSnapshot(decode(m, path, body)?),
        (Resource::SnapshotLoad, "PUT") => ApiRequest::LoadSnapshot(decode(m, path, body)?),
        (Resource::Clone, "GET") => ApiRequest::GetClone,
        (Resource::Clone, "PUT") => ApiRequest::PutClone(decode(m, path, body)?),
        (Resource::CloneConfig, "PUT") => ApiRequest::PutCloneConfig(decode(m, path, body)?),
        (Resource::GuestSnapshots, "GET") => ApiRequest::GetGuestSnapshots,
        (Resource::Version, "GET") => ApiRequest::GetVersion,
        (Resource::SnapshotLast, "GET") => ApiRequest::GetLastSnapshot,
        (Resource::Logger, "PUT") => ApiRequest::PutLogger(decode(m, path, body)?),
        (Resource::Metrics, "PUT") => ApiRequest::PutMetrics(decode(m, path, body)?),
        (Resource::Entropy, "PUT") => ApiRequest::PutEntropy(decode(m, path, body)?),
        (Resource::Serial, "PUT") => ApiRequest::PutSerial(decode(m, path, body)?),
        (Resource::CpuConfig, "PUT") => ApiRequest::PutCpuConfig(decode(m, path, body)?),
        (Resource::Mmds, "GET") => ApiRequest::GetMmds,
        (Resource::Mmds, "PUT") => ApiRequest::PutMmds(decode(m, path, body)?),
        (Resource::Mmds, "PATCH") => ApiRequest::PatchMmds(decode(m, path, body)?),
        (Resource::MmdsConfig, "PUT") => ApiRequest::PutMmdsConfig(decode(m, path, body)?),
        (Resource::GuestSnapshots, "PUT") => {
            let c = decode::<GuestSnapshotConfig>(m, path, body)?;
            c.validate_here().map_err(ApiError::BadRequest)?;
            ApiRequest::PutGuestSnapshots(c)
        }
        (res, _) => {
            return Err(ApiError::MethodNotAllowed(format!(
                "{} is not allowed on {}; use {}",
                printable(m),
                printable(path),
                res.methods().join(" or ")
            )))
        }
    };
    Ok(req)
}

/// `PUT /drives/{id}`: the body's `drive_id` must be the path's.
fn put_drive(id: &str, m: &str, path: &str, body: &[u8]) -> Result<ApiRequest, ApiError> {
    if id.is_empty() {
        return Err(ApiError::BadRequest(
            "the drive id is missing from the path: PUT /drives/{drive_id}".into(),
        ));
    }
    let drive = decode::<DriveConfig>(m, path, body)?;
    if drive.drive_id != id {
        return Err(ConfigError::DriveIdMismatch {
            path: printable(id),
            body: drive.drive_id,
        }
        .into());
    }
    Ok(ApiRequest::PutDrive(drive))
}

/// `PATCH /drives/{id}`: the body's `drive_id` must be the path's.
fn patch_drive(id: &str, m: &str, path: &str, body: &[u8]) -> Result<ApiRequest, ApiError> {
    let drive = decode::<PartialDrive>(m, path, body)?;
    if drive.drive_id != id {
        return Err(ConfigError::DriveIdMismatch {
            path: printable(id),
            body: drive.drive_id,
        }
        .into());
    }
    Ok(ApiRequest::PatchDrive(drive))
}

/// `PUT /network-interfaces/{id}`: the body's `iface_id` must be the path's.
fn put_network_interface(
    id: &str,
    m: &str,
    path: &str,
    body: &[u8],
) -> Result<ApiRequest, ApiError> {
    let iface = decode::<NetworkInterfaceConfig>(m, path, body)?;
    if iface.iface_id != id {
        return Err(ConfigError::from(NetConfigError::IdMismatch {
            path: printable(id),
            body: iface.iface_id,
        })
        .into());
    }
    Ok(ApiRequest::PutNetworkInterface(iface))
}

/// `PATCH /network-interfaces/{id}`: the body's `iface_id` must be the path's.
fn patch_network_interface(
    id: &str,
    m: &str,
    path: &str,
    body: &[u8],
) -> Result<ApiRequest, ApiError> {
    let patch = decode::<PartialNetworkInterface>(m, path, body)?;
    if patch.iface_id != id {
        return Err(ConfigError::from(NetConfigError::IdMismatch {
            path: printable(id),
            body: patch.iface_id,
        })
        .into());
    }
    Ok(ApiRequest::PatchNetworkInterface(patch))
}

/// Decodes a JSON body, naming the offending field in the error.
fn decode<T: DeserializeOwned>(method: &str, path: &str, body: &[u8]) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::BadRequest(format!(
            "{method} {} needs a JSON body",
            printable(path)
        )));
    }
    let bad = |detail: String| {
        ApiError::BadRequest(format!(
            "invalid body for {method} {}: {detail}",
            printable(path)
        ))
    };
    let mut de = serde_json::Deserializer::from_slice(body);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let field = e.path().to_string();
        let inner = e.into_inner().to_string();
        // serde_json's own messages name unknown and missing fields, but not
        // the field whose value has the wrong type: the path does. "." is the
        // top level, "?" an unparsable position.
        let named = field == "." || field.contains('?') || inner.contains(&format!("`{field}`"));
        if named {
            bad(inner)
        } else {
            bad(format!("field `{field}`: {inner}"))
        }
    })?;
    de.end().map_err(|e| bad(e.to_string()))?;
    Ok(value)
}

#[cfg(test)]
#[path = "request_tests.rs"]
mod tests;
