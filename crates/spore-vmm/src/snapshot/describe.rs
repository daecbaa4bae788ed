//! What a snapshot's manifest says about its devices (`spore snapshot
//! inspect` shows it): one entry per device, from the device states, in
//! the order the VM attached them.

use super::format::DeviceInfo;
use super::MicrovmState;
use crate::config::VmConfig;
use crate::device_manager::persist::VirtioDeviceState;
use crate::device_manager::DeviceState;

pub fn devices(config: &VmConfig, state: &MicrovmState) -> Vec<DeviceInfo> {
    let mut out = Vec::new();
    for (_, device) in state.devices.iter() {
        let (kind, detail) = match device {
            DeviceState::Serial(_) => ("serial", crate::arch::layout::SERIAL_NAME.to_string()),
            DeviceState::I8042(_) => ("i8042", String::new()),
            DeviceState::Rtc(_) => ("rtc", "PL031".to_string()),
            // Not devices the guest enumerates: the manifest never listed them.
            DeviceState::Tmem(_) | DeviceState::Mmds(_) => continue,
            DeviceState::Virtio(v) => {
                let (kind, detail) = virtio_detail(config, &v.device);
                let detail = match (detail.is_empty(), v.transport.activated) {
                    (_, true) => detail,
                    (true, false) => "inactive".to_string(),
                    (false, false) => format!("{detail}, inactive"),
                };
                (kind, detail)
            }
        };
        out.push(DeviceInfo {
            kind: kind.into(),
            detail,
        });
    }
    out
}

fn virtio_detail(config: &VmConfig, device: &VirtioDeviceState) -> (&'static str, String) {
    match device {
        VirtioDeviceState::Block(b) => (
            "virtio-blk",
            config
                .drives
                .iter()
                .find(|d| d.drive_id == b.drive_id)
                .map(|d| {
                    format!(
                        "{} {} ({})",
                        d.drive_id,
                        d.path_on_host,
                        if d.is_read_only { "ro" } else { "rw" }
                    )
                })
                .unwrap_or_default(),
        ),
        VirtioDeviceState::Net(n) => (
            "virtio-net",
            format!(
                "{} on tap {} ({})",
                n.iface_id,
                n.tap_name,
                crate::config::MacAddr(n.mac)
            ),
        ),
        VirtioDeviceState::Rng(_) => ("virtio-rng", String::new()),
        VirtioDeviceState::Balloon(b) => (
            "virtio-balloon",
            format!(
                "target {} pages, actual {} pages",
                b.target_pages, b.actual_pages
            ),
        ),
        VirtioDeviceState::Mem(m) => {
            let plugged: u32 = m.plugged.iter().map(|w| w.count_ones()).sum();
            (
                "virtio-mem",
                format!(
                    "region {:#x}+{} MiB, {} MiB plugged, {} MiB requested",
                    m.addr,
                    m.region_size >> 20,
                    (u64::from(plugged) * m.block_size) >> 20,
                    m.requested_size >> 20
                ),
            )
        }
        VirtioDeviceState::Vsock(_) => (
            "virtio-vsock",
            config
                .vsock
                .as_ref()
                .map(|v| format!("cid {} {}", v.guest_cid, v.uds_path))
                .unwrap_or_default(),
        ),
    }
}
