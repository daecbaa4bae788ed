//! Start of a spore unikernel: the `_start` entry the VMM jumps to, the ELF
//! note that marks the image, and the panic handler.

use spore_abi::boot::{NOTE_NAME, NOTE_TYPE, PROTOCOL_VERSION};

use crate::signal::exit;
use crate::{boot, clock, cmdline, heap, println, BootInfo, EXIT_BAD_BOOT_INFO, EXIT_PANIC};

/// An ELF note: header, name padded to 4 bytes, descriptor.
#[repr(C, align(4))]
struct SporeNote {
    namesz: u32,
    descsz: u32,
    kind: u32,
    name: [u8; 8],
    desc: u32,
}

const fn note_name() -> [u8; 8] {
    // NUL-terminated, padded to a multiple of 4.
    assert!(NOTE_NAME.len() < 8);
    let mut name = [0u8; 8];
    let mut i = 0;
    while i < NOTE_NAME.len() {
        name[i] = NOTE_NAME[i];
        i += 1;
    }
    name
}

/// The linker script puts `.note.spore` into a `PT_NOTE` segment; the VMM
/// boots only images that carry it.
#[used]
#[link_section = ".note.spore"]
static SPORE_NOTE: SporeNote = SporeNote {
    namesz: NOTE_NAME.len() as u32 + 1,
    descsz: 4,
    kind: NOTE_TYPE,
    name: note_name(),
    desc: PROTOCOL_VERSION,
};

extern "Rust" {
    /// Defined by the app with [`crate::entry!`].
    fn __spore_uk_main(info: &BootInfo) -> i32;
}

/// The ELF entry. The VMM starts here at CPL 3 with RDI = boot info and RSP =
/// the top of the stack; RDI passes through untouched as the first argument.
/// The stack is aligned as a `call` would leave it, as the SysV ABI expects.
#[unsafe(naked)]
#[no_mangle]
#[link_section = ".text._start"]
pub unsafe extern "C" fn _start() -> ! {
    core::arch::naked_asm!(
        "and rsp, -16",
        "xor ebp, ebp",
        "call {start}",
        "ud2",
        start = sym rust_start,
    )
}

extern "C" fn rust_start(boot_info_addr: u64) -> ! {
    // SAFETY: the boot protocol puts a readable boot-info block at RDI.
    let info = match unsafe { boot::init(boot_info_addr) } {
        Ok(info) => info,
        Err(e) => {
            println!("spore-uk: {e}");
            exit(EXIT_BAD_BOOT_INFO)
        }
    };
    clock::init(info.tsc_khz);
    // SAFETY: `info` is validated; its command line and free regions are
    // what the protocol says they are.
    unsafe {
        cmdline::init(info);
        heap::init(info);
    }
    // SAFETY: the app defines this symbol with `entry!`, with this signature.
    let code = unsafe { __spore_uk_main(info) };
    exit(code as u32)
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo) -> ! {
    println!("spore-uk: {info}");
    crate::function::report_panic(info);
    exit(EXIT_PANIC)
}
