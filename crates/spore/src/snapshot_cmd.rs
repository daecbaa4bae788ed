//! `spore snapshot create | restore | inspect | merge`.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use spore_vmm::api::ApiServer;
use spore_vmm::config::VmConfig;
use spore_vmm::snapshot::format::read_state_file;
use spore_vmm::snapshot::merge::{describe, merge as merge_chain};
use spore_vmm::snapshot::params::{LoadMemory, RestoreMode};
use spore_vmm::snapshot::LayerPaths;
use spore_vmm::vmm::{LoadOptions, Vmm};

use crate::api_client::request;
use crate::host;

#[derive(Subcommand, Debug)]
pub enum SnapshotCommand {
    /// Pause a running VMM's microVM, write a full (or --diff) snapshot, and
    /// resume it (or stop the VMM with --stop).
    Create(CreateArgs),
    /// Run a microVM restored from a snapshot in the foreground, like `spore run`.
    Restore(RestoreArgs),
    /// Print a snapshot's manifest (JSON); with --mem, also check and list
    /// every layer of its chain ("chain", newest first).
    Inspect(InspectArgs),
    /// Flatten a chain of layers (base ← diff ← … ← newest) into one full
    /// snapshot that restores to exactly the newest layer's memory.
    Merge(MergeArgs),
    /// Serve a restored VM's page faults from a snapshot's memory file: a
    /// Firecracker-compatible external userfaultfd handler. Listens on
    /// --sock, takes one VMM's uffd and memory layout, serves until it exits.
    UffdHandler(UffdHandlerArgs),
}

/// A diff's parent layers named explicitly, nearest first, each as
/// `--parent STATE MEM` (for layers moved away from where the diff's
/// manifest says they are).
#[derive(Args, Debug, Default)]
pub struct ParentArgs {
    #[arg(long = "parent", num_args = 2, value_names = ["STATE", "MEM"])]
    pub parent: Vec<PathBuf>,
}

impl ParentArgs {
    fn paths(&self) -> Vec<LayerPaths> {
        self.parent
            .chunks(2)
            .filter(|c| c.len() == 2)
            .map(|c| LayerPaths {
                state: c[0].clone(),
                mem: c[1].clone(),
            })
            .collect()
    }
}

#[derive(Args, Debug)]
pub struct InspectArgs {
    /// The snapshot state file.
    pub state: PathBuf,
    /// Its memory file: check the whole chain and list its layers.
    #[arg(long)]
    pub mem: Option<PathBuf>,
    /// Also check every layer's memory file against the SHA-256 its
    /// manifest recorded (`hash_memory`); needs --mem. Exit 1 on a mismatch.
    #[arg(long, requires = "mem")]
    pub verify: bool,
    #[command(flatten)]
    pub parents: ParentArgs,
}

#[derive(Args, Debug)]
pub struct MergeArgs {
    /// The newest layer's state file.
    #[arg(long)]
    pub state: PathBuf,
    /// The newest layer's memory file.
    #[arg(long)]
    pub mem: PathBuf,
    #[command(flatten)]
    pub parents: ParentArgs,
    /// Where to write the merged state file.
    #[arg(long)]
    pub out_state: PathBuf,
    /// Where to write the merged memory file.
    #[arg(long)]
    pub out_mem: PathBuf,
}

#[derive(Args, Debug)]
pub struct UffdHandlerArgs {
    /// The Unix socket to listen on (the VMM's mem_backend backend_path).
    #[arg(long)]
    pub sock: PathBuf,
    /// The snapshot memory file to serve.
    #[arg(long)]
    pub mem: PathBuf,
}

