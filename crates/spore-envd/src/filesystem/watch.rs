//! Directory watchers on inotify: WatchDir (a server stream of events) and
//! the polled watchers (CreateWatcher, then GetWatcherEvents to drain what
//! happened since, RemoveWatcher to stop) that the e2b SDK's `watch_dir` uses.
//!
//! Events are E2B's: the name relative to the watched directory (`.` for the
//! directory itself), one of CREATE (created or moved in), WRITE, REMOVE,
//! RENAME (moved away) and CHMOD. A recursive watch follows directories made
//! or moved in later; what a new directory already holds when its watch is
//! added is reported as created (it was, after the watch started). Uploads'
//! temporary files (see [`super::atomic`]) are left out.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use hyper::body::Incoming;
use hyper::{Request, Response};
use inotify::{EventMask, EventOwned, EventStream, Inotify, WatchDescriptor, WatchMask, Watches};
use tokio::time::Instant;

use crate::connect::{self, Body, Code, RpcError, RpcResult, ServerStream};
use crate::filesystem::atomic::TEMP_PREFIX;
use crate::filesystem::entry;
use crate::filesystem::paths::{io_text, resolve};
use crate::filesystem::watchers::{locked, Buffer, PolledWatcher};
use crate::proto::filesystem::watch_dir_response::{Event, KeepAlive, StartEvent};
use crate::proto::filesystem::{
    CreateWatcherRequest, CreateWatcherResponse, EventType, FilesystemEvent,
    GetWatcherEventsRequest, GetWatcherEventsResponse, RemoveWatcherRequest, RemoveWatcherResponse,
    WatchDirRequest, WatchDirResponse,
};
use crate::state::Ctx;

/// The polled watchers envd keeps at most (each holds an inotify instance).
const MAX_WATCHERS: usize = 256;
/// Unread events a polled watcher keeps; older ones are dropped beyond this.
const MAX_BUFFERED_EVENTS: usize = 10_000;
/// How long a WatchDir stream may stay silent before a KeepAlive, unless the
/// client's `Keepalive-Ping-Interval` header (seconds) says otherwise.
const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(30);

/// What inotify reports, as fsnotify (E2B's watcher library) asks for it.
fn watch_mask() -> WatchMask {
    WatchMask::CREATE
        | WatchMask::MOVED_TO
        | WatchMask::MOVED_FROM
        | WatchMask::DELETE
        | WatchMask::DELETE_SELF
        | WatchMask::MOVE_SELF
        | WatchMask::MODIFY
        | WatchMask::ATTRIB
        | WatchMask::ONLYDIR
}

/// The event types of one inotify event, in fsnotify's order.
fn event_types(mask: EventMask) -> Vec<EventType> {
    let mut types = Vec::new();
    if mask.intersects(EventMask::CREATE | EventMask::MOVED_TO) {
        types.push(EventType::Create);
    }
    if mask.intersects(EventMask::MOVED_FROM | EventMask::MOVE_SELF) {
        types.push(EventType::Rename);
    }
    if mask.contains(EventMask::ATTRIB) {
        types.push(EventType::Chmod);
    }
    if mask.contains(EventMask::MODIFY) {
        types.push(EventType::Write);
    }
    if mask.intersects(EventMask::DELETE | EventMask::DELETE_SELF) {
        types.push(EventType::Remove);
    }
    types
}

/// The watches added for a directory tree, and what it held (relative paths).
struct Added {
    dirs: Vec<(WatchDescriptor, PathBuf)>,
    found: Vec<PathBuf>,
}

/// Watches `root/rel` and, if `recursive`, every directory under it (not
/// through symlinks). Only failing to watch `root/rel` itself is an error.
fn add_tree(
    mut watches: Watches,
    root: &Path,
    rel: &Path,
    recursive: bool,
) -> std::io::Result<Added> {
    let mut added = Added {
        dirs: Vec::new(),
        found: Vec::new(),
    };
    let mut pending = vec![rel.to_path_buf()];
    while let Some(dir_rel) = pending.pop() {
        let abs = root.join(&dir_rel);
        let top = dir_rel == rel;
        // The watched directory may be reached through a symlink; nothing below it.
        let mask = if top && rel.as_os_str().is_empty() {
            watch_mask()
        } else {
            watch_mask() | WatchMask::DONT_FOLLOW
        };
        match watches.add(&abs, mask) {
            Ok(wd) => added.dirs.push((wd, dir_rel.clone())),
            Err(e) if top => return Err(e),
            Err(e) => {
                if e.raw_os_error() == Some(libc::ENOSPC) {
                    eprintln!(
                        "spore-envd: not watching {}: inotify watch limit reached",
                        abs.display()
                    );
                }
                continue;
            }
        }
        if !recursive {
            continue;
        }
        let Ok(read) = std::fs::read_dir(&abs) else {
            continue;
        };
        for child in read.flatten() {
            let name = child.file_name();
            if name.to_string_lossy().starts_with(TEMP_PREFIX) {
                continue;
            }
            let child_rel = dir_rel.join(&name);
            if child.file_type().is_ok_and(|t| t.is_dir()) {
                pending.push(child_rel.clone());
            }
            added.found.push(child_rel);
        }
    }
    Ok(added)
}

