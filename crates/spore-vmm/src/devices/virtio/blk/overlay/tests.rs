//! Copy-on-write overlays: merging at block boundaries, isolation between
//! clones, persistence, hostile ranges, a base that shrinks underneath.
#![allow(
    clippy::cast_possible_truncation,
    reason = "test fixtures: byte patterns and addresses the test builds itself"
)]

use std::path::{Path, PathBuf};

use vmm_sys_util::tempdir::TempDir;

use super::*;
use crate::config::{CowOverlayConfig, DriveConfig};
use crate::host_usize;

const BS: usize = host_usize::from_u64(DEFAULT_BLOCK_SIZE);

fn base_content(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 4096) as u8).collect()
}

fn make_base(dir: &Path, len: usize) -> (PathBuf, Vec<u8>) {
    let path = dir.join("base.img");
    let content = base_content(len);
    std::fs::write(&path, &content).unwrap();
    (path, content)
}

fn file_cfg(path: &Path) -> CowOverlayConfig {
    CowOverlayConfig {
        path: Some(path.display().to_string()),
        in_memory: false,
    }
}

fn mem_cfg() -> CowOverlayConfig {
    CowOverlayConfig {
        path: None,
        in_memory: true,
    }
}

fn read_all(d: &CowDisk) -> Vec<u8> {
    let mut v = vec![0u8; host_usize::from_u64(d.size())];
    d.read_at(0, &mut v).unwrap();
    v
}

fn drive(base: &Path, overlay: Option<CowOverlayConfig>) -> DriveConfig {
    DriveConfig {
        drive_id: "root fs".into(),
        path_on_host: base.display().to_string(),
        is_root_device: true,
        is_read_only: false,
        partuuid: None,
        cache_type: None,
        io_engine: None,
        cow_overlay: overlay,
        rate_limiter: None,
        socket: None,
    }
}

#[test]
fn partial_and_straddling_writes_merge_with_the_base() {
    let dir = TempDir::new().unwrap();
    // 5 whole blocks and a 1 KiB tail: the last block is short.
    let len = 5 * BS + 1024;
    let (base, model) = make_base(dir.as_path(), len);
    for cfg in [file_cfg(&dir.as_path().join("o.cow")), mem_cfg()] {
        let mut d = CowDisk::open(&base, &cfg, true).unwrap();
        let mut model_here = model.clone();
        // (offset, len): inside a block, straddling one boundary, covering a
        // whole block exactly, straddling several, the short tail block, the last byte.
        for (i, &(off, n)) in [
            (100, 10),
            (BS - 3, 7),
            (2 * BS, BS),
            (BS + 4000, 2 * BS + 200),
            (5 * BS + 10, 500),
            (len - 1, 1),
        ]
        .iter()
        .enumerate()
        {
            let data: Vec<u8> = (0..n).map(|j| (j as u8) ^ (0xA0 + i as u8)).collect();
            d.write_at(off as u64, &data).unwrap();
            model_here[off..off + n].copy_from_slice(&data);
            assert_eq!(read_all(&d), model_here, "after write {i} at {off}+{n}");
        }
        // Unaligned reads across present and absent blocks.
        let mut buf = vec![0u8; 3 * BS + 17];
        d.read_at(BS as u64 - 9, &mut buf).unwrap();
        assert_eq!(buf[..], model_here[BS - 9..BS - 9 + buf.len()]);
        assert_eq!(d.blocks_present(), 6);
        d.flush().unwrap();
    }
    // The base never changed.
    assert_eq!(std::fs::read(&base).unwrap(), model);
}

#[test]
fn overlay_survives_reopen_and_rejects_another_base() {
    let dir = TempDir::new().unwrap();
    let (base, mut model) = make_base(dir.as_path(), 8 * BS);
    let ov = dir.as_path().join("o.cow");
    {
        let mut d = CowDisk::open(&base, &file_cfg(&ov), false).unwrap();
        d.write_at(3 * BS as u64 + 5, b"persist").unwrap();
        model[3 * BS + 5..3 * BS + 12].copy_from_slice(b"persist");
    }
    let d = CowDisk::open(&base, &file_cfg(&ov), false).unwrap();
    assert_eq!(d.blocks_present(), 1);
    assert_eq!(read_all(&d), model);
    // The overlay is sparse: one block of data, not the whole disk.
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(&ov).unwrap();
    assert!(
        meta.blocks() * 512 <= 4 * BS as u64,
        "{} bytes used",
        meta.blocks() * 512
    );

    let other = dir.as_path().join("other.img");
    std::fs::write(&other, vec![0u8; 4 * BS]).unwrap();
    assert!(matches!(
        CowDisk::open(&other, &file_cfg(&ov), false),
        Err(OverlayError::WrongBase { .. })
    ));
    // Not an overlay at all.
    let junk = dir.as_path().join("junk");
    std::fs::write(&junk, b"hello").unwrap();
    assert!(matches!(
        CowDisk::open(&base, &file_cfg(&junk), false),
        Err(OverlayError::NotAnOverlay { .. })
    ));
}

