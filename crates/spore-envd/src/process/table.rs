//! The processes envd started, found by pid or tag, and what can be done to
//! one while it runs: input, signals, closing stdin, resizing its terminal.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::process::ChildStdin;
use tokio::sync::watch;

use super::output::Hub;
use super::pty::PtyMaster;
use crate::connect::{Code, RpcError, RpcResult};
use crate::proto::process::process_event::EndEvent;
use crate::proto::process::process_selector::Selector;
use crate::proto::process::{ProcessConfig, ProcessInfo, ProcessSelector};

/// Processes running at once (`Start` beyond it: `resource_exhausted`).
pub const MAX_PROCESSES: usize = 1024;
/// How long a process's end is kept for a `Connect` that comes late.
const ENDED_KEPT_FOR: Duration = Duration::from_secs(30);
/// Ended processes kept at most.
const ENDED_KEPT: usize = 256;

/// A running process.
pub struct Proc {
    pub pid: u32,
    pub tag: Option<String>,
    pub config: ProcessConfig,
    pub hub: Arc<Hub>,
    /// Start order (among processes sharing a tag, the newest is meant).
    seq: u64,
    /// Its stdin pipe, until closed; one writer at a time keeps inputs whole.
    stdin: tokio::sync::Mutex<Option<ChildStdin>>,
    pty: Option<Arc<PtyMaster>>,
    pty_input: tokio::sync::Mutex<()>,
    /// Set when it was told to stop (kill, terminate, timeout): once it has
    /// exited, envd waits only briefly for output its leftovers still hold.
    stopping: watch::Sender<bool>,
}

/// What a client's input is for.
pub enum Input {
    Stdin(Vec<u8>),
    Pty(Vec<u8>),
}

impl Proc {
    pub fn new(
        pid: u32,
        tag: Option<String>,
        config: ProcessConfig,
        hub: Arc<Hub>,
        stdin: Option<ChildStdin>,
        pty: Option<Arc<PtyMaster>>,
    ) -> Proc {
        static NEXT_SEQ: AtomicU64 = AtomicU64::new(0);
        Proc {
            pid,
            tag,
            config,
            hub,
            seq: NEXT_SEQ.fetch_add(1, Ordering::Relaxed),
            stdin: tokio::sync::Mutex::new(stdin),
            pty,
            pty_input: tokio::sync::Mutex::new(()),
            stopping: watch::Sender::new(false),
        }
    }

    /// Resolves once the process was told to stop.
    pub async fn stop_requested(&self) {
        let mut rx = self.stopping.subscribe();
        let _ = rx.wait_for(|stopping| *stopping).await;
    }

    /// Sends `signal` to the process's group (what it started too).
    pub fn signal(&self, signal: libc::c_int) -> RpcResult<()> {
        if signal == libc::SIGKILL || signal == libc::SIGTERM {
            self.stopping.send_replace(true);
        }
        let group = libc::pid_t::try_from(self.pid)
            .map_err(|_| RpcError::internal(format!("pid {} out of range", self.pid)))?;
        // SAFETY: kill has no memory preconditions. The group's id stays
        // ours while any member lives (the kernel reuses no id in use as a
        // group's), and the process leaves the table once its group is done.
        if unsafe { libc::kill(-group, signal) } == 0 {
            return Ok(());
        }
        match std::io::Error::last_os_error() {
            // Nobody left in the group: it is ending anyway.
            e if e.raw_os_error() == Some(libc::ESRCH) => Ok(()),
            e => Err(RpcError::internal(format!(
                "error sending signal to process {}: {e}",
                self.pid
            ))),
        }
    }

    pub async fn write(&self, input: Input) -> RpcResult<()> {
        match (input, &self.pty) {
            (Input::Stdin(data), None) => {
                let mut stdin = self.stdin.lock().await;
                let pipe = stdin.as_mut().ok_or_else(|| {
                    RpcError::new(Code::FailedPrecondition, "stdin not enabled or closed")
                })?;
                pipe.write_all(&data)
                    .await
                    .map_err(|e| self.input_error("stdin", &e))?;
                pipe.flush()
                    .await
                    .map_err(|e| self.input_error("stdin", &e))
            }
            (Input::Pty(data), Some(pty)) => {
                let _one_writer = self.pty_input.lock().await;
                pty.write_all(&data)
                    .await
                    .map_err(|e| self.input_error("tty", &e))
            }
            (Input::Stdin(_), Some(_)) => Err(RpcError::new(
                Code::FailedPrecondition,
                "the process has a pty: input goes to the pty, not stdin",
            )),
            (Input::Pty(_), None) => Err(RpcError::new(
                Code::FailedPrecondition,
                "the process has no pty: input goes to its stdin",
            )),
        }
    }

