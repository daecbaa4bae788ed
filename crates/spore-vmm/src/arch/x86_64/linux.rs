//! Loading a Linux kernel with the x86 64-bit boot protocol.
//!
//! [`load_linux`] puts everything a Linux guest reads at boot into guest
//! memory: the kernel (ELF vmlinux or bzImage, via linux-loader), the initrd
//! at the top of low RAM, the command line, the zero page (`boot_params` with
//! the e820 map) and the MP table.
//! [`configure_linux_vcpu`](super::linux_vcpu::configure_linux_vcpu) then gives each
//! vCPU its CPUID, MSRs, FPU and LAPIC state, and the bootstrap vCPU its
//! long-mode registers. Creating the VM and running vCPUs is not done here.
//!
//! Low memory layout (Firecracker's):
//!
//! | address      | what                                   |
//! |--------------|----------------------------------------|
//! | 0x500        | boot GDT ([`super::regs`])             |
//! | 0x520        | boot IDT                               |
//! | 0x7000       | zero page (`struct boot_params`)       |
//! | 0x8ff0       | initial stack pointer (grows down)     |
//! | 0x9000-0xbfff| identity page tables                   |
//! | 0x20000      | kernel command line                    |
//! | 0x9fc00      | EBDA: MP table (reserved in e820)      |
//! | 0x100000     | high memory: the kernel                |

use std::fs::File;
use std::io::{self, Seek};
use std::os::unix::fs::FileExt;

use linux_loader::cmdline::Cmdline;
use linux_loader::configurator::linux::LinuxBootConfigurator;
use linux_loader::configurator::{BootConfigurator, BootParams};
use linux_loader::loader::bootparam::{boot_e820_entry, boot_params, setup_header};
use linux_loader::loader::{load_cmdline, BzImage, Elf, KernelLoader};
use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryRegion};

use super::layout::{EBDA_START, MMIO_HOLE_END, MMIO_HOLE_START};
use super::mptable::{setup_mptable, MpTableError};
use crate::memory::GuestMemoryMmap;

/// Start of high memory; the kernel is loaded at or above it.
pub const HIMEM_START: u64 = 0x10_0000;
/// Zero page: `struct boot_params`.
pub const ZERO_PAGE_START: u64 = 0x7000;
/// Kernel command line.
pub const CMDLINE_START: u64 = 0x2_0000;
/// Linux's COMMAND_LINE_SIZE on x86, including the terminating NUL.
pub const CMDLINE_MAX_SIZE: usize = 2048;

const KERNEL_BOOT_FLAG_MAGIC: u16 = 0xaa55;
const KERNEL_HDR_MAGIC: u32 = 0x5372_6448;
/// type_of_loader "undefined" (0xff): spore has no registered loader id.
const KERNEL_LOADER_OTHER: u8 = 0xff;
/// Alignment a vmlinux (no setup header of its own) is told to use.
const KERNEL_MIN_ALIGNMENT_BYTES: u32 = 0x100_0000;
/// The 64-bit entry point is this far into a bzImage's protected-mode code.
const BZIMAGE_64BIT_ENTRY_OFFSET: u64 = 0x200;
/// xloadflags: the kernel has the 64-bit entry point at +0x200.
const XLF_KERNEL_64: u16 = 1 << 0;
/// xloadflags: the kernel and initrd may sit above 4 GiB (so no initrd limit).
const XLF_CAN_BE_LOADED_ABOVE_4G: u16 = 1 << 1;
/// Boot protocol version that declares XLF_KERNEL_64.
const BOOT_PROTOCOL_XLOADFLAGS: u16 = 0x020c;
const BOOT_PROTOCOL_CMDLINE_SIZE: u16 = 0x0206;
const BOOT_PROTOCOL_INITRD_MAX: u16 = 0x0203;
/// Longest command line of protocols before 2.06, without the NUL.
const OLD_PROTOCOL_CMDLINE_MAX: u32 = 255;
const E820_RAM: u32 = 1;
const E820_RESERVED: u32 = 2;
const PAGE_SIZE: u64 = 0x1000;

const ELF_MAGIC: [u8; 4] = *b"\x7fELF";
const ELFCLASS64: u8 = 2;
const EM_X86_64: u16 = 62;
const BZIMAGE_MAGIC_OFFSET: u64 = 0x202;