/// One inotify instance watching a directory (and, if recursive, its tree).
struct DirWatch {
    events: EventStream<Vec<u8>>,
    watches: Watches,
    /// Each watch's directory, relative to `root` (empty for the root).
    dirs: HashMap<WatchDescriptor, PathBuf>,
    root: PathBuf,
    recursive: bool,
    include_entry: bool,
}

impl DirWatch {
    async fn open(root: PathBuf, recursive: bool, include_entry: bool) -> RpcResult<DirWatch> {
        match tokio::fs::metadata(&root).await {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(RpcError::invalid_argument(format!(
                    "path {} not a directory",
                    root.display()
                )))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(RpcError::not_found(format!(
                    "path {} not found: stat {}: {}",
                    root.display(),
                    root.display(),
                    io_text(&e)
                )))
            }
            Err(e) => {
                return Err(super::fs_error(
                    &format!("error statting path {}", root.display()),
                    &e,
                ))
            }
        }
        let inotify = Inotify::init().map_err(|e| match e.raw_os_error() {
            Some(libc::EMFILE | libc::ENFILE) => RpcError::new(
                Code::ResourceExhausted,
                format!("too many inotify instances: {}", io_text(&e)),
            ),
            _ => RpcError::internal(format!("error creating watcher: {}", io_text(&e))),
        })?;
        let events = inotify
            .into_event_stream(vec![0u8; 16 << 10])
            .map_err(|e| RpcError::internal(format!("error creating watcher: {}", io_text(&e))))?;
        let mut watch = DirWatch {
            watches: events.watches(),
            events,
            dirs: HashMap::new(),
            root,
            recursive,
            include_entry,
        };
        let (watches, root) = (watch.watches.clone(), watch.root.clone());
        let added =
            tokio::task::spawn_blocking(move || add_tree(watches, &root, Path::new(""), recursive))
                .await
                .map_err(|e| RpcError::internal(format!("watcher task failed: {e}")))?
                .map_err(|e| {
                    let what = format!("error adding path {} to watcher", watch.root.display());
                    match e.raw_os_error() {
                        Some(libc::ENOSPC) => RpcError::new(
                            Code::ResourceExhausted,
                            format!("{what}: inotify watch limit reached"),
                        ),
                        _ => super::fs_error(&what, &e),
                    }
                })?;
        watch.dirs.extend(added.dirs);
        Ok(watch)
    }

    /// The next inotify event (cancel-safe: nothing is lost if dropped).
    async fn next_raw(&mut self) -> RpcResult<EventOwned> {
        match self.events.next().await {
            Some(Ok(event)) => Ok(event),
            Some(Err(e)) => Err(RpcError::internal(format!(
                "watcher error: {}",
                io_text(&e)
            ))),
            None => Err(RpcError::internal("watcher event stream closed")),
        }
    }

    /// What an inotify event means to the client (often nothing), keeping a
    /// recursive watch's directories in step.
    async fn process(&mut self, event: EventOwned) -> Vec<FilesystemEvent> {
        let mask = event.mask;
        if mask.contains(EventMask::Q_OVERFLOW) {
            eprintln!(
                "spore-envd: watcher on {}: the kernel's queue overflowed, events lost",
                self.root.display()
            );
            return Vec::new();
        }
        if mask.contains(EventMask::IGNORED) {
            self.dirs.remove(&event.wd);
            return Vec::new();
        }
        let Some(dir) = self.dirs.get(&event.wd) else {
            return Vec::new();
        };
        let rel = match &event.name {
            Some(name) if name.to_string_lossy().starts_with(TEMP_PREFIX) => return Vec::new(),
            Some(name) => dir.join(name),
            // The watched directory itself.
            None if dir.as_os_str().is_empty() => PathBuf::from("."),
            // A subdirectory itself: its parent reports it, by name.
            None => return Vec::new(),
        };
        let mut found = Vec::new();
        if self.recursive && mask.contains(EventMask::ISDIR) && event.name.is_some() {
            if mask.intersects(EventMask::CREATE | EventMask::MOVED_TO) {
                found = self.add_subtree(&rel).await;
                // A directory moved in held what it holds before the watch.
                if !mask.contains(EventMask::CREATE) {
                    found.clear();
                }
            } else if mask.contains(EventMask::MOVED_FROM) {
                self.forget_subtree(&rel);
            }
        }
        let mut out: Vec<FilesystemEvent> = event_types(mask)
            .into_iter()
            .map(|t| FilesystemEvent {
                name: rel.to_string_lossy().into_owned(),
                r#type: t.into(),
                entry: None,
            })
            .collect();
        out.extend(found.into_iter().map(|p| FilesystemEvent {
            name: p.to_string_lossy().into_owned(),
            r#type: EventType::Create.into(),
            entry: None,
        }));
        if self.include_entry {
            out = self.with_entries(out).await;
        }
        out
    }

    /// Watches a directory that appeared in the tree; what it already holds.
    async fn add_subtree(&mut self, rel: &Path) -> Vec<PathBuf> {
        let (watches, root, rel_owned) =
            (self.watches.clone(), self.root.clone(), rel.to_path_buf());
        match tokio::task::spawn_blocking(move || add_tree(watches, &root, &rel_owned, true)).await
        {
            Ok(Ok(added)) => {
                self.dirs.extend(added.dirs);
                added.found
            }
            // Gone already, or not ours to read: nothing to follow.
            Ok(Err(_)) | Err(_) => Vec::new(),
        }
    }

    /// Stops watching a directory moved out of (or within) the tree.
    fn forget_subtree(&mut self, rel: &Path) {
        let gone: Vec<WatchDescriptor> = self
            .dirs
            .iter()
            .filter(|(_, dir)| dir.starts_with(rel))
            .map(|(wd, _)| wd.clone())
            .collect();
        for wd in gone {
            self.dirs.remove(&wd);
            let _ = self.watches.remove(wd);
        }
    }

    /// Adds the entry of what was created, written or changed (newer SDKs ask).
    async fn with_entries(&self, mut events: Vec<FilesystemEvent>) -> Vec<FilesystemEvent> {
        let root = self.root.clone();
        let work = move || {
            let mut names = entry::Names::default();
            for event in &mut events {
                let carries = [EventType::Create, EventType::Write, EventType::Chmod]
                    .iter()
                    .any(|t| event.r#type == i32::from(*t));
                if carries {
                    event.entry = entry::entry_info(&root.join(&event.name), &mut names).ok();
                }
            }
            events
        };
        tokio::task::spawn_blocking(work).await.unwrap_or_default()
    }
}

