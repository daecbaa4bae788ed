//! The server streams, `Start` and `Connect`, and the life of a started
//! process: its output read until its end, then its `EndEvent`, then its
//! removal from the table.

use std::sync::Arc;
use std::time::Duration;

use hyper::HeaderMap;
use tokio::process::Child;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};

use super::exit;
use super::output::{self, Event, Hub, Pipe, Subscription};
use super::spawn::{self, Io, Spawned};
use super::table::{Found, Proc};
use crate::connect::{RpcError, RpcMessage, RpcResult, ServerStream};
use crate::proto::process::process_event::{self, EndEvent, KeepAlive, StartEvent};
use crate::proto::process::{
    ConnectRequest, ConnectResponse, ProcessEvent, StartRequest, StartResponse,
};
use crate::state::{Ctx, State};

/// Between two messages on an idle stream, unless the client asks otherwise.
const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(30);
/// Once a process told to stop has exited, how long its leftovers (children
/// that left its group) may keep its output open.
const STOP_GRACE: Duration = Duration::from_secs(1);

/// What a stream's request headers ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamOptions {
    /// `Keepalive-Ping-Interval` (seconds): how often an idle stream gets a
    /// `KeepAlive`.
    pub keepalive: Duration,
    /// `Connect-Timeout-Ms`: like E2B's envd, a started process is killed
    /// when its call's deadline passes (0 or none: never).
    pub timeout: Option<Duration>,
}

impl StreamOptions {
    pub fn of(headers: &HeaderMap) -> StreamOptions {
        let number =
            |name: &str| -> Option<u64> { headers.get(name)?.to_str().ok()?.trim().parse().ok() };
        let keepalive = number("keepalive-ping-interval")
            .map_or(DEFAULT_KEEPALIVE, |s| Duration::from_secs(s.clamp(1, 3600)));
        let timeout = number("connect-timeout-ms")
            .filter(|ms| *ms > 0)
            .map(Duration::from_millis);
        StreamOptions { keepalive, timeout }
    }
}

fn event(event: process_event::Event) -> ProcessEvent {
    ProcessEvent { event: Some(event) }
}

fn start_event(pid: u32) -> ProcessEvent {
    event(process_event::Event::Start(StartEvent { pid }))
}

fn end_event(end: EndEvent) -> ProcessEvent {
    event(process_event::Event::End(end))
}

/// `Start`: runs the process and streams its events until it ends. The
/// process outlives the stream if the client leaves.
pub async fn start(
    ctx: Ctx,
    req: StartRequest,
    stream: ServerStream<StartResponse>,
    options: StreamOptions,
) -> RpcResult<()> {
    let state = ctx.state.clone();
    let slot = state.processes.reserve()?;
    // Subscribed before the child exists: none of its output can be missed.
    let hub = Arc::new(Hub::default());
    let Subscription::Live(events) = hub.subscribe()? else {
        return Err(RpcError::internal("a new process's output already ended"));
    };
    let Spawned { child, pid, io } = spawn::spawn(&state, &ctx.user, &req).await?;
    let config = req.process.unwrap_or_default();
    let (proc, readers) = match io {
        Io::Pipes {
            stdout,
            stderr,
            stdin,
        } => {
            let proc = Proc::new(pid, req.tag, config, hub.clone(), stdin, None);
            let readers = vec![
                tokio::spawn(output::pump_pipe(stdout, Pipe::Stdout, hub.clone())),
                tokio::spawn(output::pump_pipe(stderr, Pipe::Stderr, hub)),
            ];
            (proc, readers)
        }
        Io::Pty(master) => {
            let master = Arc::new(master);
            let proc = Proc::new(
                pid,
                req.tag,
                config,
                hub.clone(),
                None,
                Some(master.clone()),
            );
            (proc, vec![tokio::spawn(output::pump_pty(master, hub))])
        }
    };
    let proc = Arc::new(proc);
    state.processes.insert(slot, proc.clone());
    tokio::spawn(supervise(
        state.clone(),
        proc,
        child,
        readers,
        options.timeout,
    ));

    let wrap = |e| StartResponse { event: Some(e) };
    if stream.send(&wrap(start_event(pid))).await.is_err() {
        return Ok(());
    }
    forward(&stream, events, options.keepalive, wrap).await
}

