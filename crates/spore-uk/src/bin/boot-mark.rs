//! boot-mark: signals mark 1 as its very first action and exits 0, so the
//! VMM can time a boot from its start to the guest's first instruction of
//! app code.
#![no_std]
#![no_main]

use spore_uk::BootInfo;

spore_uk::entry!(main);

fn main(_info: &BootInfo) -> i32 {
    spore_uk::mark(1);
    0
}
