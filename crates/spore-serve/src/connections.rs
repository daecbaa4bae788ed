//! The Lambda API's open connections, as the connection cap sees them
//! (served by `crate::server`, counted in `/metrics`): whether each is
//! busy or idle since when, and a way to ask one to close.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::mutex::lock;

/// One open connection, as the cap sees it.
pub(crate) struct Conn {
    /// Requests being served now.
    pub(crate) in_flight: AtomicUsize,
    /// When the last request ended (or the connection was accepted).
    idle_since: Mutex<Instant>,
    /// Asks the connection to close once its current request is done.
    pub(crate) close: tokio::sync::Notify,
}

impl Conn {
    pub(crate) fn idle_for(&self) -> Option<Duration> {
        (self.in_flight.load(Ordering::Acquire) == 0).then(|| lock(&self.idle_since).elapsed())
    }
}

/// Ends a request's time as in flight, whatever way it ends.
pub(crate) struct InFlight(pub(crate) Arc<Conn>);

impl Drop for InFlight {
    fn drop(&mut self) {
        *lock(&self.0.idle_since) = Instant::now();
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The open connections.
#[derive(Default)]
pub struct Connections {
    open: Mutex<HashMap<u64, Arc<Conn>>>,
    next_id: AtomicU64,
    refused: AtomicU64,
    evicted: AtomicU64,
}

impl Connections {
    /// Registers a new connection, closing the longest idle one when the
    /// cap is reached; `None` (refuse it) when every open one is busy.
    pub(crate) fn admit(&self, cap: usize) -> Option<(u64, Arc<Conn>)> {
        let mut open = lock(&self.open);
        if open.len() >= cap {
            let oldest = open
                .iter()
                .filter_map(|(id, c)| c.idle_for().map(|d| (d, *id)))
                .max();
            let Some((_, id)) = oldest else {
                self.refused.fetch_add(1, Ordering::Relaxed);
                return None;
            };
            if let Some(c) = open.remove(&id) {
                c.close.notify_one();
                self.evicted.fetch_add(1, Ordering::Relaxed);
            }
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn {
            in_flight: AtomicUsize::new(0),
            idle_since: Mutex::new(Instant::now()),
            close: tokio::sync::Notify::new(),
        });
        open.insert(id, conn.clone());
        Some((id, conn))
    }

    pub(crate) fn remove(&self, id: u64) {
        lock(&self.open).remove(&id);
    }

    /// (open, refused so far, closed to make room so far).
    pub fn counts(&self) -> (usize, u64, u64) {
        (
            lock(&self.open).len(),
            self.refused.load(Ordering::Relaxed),
            self.evicted.load(Ordering::Relaxed),
        )
    }
}
