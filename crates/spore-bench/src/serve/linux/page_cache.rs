//! How a cold start's page cache is dropped: `echo 1 >
//! /proc/sys/vm/drop_caches` (root), else `POSIX_FADV_DONTNEED` on the
//! files a start reads.

use std::cell::RefCell;
use std::path::{Path, PathBuf};

/// Drops the page cache before a cold start.
pub(super) struct Dropper {
    how: String,
    /// Files and directories (walked) whose cached pages a fadvise drop
    /// evicts.
    files: Vec<PathBuf>,
    /// What went differently than asked (reported in the JSON).
    notes: RefCell<Vec<String>>,
}

impl Dropper {
    /// Drops the page cache `how` (`drop-caches` or `fadvise`); `files`
    /// are what a fadvise drop evicts.
    pub(super) fn new(how: String, files: Vec<PathBuf>) -> Self {
        Dropper {
            how,
            files,
            notes: RefCell::new(Vec::new()),
        }
    }

    /// What went differently than asked.
    pub(super) fn notes(&self) -> Vec<String> {
        self.notes.borrow().clone()
    }

    pub(super) fn drop_cache(&self) {
        // SAFETY: sync(2) takes no arguments; dirty pages cannot be dropped.
        unsafe { libc::sync() };
        if self.how == "drop-caches" {
            match std::fs::write("/proc/sys/vm/drop_caches", b"1") {
                Ok(()) => return,
                Err(e) => {
                    let note = format!(
                        "echo 1 > /proc/sys/vm/drop_caches failed ({e}); dropped with fadvise instead"
                    );
                    let mut notes = self.notes.borrow_mut();
                    if !notes.contains(&note) {
                        eprintln!("bench serve --linux: {note}");
                        notes.push(note);
                    }
                }
            }
        }
        for p in &self.files {
            fadvise_tree(p);
        }
    }
}

/// POSIX_FADV_DONTNEED on every regular file at or under `p`.
fn fadvise_tree(p: &Path) {
    let Ok(meta) = std::fs::symlink_metadata(p) else {
        return;
    };
    if meta.is_dir() {
        for e in std::fs::read_dir(p).into_iter().flatten().flatten() {
            fadvise_tree(&e.path());
        }
    } else if meta.is_file() {
        if let Ok(f) = std::fs::File::open(p) {
            use std::os::fd::AsRawFd;
            // SAFETY: advice on a file descriptor we own, whole file.
            unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        }
    }
}
