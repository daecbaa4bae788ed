//! virtio-mem: guest memory plugged and unplugged in blocks at run time
//! (virtio 1.2, §5.15; device id 24).
//!
//! The device manages a region of guest-physical space above boot RAM (not
//! in the e820 map). The host sets `requested_size` (`PATCH /hotplug/memory`,
//! which also raises a config-change interrupt); the guest driver picks
//! blocks and sends PLUG / UNPLUG / UNPLUG_ALL / STATE requests on the one
//! request queue. The device checks each against the block map and answers
//! ACK, NACK (a plug beyond `requested_size`) or ERROR (bad range, wrong
//! state); it never answers BUSY. Plugging a block in a chunk with no
//! plugged block adds that chunk's KVM memory slot; unplugging punches the
//! blocks out of the backing memfd, so the host gets the memory back, and
//! removes the slot of a chunk left empty ([`crate::memory::hotplug`]).
//!
//! - [`request`]: the wire format, parsed and validated in one place.
//! - [`blocks`]: the per-block plugged bitmap and range checks.
//! - [`device`]: the device model, its worker, and [`MemHandle`] for the API.
//! - [`persist`]: the device's snapshot state, restore onto a region mapped
//!   from the snapshot file, and writing plugged blocks to the memory file.

pub mod blocks;
pub mod device;
pub mod persist;
pub mod request;

pub use device::{MemError, MemHandle, MemStatus, VirtioMem};
pub use persist::{map_snapshot_region, MemStateError, RegionDiff, VirtioMemState};

/// The device's only feature bit beyond VIRTIO_F_VERSION_1: the driver must
/// not touch unplugged memory (it is not backed, and usually not mapped).
pub const VIRTIO_MEM_F_UNPLUGGED_INACCESSIBLE: u64 = 1;
/// Size of the config space.
pub const CONFIG_SPACE_SIZE: usize = 56;
/// Entries in the request queue.
pub const QUEUE_SIZE: u16 = 128;