    fn input_error(&self, what: &str, e: &std::io::Error) -> RpcError {
        RpcError::internal(format!(
            "error writing to {what} of process {}: {e}",
            self.pid
        ))
    }

    /// Closes stdin (the process reads its end); closing twice is fine.
    pub async fn close_stdin(&self) -> RpcResult<()> {
        if self.pty.is_some() {
            return Err(RpcError::new(
                Code::FailedPrecondition,
                "a pty has no stdin to close: send Ctrl-D (0x04) instead",
            ));
        }
        drop(self.stdin.lock().await.take());
        Ok(())
    }

    pub fn resize(&self, rows: u16, cols: u16) -> RpcResult<()> {
        let pty = self
            .pty
            .as_ref()
            .ok_or_else(|| RpcError::new(Code::FailedPrecondition, "the process has no pty"))?;
        pty.resize(rows, cols).map_err(|e| {
            RpcError::internal(format!(
                "error resizing the pty of process {}: {e}",
                self.pid
            ))
        })
    }
}

/// A process that ended recently.
struct Ended {
    pid: u32,
    tag: Option<String>,
    end: EndEvent,
    at: Instant,
}

#[derive(Default)]
struct Table {
    live: HashMap<u32, Arc<Proc>>,
    /// Starts between their slot and their insertion.
    starting: usize,
    ended: VecDeque<Ended>,
}

impl Table {
    fn prune_ended(&mut self, now: Instant) {
        while self
            .ended
            .front()
            .is_some_and(|e| now.duration_since(e.at) > ENDED_KEPT_FOR)
        {
            self.ended.pop_front();
        }
    }
}

/// The processes envd started.
#[derive(Default)]
pub struct Processes {
    table: Mutex<Table>,
}

/// Room for one process being started; given back if it never is.
pub struct Slot<'a> {
    processes: &'a Processes,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let mut table = self.processes.lock();
        table.starting = table.starting.saturating_sub(1);
    }
}

/// What a `Connect` finds.
pub enum Found {
    Live(Arc<Proc>),
    Ended { pid: u32, end: EndEvent },
}

fn no_selector() -> RpcError {
    RpcError::invalid_argument("a process selector (pid or tag) is required")
}

