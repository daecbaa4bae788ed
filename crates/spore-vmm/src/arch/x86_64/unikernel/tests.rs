//! Loader tests on synthetic ELF images and in-process guest memory.
#![allow(
    clippy::cast_possible_truncation,
    reason = "test fixtures: byte patterns and addresses the test builds itself"
)]

use std::io::Cursor;

use spore_abi::boot::{BOOT_INFO_MAGIC, GDT_ADDR, NOTE_TYPE, PDPT_ADDR, PD_ADDR, PML4_ADDR};
use vm_memory::GuestMemoryMmap;

use super::*;
use crate::host_usize;

const LOAD_ADDR: u64 = 0x20_0000;
const CODE: &[u8] = &[0x90, 0x90, 0xf4, 0xcc, 1, 2, 3, 4];
const BSS: u64 = 0x3000;

fn note(version: u32) -> Vec<u8> {
    let mut v = Vec::new();
    for w in [6u32, 4, NOTE_TYPE] {
        v.extend_from_slice(&w.to_le_bytes());
    }
    v.extend_from_slice(b"spore\0\0\0");
    v.extend_from_slice(&version.to_le_bytes());
    v
}

struct Seg {
    p_type: u32,
    flags: u32,
    addr: u64,
    data: Vec<u8>,
    memsz: u64,
}

/// Builds an ELF64 x86_64 image: header, program headers, then segment data.
fn build_elf(e_type: u16, entry: u64, segs: &[Seg]) -> Vec<u8> {
    let phoff = 64u64;
    let mut data_off = phoff + 56 * segs.len() as u64;
    let mut out = Vec::new();
    out.extend_from_slice(b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0");
    out.extend_from_slice(&e_type.to_le_bytes());
    out.extend_from_slice(&62u16.to_le_bytes()); // EM_X86_64
    out.extend_from_slice(&1u32.to_le_bytes());
    out.extend_from_slice(&entry.to_le_bytes());
    out.extend_from_slice(&phoff.to_le_bytes());
    out.extend_from_slice(&0u64.to_le_bytes()); // shoff
    out.extend_from_slice(&0u32.to_le_bytes()); // flags
    for h in [64u16, 56, segs.len() as u16, 64, 0, 0] {
        out.extend_from_slice(&h.to_le_bytes());
    }
    for s in segs {
        out.extend_from_slice(&s.p_type.to_le_bytes());
        out.extend_from_slice(&s.flags.to_le_bytes());
        for v in [
            data_off,
            s.addr,
            s.addr,
            s.data.len() as u64,
            s.memsz,
            0x1000,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        data_off += s.data.len() as u64;
    }
    for s in segs {
        out.extend_from_slice(&s.data);
    }
    out
}

fn code_seg(addr: u64) -> Seg {
    Seg {
        p_type: 1,
        flags: 5,
        addr,
        data: CODE.to_vec(),
        memsz: CODE.len() as u64 + BSS,
    }
}

fn note_seg(version: u32) -> Seg {
    let data = note(version);
    Seg {
        p_type: 4,
        flags: 4,
        addr: 0,
        memsz: data.len() as u64,
        data,
    }
}

fn good_image() -> Vec<u8> {
    build_elf(
        2,
        LOAD_ADDR,
        &[code_seg(LOAD_ADDR), note_seg(PROTOCOL_VERSION)],
    )
}

fn guest_mem(mib: usize) -> GuestMemoryMmap {
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), mib << 20)]).unwrap();
    // Garbage everywhere, so the test sees that bss and tables are written.
    mem.write_slice(&vec![0xAA; mib << 20], GuestAddress(0))
        .unwrap();
    mem
}

fn read_u64(mem: &GuestMemoryMmap, addr: u64) -> u64 {
    mem.read_obj(GuestAddress(addr)).unwrap()
}

#[test]
fn detects_spore_images() {
    assert!(is_spore_unikernel(&mut Cursor::new(good_image())).unwrap());
    // Not an ELF at all, or an empty file: simply not a unikernel.
    assert!(!is_spore_unikernel(&mut Cursor::new(vec![0u8; 200])).unwrap());
    assert!(!is_spore_unikernel(&mut Cursor::new(Vec::new())).unwrap());
    // An ELF without the note (e.g. a Linux vmlinux).
    let plain = build_elf(2, LOAD_ADDR, &[code_seg(LOAD_ADDR)]);
    assert!(!is_spore_unikernel(&mut Cursor::new(plain)).unwrap());
    let v2 = build_elf(2, LOAD_ADDR, &[code_seg(LOAD_ADDR), note_seg(2)]);
    assert!(matches!(
        is_spore_unikernel(&mut Cursor::new(v2)),
        Err(UnikernelError::VersionMismatch { found: 2 })
    ));
}

