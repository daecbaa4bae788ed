//! What makes a clone a different machine from its source: its clone
//! generation, its vsock CID, its own disks and, optionally, new network
//! addresses (MAC, IPv4; the namespace it runs in is `super::network`'s). The one place the clone
//! paths (and a load with `clone_generation`) give or record an identity.
//!
//! - [`apply`] runs on a restored VM that is still paused: it sets the
//!   generation the guest reads (signal port `GENERATION`, and for a
//!   unikernel the word at `spore_abi::boot::GENERATION_ADDR`), changes the
//!   vsock CID (config space + transport reset, on which Linux re-reads it),
//!   tells a Linux guest through a vsock connection to
//!   `spore_abi::signal::GENERATION_VSOCK_PORT`, and wakes a `WAIT`. A new
//!   MAC goes into the net device's config space (with a config-change
//!   interrupt); a new IPv4 into the unikernel's
//!   `spore_abi::net::NET_IDENTITY_ADDR` block, and for Linux both into the
//!   notice's `mac`/`ipv4` lines. The contract is documented in
//!   `spore_abi::signal` and `spore_abi::net`. [`record`] keeps the new
//!   CID in the configuration, so that a snapshot of the clone keeps it.
//! - [`freeze_disks`] runs on the source before its state is captured: every
//!   writable drive stops writing its image, which becomes the read-only
//!   base its clones share; the configuration records each new overlay.
//! - [`clone_drive`] and [`clone_vsock_cid`] derive one clone's drives and
//!   CID from its source's configuration.
//!
//! The vsock device's own side of a CID change lives with the device
//! (`devices::virtio::vsock::identity`).

use std::path::Path;

use serde::{Deserialize, Serialize};
use spore_abi::boot::{CLONE_INDEX_ADDR, GENERATION_ADDR};
use spore_abi::net::{NetIdentity, NET_IDENTITY_ADDR, NET_IDENTITY_MAGIC};
use spore_abi::signal::GENERATION_VSOCK_PORT;
use vm_memory::{Bytes, GuestAddress};

use super::network::NetIdentityChange;
use super::CloneError;
use crate::arch::GuestKind;
use crate::config::{CowOverlayConfig, DriveConfig, VmConfig};
use crate::devices::virtio::blk::FreezeError;
use crate::devices::virtio::vsock::{Notice, VsockError};
use crate::vm::{RunState, Vm};

/// The identity a clone gets before it first runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CloneIdentity {
    /// Must differ from the source's (and from every sibling's) for the guest
    /// to notice; 0 is the generation of a booted VM.
    pub generation: u64,
    /// A new vsock CID; `None` keeps the source's.
    pub vsock_cid: Option<u32>,
    /// The clone's number from its source (0: not a clone of a running
    /// source, e.g. a restore with `clone_generation`); a unikernel reads
    /// it at `spore_abi::boot::CLONE_INDEX_ADDR`.
    #[serde(default)]
    pub index: u64,
    /// New network addresses, per interface (the others keep theirs).
    #[serde(default)]
    pub net: Vec<NetIdentityChange>,
}

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error(
        "the VM is {0:?}; a clone identity is applied to a restored VM before it resumes (paused)"
    )]
    NotPaused(RunState),
    #[error("vsock_cid {0} was given but the VM has no vsock device")]
    NoVsock(u32),
    #[error("vsock: {0}")]
    Vsock(#[from] VsockError),
    #[error("cannot write the generation into guest memory: {0}")]
    Memory(String),
    #[error("a new identity for network interface {0:?}, which the VM does not have")]
    NoInterface(String),
    #[error("a unikernel guest takes a new IPv4 address for one interface (its one identity block), not {0}")]
    ManyIpv4(usize),
}

/// A drive that [`freeze_disks`] switched to copy-on-write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrozenDrive {
    pub drive_id: String,
    /// Its new overlay; the drive's image is now the read-only base.
    pub cow_overlay: CowOverlayConfig,
}

/// Gives this (restored, paused) VM a clone's identity; see the module docs.
pub fn apply(vm: &Vm, id: &CloneIdentity) -> Result<(), IdentityError> {
    match vm.state() {
        // Built and not yet run (a clone about to start), or paused.
        RunState::NotStarted | RunState::Paused => {}
        s => return Err(IdentityError::NotPaused(s)),
    }
    // Before the generation word: a unikernel re-reads its network
    // identity when it sees the generation change.
    let net_lines = apply_net(vm, &id.net)?;
    if vm.kind() == GuestKind::Unikernel {
        let mem = vm.ram().memory();
        // The number first: a guest that sees the generation change reads
        // the rest of its identity.
        mem.write_obj(id.index, GuestAddress(CLONE_INDEX_ADDR))
            .and_then(|()| mem.write_obj(id.generation, GuestAddress(GENERATION_ADDR)))
            .map_err(|e| IdentityError::Memory(e.to_string()))?;
    }
    match (vm.vsock(), id.vsock_cid) {
        (None, Some(cid)) => return Err(IdentityError::NoVsock(cid)),
        (None, None) => {}
        (Some(vsock), cid) => {
            // The reset is owed even with the same CID: the source's host
            // sockets are not this VMM's. Only Linux has a listener for
            // the notice (the unikernel reads the generation word).
            let notice = (vm.kind() == GuestKind::Linux).then(|| Notice {
                port: GENERATION_VSOCK_PORT,
                message: format!("generation {}\n{}{net_lines}", id.generation, time_line())
                    .into_bytes(),
            });
            let cid = cid.map_or_else(|| vsock.guest_cid(), u64::from);
            vsock.set_guest_cid(cid, notice)?;
        }
    }
    vm.signal().set_generation(id.generation);
    tracing::info!(
        generation = id.generation,
        vsock_cid = ?id.vsock_cid,
        "clone identity applied"
    );
    Ok(())
}

