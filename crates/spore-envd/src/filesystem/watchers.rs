//! The polled watchers (CreateWatcher / GetWatcherEvents / RemoveWatcher):
//! each one's buffered events, by id. The watching itself is [`super::watch`].

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::task::JoinHandle;

use crate::connect::{RpcError, RpcResult};
use crate::proto::filesystem::FilesystemEvent;

/// What a polled watcher collected since it was last read.
#[derive(Default)]
pub struct Buffer {
    pub events: VecDeque<FilesystemEvent>,
    /// Whether dropping events has been logged (once per watcher).
    pub overflow_logged: bool,
    /// Why the watch stopped, reported on every later read.
    pub error: Option<RpcError>,
}

pub struct PolledWatcher {
    pub buffer: Arc<Mutex<Buffer>>,
    pub task: JoinHandle<()>,
}

impl Drop for PolledWatcher {
    fn drop(&mut self) {
        // Ends the task, which drops the inotify instance and its watches.
        self.task.abort();
    }
}

/// The polled watchers, by id.
#[derive(Default)]
pub struct Watchers {
    pub by_id: Mutex<HashMap<String, PolledWatcher>>,
}

pub fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Watchers {
    pub fn buffer(&self, id: &str) -> RpcResult<Arc<Mutex<Buffer>>> {
        locked(&self.by_id)
            .get(id)
            .map(|w| w.buffer.clone())
            .ok_or_else(|| RpcError::not_found(format!("watcher with id {id} not found")))
    }
}