#[test]
fn rejects_malformed_headers() {
    let mut img = good_image();
    // e_phnum beyond the limit.
    img[56..58].copy_from_slice(&1000u16.to_le_bytes());
    assert!(matches!(
        is_spore_unikernel(&mut Cursor::new(img)),
        Err(UnikernelError::BadElf(_))
    ));
    // Program headers cut off by the end of the file.
    let img = good_image()[..100].to_vec();
    assert!(matches!(
        is_spore_unikernel(&mut Cursor::new(img)),
        Err(UnikernelError::BadElf(_))
    ));
    // A segment whose file range runs past the end of the file.
    let mut img = good_image();
    let filesz_at = 64 + 32;
    img[filesz_at..filesz_at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(
        is_spore_unikernel(&mut Cursor::new(img)),
        Err(UnikernelError::BadElf(_))
    ));
    // 32-bit ELF.
    let mut img = good_image();
    img[4] = 1;
    assert!(matches!(
        is_spore_unikernel(&mut Cursor::new(img)),
        Err(UnikernelError::NotX86_64Elf)
    ));
}

#[test]
fn loads_image_and_boot_structures() {
    let mem = guest_mem(16);
    let dev = MmioDevice {
        base: 0xD000_0000,
        size: 0x1000,
        device_id: 4,
        irq: 5,
    };
    let entry = load_unikernel(
        &mem,
        &mut Cursor::new(good_image()),
        "exit=3 x",
        &[dev],
        2_000_000,
    )
    .unwrap();
    assert_eq!(
        entry,
        UnikernelEntry {
            entry: LOAD_ADDR,
            stack_top: STACK_TOP,
            boot_info: BOOT_INFO_ADDR
        }
    );

    let mut code = vec![0u8; CODE.len() + host_usize::from_u64(BSS)];
    mem.read_slice(&mut code, GuestAddress(LOAD_ADDR)).unwrap();
    assert_eq!(&code[..CODE.len()], CODE);
    assert!(code[CODE.len()..].iter().all(|&b| b == 0), "bss zeroed");

    // Identity map: 4 GiB (RAM is smaller; the MMIO hole must be reachable).
    assert_eq!(read_u64(&mem, PML4_ADDR), PDPT_ADDR | 7);
    assert_eq!(read_u64(&mem, PML4_ADDR + 8), 0);
    for i in 0..4 {
        assert_eq!(
            read_u64(&mem, PDPT_ADDR + 8 * i),
            (PD_ADDR + 0x1000 * i) | 7
        );
    }
    assert_eq!(read_u64(&mem, PDPT_ADDR + 8 * 4), 0);
    assert_eq!(read_u64(&mem, PD_ADDR), 0x87);
    let mmio_pde = PD_ADDR + 8 * (0xD000_0000u64 >> 21);
    assert_eq!(read_u64(&mem, mmio_pde), 0xD000_0000 | 0x87);

    assert_eq!(read_u64(&mem, GDT_ADDR), 0);
    assert_eq!(
        read_u64(&mem, GDT_ADDR + u64::from(USER_CODE_SEL & !7)),
        tables::USER_CODE
    );
    assert_eq!(
        read_u64(&mem, GDT_ADDR + u64::from(USER_DATA_SEL & !7)),
        tables::USER_DATA
    );

    let mut cmd = [0u8; 9];
    mem.read_slice(&mut cmd, GuestAddress(CMDLINE_ADDR))
        .unwrap();
    assert_eq!(&cmd, b"exit=3 x\0");

    let mut raw = vec![0u8; std::mem::size_of::<BootInfo>()];
    mem.read_slice(&mut raw, GuestAddress(BOOT_INFO_ADDR))
        .unwrap();
    assert_eq!(
        raw,
        BootInfo {
            ..boot_info_expected(dev)
        }
        .as_bytes()
    );
}

fn boot_info_expected(dev: MmioDevice) -> BootInfo {
    let region = |addr: u64, end: u64, kind| MemRegion {
        addr,
        size: end - addr,
        kind,
        _pad: 0,
    };
    let mut info = BootInfo {
        magic: BOOT_INFO_MAGIC,
        tsc_khz: 2_000_000,
        mem_size: 16 << 20,
        cmdline_len: 8,
        mem_region_count: 4,
        mmio_device_count: 1,
        ..BootInfo::default()
    };
    info.mem_regions[..4].copy_from_slice(&[
        region(0, STACK_TOP, MEM_RESERVED),
        region(STACK_TOP, LOAD_ADDR, MEM_FREE),
        region(LOAD_ADDR, LOAD_ADDR + 0x4000, MEM_RESERVED),
        region(LOAD_ADDR + 0x4000, 16 << 20, MEM_FREE),
    ]);
    info.mmio_devices[0] = dev;
    info
}