#[test]
fn hostile_ranges_are_errors_not_panics() {
    let dir = TempDir::new().unwrap();
    let (base, _) = make_base(dir.as_path(), 2 * BS);
    let mut d = CowDisk::open(&base, &mem_cfg(), false).unwrap();
    let mut buf = [0u8; 16];
    for off in [2 * BS as u64, 2 * BS as u64 - 8, u64::MAX, u64::MAX - 4] {
        assert!(matches!(
            d.read_at(off, &mut buf),
            Err(CowIoError::Range { .. })
        ));
        assert!(matches!(
            d.write_at(off, &buf),
            Err(CowIoError::Range { .. })
        ));
    }
    assert_eq!(d.blocks_present(), 0);
    // Zero-length at the end is fine.
    d.read_at(2 * BS as u64, &mut []).unwrap();
}

#[test]
fn truncated_base_gives_io_errors() {
    let dir = TempDir::new().unwrap();
    let (base, _) = make_base(dir.as_path(), 4 * BS);
    let mut d = CowDisk::open(&base, &mem_cfg(), false).unwrap();
    d.write_at(0, &[1u8; BS]).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&base)
        .unwrap()
        .set_len(BS as u64)
        .unwrap();
    let mut buf = vec![0u8; BS];
    // Block 0 lives in the overlay: still readable.
    d.read_at(0, &mut buf).unwrap();
    assert_eq!(buf, vec![1u8; BS]);
    // Block 2 is gone from the base: a read and a partial write (copy-up) fail.
    assert!(matches!(
        d.read_at(2 * BS as u64, &mut buf),
        Err(CowIoError::Base { .. })
    ));
    assert!(matches!(
        d.write_at(2 * BS as u64 + 1, &[9]),
        Err(CowIoError::Base { .. })
    ));
    // A whole-block write needs no base.
    d.write_at(3 * BS as u64, &buf).unwrap();
    // Deleting the base keeps the open file readable (it is unlinked, not gone).
    std::fs::remove_file(&base).unwrap();
    d.read_at(0, &mut buf).unwrap();
}

#[test]
fn clones_are_isolated_and_a_clone_of_a_clone_keeps_its_parent() {
    let dir = TempDir::new().unwrap();
    let (base, content) = make_base(dir.as_path(), 6 * BS);
    let source = drive(&base, None);
    let a = clone_drive(&source, dir.as_path(), "a").unwrap();
    let b = clone_drive(&source, dir.as_path(), "b").unwrap();
    assert!(a
        .cow_overlay
        .as_ref()
        .unwrap()
        .path
        .as_ref()
        .unwrap()
        .ends_with("a.root_fs.cow"));
    assert!(matches!(
        clone_drive(&source, dir.as_path(), "a"),
        Err(OverlayError::Exists { .. })
    ));
    let open = |d: &DriveConfig| {
        CowDisk::open(
            Path::new(&d.path_on_host),
            d.cow_overlay.as_ref().unwrap(),
            false,
        )
        .unwrap()
    };
    let mut da = open(&a);
    let mut db = open(&b);
    da.write_at(10, b"clone a").unwrap();
    db.write_at(10, b"clone b").unwrap();
    db.write_at(5 * BS as u64, &[0xBB; 100]).unwrap();
    let mut buf = [0u8; 7];
    da.read_at(10, &mut buf).unwrap();
    assert_eq!(&buf, b"clone a");
    db.read_at(10, &mut buf).unwrap();
    assert_eq!(&buf, b"clone b");
    assert_eq!(std::fs::read(&base).unwrap(), content);

    // Clone of a clone: starts with b's contents, then diverges from it.
    drop(db);
    let c = clone_drive(&b, dir.as_path(), "c").unwrap();
    let mut dc = open(&c);
    dc.read_at(10, &mut buf).unwrap();
    assert_eq!(&buf, b"clone b");
    let mut tail = [0u8; 100];
    dc.read_at(5 * BS as u64, &mut tail).unwrap();
    assert_eq!(tail, [0xBB; 100]);
    dc.write_at(10, b"clone c").unwrap();
    let db = open(&b);
    db.read_at(10, &mut buf).unwrap();
    assert_eq!(&buf, b"clone b");
    dc.read_at(10, &mut buf).unwrap();
    assert_eq!(&buf, b"clone c");

    // Read-only drives are shared as they are; bad names and in-memory parents are refused.
    let ro = DriveConfig {
        is_read_only: true,
        ..drive(&base, None)
    };
    assert_eq!(clone_drive(&ro, dir.as_path(), "d").unwrap(), ro);
    assert!(matches!(
        clone_drive(&source, dir.as_path(), "../x"),
        Err(OverlayError::Name(_))
    ));
    assert!(matches!(
        clone_drive(&drive(&base, Some(mem_cfg())), dir.as_path(), "e"),
        Err(OverlayError::InMemoryParent { .. })
    ));
}

