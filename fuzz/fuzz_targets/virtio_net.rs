#![no_main]
use spore_vmm::fuzz_api::{virtio_queue, DeviceKind};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    virtio_queue(DeviceKind::Net, data);
});
