//! Working-set files made by hand and by `write`, read back, refused when
//! damaged, and loaded beside a running guest.
#![allow(
    clippy::cast_possible_truncation,
    reason = "test fixtures: byte patterns and addresses the test builds itself"
)]

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::Duration;

use vm_memory::{Bytes, GuestAddress};

use super::format::*;
use super::read::*;
use super::record::*;
use crate::memory::layers::MemoryLayers;
use crate::memory::GuestRam;
use crate::snapshot::restore::uffd::{regions_of, PageSource};

/// A version-1 file as spore wrote it before version 2: entries in
/// first-touch order, then the data pages.
pub(crate) fn v1_file(mem_size: u64, id: &str, entries: &[u64]) -> Vec<u8> {
    let h = Header {
        version: 1,
        mem_size,
        count: entries.len() as u64,
        id: id.into(),
    };
    let list: Vec<u8> = entries.iter().flat_map(|e| e.to_le_bytes()).collect();
    let mut b = encode_header(&h, 0, 0).to_vec();
    b.extend_from_slice(&list);
    let data = entries.iter().filter(|&&e| e & V1_ZERO_BIT == 0).count() as u64;
    b.resize((v1_data_offset(h.count) + data * PAGE) as usize, 7);
    b
}

/// A version-2 file as spore wrote it before version 3: sorted runs,
/// then their pages (`fill(page)` each), one CRC over the data.
pub(crate) fn v2_file(
    mem_size: u64,
    id: &str,
    runs: &[(u64, u64)],
    fill: impl Fn(u64) -> u8,
) -> Vec<u8> {
    let h = Header {
        version: 2,
        mem_size,
        count: runs.len() as u64,
        id: id.into(),
    };
    let list = encode_runs(runs);
    let data = packed(runs, fill);
    let mut c = crc32fast::Hasher::new();
    c.update(&encode_header(&h, 0, 0));
    c.update(&list);
    let mut b = encode_header(&h, c.finalize(), crc32fast::hash(&data)).to_vec();
    b.extend_from_slice(&list);
    b.resize(data_offset(list.len() as u64) as usize, 0);
    b.extend_from_slice(&data);
    b
}

/// The pages of `runs` in order, `fill(page)` each.
fn packed(runs: &[(u64, u64)], fill: impl Fn(u64) -> u8) -> Vec<u8> {
    let mut data = Vec::new();
    for &(s, n) in runs {
        for p in s..s + n {
            data.extend_from_slice(&[fill(p); PAGE as usize]);
        }
    }
    data
}

/// A version-3 file as [`write`] makes it: `runs` in this order, then
/// their pages (`fill(page)` each), a CRC per chunk.
pub(crate) fn v3_file(
    mem_size: u64,
    id: &str,
    runs: &[(u64, u64)],
    fill: impl Fn(u64) -> u8,
) -> Vec<u8> {
    let total: u64 = runs.iter().map(|r| r.1).sum();
    let h = Header {
        version: 3,
        mem_size,
        count: runs.len() as u64,
        id: id.into(),
    };
    let list = encode_runs(runs);
    let data = packed(runs, fill);
    let table: Vec<u8> = data
        .chunks((CHUNK_PAGES * PAGE) as usize)
        .flat_map(|c| crc32fast::hash(c).to_le_bytes())
        .collect();
    let mut c = crc32fast::Hasher::new();
    c.update(&encode_header(&h, 0, total as u32));
    c.update(&list);
    c.update(&table);
    let mut b = encode_header(&h, c.finalize(), total as u32).to_vec();
    b.extend_from_slice(&list);
    b.extend_from_slice(&table);
    b.resize(v3_data_offset(h.count, total) as usize, 0);
    b.extend_from_slice(&data);
    b
}

