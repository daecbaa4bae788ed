//! The ring-3 unikernel boot protocol, VMM side (see [`spore_abi::boot`]).
//!
//! [`is_spore_unikernel`] tells a spore unikernel (a static x86_64 ELF with
//! the `spore` note) from other images; [`load_unikernel`] loads its segments
//! and writes everything the protocol promises (identity page tables, GDT and
//! TSS, boot info, command line); [`configure_vcpu`] puts the boot vCPU at the
//! entry in 64-bit mode at CPL 3 with IOPL 3 and interrupts off.
//!
//! The image is untrusted: every header field is bounds-checked, segments must
//! lie in guest RAM above [`MIN_IMAGE_ADDR`], and nothing here panics on a
//! malformed file.

mod elf;
mod tables;
mod vcpu;

use std::io::{Read, Seek, SeekFrom};

pub use elf::MAX_PHNUM;
use linux_loader::elf::ET_EXEC;
use spore_abi::boot::{
    BootInfo, MemRegion, MmioDevice, BOOT_INFO_ADDR, CMDLINE_ADDR, CMDLINE_MAX, MAX_MEM_REGIONS,
    MAX_MMIO_DEVICES, MEM_FREE, MEM_RESERVED, MIN_IMAGE_ADDR, PROTOCOL_VERSION, STACK_TOP,
};
pub use tables::{KERNEL_CODE_SEL, KERNEL_DATA_SEL, TSS_SEL, USER_CODE_SEL, USER_DATA_SEL};
pub use vcpu::{configure_vcpu, set_supported_cpuid, RFLAGS};
use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryRegion};

use crate::host_usize;

const PAGE: u64 = 0x1000;

#[derive(Debug, thiserror::Error)]
pub enum UnikernelError {
    #[error("{0}")]
    CpuTemplate(String),
    #[error("reading the unikernel image failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("the image is not an ELF file; a spore unikernel is a static x86_64 ELF built with spore-uk")]
    NotElf,
    #[error("the ELF image is not a 64-bit little-endian x86_64 image")]
    NotX86_64Elf,
    #[error("invalid ELF image: {0}")]
    BadElf(String),
    #[error("ELF type {0} is not a static executable (ET_EXEC): link the unikernel without PIE")]
    NotStaticExecutable(u16),
    #[error(
        "the ELF image has no `spore` note: it is not a spore unikernel (build it with spore-uk)"
    )]
    NotSporeUnikernel,
    #[error("the unikernel speaks boot protocol version {found}, this VMM speaks {PROTOCOL_VERSION}: rebuild it against this spore-abi")]
    VersionMismatch { found: u32 },
    #[error("segment at {addr:#x} (+{size:#x}) {reason}")]
    BadSegment {
        addr: u64,
        size: u64,
        reason: &'static str,
    },
    #[error("entry point {0:#x} is not inside an executable segment of the image")]
    BadEntry(u64),
    #[error("guest RAM must cover at least the first {need:#x} bytes for the boot structures")]
    RamTooSmall { need: u64 },
    #[error(
        "guest RAM ends at {ram_end:#x}; the unikernel identity map covers at most {max_gib} GiB"
    )]
    TooMuchMemory { ram_end: u64, max_gib: u64 },
    #[error("the command line is {len} bytes; the unikernel protocol allows at most {max}")]
    CmdlineTooLong { len: usize, max: usize },
    #[error("the command line contains a NUL byte")]
    CmdlineHasNul,
    #[error("{count} MMIO devices; the unikernel protocol allows at most {max}")]
    TooManyDevices { count: usize, max: usize },
    #[error("guest RAM is split into too many regions for the boot-info memory map (max {MAX_MEM_REGIONS})")]
    TooManyRegions,
    #[error("writing guest memory at {addr:#x} failed: {source}")]
    GuestMemory {
        addr: u64,
        source: vm_memory::GuestMemoryError,
    },
    #[error("{what} failed: {source}")]
    Kvm {
        what: &'static str,
        source: kvm_ioctls::Error,
    },
}

/// Where the boot vCPU starts: RIP, RSP and RDI.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnikernelEntry {
    pub entry: u64,
    pub stack_top: u64,
    pub boot_info: u64,
}

/// True if `image` is an x86_64 ELF carrying the spore note. Not an ELF at
/// all: false. An ELF whose headers are broken, or a spore image of another
/// protocol version: an error saying so.
pub fn is_spore_unikernel(image: &mut (impl Read + Seek)) -> Result<bool, UnikernelError> {
    let Some(parsed) = elf::parse(image)? else {
        return Ok(false);
    };
    match elf::spore_note_version(image, &parsed)? {
        None => Ok(false),
        Some(PROTOCOL_VERSION) => Ok(true),
        Some(found) => Err(UnikernelError::VersionMismatch { found }),
    }
}