/// The `Keepalive-Ping-Interval` a client asked for (seconds), within reason.
fn keepalive_interval(req: &Request<Incoming>) -> Duration {
    req.headers()
        .get("keepalive-ping-interval")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|s| (1..=3600).contains(s))
        .map_or(DEFAULT_KEEPALIVE, Duration::from_secs)
}

/// WatchDir: a StartEvent once the watch is in place, then the events as
/// they come, a KeepAlive after a quiet interval; the watch ends with the
/// client's stream.
pub async fn watch_dir(ctx: Ctx, req: Request<Incoming>) -> Response<Body> {
    let interval = keepalive_interval(&req);
    connect::server_streaming(req, move |m: WatchDirRequest, stream| async move {
        let path = resolve(&ctx, &m.path)?;
        let watch = DirWatch::open(path, m.recursive, m.include_entry).await?;
        stream_events(watch, &stream, interval).await;
        Ok(())
    })
    .await
}

fn message(event: Event) -> WatchDirResponse {
    WatchDirResponse { event: Some(event) }
}

async fn stream_events(
    mut watch: DirWatch,
    stream: &ServerStream<WatchDirResponse>,
    interval: Duration,
) {
    if stream
        .send(&message(Event::Start(StartEvent {})))
        .await
        .is_err()
    {
        return;
    }
    let mut deadline = Instant::now() + interval;
    loop {
        tokio::select! {
            () = stream.closed() => return,
            () = tokio::time::sleep_until(deadline) => {
                if stream.send(&message(Event::Keepalive(KeepAlive {}))).await.is_err() {
                    return;
                }
                deadline = Instant::now() + interval;
            }
            raw = watch.next_raw() => {
                let Ok(raw) = raw else {
                    // The watch broke (the kernel's error is in the message); the
                    // client sees the stream end and may watch again.
                    return;
                };
                for event in watch.process(raw).await {
                    if stream.send(&message(Event::Filesystem(event))).await.is_err() {
                        return;
                    }
                    deadline = Instant::now() + interval;
                }
            }
        }
    }
}

