//! The host as the scenarios share it. They run as threads of one test
//! process, as many at once as libtest runs (one per core unless
//! `RUST_TEST_THREADS` or `--test-threads` says otherwise). A test that
//! needs the host to itself (it resizes the host's huge page pool, or it is
//! a benchmark run that loads every core) takes [`alone`]; every test that
//! boots VMs takes [`shared`] through [`require_kvm`](super::require_kvm),
//! so the two kinds never overlap.
//!
//! What a test took it holds until its thread ends (libtest runs each test
//! on a thread of its own): the guard lives in a thread-local, so a failing
//! test gives the host back too.

use std::cell::RefCell;
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

static HOST: RwLock<()> = RwLock::new(());

/// What the current test thread holds of [`HOST`].
enum Hold {
    Shared {
        _guard: RwLockReadGuard<'static, ()>,
    },
    Alone {
        _guard: RwLockWriteGuard<'static, ()>,
    },
}

thread_local! {
    static HELD: RefCell<Option<Hold>> = const { RefCell::new(None) };
}

/// Whether this is the process's main thread: with one test thread libtest
/// may run the tests there, one after another, and a guard held there would
/// outlive its test.
fn on_main_thread() -> bool {
    std::thread::current().name() == Some("main")
}

/// Shares the host with the other VM tests until this test ends: waits
/// while a test that needs it alone runs.
pub fn shared() {
    if on_main_thread() {
        return;
    }
    HELD.with(|held| {
        let mut held = held.borrow_mut();
        if held.is_none() {
            let guard = HOST.read().unwrap_or_else(PoisonError::into_inner);
            *held = Some(Hold::Shared { _guard: guard });
        }
    });
}

/// Has the host to this test alone until it ends: waits for every running
/// VM test to end, and keeps the others waiting.
pub fn alone() {
    if on_main_thread() {
        return;
    }
    HELD.with(|held| {
        let mut held = held.borrow_mut();
        if matches!(*held, Some(Hold::Alone { .. })) {
            return;
        }
        // A shared hold goes first: the write lock waits for every reader.
        *held = None;
        let guard = HOST.write().unwrap_or_else(PoisonError::into_inner);
        *held = Some(Hold::Alone { _guard: guard });
    });
}