#[test]
fn a_hand_made_version_3_file_matches_what_write_makes() {
    let dir = std::env::temp_dir().join(format!("spore-ws3h-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let size = 8u64 << 20;
    let order: Vec<u64> = (0..300u64).map(|i| (i * 5) % 1500 + 1).collect();
    let mem = mem_file(&dir, size, &order);
    let source = source_of(&mem, size);
    let ws = dir.join("ws");
    write(&ws, "abc", &order, &source).unwrap();
    let runs = touch_runs(&order, size / PAGE);
    assert_eq!(
        std::fs::read(&ws).unwrap(),
        v3_file(size, "abc", &runs, |p| p as u8)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The pages of memory file `mem` as [`write`] reads them (the layers
/// only: the RAM that gave the layout is gone, so not for serving).
fn source_of(mem: &Path, size: u64) -> PageSource {
    let ram = GuestRam::new(size).unwrap();
    PageSource::new(
        MemoryLayers::single(File::open(mem).unwrap(), size),
        regions_of(&ram),
    )
    .unwrap()
}

/// A snapshot memory file of `size` with `pages` holding their number.
fn mem_file(dir: &Path, size: u64, pages: &[u64]) -> PathBuf {
    let mem = dir.join("mem");
    let f = File::create(&mem).unwrap();
    f.set_len(size).unwrap();
    for &p in pages {
        f.write_all_at(&[p as u8; 4096], p * PAGE).unwrap();
    }
    mem
}

#[test]
fn a_page_bitmap_finds_overlaps_and_sorted_runs() {
    let mut m = PageBitmap::new(300);
    for (s, n) in [(70u64, 60u64), (5, 1), (0, 3), (3, 2), (199, 101), (64, 6)] {
        assert!(m.mark(s, n), "{s}+{n}");
    }
    assert_eq!(m.runs(), vec![(0, 6), (64, 66), (199, 101)]);
    assert!(!m.mark(129, 1));
    assert!(!m.mark(150, 60));
    let mut full = PageBitmap::new(128);
    assert!(full.mark(0, 128));
    assert_eq!(full.runs(), vec![(0, 128)]);
}

#[test]
fn version_3_loads_beside_a_running_guest() {
    use crate::snapshot::restore::uffd::{register_ram, UffdServer};
    let dir = std::env::temp_dir().join(format!("spore-ws3-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let size = 8u64 << 20;
    // 600 data pages (more than two chunks), touched out of order.
    let touched: Vec<u64> = (0..600u64).map(|i| (i * 7) % 1800 + 10).collect();
    let mem = mem_file(&dir, size, &touched);
    let layers = || MemoryLayers::single(File::open(&mem).unwrap(), size);
    let ws = dir.join("ws");
    write(&ws, "abc", &touched, &source_of(&mem, size)).unwrap();

    for case in ["whole", "bad chunk", "bad list"] {
        let mut b = std::fs::read(&ws).unwrap();
        let data = b.len() - 600 * PAGE as usize;
        match case {
            // A data byte of the second chunk: the load stops there.
            "bad chunk" => b[data + 300 * PAGE as usize + 5] ^= 0x40,
            // A run's page count (past the sampled runs): the list
            // fails the header's CRC on the loading thread, nothing
            // is loaded, the handler serves every page.
            "bad list" => {
                b[data + 300 * PAGE as usize + 5] ^= 0x40;
                b[HEADER + 100 * 16 + 8] ^= 0x02;
            }
            _ => {}
        }
        std::fs::write(&ws, &b).unwrap();
        let corrupt = case != "whole";
        let Ok(Opened::Pending(set)) = open(&ws, "abc", size) else {
            panic!("a version-3 file opens pending");
        };
        assert_eq!(set.pages(), 600);
        assert_eq!(set.sample().len(), 64);
        let ram = GuestRam::new(size).unwrap();
        let uffd = register_ram(&ram).unwrap();
        let loader_uffd = uffd.try_clone().unwrap();
        let source = PageSource::new(layers(), regions_of(&ram)).unwrap();
        let mut server = UffdServer::start(uffd, Arc::new(source), false).unwrap();
        // The guest gets to two pages of the set before the load does.
        let m = ram.memory().clone();
        within(20, move || {
            assert_eq!(
                m.read_obj::<u8>(GuestAddress(1200 * PAGE)).unwrap(),
                1200u64 as u8
            );
            assert_eq!(m.read_obj::<u8>(GuestAddress(17 * PAGE)).unwrap(), 17);
        });
        let load = set.load_in_background(&ram, loader_uffd).unwrap();
        load.join();
        let faults_before = server.log().faults.load(Ordering::Relaxed);
        let m = ram.memory().clone();
        let touched2 = touched.clone();
        within(20, move || {
            for p in touched2.iter().chain(&[5, 1815, 2047]) {
                let v: u8 = m.read_obj(GuestAddress(p * PAGE)).unwrap();
                let want = if touched2.contains(p) { *p as u8 } else { 0 };
                assert_eq!(v, want, "page {p}");
            }
        });
        let faults = server.log().faults.load(Ordering::Relaxed) - faults_before;
        if corrupt {
            // Pages past the bad chunk's start came through the handler.
            assert!(faults > 0);
        } else {
            // The whole set was there: only the 3 pages outside it fault
            // (fewer when a handler's run already covered them).
            assert!(faults <= 3, "{faults} faults");
        }
        assert!(server.stop().is_none());
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Runs `f` on a thread and fails the test if it does not end in time.
fn within(secs: u64, f: impl FnOnce() + Send + 'static) {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    rx.recv_timeout(Duration::from_secs(secs))
        .expect("guest memory accesses hung or failed");
}

#[test]
fn round_trip_old_files_and_refusals() {
    let dir = std::env::temp_dir().join(format!("spore-ws-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let size = 8u64 << 20;
    let mem = mem_file(&dir, size, &[3, 4, 100, 1500]);
    let source = source_of(&mem, size);
    let ws = dir.join("ws");
    // First-touch order in and out; 100 twice is one page, a page past
    // the memory is dropped, 3 then 4 is one run.
    let (n, r) = write(&ws, "abc", &[100, 3, 4, 7, 1500, 100, 101, 5000], &source).unwrap();
    assert_eq!((n, r), (6, 5));
    let set = load(&ws, "abc", size).unwrap();
    assert_eq!(
        set.runs,
        vec![(100, 1), (3, 2), (7, 1), (1500, 1), (101, 1)]
    );
    assert_eq!(set.sorted_runs(), [(3, 2), (7, 1), (100, 2), (1500, 1)]);
    assert_eq!((set.pages(), set.version), (6, 3));
    // The runs and one chunk CRC, then each page's data from the snapshot.
    assert_eq!(std::fs::metadata(&ws).unwrap().len(), PAGE + 6 * PAGE);

    // Version 2 still loads, read in whole before the guest runs.
    let v2 = dir.join("v2");
    let runs2 = [(3u64, 2u64), (7, 1), (100, 2), (1500, 1)];
    let fill = |p: u64| if p == 7 || p == 101 { 0 } else { p as u8 };
    std::fs::write(&v2, v2_file(size, "abc", &runs2, fill)).unwrap();
    let set = load(&v2, "abc", size).unwrap();
    assert_eq!((&set.runs[..], set.version), (&runs2[..], 2));
    assert!(set.has_data());
    let ram = GuestRam::new(size).unwrap();
    set.read_into(&ram).unwrap();
    for p in [3u64, 4, 7, 100, 101, 1500] {
        let v: u8 = ram.memory().read_obj(GuestAddress(p * PAGE)).unwrap();
        assert_eq!(v, fill(p), "page {p}");
    }
    let resident = crate::memory::pages::data_ranges(ram.memfd(), size).unwrap();
    assert_eq!(resident.iter().map(|r| r.1 / PAGE).sum::<u64>(), 6);
    // Corrupt data: refused at read time, and nothing is left behind.
    let mut b = std::fs::read(&v2).unwrap();
    let n = b.len();
    b[n - 10] ^= 1;
    let flipped = dir.join("flipped");
    std::fs::write(&flipped, &b).unwrap();
    let set2 = load(&flipped, "abc", size).unwrap();
    let ram = GuestRam::new(size).unwrap();
    assert!(matches!(set2.read_into(&ram), Err(WsLoad::Ignored(w)) if w.contains("checksum")));
    assert!(crate::memory::pages::data_ranges(ram.memfd(), size)
        .unwrap()
        .is_empty());

    // A version-1 file still loads (its page list; data not read).
    let old = dir.join("old");
    std::fs::write(&old, v1_file(size, "abc", &[100, 3, 7 | V1_ZERO_BIT, 4])).unwrap();
    let set = load(&old, "abc", size).unwrap();
    assert_eq!(
        (&set.runs[..], set.version),
        (&[(3, 2), (7, 1), (100, 1)][..], 1)
    );
    assert!(!set.has_data());
    let mut cut = v1_file(size, "abc", &[100, 3]);
    cut.truncate(cut.len() - 100);
    std::fs::write(&old, &cut).unwrap();
    assert!(matches!(load(&old, "abc", size), Err(WsLoad::Ignored(w)) if w.contains("truncated")));
    std::fs::write(&old, v1_file(size, "abc", &[3, 2048 | V1_ZERO_BIT])).unwrap();
    assert!(
        matches!(load(&old, "abc", size), Err(WsLoad::Ignored(w)) if w.contains("outside guest memory"))
    );

    // Another snapshot's set, another memory size, a missing one, a
    // flipped byte, a truncated one, a future version.
    assert!(
        matches!(load(&ws, "other", size), Err(WsLoad::Ignored(w)) if w.contains("recorded for snapshot abc"))
    );
    assert!(
        matches!(load(&ws, "abc", size * 2), Err(WsLoad::Ignored(w)) if w.contains("bytes of memory"))
    );
    assert!(matches!(
        load(&dir.join("none"), "abc", size),
        Err(WsLoad::Absent)
    ));
    let bytes = std::fs::read(&ws).unwrap();
    let bad = dir.join("bad");
    let mut flipped = bytes.clone();
    flipped[HEADER + 3] ^= 1;
    std::fs::write(&bad, &flipped).unwrap();
    assert!(matches!(load(&bad, "abc", size), Err(WsLoad::Ignored(w)) if w.contains("checksum")));
    std::fs::write(&bad, &bytes[..bytes.len() - 4]).unwrap();
    assert!(matches!(load(&bad, "abc", size), Err(WsLoad::Ignored(w)) if w.contains("truncated")));
    let mut future = bytes.clone();
    future[8] = 4;
    std::fs::write(&bad, &future).unwrap();
    assert!(
        matches!(load(&bad, "abc", size), Err(WsLoad::Ignored(w)) if w.contains("unsupported version 4"))
    );
    // A flipped chunk CRC fails the header's CRC.
    let mut table = bytes.clone();
    table[HEADER + 5 * 16] ^= 1;
    std::fs::write(&bad, &table).unwrap();
    assert!(matches!(load(&bad, "abc", size), Err(WsLoad::Ignored(w)) if w.contains("checksum")));
    // Well-formed files (valid CRC) naming pages beyond guest memory,
    // or overflowing, or unsorted.
    // A file with a valid header CRC, of `version`, listing `runs`,
    // with zeroed data for them (3: and a zero chunk-CRC table).
    let signed = |version: u32, runs: &[(u64, u64)]| {
        let h = Header {
            version,
            mem_size: size,
            count: runs.len() as u64,
            id: "abc".into(),
        };
        let list = encode_runs(runs);
        let pages = runs.iter().fold(0u64, |a, r| a.saturating_add(r.1));
        let table = if version == 3 {
            vec![0u8; pages.min(size / PAGE).div_ceil(CHUNK_PAGES) as usize * 4]
        } else {
            Vec::new()
        };
        let word68 = if version == 3 {
            pages.min(u64::from(u32::MAX)) as u32
        } else {
            0
        };
        let mut c = crc32fast::Hasher::new();
        c.update(&encode_header(&h, 0, word68));
        c.update(&list);
        c.update(&table);
        let mut b = encode_header(&h, c.finalize(), word68).to_vec();
        b.extend_from_slice(&list);
        b.extend_from_slice(&table);
        b.resize(data_offset((list.len() + table.len()) as u64) as usize, 0);
        if pages < 4096 {
            b.resize(b.len() + (pages * PAGE) as usize, 0);
        }
        b
    };
    for version in [2, 3] {
        for runs in [
            vec![(2048u64, 1u64)],
            vec![(2040, 9)],
            vec![((1 << 62) + 5, 1)],
            vec![(5, u64::MAX)],
            vec![(3, 0)],
        ] {
            std::fs::write(&bad, signed(version, &runs)).unwrap();
            // Version 3 may already refuse its header's page total.
            assert!(
                matches!(load(&bad, "abc", size), Err(WsLoad::Ignored(w))
                    if w.contains("outside guest memory") || (version == 3 && w.contains("pages, for"))),
                "v{version} {runs:?}"
            );
        }
    }
    std::fs::write(&bad, signed(2, &[(10, 2), (11, 1)])).unwrap();
    assert!(matches!(load(&bad, "abc", size), Err(WsLoad::Ignored(w)) if w.contains("not sorted")));
    // Version 3 keeps first-touch order, but its runs must not overlap.
    std::fs::write(&bad, signed(3, &[(20, 1), (10, 2)])).unwrap();
    assert_eq!(
        load(&bad, "abc", size).unwrap().runs,
        vec![(20, 1), (10, 2)]
    );
    std::fs::write(&bad, signed(3, &[(10, 2), (11, 1)])).unwrap();
    assert!(matches!(load(&bad, "abc", size), Err(WsLoad::Ignored(w)) if w.contains("overlap")));
    std::fs::write(&bad, b"garbage").unwrap();
    assert!(matches!(load(&bad, "abc", size), Err(WsLoad::Ignored(_))));
    std::fs::remove_dir_all(&dir).unwrap();
}