/// `spore snapshot restore --mode`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Map the memory file privately; pages fault in on demand.
    Lazy,
    /// Read every data page in before the guest runs.
    Eager,
    /// Load the recorded working set, the rest on demand (records it on the first run).
    #[value(name = "working-set", alias = "working_set")]
    WorkingSet,
    /// userfaultfd with the built-in handler serving the memory file.
    Uffd,
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
    /// Write a Diff snapshot (only the pages changed since the VM's last
    /// snapshot; needs track_dirty_pages) instead of a Full one.
    #[arg(long)]
    pub diff: bool,
    /// Record the memory file's SHA-256 in the manifest (checked by eager
    /// restores and `inspect --verify`).
    #[arg(long)]
    pub hash_memory: bool,
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
    /// How guest memory is restored.
    #[arg(long, value_enum, default_value = "lazy")]
    pub mode: Mode,
    /// Hand page faults to the external userfaultfd handler on this socket
    /// (Firecracker's Uffd backend) instead; --mem is then not read.
    #[arg(long, conflicts_with = "mode")]
    pub uffd_handler: Option<PathBuf>,
    /// With --mode working-set: end a new recording this many ms after the
    /// guest starts (default: when the VM stops).
    #[arg(long)]
    pub record_ms: Option<u64>,
    /// Track dirty pages in the restored VM, so that it can write Diff
    /// snapshots on top of this one (default: as the snapshotted VM did).
    #[arg(long)]
    pub track_dirty_pages: bool,
    #[command(flatten)]
    pub parents: ParentArgs,
    #[command(flatten)]
    pub seccomp: host::SeccompArgs,
}

pub fn run(cmd: SnapshotCommand) -> anyhow::Result<u8> {
    match cmd {
        SnapshotCommand::Create(a) => create(a),
        SnapshotCommand::Restore(a) => restore(a),
        SnapshotCommand::Inspect(a) => inspect(a),
        SnapshotCommand::Merge(a) => merge(a),
        SnapshotCommand::UffdHandler(a) => uffd_handler(a),
    }
}

fn inspect(a: InspectArgs) -> anyhow::Result<u8> {
    let (manifest, _) = read_state_file(&a.state)?;
    let mut out = serde_json::to_value(&manifest)?;
    if let Some(mem) = &a.mem {
        let newest = LayerPaths {
            state: a.state.clone(),
            mem: mem.clone(),
        };
        let chain = describe(&newest, &a.parents.paths())?;
        out["chain"] = serde_json::to_value(&chain)?;
        if a.verify {
            let v = spore_vmm::snapshot::merge::verify(&newest, &a.parents.paths())?;
            out["verified"] = serde_json::to_value(&v)?;
        }
    }
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(0)
}

fn merge(a: MergeArgs) -> anyhow::Result<u8> {
    let t0 = std::time::Instant::now();
    let newest = LayerPaths {
        state: a.state.clone(),
        mem: a.mem.clone(),
    };
    let out = LayerPaths {
        state: a.out_state.clone(),
        mem: a.out_mem.clone(),
    };
    let info = merge_chain(&newest, &a.parents.paths(), &out)?;
    eprintln!(
        "spore: merged into {} and {} in {:.1} ms ({} bytes of data)",
        a.out_state.display(),
        a.out_mem.display(),
        t0.elapsed().as_secs_f64() * 1e3,
        info.manifest.layer.mem_data_bytes
    );
    println!("{}", serde_json::to_string_pretty(&info.manifest)?);
    Ok(0)
}

fn call(sock: &Path, method: &str, path: &str, body: &str) -> anyhow::Result<String> {
    let (status, reply) = request(sock, method, path, body)?;
    if status >= 400 {
        bail!("{method} {path}: HTTP {status}: {}", reply.trim());
    }
    Ok(reply)
}

/// `p` as an absolute path for the VMM (which refuses `..`): its directory
/// resolved when it exists, else joined to the current directory.
fn abs(p: &Path) -> anyhow::Result<String> {
    let p = if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()?.join(p)
    };
    let resolved = match (p.parent(), p.file_name()) {
        (Some(dir), Some(name)) => std::fs::canonicalize(dir).ok().map(|d| d.join(name)),
        _ => None,
    };
    Ok(resolved.unwrap_or(p).to_string_lossy().into_owned())
}

