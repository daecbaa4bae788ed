#![no_main]
use spore_vmm::fuzz_api::snapshot_state;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    snapshot_state(data);
});