/// Puts new MACs in the net devices' config spaces and, for a unikernel,
/// a new IPv4 in its identity block; returns the Linux notice's lines for
/// them (in the order of the VM's interfaces).
fn apply_net(vm: &Vm, changes: &[NetIdentityChange]) -> Result<String, IdentityError> {
    let nets = vm.nets();
    for c in changes {
        if !nets.iter().any(|h| h.iface_id() == c.iface_id) {
            return Err(IdentityError::NoInterface(c.iface_id.clone()));
        }
    }
    let with_ipv4 = changes.iter().filter(|c| c.ipv4.is_some()).count();
    if vm.kind() == GuestKind::Unikernel && with_ipv4 > 1 {
        return Err(IdentityError::ManyIpv4(with_ipv4));
    }
    let mut lines = String::new();
    // Virtio-net devices are listed to the guest in attach order, which is
    // the order of `nets()`: the unikernel's `iface` index.
    for (index, handle) in nets.iter().enumerate() {
        let Some(c) = changes.iter().find(|c| c.iface_id == handle.iface_id()) else {
            continue;
        };
        if let Some(mac) = c.mac {
            handle.set_mac(mac);
        }
        lines.push_str(&notice_lines(c));
        let Some((addr, prefix)) = c.ipv4 else {
            continue;
        };
        if vm.kind() == GuestKind::Unikernel {
            let block = NetIdentity {
                magic: NET_IDENTITY_MAGIC,
                iface: u32::try_from(index).unwrap_or(u32::MAX),
                ipv4: addr.octets(),
                prefix_len: prefix,
                gateway: c.gateway.map_or([0; 4], |g| g.octets()),
                mac: handle.mac().map_or([0; 6], |m| m.0),
                ..NetIdentity::default()
            };
            vm.ram()
                .memory()
                .write_slice(block.as_bytes(), GuestAddress(NET_IDENTITY_ADDR))
                .map_err(|e| IdentityError::Memory(e.to_string()))?;
        }
    }
    Ok(lines)
}

/// The Linux generation notice's lines for one interface's new identity
/// (`spore_abi::signal::GENERATION_VSOCK_PORT`).
/// The notice's `time` line: the host's wall clock now, which the guest
/// steps its own to (its clock is the snapshot's).
fn time_line() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    format!("time {}.{:09}\n", now.as_secs(), now.subsec_nanos())
}

fn notice_lines(c: &NetIdentityChange) -> String {
    let mut lines = String::new();
    if let Some(mac) = c.mac {
        lines.push_str(&format!("mac {} {mac}\n", c.iface_id));
    }
    if let Some((addr, prefix)) = c.ipv4 {
        let gateway = c.gateway.map_or("-".to_string(), |g| g.to_string());
        lines.push_str(&format!("ipv4 {} {addr}/{prefix} {gateway}\n", c.iface_id));
    }
    lines
}

/// Keeps an applied identity's CID in the configuration (a snapshot or a
/// clone of this VM then carries it).
pub fn record(config: &mut VmConfig, id: &CloneIdentity) {
    if let (Some(v), Some(cid)) = (config.vsock.as_mut(), id.vsock_cid) {
        v.guest_cid = cid;
    }
    record_net(config, &id.net);
}

/// Keeps new MACs in the configuration (`GET /vm/config`, a snapshot's).
pub fn record_net(config: &mut VmConfig, changes: &[NetIdentityChange]) {
    for c in changes {
        let iface = config
            .network_interfaces
            .iter_mut()
            .find(|i| i.iface_id == c.iface_id);
        if let (Some(i), Some(mac)) = (iface, c.mac) {
            i.guest_mac = Some(mac);
        }
    }
}

/// Makes every writable drive of this paused VM stop writing its image:
/// raw drives get a new overlay file in `dir` (their image becomes the
/// base its clones share), in-memory overlays move to a file there. Each
/// drive's new overlay is recorded in `config`, which clones derive theirs
/// from; the changed drives are returned.
pub fn freeze_disks(
    vm: &Vm,
    config: &mut VmConfig,
    dir: &Path,
) -> Result<Vec<FrozenDrive>, FreezeError> {
    let prefix = format!("source-{}", std::process::id());
    let mut changed = Vec::new();
    for drive in vm.drives() {
        if let Some(cow_overlay) = drive.freeze(dir, &prefix)? {
            changed.push(FrozenDrive {
                drive_id: drive.id().to_string(),
                cow_overlay,
            });
        }
    }
    for f in &changed {
        if let Some(d) = config.drives.iter_mut().find(|d| d.drive_id == f.drive_id) {
            d.cow_overlay = Some(f.cow_overlay.clone());
        }
    }
    Ok(changed)
}

