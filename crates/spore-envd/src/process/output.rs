//! A process's output, fanned out to whoever is watching it: the `Start`
//! stream and any `Connect` streams.
//!
//! Each subscriber has a small bounded queue. The reader waits for the
//! slowest live subscriber, so nobody's data is ever dropped or reordered,
//! and what envd buffers per subscriber stays bounded. A subscriber whose
//! stream went away is forgotten; with nobody left, output is read and
//! discarded so the child never blocks on a full pipe.

use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::mpsc;

use super::pty::PtyMaster;
use crate::connect::{Code, RpcError, RpcResult};
use crate::proto::process::process_event::{data_event, DataEvent, EndEvent};

/// The largest chunk read at once (one `DataEvent`).
pub const CHUNK_BYTES: usize = 32 << 10;
/// Events a subscriber may have queued before the reader waits for it.
const SUBSCRIBER_DEPTH: usize = 16;
/// Streams watching one process at once.
const MAX_SUBSCRIBERS: usize = 64;

/// One chunk of output, by where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    Stdout(Bytes),
    Stderr(Bytes),
    Pty(Bytes),
}

impl Output {
    pub fn to_proto(&self) -> DataEvent {
        let output = match self {
            Output::Stdout(b) => data_event::Output::Stdout(b.to_vec()),
            Output::Stderr(b) => data_event::Output::Stderr(b.to_vec()),
            Output::Pty(b) => data_event::Output::Pty(b.to_vec()),
        };
        DataEvent {
            output: Some(output),
        }
    }
}

/// What a subscriber receives: output, then the end (last).
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Data(Output),
    End(EndEvent),
}

/// What subscribing yields: the events from now on, or the end when the
/// process has already ended.
pub enum Subscription {
    Live(mpsc::Receiver<Event>),
    Ended(EndEvent),
}

struct Subscriber {
    id: u64,
    tx: mpsc::Sender<Event>,
}

#[derive(Default)]
struct Inner {
    subscribers: Vec<Subscriber>,
    next_id: u64,
    end: Option<EndEvent>,
}

/// The fan-out of one process's output.
#[derive(Default)]
pub struct Hub {
    inner: Mutex<Inner>,
}

impl Hub {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Starts receiving the events from now on.
    pub fn subscribe(&self) -> RpcResult<Subscription> {
        let mut inner = self.lock();
        if let Some(end) = &inner.end {
            return Ok(Subscription::Ended(end.clone()));
        }
        // Streams that left while the process was quiet are still listed.
        inner.subscribers.retain(|s| !s.tx.is_closed());
        if inner.subscribers.len() >= MAX_SUBSCRIBERS {
            return Err(RpcError::new(
                Code::ResourceExhausted,
                format!("at most {MAX_SUBSCRIBERS} streams may watch one process"),
            ));
        }
        let (tx, rx) = mpsc::channel(SUBSCRIBER_DEPTH);
        let id = inner.next_id;
        inner.next_id += 1;
        inner.subscribers.push(Subscriber { id, tx });
        Ok(Subscription::Live(rx))
    }

    /// Gives `output` to every subscriber, waiting while one's queue is full;
    /// those that went away are dropped.
    pub async fn publish(&self, output: Output) {
        let targets: Vec<(u64, mpsc::Sender<Event>)> = self
            .lock()
            .subscribers
            .iter()
            .map(|s| (s.id, s.tx.clone()))
            .collect();
        let mut gone = Vec::new();
        for (id, tx) in targets {
            if tx.send(Event::Data(output.clone())).await.is_err() {
                gone.push(id);
            }
        }
        if !gone.is_empty() {
            self.lock().subscribers.retain(|s| !gone.contains(&s.id));
        }
    }

    /// Ends every subscription with `end` (after all output was published);
    /// later subscribers get `end` at once.
    pub fn finish(&self, end: EndEvent) {
        let subscribers = {
            let mut inner = self.lock();
            inner.end = Some(end.clone());
            std::mem::take(&mut inner.subscribers)
        };
        for Subscriber { tx, .. } in subscribers {
            match tx.try_send(Event::End(end.clone())) {
                Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => {}
                // A slow stream gets its end when it has read the rest; the
                // process need not wait for it.
                Err(mpsc::error::TrySendError::Full(event)) => {
                    tokio::spawn(async move {
                        let _ = tx.send(event).await;
                    });
                }
            }
        }
    }
}

/// Which stream a pipe reader reads.
#[derive(Debug, Clone, Copy)]
pub enum Pipe {
    Stdout,
    Stderr,
}