#[test]
fn spill_moves_an_in_memory_overlay_to_a_file() {
    let dir = TempDir::new().unwrap();
    let (base, _) = make_base(dir.as_path(), 3 * BS);
    let mut d = CowDisk::open(&base, &mem_cfg(), true).unwrap();
    d.write_at(BS as u64, b"in memory").unwrap();
    let path = dir.as_path().join("spilled.cow");
    let cfg = d.spill(&path).unwrap();
    assert_eq!(cfg, file_cfg(&path));
    d.write_at(2 * BS as u64, b"after").unwrap();
    d.flush().unwrap();
    let again = CowDisk::open(&base, &cfg, false).unwrap();
    let mut buf = [0u8; 9];
    again.read_at(BS as u64, &mut buf).unwrap();
    assert_eq!(&buf, b"in memory");
    let mut buf = [0u8; 5];
    again.read_at(2 * BS as u64, &mut buf).unwrap();
    assert_eq!(&buf, b"after");
}

#[test]
fn damaged_block_map_is_refused() {
    let dir = TempDir::new().unwrap();
    let (base, _) = make_base(dir.as_path(), 3 * BS + 512);
    let ov = dir.as_path().join("o.cow");
    drop(CowDisk::open(&base, &file_cfg(&ov), false).unwrap());
    // Mark a block past the end of the 4-block disk.
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(&ov).unwrap();
    f.write_all_at(&[0x80], HEADER_LEN).unwrap();
    assert!(matches!(
        CowDisk::open(&base, &file_cfg(&ov), false),
        Err(OverlayError::Corrupt { .. })
    ));
    // A header cut short.
    f.set_len(10).unwrap();
    assert!(CowDisk::open(&base, &file_cfg(&ov), false).is_err());
}

#[test]
fn in_memory_clones_create_nothing_or_a_frozen_copy() {
    let dir = TempDir::new().unwrap();
    let (base, content) = make_base(dir.as_path(), 4 * BS);
    let source = drive(&base, None);
    let m = clone_drive_to(&source, dir.as_path(), "m", OverlayPlace::Memory).unwrap();
    assert_eq!(m.cow_overlay, Some(mem_cfg()));
    assert!(!dir.as_path().join("m.root_fs.cow").exists());
    let open = |d: &DriveConfig| {
        CowDisk::open(
            Path::new(&d.path_on_host),
            d.cow_overlay.as_ref().unwrap(),
            false,
        )
        .unwrap()
    };
    let mut dm = open(&m);
    dm.write_at(0, b"memory").unwrap();
    assert_eq!(std::fs::read(&base).unwrap(), content);

    // Over a clone with a file overlay: a frozen copy, loaded into memory.
    let a = clone_drive(&source, dir.as_path(), "a").unwrap();
    let mut da = open(&a);
    da.write_at(BS as u64, b"parent a").unwrap();
    drop(da);
    let am = clone_drive_to(&a, dir.as_path(), "am", OverlayPlace::Memory).unwrap();
    let cfg = am.cow_overlay.clone().unwrap();
    assert!(cfg.in_memory && cfg.path.as_ref().unwrap().ends_with("am.root_fs.cow"));
    let frozen = std::fs::read(cfg.path.as_ref().unwrap()).unwrap();
    let mut dam = open(&am);
    let mut buf = [0u8; 8];
    dam.read_at(BS as u64, &mut buf).unwrap();
    assert_eq!(&buf, b"parent a");
    dam.write_at(BS as u64, b"child am").unwrap();
    dam.read_at(BS as u64, &mut buf).unwrap();
    assert_eq!(&buf, b"child am");
    // Neither the frozen copy nor the parent saw the child's write.
    assert_eq!(std::fs::read(cfg.path.as_ref().unwrap()).unwrap(), frozen);
    open(&a).read_at(BS as u64, &mut buf).unwrap();
    assert_eq!(&buf, b"parent a");
    // A base that is gone is reported at clone time.
    let gone = drive(&dir.as_path().join("nope.img"), None);
    assert!(matches!(
        clone_drive_to(&gone, dir.as_path(), "g", OverlayPlace::Memory),
        Err(OverlayError::Base { .. })
    ));
}