impl Processes {
    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Reserves room for one more process.
    pub fn reserve(&self) -> RpcResult<Slot<'_>> {
        let mut table = self.lock();
        if table.live.len() + table.starting >= MAX_PROCESSES {
            return Err(RpcError::new(
                Code::ResourceExhausted,
                format!("at most {MAX_PROCESSES} processes may run at once"),
            ));
        }
        table.starting += 1;
        Ok(Slot { processes: self })
    }

    /// Lists a started process (its slot is now taken by it).
    pub fn insert(&self, slot: Slot<'_>, proc: Arc<Proc>) {
        // The slot turns into the entry under one lock, so no other start
        // can take its room in between.
        std::mem::forget(slot);
        let mut table = self.lock();
        table.starting = table.starting.saturating_sub(1);
        // A pid or tag taken anew: an earlier process's end no longer answers for it.
        table
            .ended
            .retain(|e| e.pid != proc.pid && (proc.tag.is_none() || e.tag != proc.tag));
        table.live.insert(proc.pid, proc);
    }

    /// Unlists an ended process, keeping its end for late `Connect`s.
    pub fn remove(&self, proc: &Arc<Proc>, end: EndEvent) {
        let mut table = self.lock();
        if table
            .live
            .get(&proc.pid)
            .is_some_and(|p| Arc::ptr_eq(p, proc))
        {
            table.live.remove(&proc.pid);
        }
        let now = Instant::now();
        table.prune_ended(now);
        if table.ended.len() >= ENDED_KEPT {
            table.ended.pop_front();
        }
        table.ended.push_back(Ended {
            pid: proc.pid,
            tag: proc.tag.clone(),
            end,
            at: now,
        });
    }

    /// The running process `selector` names.
    pub fn find(&self, selector: Option<&ProcessSelector>) -> RpcResult<Arc<Proc>> {
        let selector = selector
            .and_then(|s| s.selector.as_ref())
            .ok_or_else(no_selector)?;
        let table = self.lock();
        let found = match selector {
            Selector::Pid(pid) => table.live.get(pid).cloned(),
            Selector::Tag(tag) => table
                .live
                .values()
                .filter(|p| p.tag.as_deref() == Some(tag.as_str()))
                .max_by_key(|p| p.seq)
                .cloned(),
        };
        found.ok_or_else(|| match selector {
            Selector::Pid(pid) => RpcError::not_found(format!("process with pid {pid} not found")),
            Selector::Tag(tag) => RpcError::not_found(format!("process with tag {tag} not found")),
        })
    }

    /// The process `selector` names, or how it ended if that was recent.
    pub fn find_for_connect(&self, selector: Option<&ProcessSelector>) -> RpcResult<Found> {
        let missing = match self.find(selector) {
            Ok(proc) => return Ok(Found::Live(proc)),
            Err(e) => e,
        };
        let Some(selector) = selector.and_then(|s| s.selector.as_ref()) else {
            return Err(missing);
        };
        let mut table = self.lock();
        table.prune_ended(Instant::now());
        let ended = table.ended.iter().rev().find(|e| match selector {
            Selector::Pid(pid) => e.pid == *pid,
            Selector::Tag(tag) => e.tag.as_deref() == Some(tag.as_str()),
        });
        match ended {
            Some(e) => Ok(Found::Ended {
                pid: e.pid,
                end: e.end.clone(),
            }),
            None => Err(missing),
        }
    }

    pub fn list(&self) -> Vec<ProcessInfo> {
        let table = self.lock();
        let mut procs: Vec<&Arc<Proc>> = table.live.values().collect();
        procs.sort_by_key(|p| p.seq);
        procs
            .into_iter()
            .map(|p| ProcessInfo {
                config: Some(p.config.clone()),
                pid: p.pid,
                tag: p.tag.clone(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proc(pid: u32, tag: Option<&str>) -> Arc<Proc> {
        Arc::new(Proc::new(
            pid,
            tag.map(str::to_owned),
            ProcessConfig::default(),
            Arc::default(),
            None,
            None,
        ))
    }

    fn by_pid(pid: u32) -> ProcessSelector {
        ProcessSelector {
            selector: Some(Selector::Pid(pid)),
        }
    }

    fn by_tag(tag: &str) -> ProcessSelector {
        ProcessSelector {
            selector: Some(Selector::Tag(tag.into())),
        }
    }

    #[test]
    fn processes_are_found_by_pid_or_newest_tag_and_ends_are_kept() {
        let table = Processes::default();
        let (a, b) = (proc(10, Some("web")), proc(11, Some("web")));
        table.insert(table.reserve().unwrap(), a.clone());
        table.insert(table.reserve().unwrap(), b.clone());
        assert_eq!(table.find(Some(&by_pid(10))).unwrap().pid, 10);
        assert_eq!(table.find(Some(&by_tag("web"))).unwrap().pid, 11);
        assert_eq!(
            table.find(Some(&by_pid(12))).err().map(|e| e.code),
            Some(Code::NotFound)
        );
        assert_eq!(
            table.find(None).err().map(|e| e.code),
            Some(Code::InvalidArgument)
        );
        assert_eq!(
            table.list().iter().map(|p| p.pid).collect::<Vec<_>>(),
            [10, 11]
        );

        let end = EndEvent {
            exit_code: 0,
            exited: true,
            status: "exit status 0".into(),
            error: None,
        };
        table.remove(&b, end.clone());
        assert_eq!(table.find(Some(&by_tag("web"))).unwrap().pid, 10);
        assert!(matches!(
            table.find_for_connect(Some(&by_pid(11))),
            Ok(Found::Ended { pid: 11, .. })
        ));
        assert!(table.find(Some(&by_pid(11))).is_err());
        // The pid taken again: the old end no longer answers for it.
        table.insert(table.reserve().unwrap(), proc(11, None));
        assert!(matches!(
            table.find_for_connect(Some(&by_pid(11))),
            Ok(Found::Live(_))
        ));
    }

    #[test]
    fn the_number_of_processes_is_capped() {
        let table = Processes::default();
        let slots: Vec<_> = (0..MAX_PROCESSES)
            .map(|_| table.reserve().unwrap())
            .collect();
        assert_eq!(
            table.reserve().err().map(|e| e.code),
            Some(Code::ResourceExhausted)
        );
        drop(slots);
        assert!(table.reserve().is_ok());
    }
}