#[test]
fn rejects_bad_segments_and_arguments() {
    let mem = guest_mem(4);
    let load = |img: Vec<u8>| load_unikernel(&mem, &mut Cursor::new(img), "", &[], 0);
    let with_seg = |seg: Seg, entry: u64| build_elf(2, entry, &[seg, note_seg(PROTOCOL_VERSION)]);
    // Below 1 MiB: would overwrite the page tables.
    assert!(matches!(
        load(with_seg(code_seg(0x8000), 0x8000)),
        Err(UnikernelError::BadSegment { addr: 0x8000, .. })
    ));
    // Past the end of RAM.
    assert!(matches!(
        load(with_seg(code_seg(0x3F_F000), 0x3F_F000)),
        Err(UnikernelError::BadSegment { .. })
    ));
    // Wraps around.
    let mut seg = code_seg(LOAD_ADDR);
    seg.memsz = u64::MAX;
    assert!(matches!(
        load(with_seg(seg, LOAD_ADDR)),
        Err(UnikernelError::BadSegment { .. })
    ));
    // Entry outside the code.
    assert!(matches!(
        load(with_seg(code_seg(LOAD_ADDR), 0x30_0000)),
        Err(UnikernelError::BadEntry(0x30_0000))
    ));
    // No note, PIE.
    assert!(matches!(
        load(build_elf(2, LOAD_ADDR, &[code_seg(LOAD_ADDR)])),
        Err(UnikernelError::NotSporeUnikernel)
    ));
    assert!(matches!(
        load(build_elf(3, LOAD_ADDR, &[code_seg(LOAD_ADDR), note_seg(1)])),
        Err(UnikernelError::NotStaticExecutable(3))
    ));
    assert!(matches!(load(vec![1, 2, 3]), Err(UnikernelError::NotElf)));

    let long = "x".repeat(CMDLINE_MAX);
    assert!(matches!(
        load_unikernel(&mem, &mut Cursor::new(good_image()), &long, &[], 0),
        Err(UnikernelError::CmdlineTooLong { .. })
    ));
    let devices = vec![MmioDevice::default(); MAX_MMIO_DEVICES + 1];
    assert!(matches!(
        load_unikernel(&mem, &mut Cursor::new(good_image()), "", &devices, 0),
        Err(UnikernelError::TooManyDevices { .. })
    ));
    let tiny = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x8_0000)]).unwrap();
    assert!(matches!(
        load_unikernel(&tiny, &mut Cursor::new(good_image()), "", &[], 0),
        Err(UnikernelError::RamTooSmall { .. })
    ));
}

#[test]
fn memory_map_splits_around_the_hole() {
    const GIB: u64 = 1 << 30;
    let ram = [(0, 3 * GIB), (4 * GIB, GIB / 2)];
    let map = memory_map(&ram, MIN_IMAGE_ADDR, MIN_IMAGE_ADDR + 0x5000).unwrap();
    let got: Vec<(u64, u64, u32)> = map.iter().map(|r| (r.addr, r.size, r.kind)).collect();
    assert_eq!(
        got,
        vec![
            (0, MIN_IMAGE_ADDR + 0x5000, MEM_RESERVED),
            (
                MIN_IMAGE_ADDR + 0x5000,
                3 * GIB - MIN_IMAGE_ADDR - 0x5000,
                MEM_FREE
            ),
            (4 * GIB, GIB / 2, MEM_FREE),
        ]
    );
}

#[test]
fn identity_map_reaches_the_hotplug_region() {
    let mem = guest_mem(16);
    // A 2 GiB hotplug region at 4 GiB: the map must cover 0..6 GiB.
    load_unikernel_mapping(&mem, &mut Cursor::new(good_image()), "", &[], 0, 6 << 30).unwrap();
    for i in 0..6 {
        assert_eq!(
            read_u64(&mem, PDPT_ADDR + 8 * i),
            (PD_ADDR + 0x1000 * i) | 7
        );
    }
    assert_eq!(read_u64(&mem, PDPT_ADDR + 8 * 6), 0);
    // The last 2 MiB page below 6 GiB maps itself.
    let last = (6u64 << 30) - (2 << 20);
    assert_eq!(read_u64(&mem, PD_ADDR + 8 * (last >> 21)), last | 0x87);
    // Beyond the 64 GiB the protocol reserves room for: refused.
    assert!(load_unikernel_mapping(
        &mem,
        &mut Cursor::new(good_image()),
        "",
        &[],
        0,
        (64 << 30) + 1,
    )
    .is_err());
}
