//! The userfaultfd and the built-in handler on real RAM: fills from the
//! newest layer, zero holes, runs, recording, the external handshake.
#![allow(
    clippy::cast_possible_truncation,
    reason = "test fixtures: byte patterns and addresses the test builds itself"
)]

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use vm_memory::{Bytes, GuestAddress};

use super::*;
use crate::memory::layers::MemoryLayers;
use crate::memory::GuestRam;

fn layer_file(name: &str, size: u64, pages: &[(u64, u8)]) -> File {
    let path = std::env::temp_dir().join(format!("spore-uffd-{}-{name}", std::process::id()));
    let f = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    f.set_len(size).unwrap();
    for &(p, v) in pages {
        f.write_all_at(&[v; 4096], p * PAGE).unwrap();
    }
    let _ = std::fs::remove_file(&path);
    f
}

#[test]
fn built_in_handler_serves_newest_layer_and_zero_holes_and_records_order() {
    let uffd = match Uffd::new() {
        Ok(u) => u,
        Err(e) => panic!("userfaultfd must be available on the test host: {e}"),
    };
    drop(uffd);
    let size = 8u64 << 20;
    let base = layer_file("base", size, &[(0, 1), (1, 2), (300, 3)]);
    let diff = layer_file("diff", size, &[(1, 9)]);
    let ram = GuestRam::new(size).unwrap();
    let uffd = register_ram(&ram).unwrap();
    let source =
        PageSource::new(MemoryLayers::new(vec![base, diff], size), regions_of(&ram)).unwrap();
    let mut server = UffdServer::start(uffd, Arc::new(source), true).unwrap();
    let m = ram.memory();
    let v: u8 = m.read_obj(GuestAddress(300 * PAGE + 7)).unwrap();
    assert_eq!(v, 3);
    let v: u8 = m.read_obj(GuestAddress(PAGE)).unwrap();
    assert_eq!(v, 9, "the diff layer wins");
    let v: u8 = m.read_obj(GuestAddress(0)).unwrap();
    assert_eq!(v, 1);
    let v: u8 = m.read_obj(GuestAddress(100 * PAGE)).unwrap();
    assert_eq!(v, 0, "a hole reads as zero");
    m.write_obj(5u8, GuestAddress(200 * PAGE)).unwrap();
    let v: u8 = m.read_obj(GuestAddress(200 * PAGE)).unwrap();
    assert_eq!(v, 5);
    let order = server.log().order.lock().unwrap().clone().unwrap();
    assert_eq!(order, vec![300, 1, 0, 100, 200]);
    assert_eq!(server.log().faults.load(Ordering::Relaxed), 5);
    assert!(server.stop().is_none());
}

#[test]
fn a_layout_from_a_vmm_is_checked_and_huge_pages_read_whole() {
    let size = 4u64 << 20;
    let base = layer_file("huge", size, &[(1, 7), (600, 8)]);
    let layers = MemoryLayers::single(base, size);
    // Page sizes other than 4 KiB and 2 MiB, and unaligned regions.
    for bad in [
        RegionMapping::new(0x4000_0000, size, 0, 8192),
        RegionMapping::new(0x4000_1000, size, 0, HUGE_PAGE),
        RegionMapping::new(0x4000_0000, size, PAGE, HUGE_PAGE),
    ] {
        let layers = MemoryLayers::single(layers.files()[0].try_clone().unwrap(), size);
        assert!(PageSource::new(layers, vec![bad]).is_err(), "{bad:?}");
    }
    let good = RegionMapping::new(0x4000_0000, size, 0, HUGE_PAGE);
    assert_eq!(good.page_size_kib, 2048);
    let source = PageSource::new(layers, vec![good]).unwrap();
    assert_eq!(source.max_page(), HUGE_PAGE);
    assert_eq!(
        source.page_of(0x4000_0000 + HUGE_PAGE + 5),
        Some((0x4000_0000 + HUGE_PAGE, HUGE_PAGE, HUGE_PAGE))
    );
    // A huge page spanning data and holes reads as one buffer.
    let mut buf = vec![0xffu8; HUGE_PAGE as usize];
    source.read_range(0, &mut buf).unwrap();
    assert!(buf[..4096].iter().all(|&b| b == 0));
    assert!(buf[4096..8192].iter().all(|&b| b == 7));
    assert!(buf[8192..].iter().all(|&b| b == 0));
    source.read_range(HUGE_PAGE, &mut buf).unwrap();
    let at = (600 * PAGE - HUGE_PAGE) as usize;
    assert!(buf[at..at + 4096].iter().all(|&b| b == 8));
    assert_eq!(buf.iter().filter(|&&b| b != 0).count(), 4096);
}

