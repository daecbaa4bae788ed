//! Events kept beyond this node (`spore serve --cluster`): each accepted
//! event is also written where the other nodes find it (etcd, by
//! `crate::cluster`) before its 202, and forgotten there once it ran or was
//! dropped; a node that takes over a dead node's events adopts them into
//! its own queue.

use std::path::Path;

use super::{decode, lock, write_private, EventQueue, SUFFIX};

/// Where a cluster node keeps copies of its accepted events.
pub trait EventReplica: Send + Sync {
    /// Keeps the event file `name` (its bytes as on disk); blocking. An
    /// error refuses the event.
    fn keep(&self, name: &str, bytes: &[u8]) -> std::io::Result<()>;
    /// Forgets it (it ran or was dropped); never blocks, best effort (an
    /// event forgotten late runs once more at worst, after a takeover).
    fn forget(&self, name: &str);
}

impl EventQueue {
    /// Makes every event accepted from now on kept by `replica` too.
    pub fn set_replica(&self, replica: Box<dyn EventReplica>) {
        let _ = self.replica.set(replica);
    }

    pub(super) fn forget_replica(&self, file: &Path) {
        if let (Some(r), Some(name)) = (
            self.replica.get(),
            file.file_name().and_then(|n| n.to_str()),
        ) {
            r.forget(name);
        }
    }

    /// The file names of the events waiting here (a node's start compares
    /// them with its copies in etcd).
    pub fn waiting_names(&self) -> Vec<String> {
        lock(&self.inner)
            .waiting
            .values()
            .filter_map(|w| w.file.file_name()?.to_str().map(str::to_string))
            .collect()
    }

    /// Removes a waiting event that another node took over while this one
    /// was away (it runs there); true if it was here.
    pub fn disown(&self, name: &str) -> bool {
        let mut g = lock(&self.inner);
        let before = g.waiting.len();
        g.waiting
            .retain(|_, w| w.file.file_name().and_then(|n| n.to_str()) != Some(name));
        let removed = g.waiting.len() < before;
        drop(g);
        if removed && is_event_name(name) {
            let _ = std::fs::remove_file(self.dir.join(name));
        }
        removed
    }

    /// Whether an event file of this name is queued here (on disk).
    pub fn holds(&self, name: &str) -> bool {
        is_event_name(name) && self.dir.join(name).exists()
    }

    /// Queues an event another node accepted (taken over from a dead node,
    /// or this node's own from etcd when its disk lost it): written to disk
    /// under its name, due now. It stays in the replica under this node.
    pub fn adopt(&self, name: &str, bytes: &[u8]) -> Result<(), String> {
        if !is_event_name(name) {
            return Err(format!("{name:?} is no event file name"));
        }
        let (meta, _) = decode(bytes)?;
        let file = self.dir.join(name);
        if !file.exists() {
            write_private(&file, bytes).map_err(|e| e.to_string())?;
        } else {
            return Ok(());
        }
        self.enqueue(meta, file);
        Ok(())
    }
}

/// `<16 hex digits>-<safe id>.event`: what `keep` names files (checked, as
/// names come back from etcd).
fn is_event_name(name: &str) -> bool {
    name.strip_suffix(SUFFIX).is_some_and(|stem| {
        !stem.is_empty()
            && stem
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    })
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    #[derive(Default, Clone)]
    struct Recorder(Arc<Mutex<Vec<String>>>);

    impl EventReplica for Recorder {
        fn keep(&self, name: &str, _: &[u8]) -> std::io::Result<()> {
            self.0.lock().unwrap().push(format!("keep {name}"));
            Ok(())
        }
        fn forget(&self, name: &str) {
            self.0.lock().unwrap().push(format!("forget {name}"));
        }
    }

    #[tokio::test]
    async fn a_replica_keeps_each_event_until_it_ran_and_adopted_ones_run() {
        let dir = std::env::temp_dir().join(format!("spore-ev-replica-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (q, _) = EventQueue::open(&dir, super::super::EventsConfig::default()).unwrap();
        let rec = Recorder::default();
        q.set_replica(Box::new(rec.clone()));
        q.accept("f", None, "r1", b"{}").unwrap();
        let ev = q.next_due().await;
        let name = ev.file.file_name().unwrap().to_str().unwrap().to_string();
        assert!(q.holds(&name));
        let bytes = std::fs::read(&ev.file).unwrap();
        q.done(ev);
        assert_eq!(
            *rec.0.lock().unwrap(),
            [format!("keep {name}"), format!("forget {name}")]
        );
        // Another node's event, adopted: it runs here.
        let other = name.replace("r1", "r2");
        q.adopt(&other, &bytes).unwrap();
        assert_eq!(q.next_due().await.meta.request_id, "r1", "its bytes say r1");
        assert!(q.adopt("../x.event", &bytes).is_err());
        assert!(q.adopt("x.event", b"no newline").is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
