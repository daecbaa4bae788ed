//! Working sets (REAP): the pages a restored guest touched on its first
//! run, stored beside the snapshot as sorted runs of pages, so a later
//! restore prefetches them from the snapshot's memory file in a few large
//! requests while the guest already runs.
//!
//! Recording: the first `working_set` restore of a snapshot serves every
//! page through the built-in userfaultfd handler, which logs each page the
//! guest (or a device) touches for the first time. Recording ends when the
//! VM stops, or `record_for` after the guest started if that was given;
//! then the file is written under a temporary name, synced, and renamed
//! into place.
//!
//! Loading (the set's runs are bounds-checked against the memory size
//! first) takes one of three ways, by where the data is now and the file's
//! version:
//! - the memory file's pages of the set are in the page cache (another VM
//!   of the snapshot ran, or a restore just did): RAM is the snapshot's
//!   layers mapped privately, as for a lazy restore, and a thread
//!   prefetches the runs into the mapping beside the guest
//!   ([`super::prefetch`]); the pages stay shared in the page cache, in
//!   huge pages where it holds them so, and the packed data is not read;
//! - otherwise, version 3: RAM is a fresh memfd served by the built-in
//!   userfaultfd handler, the guest starts at once, and a thread
//!   ([`BackgroundLoad`]) reads the packed data in one sequential pass,
//!   in the order the guest first touched it, verifies each chunk's CRC
//!   and copies its runs in with `UFFDIO_COPY` ahead of the guest. A page
//!   the guest reaches first is served by the handler from the snapshot
//!   (the same bytes); the copy then finds it there and moves on;
//! - otherwise, version 2 (one CRC over all the data, so nothing can be
//!   used before all of it is read): the packed data is read into a fresh
//!   memfd in one sequential pass, one iovec per run, its CRC verified,
//!   before the guest starts; the handler serves the rest.
//!
//! A file that is corrupt, truncated, for another memory size, names pages
//! outside guest memory or was recorded for another snapshot id (the
//! snapshot was re-created) is ignored with a warning and recorded anew. A
//! version-3 chunk that fails its CRC while the guest runs stops the
//! background load there (the handler serves the rest from the snapshot).
//!
//! Files: `format.rs` (the file's layout: header, runs, chunk CRCs),
//! `record.rs` (recording first touches and writing the file), `read.rs`
//! (opening and checking a file), `load.rs` (filling RAM from its packed
//! data: version 2 before the guest starts, version 3 beside it).

mod format;
mod load;
mod read;
mod record;
#[cfg(test)]
pub(crate) mod tests;

pub use format::{runs_of, touch_runs};
pub use load::BackgroundLoad;
pub use read::{load, open, Opened, Pending, WorkingSet, WsLoad};
pub use record::{write, Recorder};
