//! The daemon's side of a `spore vmm` process: start one, send it API
//! requests over its Unix socket (HTTP/1.1, as any user's client would), end
//! it. The daemon never links KVM or guest memory: a VMM that crashes or is
//! exploited stays one process.

use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;

use crate::network::InstanceNet;
use crate::vmm_exit::{self, Ending};

/// How long a VMM asked to stop cleanly may take before it is killed: one
/// recording a working set writes it then (a Linux guest's can be tens of
/// MiB, slow on a slow disk). Only such VMMs are stopped cleanly, and their
/// ending is off any invocation's path.
const CLEAN_STOP_LIMIT: Duration = Duration::from_secs(20);

/// A VMM process: either started by the daemon (its child), or a clone
/// started by a zygote's VMM (known by pid).
pub struct VmmProcess {
    pub pid: i32,
    pub api_sock: PathBuf,
    pub vsock_uds: PathBuf,
    /// The directory holding its sockets and log; removed when it ends
    /// (clones share their zygote's directory and remove only their files).
    pub run_dir: PathBuf,
    child: Option<tokio::process::Child>,
    ended: bool,
    /// Ended with SIGTERM first (a VMM recording a working set writes it
    /// when it stops cleanly).
    pub stop_cleanly: bool,
    /// The network namespace it runs in (a networked function's), removed
    /// when it ends.
    pub net: Option<InstanceNet>,
    /// Its cgroup (memory, pids, CPU share), removed when it ends.
    pub cgroup: Option<crate::cgroups::Leaf>,
    /// The user it runs as (`crate::jail`); `None` when unjailed, and for
    /// clones (they run as their zygote's).
    pub user: Option<crate::jail::User>,
    /// Its CPU cap being written ([`VmmProcess::cap_cpu`]): done before its
    /// cgroup goes to another instance.
    cap_job: Option<tokio::task::JoinHandle<()>>,
}

