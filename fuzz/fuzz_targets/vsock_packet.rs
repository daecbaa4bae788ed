#![no_main]
use spore_vmm::fuzz_api::vsock_tx;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    vsock_tx(data);
});
