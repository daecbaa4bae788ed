#![no_std]
#![no_main]
spore_uk::entry!(main);
fn main(_: &spore_uk::BootInfo) -> i32 { 0 }