/// `Connect`: the events of a running process from now on (or, for one that
/// ended moments ago, how it ended).
pub async fn connect(
    state: Arc<State>,
    req: ConnectRequest,
    stream: ServerStream<ConnectResponse>,
    options: StreamOptions,
) -> RpcResult<()> {
    let (pid, subscription) = match state.processes.find_for_connect(req.process.as_ref())? {
        Found::Live(proc) => (proc.pid, proc.hub.subscribe()?),
        Found::Ended { pid, end } => (pid, Subscription::Ended(end)),
    };
    let wrap = |e| ConnectResponse { event: Some(e) };
    if stream.send(&wrap(start_event(pid))).await.is_err() {
        return Ok(());
    }
    match subscription {
        Subscription::Live(events) => forward(&stream, events, options.keepalive, wrap).await,
        Subscription::Ended(end) => {
            let _ = stream.send(&wrap(end_event(end))).await;
            Ok(())
        }
    }
}

/// Passes a subscription's events to a stream, with a `KeepAlive` whenever
/// it has been quiet for `keepalive`, until the end or until the client
/// leaves (the subscription then lapses).
async fn forward<M: RpcMessage>(
    stream: &ServerStream<M>,
    mut events: mpsc::Receiver<Event>,
    keepalive: Duration,
    wrap: fn(ProcessEvent) -> M,
) -> RpcResult<()> {
    let mut ticker = tokio::time::interval_at(Instant::now() + keepalive, keepalive);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        let next = tokio::select! {
            next = events.recv() => next,
            _ = ticker.tick() => {
                let ping = event(process_event::Event::Keepalive(KeepAlive {}));
                if stream.send(&wrap(ping)).await.is_err() {
                    return Ok(());
                }
                continue;
            }
            () = stream.closed() => return Ok(()),
        };
        let message = match next {
            Some(Event::Data(output)) => event(process_event::Event::Data(output.to_proto())),
            Some(Event::End(end)) => {
                let _ = stream.send(&wrap(end_event(end))).await;
                return Ok(());
            }
            None => {
                return Err(RpcError::internal(
                    "the process's events stopped before its end",
                ))
            }
        };
        if stream.send(&wrap(message)).await.is_err() {
            return Ok(());
        }
        ticker.reset();
    }
}

/// Waits for the process (reaping it), then for its output to be read and
/// delivered, then ends its subscriptions and unlists it.
async fn supervise(
    state: Arc<State>,
    proc: Arc<Proc>,
    mut child: Child,
    readers: Vec<JoinHandle<()>>,
    timeout: Option<Duration>,
) {
    let timer = timeout.map(|after| {
        let proc = Arc::downgrade(&proc);
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            if let Some(proc) = proc.upgrade() {
                let _ = proc.signal(libc::SIGKILL);
            }
        })
    });
    let status = child.wait().await;
    drain(&proc, readers).await;
    if let Some(timer) = timer {
        timer.abort();
    }
    let end = match status {
        Ok(status) => exit::end_event(status),
        Err(e) => exit::failed(&e),
    };
    // Unlisted first: a client told of the end no longer finds it running.
    state.processes.remove(&proc, end.clone());
    proc.hub.finish(end);
}

/// Waits until the process's output is all read: its stdio closes once it
/// and whatever it started and left running have exited. A process told to
/// stop gets `STOP_GRACE` for that, then what is left unread is abandoned.
async fn drain(proc: &Proc, readers: Vec<JoinHandle<()>>) {
    let aborts: Vec<_> = readers.iter().map(JoinHandle::abort_handle).collect();
    let mut all = std::pin::pin!(futures_util::future::join_all(readers));
    tokio::select! {
        _ = &mut all => return,
        () = async {
            proc.stop_requested().await;
            tokio::time::sleep(STOP_GRACE).await;
        } => {}
    }
    for abort in aborts {
        abort.abort();
    }
    all.await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_options_come_from_the_headers() {
        let mut headers = HeaderMap::new();
        assert_eq!(
            StreamOptions::of(&headers),
            StreamOptions {
                keepalive: DEFAULT_KEEPALIVE,
                timeout: None
            }
        );
        headers.insert("keepalive-ping-interval", "50".parse().unwrap());
        headers.insert("connect-timeout-ms", "60000".parse().unwrap());
        let options = StreamOptions::of(&headers);
        assert_eq!(options.keepalive, Duration::from_secs(50));
        assert_eq!(options.timeout, Some(Duration::from_secs(60)));
        headers.insert("keepalive-ping-interval", "0".parse().unwrap());
        headers.insert("connect-timeout-ms", "0".parse().unwrap());
        assert_eq!(
            StreamOptions::of(&headers),
            StreamOptions {
                keepalive: Duration::from_secs(1),
                timeout: None
            }
        );
        headers.insert("keepalive-ping-interval", "soon".parse().unwrap());
        assert_eq!(StreamOptions::of(&headers).keepalive, DEFAULT_KEEPALIVE);
    }
}
