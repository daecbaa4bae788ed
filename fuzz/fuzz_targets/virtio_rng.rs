#![no_main]
use spore_vmm::fuzz_api::{DeviceKind, virtio_queue};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    virtio_queue(DeviceKind::Rng, data);
});
