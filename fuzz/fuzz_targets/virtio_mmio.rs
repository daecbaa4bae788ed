#![no_main]
use spore_vmm::fuzz_api::mmio_registers;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    mmio_registers(data);
});
