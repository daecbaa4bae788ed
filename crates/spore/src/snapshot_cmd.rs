//! `spore snapshot create | restore | inspect`.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use spore_vmm::api::ApiServer;
use spore_vmm::config::VmConfig;
use spore_vmm::snapshot::format::read_state_file;
use spore_vmm::vmm::Vmm;

use crate::api_client::request;
use crate::host;

#[derive(Subcommand, Debug)]
pub enum SnapshotCommand {
    /// Pause a running VMM's microVM, write a full snapshot, and resume it
    /// (or stop the VMM with --stop).
    Create(CreateArgs),
    /// Run a microVM restored from a snapshot in the foreground, like `spore run`.
    Restore(RestoreArgs),
    /// Print a snapshot's manifest (JSON).
    Inspect {
        /// The snapshot state file.
        state: PathBuf,
    },
}

#[derive(Args, Debug)]
pub struct CreateArgs {
    /// The VMM's API socket.
    pub socket: PathBuf,
    /// Where to write the state file.
    #[arg(long)]
    pub state: PathBuf,
    /// Where to write the memory file.
    #[arg(long)]
    pub mem: PathBuf,
    /// Stop the VMM after the snapshot instead of resuming the guest.
    #[arg(long)]
    pub stop: bool,
}

#[derive(Args, Debug)]
pub struct RestoreArgs {
    #[arg(long)]
    pub state: PathBuf,
    #[arg(long)]
    pub mem: PathBuf,
    /// Also serve the API on this socket.
    #[arg(long)]
    pub api_sock: Option<PathBuf>,
    /// Write the guest's signal-port marks here as JSON when the VM stops.
    #[arg(long)]
    pub marks_file: Option<PathBuf>,
}

pub fn run(cmd: SnapshotCommand) -> anyhow::Result<u8> {
    match cmd {
        SnapshotCommand::Create(a) => create(a),
        SnapshotCommand::Restore(a) => restore(a),
        SnapshotCommand::Inspect { state } => {
            let (manifest, _) = read_state_file(&state)?;
            println!("{}", serde_json::to_string_pretty(&manifest)?);
            Ok(0)
        }
    }
}

fn call(sock: &Path, method: &str, path: &str, body: &str) -> anyhow::Result<String> {
    let (status, reply) = request(sock, method, path, body)?;
    if status >= 400 {
        bail!("{method} {path}: HTTP {status}: {}", reply.trim());
    }
    Ok(reply)
}

fn abs(p: &Path) -> anyhow::Result<String> {
    let p = if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()?.join(p)
    };
    Ok(p.to_string_lossy().into_owned())
}

fn create(a: CreateArgs) -> anyhow::Result<u8> {
    let body = serde_json::json!({
        "snapshot_type": "Full",
        "snapshot_path": abs(&a.state)?,
        "mem_file_path": abs(&a.mem)?,
    })
    .to_string();
    let t0 = std::time::Instant::now();
    call(&a.socket, "PATCH", "/vm", r#"{"state":"Paused"}"#)?;
    let created = call(&a.socket, "PUT", "/snapshot/create", &body);
    if a.stop {
        stop_vmm(&a.socket)?;
    } else {
        call(&a.socket, "PATCH", "/vm", r#"{"state":"Resumed"}"#)?;
    }
    let manifest = created?;
    eprintln!(
        "spore: snapshot written in {:.1} ms: {} and {}",
        t0.elapsed().as_secs_f64() * 1e3,
        a.state.display(),
        a.mem.display()
    );
    println!("{}", manifest.trim());
    Ok(0)
}

/// Stops the VMM serving `sock` with SIGTERM (a clean stop), found through
/// the socket's peer credentials.
fn stop_vmm(sock: &Path) -> anyhow::Result<()> {
    let s = std::os::unix::net::UnixStream::connect(sock)
        .with_context(|| format!("connecting to {}", sock.display()))?;
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut _ as *mut libc::c_void,
            &mut len,
        )
    };
    if r != 0 || cred.pid <= 0 {
        bail!("cannot find the VMM process behind {}", sock.display());
    }
    // SAFETY: sending SIGTERM to the VMM process found above.
    if unsafe { libc::kill(cred.pid, libc::SIGTERM) } != 0 {
        bail!(
            "cannot stop VMM process {}: {}",
            cred.pid,
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

fn restore(a: RestoreArgs) -> anyhow::Result<u8> {
    let vmm = Arc::new(Vmm::new(
        "restore".into(),
        VmConfig::default(),
        Box::new(std::io::stdout()),
    ));
    host::stop_on_host_signals(vmm.clone())?;
    let _server = match &a.api_sock {
        Some(path) => Some(
            ApiServer::start(path, vmm.clone())
                .with_context(|| format!("serving the API on {}", path.display()))?,
        ),
        None => None,
    };
    vmm.load_snapshot(&a.state, &a.mem, true)?;
    host::forward_stdin(vmm.clone());
    crate::run::finish(&vmm, a.marks_file.as_deref())
}