fn create(a: CreateArgs) -> anyhow::Result<u8> {
    let body = serde_json::json!({
        "snapshot_type": if a.diff { "Diff" } else { "Full" },
        "snapshot_path": abs(&a.state)?,
        "mem_file_path": abs(&a.mem)?,
        "hash_memory": a.hash_memory,
    })
    .to_string();
    let t0 = std::time::Instant::now();
    call(&a.socket, "PATCH", "/vm", r#"{"state":"Paused"}"#)?;
    // 204, as Firecracker answers; the manifest is read back before the
    // VMM is resumed or stopped.
    let created = call(&a.socket, "PUT", "/snapshot/create", &body)
        .and_then(|_| call(&a.socket, "GET", "/snapshot/last", ""));
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
    #[allow(
        clippy::cast_possible_truncation,
        reason = "ucred is three 32-bit fields: 12 bytes fit a socklen_t"
    )]
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            std::ptr::from_mut(&mut cred).cast::<libc::c_void>(),
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
    host::configure_seccomp(a.seccomp.setting()?)?;
    // The main thread's filter first: every thread started from here on
    // inherits it instead of installing its own.
    spore_vmm::seccomp::apply(spore_vmm::seccomp::ThreadKind::Vmm)?;
    let vmm = Arc::new(Vmm::new(
        "restore".into(),
        VmConfig::default(),
        Box::new(std::io::stdout()),
    ));
    host::stop_on_host_signals(vmm.clone())?;
    crate::run::clear_exit_record(a.api_sock.as_deref());
    let _server = match &a.api_sock {
        Some(path) => Some(
            ApiServer::start(path, vmm.clone())
                .with_context(|| format!("serving the API on {}", path.display()))?,
        ),
        None => None,
    };
    let mem = a.mem.to_string_lossy().into_owned();
    let memory = match (a.uffd_handler, a.mode) {
        (Some(sock), _) => LoadMemory::UffdExternal {
            socket: sock.to_string_lossy().into_owned(),
        },
        (None, Mode::Uffd) => LoadMemory::UffdBuiltin { path: mem },
        (None, m) => LoadMemory::File {
            path: mem,
            mode: match m {
                Mode::Eager => RestoreMode::Eager,
                Mode::WorkingSet => RestoreMode::WorkingSet,
                _ => RestoreMode::Lazy,
            },
        },
    };
    let record_for = a.record_ms.map(std::time::Duration::from_millis);
    let lo = LoadOptions {
        resume: true,
        record_for,
        track_dirty_pages: a.track_dirty_pages.then_some(true),
        parents: a.parents.paths(),
        ..Default::default()
    };
    spore_vmm::seccomp::apply_main()?;
    vmm.load_snapshot_with(&a.state, &memory, &lo)?;
    host::forward_stdin(vmm.clone());
    crate::run::finish(&vmm, a.marks_file.as_deref(), a.api_sock.as_deref())
}

fn uffd_handler(a: UffdHandlerArgs) -> anyhow::Result<u8> {
    use spore_vmm::memory::layers::MemoryLayers;
    use spore_vmm::snapshot::restore::uffd::{receive_from_vmm, serve_loop, PageSource, ServeLog};
    let file =
        std::fs::File::open(&a.mem).with_context(|| format!("opening {}", a.mem.display()))?;
    // The guest-memory part ends where the file's trailer begins.
    let size = spore_vmm::snapshot::trailer::read(&file)
        .with_context(|| format!("the memory file {}", a.mem.display()))?
        .mem_bytes;
    let _ = std::fs::remove_file(&a.sock);
    let listener = std::os::unix::net::UnixListener::bind(&a.sock)
        .with_context(|| format!("listening on {}", a.sock.display()))?;
    let (stream, _) = listener.accept().context("waiting for the VMM")?;
    let (uffd, regions) = receive_from_vmm(&stream).context("receiving the userfaultfd")?;
    let end = regions
        .iter()
        .map(|r| r.offset.saturating_add(r.size))
        .max()
        .unwrap_or(0);
    if end > size {
        bail!(
            "the VMM's memory layout ends at {end} bytes, the memory file {} has {size}",
            a.mem.display()
        );
    }
    // Each region says its page size: 2 MiB for hugetlbfs RAM, filled
    // one whole huge page per fault.
    let pages: std::collections::BTreeSet<u64> = regions.iter().map(|r| r.page_size).collect();
    eprintln!(
        "spore: uffd handler: {} regions, page size {pages:?}",
        regions.len()
    );
    let source = PageSource::new(MemoryLayers::single(file, size), regions)?;
    // Serve until the VMM closes the connection (it exited).
    let log = ServeLog::default();
    serve_loop(&uffd, &source, stream.as_raw_fd(), &log).map_err(anyhow::Error::msg)?;
    eprintln!(
        "spore: uffd handler served {} faults",
        log.faults.load(std::sync::atomic::Ordering::Relaxed)
    );
    Ok(0)
}
