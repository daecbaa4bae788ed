//! `spore clone SOCK -n N`: clone a running VMM's microVM; `--keep N` keeps
//! N clones running and replaces each one that exits. A client of the
//! source's API (`PUT /clone`); the clone processes themselves are
//! `spore vmm --clone-handoff` (`spore_vmm::clone::process`).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use spore_vmm::api::client;
use spore_vmm::clone::CloneReport;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Mode {
    Zygote,
    Continue,
}

#[derive(Args, Debug)]
pub struct CloneArgs {
    /// The source VMM's API socket.
    pub socket: PathBuf,
    /// How many clones to start.
    #[arg(short = 'n', long, default_value_t = 1)]
    pub count: u32,
    /// zygote: the source stays frozen as the template; continue: it runs on.
    /// Default: the source's configured mode (PUT /clone/config), zygote.
    #[arg(long, value_enum)]
    pub mode: Option<Mode>,
    /// Directory for the clones' API sockets and logs (default: beside the source's).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Keep this many clones running: start them, then replace each one
    /// that exits, until interrupted (or --total clones were started).
    #[arg(long, conflicts_with = "count")]
    pub keep: Option<u32>,
    /// With --keep: stop after starting this many clones in all, wait for
    /// them to exit, and print the throughput.
    #[arg(long, requires = "keep")]
    pub total: Option<u64>,
}

fn body(count: u32, mode: Option<Mode>, dir: Option<&Path>) -> anyhow::Result<String> {
    let mut b = serde_json::json!({ "count": count });
    if let Some(m) = mode {
        b["mode"] = match m {
            Mode::Zygote => "zygote",
            Mode::Continue => "continue",
        }
        .into();
    }
    if let Some(d) = dir {
        let d = if d.is_absolute() {
            d.to_path_buf()
        } else {
            std::env::current_dir()?.join(d)
        };
        b["socket_dir"] = d.to_string_lossy().into_owned().into();
    }
    Ok(b.to_string())
}

/// One `PUT /clone`; the API's fault message becomes the error.
pub fn put_clone(
    sock: &Path,
    count: u32,
    mode: Option<Mode>,
    dir: Option<&Path>,
) -> anyhow::Result<CloneReport> {
    Ok(client::put_clone(sock, &body(count, mode, dir)?)?)
}

pub fn run(a: CloneArgs) -> anyhow::Result<u8> {
    match a.keep {
        None => {
            let report = put_clone(&a.socket, a.count, a.mode, a.dir.as_deref())?;
            for c in &report.clones {
                eprintln!(
                    "spore: clone {} started: pid {}, socket {}, {:.2} ms after the request",
                    c.index,
                    c.pid,
                    c.socket,
                    c.start_ns.saturating_sub(report.request_ns) as f64 / 1e6
                );
            }
            println!("{}", serde_json::to_string_pretty(&report)?);
            Ok(0)
        }
        Some(keep) => keep_pool(&a, keep),
    }
}

/// A pidfd: readable once the process exited (works for processes that are
/// not our children, which clones are not: the source VMM started them).
fn pidfd(pid: u32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return None;
    }
    // A file descriptor is a c_int: the syscall's c_long holds one.
    let fd = RawFd::try_from(fd).ok()?;
    // SAFETY: a fresh fd owned by nobody else.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `--keep N`: HyperFork's throughput mode.
fn keep_pool(a: &CloneArgs, keep: u32) -> anyhow::Result<u8> {
    if keep == 0 {
        bail!("--keep needs at least 1 clone");
    }
    let total = a.total.unwrap_or(u64::MAX);
    let t0 = Instant::now();
    let mut running: Vec<(u32, OwnedFd)> = Vec::new();
    let mut started = 0u64;
    let mut finished = 0u64;
    let mut latencies = Vec::new();
    loop {
        let room = keep.saturating_sub(u32::try_from(running.len()).unwrap_or(u32::MAX));
        let want = u32::try_from(total - started).map_or(room, |left| room.min(left));
        if want > 0 {
            let r = put_clone(&a.socket, want, a.mode, a.dir.as_deref())?;
            for c in &r.clones {
                latencies.push(c.start_ns.saturating_sub(r.request_ns));
                match pidfd(c.pid) {
                    Some(fd) => running.push((c.pid, fd)),
                    // Already gone.
                    None => finished += 1,
                }
            }
            started += r.clones.len() as u64;
        }
        if running.is_empty() && started >= total {
            break;
        }
        let mut fds: Vec<libc::pollfd> = running
            .iter()
            .map(|(_, fd)| libc::pollfd {
                fd: fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: fds is a valid array of pollfds for the call.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 1000) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e).context("waiting for clones");
            }
        }
        let before = running.len();
        let exited: Vec<bool> = fds.iter().map(|p| p.revents != 0).collect();
        let mut i = 0;
        running.retain(|_| {
            let keep = !exited[i];
            i += 1;
            keep
        });
        finished += (before - running.len()) as u64;
        if before != running.len() && started < total {
            eprintln!(
                "spore: {} clone(s) exited, replacing ({started} started)",
                before - running.len()
            );
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    latencies.sort_unstable();
    #[allow(
        clippy::cast_possible_truncation,
        reason = "p is 0.5 or 0.99, so the rounded index lies in 0..len"
    )]
    let pct = |p: f64| {
        latencies
            .get(((latencies.len() as f64 - 1.0) * p).round() as usize)
            .map_or(0.0, |&ns| ns as f64 / 1e3)
    };
    println!(
        "{}",
        serde_json::json!({
            "keep": keep,
            "clones_started": started,
            "clones_finished": finished,
            "seconds": secs,
            "clones_per_s": finished as f64 / secs,
            "start_latency_us": { "p50": pct(0.5), "p99": pct(0.99) },
        })
    );
    Ok(0)
}
