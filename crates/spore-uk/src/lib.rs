//! spore-uk: the runtime of a spore unikernel.
//!
//! A spore unikernel is one static x86_64 image booted by the spore VMM with the
//! ring-3 protocol of [`spore_abi::boot`]: 64-bit mode, CPL 3, IOPL 3,
//! interrupts off, all guest RAM identity-mapped. This crate gives an app
//! everything it needs on top of that: the `_start` entry, a validated view of
//! the boot info, serial output ([`print!`]/[`println!`] on COM1), a global heap
//! over the free RAM, the signal port ([`exit`], [`mark`], [`wait`], [`fork`], [`done`], and
//! [`snapshot_point`] to snapshot the VM from inside), the
//! command line and a TSC clock; polled virtio-mmio drivers ([`virtio`],
//! with vsock and virtio-mem), the whole-block allocator over hotplugged
//! memory ([`blockalloc`]), the function SDK for `spore serve` ([`function`]),
//! the tmem client ([`tmem`]), TCP/IP over virtio-net with smoltcp
//! ([`net`]) and an HTTP/1.1 request parser ([`http`]), random numbers that
//! are reseeded from virtio-rng in every clone ([`random`]), and pieces for
//! apps that must survive a full heap ([`kvmap`], [`resp`]).
//!
//! It never takes an interrupt or a fault and never touches ring-0 state: the
//! unikernel runs as ring-3 code, which is what runs natively on every KVM
//! (including kvm_pvm, where ring-0 code is emulated).
//!
//! An app is a `#![no_std] #![no_main]` binary that names its main function
//! with [`entry!`]:
//!
//! ```ignore
//! #![no_std]
//! #![no_main]
//! spore_uk::entry!(main);
//! fn main(info: &spore_uk::BootInfo) -> i32 { spore_uk::println!("hi"); 0 }
//! ```
#![cfg_attr(not(test), no_std)]
// Host unit tests leave out the start code, so its init functions look unused.
#![cfg_attr(test, allow(dead_code))]

extern crate alloc;

pub mod blockalloc;
pub mod boot;
pub mod clock;
pub mod cmdline;
#[cfg(not(test))]
mod entry;
pub mod function;
pub mod heap;
pub mod http;
pub mod kvmap;
pub mod net;
pub mod port;
pub mod random;
pub mod resp;
pub mod serial;
pub mod signal;
pub mod tmem;
pub mod virtio;

pub use boot::BootInfo;
pub use cmdline::{arg, cmdline};
pub use random::{clone_index, generation, random_u64};
pub use signal::{done, exit, fork, mark, snapshot_point, wait, SnapshotPoint};

/// Exit code of a panic.
pub const EXIT_PANIC: u32 = 101;
/// Exit code when the boot info the VMM passed is not valid.
pub const EXIT_BAD_BOOT_INFO: u32 = 100;

/// Names the app's main function, `fn(&BootInfo) -> i32`. The runtime calls it
/// once everything is set up and exits with its return value (low 8 bits).
#[macro_export]
macro_rules! entry {
    ($main:path) => {
        #[doc(hidden)]
        #[no_mangle]
        pub fn __spore_uk_main(info: &$crate::BootInfo) -> i32 {
            let main: fn(&$crate::BootInfo) -> i32 = $main;
            main(info)
        }
    };
}