/// Loads a spore unikernel and writes the boot structures of the ring-3
/// protocol into `mem`. `devices` are listed in the boot info for the guest to
/// probe; `tsc_khz` (0 if unknown) drives the guest's clock.
pub fn load_unikernel<M: GuestMemoryBackend>(
    mem: &M,
    image: &mut (impl Read + Seek),
    cmdline: &str,
    devices: &[MmioDevice],
    tsc_khz: u64,
) -> Result<UnikernelEntry, UnikernelError> {
    load_unikernel_mapping(mem, image, cmdline, devices, tsc_khz, 0)
}

/// [`load_unikernel`] with the identity map stretched to cover guest-physical
/// addresses up to `map_end` as well (the virtio-mem hotplug region, which is
/// not RAM in `mem`). Its unplugged parts have no KVM slot, so a guest access
/// there exits to the VMM as MMIO and stops the unikernel.
pub fn load_unikernel_mapping<M: GuestMemoryBackend>(
    mem: &M,
    image: &mut (impl Read + Seek),
    cmdline: &str,
    devices: &[MmioDevice],
    tsc_khz: u64,
    map_end: u64,
) -> Result<UnikernelEntry, UnikernelError> {
    // Check everything that does not touch guest memory first.
    if cmdline.len() >= CMDLINE_MAX {
        return Err(UnikernelError::CmdlineTooLong {
            len: cmdline.len(),
            max: CMDLINE_MAX - 1,
        });
    }
    if cmdline.as_bytes().contains(&0) {
        return Err(UnikernelError::CmdlineHasNul);
    }
    if devices.len() > MAX_MMIO_DEVICES {
        return Err(UnikernelError::TooManyDevices {
            count: devices.len(),
            max: MAX_MMIO_DEVICES,
        });
    }
    let ram = ram_ranges(mem);
    let ram_end = ram.last().map_or(0, |&(start, size)| start + size);
    if !mem.check_range(GuestAddress(0), host_usize::from_u64(STACK_TOP)) {
        return Err(UnikernelError::RamTooSmall { need: STACK_TOP });
    }
    let gib = tables::identity_gib(ram_end.max(map_end))?;

    let parsed = elf::parse(image)?.ok_or(UnikernelError::NotElf)?;
    if parsed.e_type != ET_EXEC {
        // A PIE or relocatable object would need relocation, which the ring-3
        // protocol does not do.
        return Err(UnikernelError::NotStaticExecutable(parsed.e_type));
    }
    match elf::spore_note_version(image, &parsed)? {
        None => return Err(UnikernelError::NotSporeUnikernel),
        Some(PROTOCOL_VERSION) => {}
        Some(found) => return Err(UnikernelError::VersionMismatch { found }),
    }
    let (image_start, image_end) = check_segments(mem, &parsed)?;
    load_segments(mem, image, &parsed)?;

    tables::write_page_tables(mem, gib)?;
    tables::write_gdt(mem)?;

    let mut cmdline_bytes = cmdline.as_bytes().to_vec();
    cmdline_bytes.push(0);
    write(mem, CMDLINE_ADDR, &cmdline_bytes)?;

    let regions = memory_map(&ram, image_start, image_end)?;
    #[allow(
        clippy::cast_possible_truncation,
        reason = "regions and devices fit the block's arrays (MAX_MEM_REGIONS, MAX_MMIO_DEVICES): copied below"
    )]
    let mut info = BootInfo {
        tsc_khz,
        mem_size: ram.iter().map(|&(_, size)| size).sum(),
        cmdline_addr: CMDLINE_ADDR,
        cmdline_len: cmdline.len() as u64,
        mem_region_count: regions.len() as u32,
        mmio_device_count: devices.len() as u32,
        ..BootInfo::default()
    };
    info.mem_regions[..regions.len()].copy_from_slice(&regions);
    info.mmio_devices[..devices.len()].copy_from_slice(devices);
    write(mem, BOOT_INFO_ADDR, info.as_bytes())?;

    Ok(UnikernelEntry {
        entry: parsed.entry,
        stack_top: STACK_TOP,
        boot_info: BOOT_INFO_ADDR,
    })
}

fn write(mem: &impl GuestMemoryBackend, addr: u64, bytes: &[u8]) -> Result<(), UnikernelError> {
    mem.write_slice(bytes, GuestAddress(addr))
        .map_err(|source| UnikernelError::GuestMemory { addr, source })
}

/// Guest RAM as sorted (start, size) ranges, adjacent regions merged.
fn ram_ranges(mem: &impl GuestMemoryBackend) -> Vec<(u64, u64)> {
    let mut ranges: Vec<(u64, u64)> = mem
        .iter()
        .map(|r| (r.start_addr().raw_value(), r.len()))
        .collect();
    ranges.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (start, size) in ranges {
        match merged.last_mut() {
            Some((s, sz)) if *s + *sz == start => *sz += size,
            _ => merged.push((start, size)),
        }
    }
    merged
}