impl VmmProcess {
    /// Starts `spore vmm --api-sock <run_dir>/api.sock`, its console and
    /// messages going to `<run_dir>/vmm.log`, in a process group of its own;
    /// with `net`, inside that network namespace (`--netns`), which the
    /// process then owns; with `cgroup`, in that cgroup before it is
    /// configured; `jailed`, as that user in a root of its own (its run
    /// directory that user's).
    pub async fn spawn(
        spore_bin: &Path,
        run_dir: &Path,
        net: Option<InstanceNet>,
        cgroup: Option<crate::cgroups::Leaf>,
        jailed: Option<crate::jail::Jailed>,
    ) -> anyhow::Result<Self> {
        crate::fs::create_private_dir(run_dir)?;
        let api_sock = run_dir.join("api.sock");
        let log = std::fs::File::create(run_dir.join("vmm.log"))?;
        let mut command = tokio::process::Command::new(spore_bin);
        command.arg("vmm");
        if let Some(n) = &net {
            command.arg("--netns").arg(n.path());
        }
        let user = jailed.as_ref().map(|j| j.user.clone());
        if let Some(j) = &jailed {
            // Its root's mount point: empty on the host, always.
            crate::fs::create_private_dir(&run_dir.join("root"))?;
            crate::jail::own_tree(run_dir, &j.user)?;
            command.args(j.args(run_dir));
        }
        let child = command
            .arg("--api-sock")
            .arg(&api_sock)
            .env(crate::vmm_exit::EXIT_RECORD_ENV, "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {} vmm", spore_bin.display()))?;
        let pid = child
            .id()
            .ok_or_else(|| anyhow!("the VMM exited at once"))? as i32;
        // Into its cgroup while it starts (it allocates its guest's memory
        // only when configured, after this returns). Moved, not joined
        // before exec: a `pre_exec` hook would make std fork the daemon
        // instead of `posix_spawn`, which costs a cold start milliseconds.
        let joined = cgroup.as_ref().map(|leaf| {
            let files = leaf.procs_files();
            tokio::task::spawn_blocking(move || crate::cgroups::add_pid(&files, pid))
        });
        let mut vmm = VmmProcess {
            pid,
            vsock_uds: run_dir.join("v.sock"),
            api_sock,
            run_dir: run_dir.to_path_buf(),
            child: Some(child),
            ended: false,
            stop_cleanly: false,
            net,
            cgroup,
            user,
            cap_job: None,
        };
        let serving = vmm.wait_for_socket(Duration::from_secs(10)).await;
        if let Some(joined) = joined {
            let joined = joined
                .await
                .map_err(anyhow::Error::from)
                .and_then(|r| r.map_err(|e| anyhow!("moving the VMM into its cgroup: {e}")));
            if let Err(e) = joined {
                vmm.kill().await;
                return Err(e);
            }
        }
        serving?;
        Ok(vmm)
    }

    /// A clone a zygote's VMM started (not our child).
    pub fn adopt(pid: i32, api_sock: PathBuf, vsock_uds: PathBuf, run_dir: PathBuf) -> Self {
        VmmProcess {
            pid,
            api_sock,
            vsock_uds,
            run_dir,
            child: None,
            ended: false,
            stop_cleanly: false,
            net: None,
            cgroup: None,
            user: None,
            cap_job: None,
        }
    }

    /// Caps its CPU at its memory's share, once it served as an instance
    /// (never as a zygote), on a blocking thread: off the invocation's
    /// response (the write takes 0.01–0.5 ms here, and enabling the
    /// kernel's CFS bandwidth code when no other cgroup is capped patches
    /// kernel text). A failure is logged, the instance still serves.
    pub fn cap_cpu(&mut self) {
        let Some((file, value)) = self.cgroup.as_mut().and_then(|l| l.cpu_cap_write()) else {
            return;
        };
        let pid = self.pid;
        self.cap_job = Some(tokio::task::spawn_blocking(move || {
            if let Err(e) = std::fs::write(&file, value) {
                tracing::warn!("VMM {pid}: capping its CPU: {e}");
            }
        }));
    }

    async fn wait_for_socket(&mut self, limit: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            if UnixStream::connect(&self.api_sock).await.is_ok() {
                return Ok(());
            }
            if let Some(child) = &mut self.child {
                if let Some(status) = child.try_wait()? {
                    bail!(
                        "the VMM exited before serving its API ({status}): {}",
                        self.log_tail()
                    );
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "the VMM did not serve {} within {limit:?}",
                    self.api_sock.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// One API request; the response body on 2xx, an error naming the
    /// VMM's `fault_message` otherwise.
    pub async fn api(
        &self,
        method: &str,
        path: &str,
        body: Option<String>,
    ) -> anyhow::Result<String> {
        api_call(&self.api_sock, method, path, body).await
    }

    /// The last lines of the VMM's log, for error messages.
    pub fn log_tail(&self) -> String {
        self.log_lines(3)
    }

    /// Where its console and messages go: `vmm.log` in its run directory,
    /// or a clone's own `<name>.log` beside its API socket (the run
    /// directory of a clone is its zygote's).
    pub fn log_path(&self) -> PathBuf {
        if self.is_clone() {
            self.api_sock.with_extension("log")
        } else {
            self.run_dir.join("vmm.log")
        }
    }

    /// The last `n` lines of its log ([`VmmProcess::log_path`]), joined
    /// with ` | `.
    pub fn log_lines(&self, n: usize) -> String {
        let text = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().rev().take(n).collect();
        lines.into_iter().rev().collect::<Vec<_>>().join(" | ")
    }

    /// Whether the process is still running.
    pub fn is_alive(&mut self) -> bool {
        if self.ended {
            return false;
        }
        match &mut self.child {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            // A clone is its factory's child: once dead it may stay a
            // zombie until the factory reaps it, which signal 0 still finds.
            // SAFETY: signal 0 only checks that the process exists.
            None => (unsafe { libc::kill(self.pid, 0) }) == 0 && !is_zombie(self.pid),
        }
    }

    /// A clone a zygote's VMM started (not the daemon's child): it lies
    /// in its zygote's process tree.
    pub fn is_clone(&self) -> bool {
        self.child.is_none()
    }

    /// How the process ended, once it is gone (`None` while it runs):
    /// from the record it left and, for our children, the wait status.
    pub fn ending(&mut self) -> Option<Ending> {
        if self.is_alive() {
            return None;
        }
        let signal = match &mut self.child {
            Some(child) => child.try_wait().ok().flatten().and_then(|s| s.signal()),
            None => None,
        };
        Some(vmm_exit::classify(
            vmm_exit::read_record(&self.api_sock),
            signal,
        ))
    }

    /// Ends the process (SIGKILL to its group for our children, to the pid
    /// for clones), waits for our child, and removes its files.
    pub async fn kill(&mut self) {
        if self.ended {
            return;
        }
        self.ended = true;
        match &mut self.child {
            Some(child) => {
                if self.stop_cleanly {
                    // SAFETY: signalling our own child.
                    unsafe { libc::kill(self.pid, libc::SIGTERM) };
                    let _ = tokio::time::timeout(CLEAN_STOP_LIMIT, child.wait()).await;
                }
                // SAFETY: the child leads its own process group (spawned with
                // process_group(0)); only that group is signalled.
                unsafe { libc::kill(-self.pid, libc::SIGKILL) };
                let _ = child.wait().await;
                let _ = std::fs::remove_dir_all(&self.run_dir);
            }
            None => {
                // SAFETY: the pid is a clone's; its zygote's VMM reaps it.
                unsafe { libc::kill(self.pid, libc::SIGKILL) };
                let _ = std::fs::remove_file(&self.api_sock);
                let _ = std::fs::remove_file(&self.vsock_uds);
                let _ = std::fs::remove_file(vmm_exit::record_path(&self.api_sock));
            }
        }
        if let Some(net) = self.net.take() {
            // Removing runs `ip` commands: off the async threads.
            let _ = tokio::task::spawn_blocking(move || drop(net)).await;
        }
        if let Some(leaf) = self.cgroup.take() {
            // Capped before it is reused (else the cap could land on the
            // next instance's start).
            if let Some(job) = self.cap_job.take() {
                let _ = job.await;
            }
            leaf.release().await;
        }
    }

    /// Its cgroup's memory limit now, if it has a cgroup.
    pub fn memory_limit(&self) -> Option<u64> {
        self.cgroup.as_ref()?.memory_limit()
    }

    /// Whether the kernel ended it (or a process of its cgroup) for going
    /// past its cgroup's memory.
    pub fn oom_killed(&self) -> bool {
        self.cgroup
            .as_ref()
            .is_some_and(crate::cgroups::Leaf::oom_killed)
    }

    /// Host memory the process holds: its proportional set size (shared
    /// template pages split among the processes mapping them), in bytes.
    pub fn pss_bytes(&self) -> u64 {
        proc_pss_bytes(self.pid)
    }
}

impl Drop for VmmProcess {
    fn drop(&mut self) {
        if !self.ended && self.child.is_none() {
            // SAFETY: as in kill(): a clone's pid.
            unsafe { libc::kill(self.pid, libc::SIGKILL) };
        }
        // Our children are killed by kill_on_drop.
    }
}

/// The processes under `root` (its children, theirs, and so on), read from
/// `/proc/PID/task/TID/children` (a child is listed under the thread that
/// started it); the subtrees of the pids in `skip` left out.
pub fn descendants(root: i32, skip: &[i32]) -> Vec<i32> {
    let mut out = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut todo = vec![root];
    while let Some(pid) = todo.pop() {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            let Ok(list) = std::fs::read_to_string(task.path().join("children")) else {
                continue;
            };
            for child in list
                .split_whitespace()
                .filter_map(|c| c.parse::<i32>().ok())
            {
                if !skip.contains(&child) && seen.insert(child) {
                    out.push(child);
                    todo.push(child);
                }
            }
        }
    }
    out
}

/// PSS of `pid` and every process under it (a zygote's VMM, its clone
/// factory and the clones started ahead), in bytes.
pub fn tree_pss_bytes(pid: i32) -> u64 {
    proc_pss_bytes(pid)
        + descendants(pid, &[])
            .into_iter()
            .map(proc_pss_bytes)
            .sum::<u64>()
}

/// Whether `/proc/PID/stat` says the process is dead and not yet reaped
/// (state `Z`, or `X`); an unreadable one counts as gone.
fn is_zombie(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return true;
    };
    // The state follows the command name, which is in parentheses and may
    // itself hold spaces and parentheses: look after the last ')'.
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .is_some_and(|state| state == "Z" || state == "X")
}

/// `Pss:` of `/proc/PID/smaps_rollup`, in bytes (0 if unreadable).
pub fn proc_pss_bytes(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Pss:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// Sends one HTTP/1.1 request to a VMM's API socket.
pub async fn api_call(
    sock: &Path,
    method: &str,
    path: &str,
    body: Option<String>,
) -> anyhow::Result<String> {
    let stream = UnixStream::connect(sock)
        .await
        .with_context(|| format!("connecting to {}", sock.display()))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let req = hyper::Request::builder()
        .method(method)
        .uri(format!("http://localhost{path}"))
        .header("host", "localhost")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.unwrap_or_default())))?;
    let resp = sender.send_request(req).await?;
    let status = resp.status();
    let bytes = resp.into_body().collect().await?.to_bytes();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    if !status.is_success() {
        let fault = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| {
                v.get("fault_message")
                    .and_then(|m| m.as_str())
                    .map(String::from)
            })
            .unwrap_or(text);
        bail!("{method} {path}: {status}: {fault}");
    }
    Ok(text)
}