async fn collect(mut watch: DirWatch, id: String, buffer: Arc<Mutex<Buffer>>) {
    loop {
        let raw = match watch.next_raw().await {
            Ok(raw) => raw,
            Err(e) => {
                locked(&buffer).error = Some(e);
                return;
            }
        };
        let events = watch.process(raw).await;
        if events.is_empty() {
            continue;
        }
        let mut buffer = locked(&buffer);
        buffer.events.extend(events);
        let excess = buffer.events.len().saturating_sub(MAX_BUFFERED_EVENTS);
        if excess > 0 {
            buffer.events.drain(..excess);
            if !buffer.overflow_logged {
                buffer.overflow_logged = true;
                eprintln!(
                    "spore-envd: watcher {id}: over {MAX_BUFFERED_EVENTS} unread events, dropping the oldest"
                );
            }
        }
    }
}

pub async fn create_watcher(
    ctx: &Ctx,
    req: CreateWatcherRequest,
) -> RpcResult<CreateWatcherResponse> {
    let path = resolve(ctx, &req.path)?;
    let watchers = &ctx.state.watchers;
    let full = || {
        RpcError::new(
            Code::ResourceExhausted,
            format!("too many watchers (at most {MAX_WATCHERS}); remove some"),
        )
    };
    if locked(&watchers.by_id).len() >= MAX_WATCHERS {
        return Err(full());
    }
    let watch = DirWatch::open(path, req.recursive, req.include_entry).await?;
    let mut by_id = locked(&watchers.by_id);
    if by_id.len() >= MAX_WATCHERS {
        return Err(full());
    }
    let id = loop {
        let id = format!("w{:016x}", super::atomic::random());
        if !by_id.contains_key(&id) {
            break id;
        }
    };
    let buffer = Arc::new(Mutex::new(Buffer::default()));
    let task = tokio::spawn(collect(watch, id.clone(), buffer.clone()));
    by_id.insert(id.clone(), PolledWatcher { buffer, task });
    Ok(CreateWatcherResponse { watcher_id: id })
}

pub async fn get_watcher_events(
    ctx: &Ctx,
    req: GetWatcherEventsRequest,
) -> RpcResult<GetWatcherEventsResponse> {
    let buffer = ctx.state.watchers.buffer(&req.watcher_id)?;
    let mut buffer = locked(&buffer);
    if let Some(e) = &buffer.error {
        return Err(e.clone());
    }
    Ok(GetWatcherEventsResponse {
        events: buffer.events.drain(..).collect(),
    })
}