/// Where the bootstrap vCPU starts and where it finds `boot_params`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinuxEntry {
    /// Guest-physical address of the kernel's 64-bit entry point.
    pub entry: u64,
    /// Guest-physical address of the zero page, passed in RSI.
    pub zero_page: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum LinuxBootError {
    #[error("cannot read the kernel image: {0}")]
    ReadKernel(#[source] io::Error),
    #[error(
        "unknown kernel format: {0}; spore boots an x86_64 ELF vmlinux or a bzImage \
         (arch/x86/boot/bzImage)"
    )]
    UnknownKernelFormat(String),
    #[error("cannot load the ELF vmlinux: {0}")]
    LoadElf(#[source] linux_loader::loader::Error),
    #[error("cannot load the bzImage: {0}")]
    LoadBzImage(#[source] linux_loader::loader::Error),
    #[error(
        "the bzImage (boot protocol {:x}.{:02x}) has no 64-bit entry point; \
         spore needs boot protocol 2.12 or later with a 64-bit kernel", .0 >> 8, .0 & 0xff
    )]
    NoBzImage64BitEntry(u16),
    #[error("guest memory has no RAM at address 0 extending past 1 MiB; a Linux guest needs more")]
    NoLowMemory,
    #[error(
        "the kernel needs guest memory up to {end:#x} but low RAM ends at {ram_end:#x}; \
         give the VM more memory"
    )]
    KernelTooBig { end: u64, ram_end: u64 },
    #[error("cannot read the initrd: {0}")]
    ReadInitrd(#[source] io::Error),
    #[error("the initrd file is empty")]
    EmptyInitrd,
    #[error(
        "the initrd ({size} bytes) does not fit between the kernel end {kernel_end:#x} and \
         {limit:#x}; give the VM more memory or use a smaller initrd"
    )]
    InitrdTooBig {
        size: u64,
        kernel_end: u64,
        limit: u64,
    },
    #[error("the kernel command line is {len} bytes; this kernel accepts at most {max}")]
    CmdlineTooLong { len: usize, max: usize },
    #[error("invalid kernel command line: {0}")]
    InvalidCmdline(#[source] linux_loader::cmdline::Error),
    #[error("cannot write the kernel command line to guest memory: {0}")]
    WriteCmdline(#[source] linux_loader::loader::Error),
    #[error("the e820 map needs more than {0} entries")]
    TooManyE820Entries(usize),
    #[error("cannot write the zero page to guest memory: {0}")]
    WriteZeroPage(#[source] linux_loader::configurator::Error),
    #[error("cannot write the MP table: {0}")]
    MpTable(#[from] MpTableError),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KernelFormat {
    Elf,
    BzImage,
}

/// Reads up to `buf.len()` bytes at `offset`; short files give short reads.
fn read_at_most(file: &File, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// Tells an x86_64 ELF from a bzImage by their magic numbers.
fn detect_format(kernel: &File) -> Result<KernelFormat, LinuxBootError> {
    let unknown = |why: &str| Err(LinuxBootError::UnknownKernelFormat(why.to_string()));
    // e_ident (16 bytes), e_type (2), e_machine (2).
    let mut ident = [0u8; 20];
    let n = read_at_most(kernel, 0, &mut ident).map_err(LinuxBootError::ReadKernel)?;
    if n == 0 {
        return unknown("the file is empty");
    }
    if n >= 4 && ident[..4] == ELF_MAGIC {
        if n < ident.len() {
            return unknown("the ELF header is truncated");
        }
        if ident[4] != ELFCLASS64 {
            return unknown("the ELF file is not 64-bit");
        }
        let machine = u16::from_le_bytes([ident[18], ident[19]]);
        if machine != EM_X86_64 {
            return Err(LinuxBootError::UnknownKernelFormat(format!(
                "the ELF file is for machine {machine}, not x86_64 ({EM_X86_64})"
            )));
        }
        return Ok(KernelFormat::Elf);
    }
    let mut magic = [0u8; 4];
    let m = read_at_most(kernel, BZIMAGE_MAGIC_OFFSET, &mut magic)
        .map_err(LinuxBootError::ReadKernel)?;
    if m == magic.len() && u32::from_le_bytes(magic) == KERNEL_HDR_MAGIC {
        return Ok(KernelFormat::BzImage);
    }
    unknown("no ELF magic at offset 0 and no \"HdrS\" setup header signature at 0x202")
}

/// End of low RAM: the region at guest address 0, cut at the MMIO hole.
fn low_ram_end(mem: &GuestMemoryMmap) -> Result<u64, LinuxBootError> {
    let region = mem
        .find_region(GuestAddress(0))
        .ok_or(LinuxBootError::NoLowMemory)?;
    let end = region.start_addr().raw_value() + region.len();
    let end = end.min(MMIO_HOLE_START);
    if end <= HIMEM_START {
        return Err(LinuxBootError::NoLowMemory);
    }
    Ok(end)
}

/// Size of the RAM region at 4 GiB, if guest memory continues there.
fn high_ram_size(mem: &GuestMemoryMmap) -> Option<u64> {
    mem.iter()
        .find(|r| r.start_addr().raw_value() == MMIO_HOLE_END)
        .map(|r| r.len())
}

/// Loaded kernel: where it starts running, the setup header to pass on (a
/// bzImage's), and the end of the memory it needs before reading e820.
struct LoadedKernel {
    entry: u64,
    header: Option<setup_header>,
    end: u64,
}

fn load_kernel(
    mem: &GuestMemoryMmap,
    kernel: &mut File,
    format: KernelFormat,
) -> Result<LoadedKernel, LinuxBootError> {
    let himem = Some(GuestAddress(HIMEM_START));
    match format {
        KernelFormat::Elf => {
            let r = Elf::load(mem, None, kernel, himem).map_err(LinuxBootError::LoadElf)?;
            Ok(LoadedKernel {
                entry: r.kernel_load.raw_value(),
                header: None,
                end: r.kernel_end,
            })
        }
        KernelFormat::BzImage => {
            let r = BzImage::load(mem, None, kernel, himem).map_err(LinuxBootError::LoadBzImage)?;
            let hdr = r.setup_header.ok_or(LinuxBootError::UnknownKernelFormat(
                "no setup header".into(),
            ))?;
            let (version, xloadflags) = (hdr.version, hdr.xloadflags);
            if version < BOOT_PROTOCOL_XLOADFLAGS || xloadflags & XLF_KERNEL_64 == 0 {
                return Err(LinuxBootError::NoBzImage64BitEntry(version));
            }
            let load = r.kernel_load.raw_value();
            // The decompressor runs at the load address rounded up to
            // kernel_alignment (or at pref_address if not relocatable, or if
            // that is higher) and needs init_size bytes from there before it
            // looks at e820: the initrd must stay clear of all of it.
            let (align, pref, init_size) = (
                u64::from(hdr.kernel_alignment).max(1),
                hdr.pref_address,
                u64::from(hdr.init_size),
            );
            let runtime_start = if hdr.relocatable_kernel != 0 {
                load.div_ceil(align).saturating_mul(align).max(pref)
            } else {
                pref
            };
            Ok(LoadedKernel {
                entry: load + BZIMAGE_64BIT_ENTRY_OFFSET,
                header: Some(hdr),
                end: r.kernel_end.max(runtime_start.saturating_add(init_size)),
            })
        }
    }
}

/// Loads the initrd page aligned at the top of low RAM (below `limit`).
/// Returns (address, size).
fn load_initrd(
    mem: &GuestMemoryMmap,
    initrd: &mut File,
    kernel_end: u64,
    limit: u64,
) -> Result<(u64, u64), LinuxBootError> {
    let size = initrd.metadata().map_err(LinuxBootError::ReadInitrd)?.len();
    if size == 0 {
        return Err(LinuxBootError::EmptyInitrd);
    }
    let too_big = LinuxBootError::InitrdTooBig {
        size,
        kernel_end,
        limit,
    };
    let Some(start) = limit.checked_sub(size).map(|a| a & !(PAGE_SIZE - 1)) else {
        return Err(too_big);
    };
    if start < kernel_end || start < HIMEM_START {
        return Err(too_big);
    }
    let len = usize::try_from(size).map_err(|_| too_big)?;
    initrd.rewind().map_err(LinuxBootError::ReadInitrd)?;
    mem.read_exact_volatile_from(GuestAddress(start), initrd, len)
        .map_err(|e| LinuxBootError::ReadInitrd(io::Error::other(e)))?;
    Ok((start, size))
}

fn add_e820(
    params: &mut boot_params,
    addr: u64,
    size: u64,
    kind: u32,
) -> Result<(), LinuxBootError> {
    let idx = usize::from(params.e820_entries);
    let table_len = params.e820_table.len();
    if idx >= table_len {
        return Err(LinuxBootError::TooManyE820Entries(table_len));
    }
    params.e820_table[idx] = boot_e820_entry {
        addr,
        size,
        r#type: kind,
    };
    params.e820_entries += 1;
    Ok(())
}

/// Longest command line (without NUL) the kernel accepts.
fn cmdline_limit(header: Option<&setup_header>) -> usize {
    let kernel_max = match header {
        Some(h) if h.version >= BOOT_PROTOCOL_CMDLINE_SIZE => h.cmdline_size,
        Some(_) => OLD_PROTOCOL_CMDLINE_MAX,
        None => u32::MAX,
    };
    usize::try_from(kernel_max)
        .unwrap_or(usize::MAX)
        .min(CMDLINE_MAX_SIZE - 1)
}

/// An initrd and where it was loaded, if it was already.
type InitrdPlaced<'a> = (&'a mut File, Option<(u64, u64)>);

/// Loads an ELF `kernel` on this thread and `initrd` at the top of low RAM
/// on another, at once. The initrd's place does not depend on the kernel's
/// (checked against the kernel's end afterwards: an overlap fails the boot
/// as it would loading one after the other). Without a second thread, one
/// after the other.
fn load_kernel_and_initrd<'a>(
    mem: &GuestMemoryMmap,
    kernel: &mut File,
    initrd: &'a mut File,
    low_end: u64,
) -> Result<(LoadedKernel, Option<InitrdPlaced<'a>>), LinuxBootError> {
    let placed = std::thread::scope(|s| {
        let reader = std::thread::Builder::new()
            .name("initrd-load".into())
            .spawn_scoped(s, || load_initrd(mem, initrd, HIMEM_START, low_end));
        let loaded = load_kernel(mem, kernel, KernelFormat::Elf);
        match reader {
            Ok(handle) => {
                let placed = handle
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
                loaded.map(|k| (k, Some(placed)))
            }
            Err(_) => loaded.map(|k| (k, None)),
        }
    });
    match placed? {
        (loaded, Some(result)) => {
            let placed = result.map_err(|e| match e {
                // Checked against the least kernel end: say the real one.
                LinuxBootError::InitrdTooBig { size, limit, .. } => LinuxBootError::InitrdTooBig {
                    size,
                    kernel_end: loaded.end,
                    limit,
                },
                other => other,
            })?;
            Ok((loaded, Some((initrd, Some(placed)))))
        }
        (loaded, None) => Ok((loaded, Some((initrd, None)))),
    }
}

/// Loads `kernel` (ELF vmlinux or bzImage), `initrd`, `cmdline`, the zero
/// page and the MP table for `num_vcpus` vCPUs into `mem`.
///
/// Only the RAM region at address 0 (up to the MMIO hole) and one at 4 GiB
/// are reported as RAM in e820; other regions (hot-pluggable memory) are not.
pub fn load_linux(
    mem: &GuestMemoryMmap,
    kernel: &mut File,
    initrd: Option<&mut File>,
    cmdline: &str,
    num_vcpus: u8,
) -> Result<LinuxEntry, LinuxBootError> {
    let low_end = low_ram_end(mem)?;
    let format = detect_format(kernel)?;
    let (loaded, initrd_placed) = match (format, initrd) {
        // An ELF kernel has no header that limits the initrd: both files
        // load at once, the initrd on a second thread (they are most of
        // the VMM's part of a boot, each a copy into fresh guest memory).
        (KernelFormat::Elf, Some(initrd)) => load_kernel_and_initrd(mem, kernel, initrd, low_end)?,
        (_, initrd) => (load_kernel(mem, kernel, format)?, initrd.map(|f| (f, None))),
    };
    if loaded.end > low_end {
        return Err(LinuxBootError::KernelTooBig {
            end: loaded.end,
            ram_end: low_end,
        });
    }

    let mut params = boot_params::default();
    match loaded.header {
        // A bzImage's own header carries what the kernel told its loader
        // (alignment, init_size, ...); keep it and fill in our fields.
        Some(hdr) => params.hdr = hdr,
        None => params.hdr.kernel_alignment = KERNEL_MIN_ALIGNMENT_BYTES,
    }
    params.hdr.boot_flag = KERNEL_BOOT_FLAG_MAGIC;
    params.hdr.header = KERNEL_HDR_MAGIC;
    params.hdr.type_of_loader = KERNEL_LOADER_OTHER;

    let max = cmdline_limit(loaded.header.as_ref());
    let trimmed = cmdline.trim();
    if trimmed.len() > max {
        return Err(LinuxBootError::CmdlineTooLong {
            len: trimmed.len(),
            max,
        });
    }
    let mut cl = Cmdline::new(max + 1).map_err(LinuxBootError::InvalidCmdline)?;
    cl.insert_str(trimmed)
        .map_err(LinuxBootError::InvalidCmdline)?;
    load_cmdline(mem, GuestAddress(CMDLINE_START), &cl).map_err(LinuxBootError::WriteCmdline)?;
    #[allow(
        clippy::cast_possible_truncation,
        reason = "CMDLINE_START is 0x2_0000; trimmed.len() <= max < CMDLINE_MAX_SIZE (2048), checked above"
    )]
    let (cmdline_ptr, cmdline_len) = (CMDLINE_START as u32, trimmed.len() as u32);
    params.hdr.cmd_line_ptr = cmdline_ptr;
    // Includes the NUL, as Firecracker and Cloud Hypervisor report it.
    params.hdr.cmdline_size = cmdline_len + 1;

    if let Some((initrd, placed)) = initrd_placed {
        // A 64-bit kernel that cannot take an initrd anywhere says where it
        // must end; otherwise any low-RAM address works.
        let limit = match loaded.header {
            Some(h)
                if h.version >= BOOT_PROTOCOL_INITRD_MAX
                    && h.xloadflags & XLF_CAN_BE_LOADED_ABOVE_4G == 0 =>
            {
                low_end.min(u64::from(h.initrd_addr_max) + 1)
            }
            _ => low_end,
        };
        let (addr, size) = match placed {
            Some((addr, size)) if addr >= loaded.end => (addr, size),
            Some((_, size)) => {
                return Err(LinuxBootError::InitrdTooBig {
                    size,
                    kernel_end: loaded.end,
                    limit,
                })
            }
            None => load_initrd(mem, initrd, loaded.end, limit)?,
        };
        // Both below the 4 GiB MMIO hole, so the 32-bit fields hold them.
        #[allow(
            clippy::cast_possible_truncation,
            reason = "addr + size <= low_end <= MMIO_HOLE_START, below 4 GiB (load_initrd, low_ram_end)"
        )]
        let (image, image_size) = (addr as u32, size as u32);
        params.hdr.ramdisk_image = image;
        params.hdr.ramdisk_size = image_size;
    }

    add_e820(&mut params, 0, EBDA_START, E820_RAM)?;
    add_e820(
        &mut params,
        EBDA_START,
        HIMEM_START - EBDA_START,
        E820_RESERVED,
    )?;
    add_e820(&mut params, HIMEM_START, low_end - HIMEM_START, E820_RAM)?;
    if let Some(high) = high_ram_size(mem) {
        add_e820(&mut params, MMIO_HOLE_END, high, E820_RAM)?;
    }

    let zero_page = GuestAddress(ZERO_PAGE_START);
    LinuxBootConfigurator::write_bootparams(&BootParams::new(&params, zero_page), mem)
        .map_err(LinuxBootError::WriteZeroPage)?;

    setup_mptable(mem, num_vcpus)?;

    Ok(LinuxEntry {
        entry: loaded.entry,
        zero_page: zero_page.raw_value(),
    })
}