/// Reads a pipe to its end, publishing each chunk.
pub async fn pump_pipe<R: AsyncRead + Unpin>(mut reader: R, pipe: Pipe, hub: Arc<Hub>) {
    let mut buf = vec![0u8; CHUNK_BYTES];
    loop {
        match reader.read(&mut buf).await {
            Ok(0) => return,
            Ok(n) => {
                let chunk = Bytes::copy_from_slice(&buf[..n]);
                let output = match pipe {
                    Pipe::Stdout => Output::Stdout(chunk),
                    Pipe::Stderr => Output::Stderr(chunk),
                };
                hub.publish(output).await;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

/// Reads a PTY's master until every holder of its slave has closed it.
pub async fn pump_pty(master: Arc<PtyMaster>, hub: Arc<Hub>) {
    let mut buf = vec![0u8; CHUNK_BYTES];
    loop {
        match master.read(&mut buf).await {
            Ok(0) => return,
            Ok(n) => {
                hub.publish(Output::Pty(Bytes::copy_from_slice(&buf[..n])))
                    .await
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            // EIO: the slave side is closed everywhere, the terminal's end.
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn live(sub: Subscription) -> mpsc::Receiver<Event> {
        match sub {
            Subscription::Live(rx) => rx,
            Subscription::Ended(_) => panic!("ended"),
        }
    }

    fn end(code: i32) -> EndEvent {
        EndEvent {
            exit_code: code,
            exited: true,
            status: format!("exit status {code}"),
            error: None,
        }
    }

    #[tokio::test]
    async fn a_slow_subscriber_gets_everything_in_order_and_slows_the_reader() {
        let hub = Arc::new(Hub::default());
        let mut fast = live(hub.subscribe().unwrap());
        let mut slow = live(hub.subscribe().unwrap());
        let n = 200u32;
        let producer = {
            let hub = hub.clone();
            tokio::spawn(async move {
                for i in 0..n {
                    hub.publish(Output::Stdout(Bytes::from(i.to_be_bytes().to_vec())))
                        .await;
                }
                hub.finish(end(0));
            })
        };
        let fast_reader = tokio::spawn(async move {
            let mut got = Vec::new();
            while let Some(event) = fast.recv().await {
                got.push(event);
            }
            got
        });
        // The slow one has not read: the producer must be waiting for it.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !producer.is_finished(),
            "the reader ran ahead of a slow subscriber"
        );
        let mut got = Vec::new();
        while let Some(event) = slow.recv().await {
            got.push(event);
            tokio::task::yield_now().await;
        }
        producer.await.unwrap();
        for events in [got, fast_reader.await.unwrap()] {
            assert_eq!(events.len(), usize::try_from(n).unwrap() + 1);
            for (i, event) in (0..n).zip(&events) {
                assert_eq!(
                    event,
                    &Event::Data(Output::Stdout(Bytes::from(i.to_be_bytes().to_vec())))
                );
            }
            assert_eq!(events.last(), Some(&Event::End(end(0))));
        }
    }

    #[tokio::test]
    async fn a_subscriber_that_left_is_dropped_and_output_keeps_flowing() {
        let hub = Hub::default();
        let gone = live(hub.subscribe().unwrap());
        drop(gone);
        // Nobody listens: publishing never blocks.
        for _ in 0..100 {
            hub.publish(Output::Stderr(Bytes::from_static(b"x"))).await;
        }
        assert!(hub.lock().subscribers.is_empty());
        let mut late = live(hub.subscribe().unwrap());
        hub.publish(Output::Pty(Bytes::from_static(b"y"))).await;
        hub.finish(end(3));
        assert_eq!(
            late.recv().await,
            Some(Event::Data(Output::Pty(Bytes::from_static(b"y"))))
        );
        assert_eq!(late.recv().await, Some(Event::End(end(3))));
        assert_eq!(late.recv().await, None);
        assert!(matches!(hub.subscribe().unwrap(), Subscription::Ended(e) if e == end(3)));
    }

    #[tokio::test]
    async fn subscribers_are_capped() {
        let hub = Hub::default();
        let kept: Vec<_> = (0..MAX_SUBSCRIBERS)
            .map(|_| hub.subscribe().unwrap())
            .collect();
        assert_eq!(
            hub.subscribe().err().map(|e| e.code),
            Some(Code::ResourceExhausted)
        );
        drop(kept);
        assert!(hub.subscribe().is_ok());
    }
}