pub async fn remove_watcher(
    ctx: &Ctx,
    req: RemoveWatcherRequest,
) -> RpcResult<RemoveWatcherResponse> {
    let removed = locked(&ctx.state.watchers.by_id).remove(&req.watcher_id);
    match removed {
        Some(watcher) => {
            drop(watcher);
            Ok(RemoveWatcherResponse {})
        }
        None => Err(RpcError::not_found(format!(
            "watcher with id {} not found",
            req.watcher_id
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn next_events(watch: &mut DirWatch) -> Vec<(String, EventType)> {
        let mut out = Vec::new();
        // Gather what arrives within a short quiet period.
        loop {
            match tokio::time::timeout(Duration::from_millis(300), watch.next_raw()).await {
                Ok(raw) => {
                    for e in watch.process(raw.unwrap()).await {
                        out.push((e.name, EventType::try_from(e.r#type).unwrap()));
                    }
                }
                Err(_) => return out,
            }
        }
    }

    #[tokio::test]
    async fn events_are_named_relative_to_the_watched_directory() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        let mut watch = DirWatch::open(root.clone(), true, false).await.unwrap();
        std::fs::write(root.join("a"), b"1").unwrap();
        std::fs::create_dir(root.join("sub")).unwrap();
        // Give the watch a moment to follow the new directory.
        let first = next_events(&mut watch).await;
        assert!(
            first.contains(&("a".into(), EventType::Create)),
            "{first:?}"
        );
        assert!(first.contains(&("a".into(), EventType::Write)), "{first:?}");
        assert!(
            first.contains(&("sub".into(), EventType::Create)),
            "{first:?}"
        );
        std::fs::write(root.join("sub/b"), b"2").unwrap();
        std::fs::rename(root.join("a"), root.join("c")).unwrap();
        std::fs::remove_file(root.join("sub/b")).unwrap();
        let second = next_events(&mut watch).await;
        assert!(
            second.contains(&("sub/b".into(), EventType::Create)),
            "{second:?}"
        );
        assert!(
            second.contains(&("a".into(), EventType::Rename)),
            "{second:?}"
        );
        assert!(
            second.contains(&("c".into(), EventType::Create)),
            "{second:?}"
        );
        assert!(
            second.contains(&("sub/b".into(), EventType::Remove)),
            "{second:?}"
        );
    }

    #[tokio::test]
    async fn uploads_show_as_a_create_and_write_of_the_destination_only() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        let mut watch = DirWatch::open(root.clone(), false, false).await.unwrap();
        let mut file = crate::filesystem::atomic::AtomicFile::create(root.join("up"), None)
            .await
            .unwrap();
        file.write(b"data").await.unwrap();
        file.commit().await.unwrap();
        let events = next_events(&mut watch).await;
        assert_eq!(
            events,
            [
                ("up".into(), EventType::Create),
                ("up".into(), EventType::Write)
            ]
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn polled_watchers_keep_the_newest_events_and_go_away_when_removed() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = Ctx {
            state: crate::state::State::new(crate::state::Settings::default()),
            user: crate::state::User::current().unwrap(),
        };
        let path = dir.path().to_string_lossy().into_owned();
        let request = CreateWatcherRequest {
            path,
            ..Default::default()
        };
        let id = create_watcher(&ctx, request).await.unwrap().watcher_id;
        let files = MAX_BUFFERED_EVENTS / 2 + 100;
        let root = dir.path().to_path_buf();
        tokio::task::spawn_blocking(move || {
            for i in 0..files {
                std::fs::write(root.join(format!("f{i:05}")), b"x").unwrap();
            }
        })
        .await
        .unwrap();
        let last = format!("f{:05}", files - 1);
        let mut events = Vec::new();
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let buffer = ctx.state.watchers.buffer(&id).unwrap();
            let buffer = locked(&buffer);
            if buffer
                .events
                .back()
                .is_some_and(|e| e.name == last && e.r#type == i32::from(EventType::Write))
            {
                events = buffer.events.iter().cloned().collect();
                break;
            }
        }
        assert_eq!(events.len(), MAX_BUFFERED_EVENTS);
        let drained = get_watcher_events(
            &ctx,
            GetWatcherEventsRequest {
                watcher_id: id.clone(),
            },
        )
        .await
        .unwrap();
        assert_eq!(drained.events.len(), MAX_BUFFERED_EVENTS);
        let again = get_watcher_events(
            &ctx,
            GetWatcherEventsRequest {
                watcher_id: id.clone(),
            },
        )
        .await
        .unwrap();
        assert!(again.events.is_empty());
        remove_watcher(
            &ctx,
            RemoveWatcherRequest {
                watcher_id: id.clone(),
            },
        )
        .await
        .unwrap();
        let gone = get_watcher_events(
            &ctx,
            GetWatcherEventsRequest {
                watcher_id: id.clone(),
            },
        )
        .await
        .unwrap_err();
        assert_eq!(gone.code, Code::NotFound);
        assert_eq!(
            remove_watcher(&ctx, RemoveWatcherRequest { watcher_id: id })
                .await
                .unwrap_err()
                .code,
            Code::NotFound
        );
    }

    #[tokio::test]
    async fn watching_needs_an_existing_directory() {
        let dir = tempfile::tempdir().unwrap();
        let missing = DirWatch::open(dir.path().join("x"), false, false)
            .await
            .err()
            .unwrap();
        assert_eq!(missing.code, Code::NotFound);
        std::fs::write(dir.path().join("f"), b"").unwrap();
        let file = DirWatch::open(dir.path().join("f"), false, false)
            .await
            .err()
            .unwrap();
        assert_eq!(file.code, Code::InvalidArgument);
    }
}
