//! Directory watchers (WatchDir, CreateWatcher…). (Being written.)

/// The polled watchers (CreateWatcher / GetWatcherEvents / RemoveWatcher).
#[derive(Default)]
pub struct Watchers {}