/// Runs `f` on a thread and fails the test if it does not end in
/// time (a fault nobody serves would hang the test for ever).
fn within(secs: u64, f: impl FnOnce() + Send + 'static) {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    rx.recv_timeout(std::time::Duration::from_secs(secs))
        .expect("guest memory accesses hung or failed: a fault was never served right");
}

/// RAM holding pages 5 and 100 (value 0xee) before registration, the
/// snapshot's data on every page of 0..40.
fn prefilled_ram(name: &str) -> (GuestRam, PageSource, u64) {
    let size = 4u64 << 20;
    let pages: Vec<(u64, u8)> = (0..40).map(|p| (p, p as u8 + 1)).collect();
    let base = layer_file(name, size, &pages);
    let ram = GuestRam::new(size).unwrap();
    for p in [5u64, 100] {
        ram.memory()
            .write_slice(&[0xee; 4096], GuestAddress(p * PAGE))
            .unwrap();
    }
    let source = PageSource::new(MemoryLayers::single(base, size), regions_of(&ram)).unwrap();
    (ram, source, size)
}

fn check_prefilled(m: crate::memory::GuestMemoryMmap) {
    within(20, move || {
        let read = |p: u64| -> u8 { m.read_obj(GuestAddress(p * PAGE)).unwrap() };
        assert_eq!(read(3), 4);
        assert_eq!(read(5), 0xee, "a prefilled page keeps its data");
        for p in [0u64, 4, 6, 10, 39] {
            assert_eq!(read(p), p as u8 + 1);
        }
        assert_eq!(read(99), 0);
        assert_eq!(read(100), 0xee);
        assert_eq!(read(101), 0);
        assert_eq!(read(300), 0);
    });
}

#[test]
fn runs_stop_at_pages_read_in_before_registration() {
    // The handler is told what is there (a working set's runs).
    let (ram, source, _) = prefilled_ram("told");
    let uffd = register_ram(&ram).unwrap();
    let mut server = UffdServer::start_over(uffd, Arc::new(source), &[(5, 1), (100, 1)]).unwrap();
    check_prefilled(ram.memory().clone());
    assert!(server.stop().is_none());
}

#[test]
fn a_run_that_meets_a_page_already_there_still_serves_the_fault() {
    // Not told: the run's copy stops part way (EAGAIN with the bytes
    // done), which must neither end the handler nor leave the fault.
    let (ram, source, _) = prefilled_ram("untold");
    let uffd = register_ram(&ram).unwrap();
    let mut server = UffdServer::start(uffd, Arc::new(source), false).unwrap();
    check_prefilled(ram.memory().clone());
    assert!(server.stop().is_none());
}

#[test]
fn outside_recording_a_fault_fills_its_run() {
    let size = 4u64 << 20;
    let pages: Vec<(u64, u8)> = (0..40).map(|p| (p, p as u8 + 1)).collect();
    let base = layer_file("block", size, &pages);
    let ram = GuestRam::new(size).unwrap();
    let uffd = register_ram(&ram).unwrap();
    let source = PageSource::new(MemoryLayers::single(base, size), regions_of(&ram)).unwrap();
    let mut server = UffdServer::start(uffd, Arc::new(source), false).unwrap();
    let m = ram.memory();
    let faults = || server.log().faults.load(Ordering::Relaxed);
    let read = |p: u64| -> u8 { m.read_obj(GuestAddress(p * PAGE)).unwrap() };
    // The data extent 0..40 in one copy.
    assert_eq!(read(3), 4);
    assert_eq!(faults(), 1);
    for p in [0u64, 10, 20, 39] {
        assert_eq!(read(p), p as u8 + 1, "served with page 3's run");
    }
    assert_eq!(faults(), 1);
    // The hole 40..256 (the rest of the aligned block) in one zero fill.
    assert_eq!(read(45), 0);
    assert_eq!(read(255), 0);
    assert_eq!(faults(), 2);
    // The next block: one fill for all of it.
    assert_eq!(read(700), 0);
    assert_eq!(faults(), 3);
    for p in [512u64, 600, 767] {
        assert_eq!(read(p), 0);
    }
    assert_eq!(faults(), 3);
    assert!(server.stop().is_none());
}