#[cfg(test)]
#[allow(
    clippy::cast_possible_truncation,
    reason = "test fixtures: byte patterns and addresses the test builds itself"
)]
pub(super) mod tests {
    use std::io::Write;

    use vm_memory::ByteValued;
    use vmm_sys_util::tempfile::TempFile;

    use super::*;

    const MEM: u64 = 256 << 20;
    pub(crate) const ELF_ENTRY: u64 = 0x100_0000;
    /// The test kernel: `mov eax, [rsi + 0x202]` (the zero page's "HdrS"),
    /// `push rax; pop rax` (uses the boot stack), `mov dx, 0x3f8`,
    /// `out dx, eax`, `hlt`.
    pub(crate) const CODE: &[u8] = b"\x8b\x86\x02\x02\x00\x00\x50\x58\x66\xba\xf8\x03\xef\xf4";

    pub(crate) fn mem(size: u64) -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), size as usize)]).unwrap()
    }

    pub(crate) fn file_with(bytes: &[u8]) -> File {
        let mut f = TempFile::new().unwrap().into_file();
        f.write_all(bytes).unwrap();
        f
    }

    /// A minimal x86_64 ELF: header, one PT_LOAD of CODE at ELF_ENTRY with
    /// 64 KiB of bss.
    pub(crate) fn tiny_elf() -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&ELF_MAGIC);
        b.extend_from_slice(&[ELFCLASS64, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        b.extend_from_slice(&2u16.to_le_bytes()); // e_type: EXEC
        b.extend_from_slice(&EM_X86_64.to_le_bytes());
        b.extend_from_slice(&1u32.to_le_bytes()); // e_version
        b.extend_from_slice(&ELF_ENTRY.to_le_bytes()); // e_entry
        b.extend_from_slice(&64u64.to_le_bytes()); // e_phoff
        b.extend_from_slice(&0u64.to_le_bytes()); // e_shoff
        b.extend_from_slice(&0u32.to_le_bytes()); // e_flags
        for half in [64u16, 56, 1, 0, 0, 0] {
            // e_ehsize, e_phentsize, e_phnum, e_shentsize, e_shnum, e_shstrndx
            b.extend_from_slice(&half.to_le_bytes());
        }
        assert_eq!(b.len(), 64);
        let offset = 0x1000u64;
        b.extend_from_slice(&1u32.to_le_bytes()); // PT_LOAD
        b.extend_from_slice(&5u32.to_le_bytes()); // R+X
        b.extend_from_slice(&offset.to_le_bytes());
        b.extend_from_slice(&(0xffff_ffff_8000_0000u64 + ELF_ENTRY).to_le_bytes()); // p_vaddr
        b.extend_from_slice(&ELF_ENTRY.to_le_bytes()); // p_paddr
        b.extend_from_slice(&(CODE.len() as u64).to_le_bytes()); // p_filesz
        b.extend_from_slice(&(CODE.len() as u64 + 0x1_0000).to_le_bytes()); // p_memsz
        b.extend_from_slice(&0x1000u64.to_le_bytes()); // p_align
        b.resize(offset as usize, 0);
        b.extend_from_slice(CODE);
        b
    }

    /// A bzImage-shaped file: 4 setup sectors with a protocol 2.15 header,
    /// then the "compressed kernel" CODE.
    fn tiny_bzimage(version: u16, xloadflags: u16) -> Vec<u8> {
        let mut hdr = setup_header {
            setup_sects: 4,
            boot_flag: KERNEL_BOOT_FLAG_MAGIC,
            header: KERNEL_HDR_MAGIC,
            version,
            loadflags: 1,
            code32_start: HIMEM_START as u32,
            initrd_addr_max: 0x7fff_ffff,
            kernel_alignment: 0x20_0000,
            relocatable_kernel: 1,
            xloadflags,
            cmdline_size: 2047,
            pref_address: 0x100_0000,
            init_size: 0x80_0000,
            ..Default::default()
        };
        hdr.syssize = (CODE.len() as u32).div_ceil(16);
        let mut b = vec![0u8; 5 * 512];
        b[0x1f1..0x1f1 + std::mem::size_of::<setup_header>()].copy_from_slice(hdr.as_slice());
        b.extend_from_slice(CODE);
        b
    }

    fn zero_page(m: &GuestMemoryMmap) -> boot_params {
        m.read_obj(GuestAddress(ZERO_PAGE_START)).unwrap()
    }

    fn e820(p: &boot_params) -> Vec<(u64, u64, u32)> {
        let table = p.e820_table;
        table[..usize::from(p.e820_entries)]
            .iter()
            .map(|e| (e.addr, e.size, e.r#type))
            .collect()
    }

    fn read_bytes(m: &GuestMemoryMmap, addr: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        m.read_slice(&mut v, GuestAddress(addr)).unwrap();
        v
    }

    #[test]
    fn elf_kernel_with_initrd() {
        let m = mem(MEM);
        let initrd_data: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        let mut kernel = file_with(&tiny_elf());
        let mut initrd = file_with(&initrd_data);
        let cmdline = "console=ttyS0 reboot=k panic=1";
        let e = load_linux(&m, &mut kernel, Some(&mut initrd), cmdline, 2).unwrap();
        assert_eq!(
            e,
            LinuxEntry {
                entry: ELF_ENTRY,
                zero_page: ZERO_PAGE_START
            }
        );
        assert_eq!(read_bytes(&m, ELF_ENTRY, CODE.len()), CODE);

        let p = zero_page(&m);
        let h = p.hdr;
        assert_eq!(
            (h.boot_flag, h.header, h.type_of_loader),
            (0xaa55, 0x5372_6448, 0xff)
        );
        assert_eq!({ h.kernel_alignment }, 0x100_0000);
        assert_eq!(u64::from(h.cmd_line_ptr), CMDLINE_START);
        assert_eq!(h.cmdline_size as usize, cmdline.len() + 1);
        let mut want = cmdline.as_bytes().to_vec();
        want.push(0);
        assert_eq!(read_bytes(&m, CMDLINE_START, want.len()), want);

        // Page aligned, at the top of RAM, holding the file's bytes.
        let (start, size) = (u64::from(h.ramdisk_image), u64::from(h.ramdisk_size));
        assert_eq!(size, initrd_data.len() as u64);
        assert_eq!(start % PAGE_SIZE, 0);
        assert!(start + size <= MEM && MEM - (start + size) < PAGE_SIZE);
        assert!(start >= ELF_ENTRY + CODE.len() as u64 + 0x1_0000);
        assert_eq!(read_bytes(&m, start, initrd_data.len()), initrd_data);

        assert_eq!(
            e820(&p),
            vec![
                (0, EBDA_START, E820_RAM),
                (EBDA_START, HIMEM_START - EBDA_START, E820_RESERVED),
                (HIMEM_START, MEM - HIMEM_START, E820_RAM),
            ]
        );
        // The MP table was written too.
        assert_eq!(read_bytes(&m, EBDA_START, 4), b"_MP_");
    }

    #[test]
    fn e820_reports_ram_above_4g() {
        let high = 16u64 << 20;
        let m = GuestMemoryMmap::from_ranges(&[
            (GuestAddress(0), MEM as usize),
            (GuestAddress(MMIO_HOLE_END), high as usize),
        ])
        .unwrap();
        load_linux(&m, &mut file_with(&tiny_elf()), None, "", 1).unwrap();
        let p = zero_page(&m);
        let map = e820(&p);
        assert_eq!(map.len(), 4);
        assert_eq!(map[3], (MMIO_HOLE_END, high, E820_RAM));
        let h = p.hdr;
        assert_eq!((h.ramdisk_image, h.ramdisk_size), (0, 0));
        assert_eq!({ h.cmdline_size }, 1);
    }

    #[test]
    fn bzimage_keeps_its_setup_header() {
        let m = mem(MEM);
        let mut kernel = file_with(&tiny_bzimage(0x020f, 0x3));
        let mut initrd = file_with(&[7u8; 5000]);
        let e = load_linux(&m, &mut kernel, Some(&mut initrd), "quiet", 1).unwrap();
        assert_eq!(e.entry, HIMEM_START + 0x200);
        assert_eq!(read_bytes(&m, HIMEM_START, CODE.len()), CODE);
        let h = zero_page(&m).hdr;
        assert_eq!(
            (h.version, h.kernel_alignment, h.init_size),
            (0x020f, 0x20_0000, 0x80_0000)
        );
        assert_eq!(
            (h.xloadflags, h.relocatable_kernel, h.setup_sects),
            (3, 1, 4)
        );
        assert_eq!(h.code32_start as u64, HIMEM_START);
        assert_eq!((h.type_of_loader, h.cmdline_size), (0xff, 6));
        assert_eq!(u64::from(h.ramdisk_image) % PAGE_SIZE, 0);
        assert_eq!({ h.ramdisk_size }, 5000);
    }

    #[test]
    fn bzimage_initrd_stays_clear_of_decompression() {
        // 24 MiB: the kernel runs from 16 MiB (pref_address) with init_size
        // 8 MiB, so nothing is left for an initrd.
        let m = mem(24 << 20);
        let mut kernel = file_with(&tiny_bzimage(0x020f, 0x3));
        let err = load_linux(&m, &mut kernel, Some(&mut file_with(&[1u8; 100])), "", 1);
        assert!(matches!(
            err,
            Err(LinuxBootError::InitrdTooBig {
                kernel_end: 0x180_0000,
                ..
            })
        ));
        let m = mem(20 << 20);
        let err = load_linux(&m, &mut kernel, None, "", 1).unwrap_err();
        assert!(matches!(err, LinuxBootError::KernelTooBig { .. }), "{err}");
    }

    #[test]
    fn bzimage_without_64bit_entry_is_refused() {
        let m = mem(MEM);
        for (version, xlf) in [(0x020f, 0x2), (0x020a, 0x0)] {
            let mut kernel = file_with(&tiny_bzimage(version, xlf));
            let err = load_linux(&m, &mut kernel, None, "", 1).unwrap_err();
            assert!(matches!(err, LinuxBootError::NoBzImage64BitEntry(v) if v == version));
        }
    }

    #[test]
    fn unknown_formats() {
        let m = mem(MEM);
        let mut elf32 = tiny_elf();
        elf32[4] = 1;
        let mut arm = tiny_elf();
        arm[18] = 183;
        let cases: Vec<Vec<u8>> = vec![
            Vec::new(),
            b"\x7fEL".to_vec(),
            b"\x7fELF\x02\x01".to_vec(),
            b"#!/bin/sh\necho not a kernel\n".to_vec(),
            (0..4096u32).map(|i| (i * 7) as u8).collect(),
            elf32,
            arm,
        ];
        for bytes in cases {
            let err = load_linux(&m, &mut file_with(&bytes), None, "", 1).unwrap_err();
            assert!(
                matches!(err, LinuxBootError::UnknownKernelFormat(_)),
                "{} bytes: {err}",
                bytes.len()
            );
            assert!(err.to_string().contains("bzImage"), "{err}");
        }
        let err = load_linux(&m, &mut file_with(&[]), None, "", 1).unwrap_err();
        assert!(err.to_string().contains("empty"), "{err}");
    }

    #[test]
    fn truncated_elf_is_a_load_error() {
        let m = mem(MEM);
        let mut elf = tiny_elf();
        elf.truncate(0x1000 + 4);
        let err = load_linux(&m, &mut file_with(&elf), None, "", 1).unwrap_err();
        assert!(matches!(err, LinuxBootError::LoadElf(_)), "{err}");
    }

    #[test]
    fn initrd_errors() {
        let m = mem(MEM);
        let big = TempFile::new().unwrap().into_file();
        big.set_len(MEM - (8 << 20)).unwrap();
        let mut big = big;
        let err = load_linux(&m, &mut file_with(&tiny_elf()), Some(&mut big), "", 1).unwrap_err();
        // Loaded beside the kernel, the initrd is checked against its end
        // afterwards, and the message names that end.
        assert!(
            matches!(err, LinuxBootError::InitrdTooBig { kernel_end, .. } if kernel_end > HIMEM_START),
            "{err}"
        );
        let mut huge = TempFile::new().unwrap().into_file();
        huge.set_len(1 << 40).unwrap();
        let err = load_linux(&m, &mut file_with(&tiny_elf()), Some(&mut huge), "", 1).unwrap_err();
        assert!(matches!(err, LinuxBootError::InitrdTooBig { .. }), "{err}");
        let mut empty = file_with(&[]);
        let err = load_linux(&m, &mut file_with(&tiny_elf()), Some(&mut empty), "", 1).unwrap_err();
        assert!(matches!(err, LinuxBootError::EmptyInitrd));
    }

    #[test]
    fn cmdline_limits() {
        let m = mem(MEM);
        let long = "a".repeat(CMDLINE_MAX_SIZE);
        let err = load_linux(&m, &mut file_with(&tiny_elf()), None, &long, 1).unwrap_err();
        assert!(matches!(
            err,
            LinuxBootError::CmdlineTooLong { max: 2047, .. }
        ));
        let fits = "a".repeat(CMDLINE_MAX_SIZE - 1);
        load_linux(&m, &mut file_with(&tiny_elf()), None, &fits, 1).unwrap();
        let err = load_linux(&m, &mut file_with(&tiny_elf()), None, "bad\u{7}", 1).unwrap_err();
        assert!(matches!(err, LinuxBootError::InvalidCmdline(_)));
    }

    #[test]
    fn memory_below_1mib_is_refused() {
        let m = mem(HIMEM_START);
        let err = load_linux(&m, &mut file_with(&tiny_elf()), None, "", 1).unwrap_err();
        assert!(matches!(err, LinuxBootError::NoLowMemory));
    }
}