/// Checks every loadable segment and returns the page-aligned span of the
/// image. Segments must be identity-mapped (vaddr = paddr), lie in guest RAM
/// above [`MIN_IMAGE_ADDR`], and the entry must be in an executable one.
fn check_segments(
    mem: &impl GuestMemoryBackend,
    parsed: &elf::ElfImage,
) -> Result<(u64, u64), UnikernelError> {
    let mut span: Option<(u64, u64)> = None;
    let mut entry_ok = false;
    for p in parsed.loads() {
        let bad = |reason| UnikernelError::BadSegment {
            addr: p.p_paddr,
            size: p.p_memsz,
            reason,
        };
        if p.p_vaddr != p.p_paddr {
            return Err(bad(
                "has a virtual address unlike its physical one; the unikernel is identity-mapped",
            ));
        }
        if p.p_filesz > p.p_memsz {
            return Err(bad("has more file bytes than memory bytes"));
        }
        if p.p_paddr < MIN_IMAGE_ADDR {
            return Err(bad(
                "lies below 1 MiB, where the VMM keeps the boot structures",
            ));
        }
        let end = p
            .p_paddr
            .checked_add(p.p_memsz)
            .filter(|_| usize::try_from(p.p_memsz).is_ok())
            .ok_or_else(|| bad("wraps around the address space"))?;
        if !mem.check_range(GuestAddress(p.p_paddr), host_usize::from_u64(p.p_memsz)) {
            return Err(bad("does not fit in guest RAM"));
        }
        if p.p_flags & elf::PF_X != 0 && (p.p_paddr..end).contains(&parsed.entry) {
            entry_ok = true;
        }
        let (lo, hi) = span.unwrap_or((u64::MAX, 0));
        span = Some((lo.min(p.p_paddr), hi.max(end)));
    }
    let (lo, hi) = span.ok_or_else(|| UnikernelError::BadElf("no loadable segment".into()))?;
    if !entry_ok {
        return Err(UnikernelError::BadEntry(parsed.entry));
    }
    // In RAM, so far from u64::MAX: rounding up cannot overflow.
    Ok((lo & !(PAGE - 1), hi.div_ceil(PAGE) * PAGE))
}

/// Copies the file bytes of every segment and zeroes the rest (bss). Call
/// after [`check_segments`].
fn load_segments(
    mem: &impl GuestMemoryBackend,
    image: &mut (impl Read + Seek),
    parsed: &elf::ElfImage,
) -> Result<(), UnikernelError> {
    const CHUNK: usize = 64 * 1024;
    let mut buf = vec![0u8; CHUNK];
    for p in parsed.loads() {
        image.seek(SeekFrom::Start(p.p_offset))?;
        let mut done = 0u64;
        while done < p.p_filesz {
            let n = host_usize::from_u64((p.p_filesz - done).min(CHUNK as u64));
            image.read_exact(&mut buf[..n])?;
            write(mem, p.p_paddr + done, &buf[..n])?;
            done += n as u64;
        }
        // Memory may be reused (or come from a template): zero bss explicitly.
        buf.fill(0);
        while done < p.p_memsz {
            let n = host_usize::from_u64((p.p_memsz - done).min(CHUNK as u64));
            write(mem, p.p_paddr + done, &buf[..n])?;
            done += n as u64;
        }
    }
    Ok(())
}

/// The boot-info memory map: every RAM range, split into reserved pieces (the
/// boot structures and stack below [`STACK_TOP`], and the image) and free ones.
fn memory_map(
    ram: &[(u64, u64)],
    image_start: u64,
    image_end: u64,
) -> Result<Vec<MemRegion>, UnikernelError> {
    let reserved = [(0, STACK_TOP), (image_start, image_end)];
    let mut out: Vec<MemRegion> = Vec::new();
    let mut push = |addr: u64, end: u64, kind: u32| {
        if end <= addr {
            return;
        }
        match out.last_mut() {
            // Merge touching pieces of the same kind (e.g. an image at 1 MiB).
            Some(last) if last.kind == kind && last.addr + last.size == addr => {
                last.size += end - addr
            }
            _ => out.push(MemRegion {
                addr,
                size: end - addr,
                kind,
                _pad: 0,
            }),
        }
    };
    for &(start, size) in ram {
        let end = start + size;
        let mut cursor = start;
        for &(rs, re) in &reserved {
            let (rs, re) = (rs.max(start), re.min(end));
            if rs >= re {
                continue;
            }
            push(cursor, rs, MEM_FREE);
            push(rs, re, MEM_RESERVED);
            cursor = cursor.max(re);
        }
        push(cursor, end, MEM_FREE);
    }
    if out.len() > MAX_MEM_REGIONS {
        return Err(UnikernelError::TooManyRegions);
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