/// The clone's configuration for one of its source's drives: read-only
/// drives are shared as they are; a writable one becomes the source's image
/// (frozen: the source writes its own overlay since) as a read-only base plus
/// a new private overlay beside the clone's socket.
pub fn clone_drive(drive: &DriveConfig, dir: &Path, name: &str) -> Result<DriveConfig, CloneError> {
    if drive.is_read_only {
        return Ok(drive.clone());
    }
    crate::devices::virtio::blk::overlay::clone_drive(drive, dir, name).map_err(|e| {
        CloneError::Unsupported(format!(
            "cannot give the clone its own copy of drive {:?}: {e}",
            drive.drive_id
        ))
    })
}

/// The vsock CID a clone gets (a fresh one per clone number).
pub fn clone_vsock_cid(config: &VmConfig, index: u64) -> Option<u32> {
    config.vsock.as_ref().map(|v| {
        // CIDs 0-2 and u32::MAX are reserved: wrap within 3..u32::MAX, so
        // clone k of a source with CID c gets c + k.
        let span = u64::from(u32::MAX) - 3;
        let cid = u64::from(v.guest_cid).saturating_sub(3) + index;
        #[allow(
            clippy::cast_possible_truncation,
            reason = "cid % span + 3 < u32::MAX (span is u32::MAX - 3)"
        )]
        let cid = (cid % span + 3) as u32;
        cid
    })
}

/// Gives clone number `index` of generation `generation` its identity,
/// right before it first runs. (Its configuration keeps the source's CID,
/// from which its own clones' CIDs are derived.)
pub fn apply_to_clone(
    vm: &Vm,
    config: &mut VmConfig,
    index: u64,
    generation: u64,
    net: Vec<NetIdentityChange>,
) -> Result<(), CloneError> {
    let id = CloneIdentity {
        generation,
        vsock_cid: clone_vsock_cid(config, index),
        index,
        net,
    };
    // (The clone's configuration keeps the source's CID, see above.)
    record_net(config, &id.net);
    apply(vm, &id)
        .map_err(|e| CloneError::Capture(format!("cannot give the clone its identity: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::VsockConfig;

    #[test]
    fn clone_cids_follow_the_source_and_skip_reserved_ones() {
        let mut config = VmConfig::default();
        assert_eq!(clone_vsock_cid(&config, 1), None);
        config.vsock = Some(VsockConfig {
            guest_cid: 3,
            uds_path: "v.sock".into(),
            vsock_id: None,
        });
        assert_eq!(clone_vsock_cid(&config, 1), Some(4));
        assert_eq!(clone_vsock_cid(&config, 2), Some(5));
        if let Some(v) = config.vsock.as_mut() {
            v.guest_cid = u32::MAX - 1;
        }
        assert_eq!(clone_vsock_cid(&config, 1), Some(3));
    }

    #[test]
    fn net_identities_become_notice_lines_and_recorded_macs() {
        let mut c = NetIdentityChange {
            iface_id: "eth0".into(),
            mac: Some("06:00:AC:10:00:02".parse().unwrap()),
            ipv4: Some(("10.0.0.2".parse().unwrap(), 24)),
            gateway: None,
        };
        assert_eq!(
            notice_lines(&c),
            "mac eth0 06:00:ac:10:00:02\nipv4 eth0 10.0.0.2/24 -\n"
        );
        c.gateway = Some("10.0.0.1".parse().unwrap());
        c.mac = None;
        assert_eq!(notice_lines(&c), "ipv4 eth0 10.0.0.2/24 10.0.0.1\n");
        let mut config = VmConfig::default();
        config.network_interfaces.push(
            serde_json::from_str(r#"{"iface_id": "eth0", "host_dev_name": "tap0"}"#).unwrap(),
        );
        c.mac = Some("06:00:00:00:00:07".parse().unwrap());
        record_net(&mut config, &[c]);
        assert_eq!(
            config.network_interfaces[0]
                .guest_mac
                .map(|m| m.to_string()),
            Some("06:00:00:00:00:07".into())
        );
    }

    #[test]
    fn a_recorded_identity_keeps_its_cid_in_the_config() {
        let mut config = VmConfig::default();
        let id = CloneIdentity {
            generation: 2,
            vsock_cid: Some(9),
            index: 1,
            net: Vec::new(),
        };
        record(&mut config, &id);
        assert!(config.vsock.is_none());
        config.vsock = Some(VsockConfig {
            guest_cid: 3,
            uds_path: "v.sock".into(),
            vsock_id: None,
        });
        record(&mut config, &id);
        assert_eq!(config.vsock.map(|v| v.guest_cid), Some(9));
    }
}
