//! `spore vmm`: one microVM process behind the REST API.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::Args;
use spore_vmm::api::server::MAX_BODY_BYTES;
use spore_vmm::api::ApiServer;
use spore_vmm::clone::args::ClonedProcessArgs;
use spore_vmm::config::VmConfig;
use spore_vmm::vmm::{clone_process, Vmm};

use crate::host;

#[derive(Args, Debug)]
pub struct VmmArgs {
    /// Serve the API on this Unix socket.
    #[arg(long)]
    pub api_sock: Option<PathBuf>,
    /// Boot at once from this JSON file (Firecracker's config-file layout).
    #[arg(long)]
    pub config_file: Option<PathBuf>,
    /// Instance id reported by `GET /`.
    #[arg(long, default_value = "spore-vm")]
    pub id: String,
    /// Write the guest's signal-port marks here as JSON when the VM stops.
    #[arg(long)]
    pub marks_file: Option<PathBuf>,
    /// Run as a clone: wait on this inherited socket for a template from
    /// the source VMM (set by the source when it starts a clone; not for
    /// interactive use).
    #[arg(long, value_name = "FD", conflicts_with = "config_file")]
    pub clone_handoff: Option<i32>,
    /// With --clone-handoff: make the KVM VM and memory slots for a
    /// `MIB,VCPUS` VM while waiting for the template.
    #[arg(long, value_name = "MIB,VCPUS", requires = "clone_handoff")]
    pub clone_prepare: Option<String>,
    /// Run as a source VMM's clone factory: fork clone processes on orders
    /// from this inherited socket (started by the source; not for
    /// interactive use).
    #[arg(long, value_name = "FD", hide = true, conflicts_with_all = ["config_file", "clone_handoff"])]
    pub clone_factory: Option<i32>,
    /// With --clone-factory: where the source's clones go (shown on the
    /// factory's command line, for `ps` and `spore serve`'s recovery).
    #[arg(long, value_name = "DIR", hide = true, requires = "clone_factory")]
    pub clone_dir: Option<PathBuf>,
    /// Enter this network namespace (a file such as `/run/netns/NAME`, as
    /// `ip netns add` makes) before anything else: the VM's taps are then
    /// opened, by name, in that namespace. `spore serve` starts the VMMs of
    /// networked functions this way; clones this VMM starts begin in it too.
    #[arg(long, value_name = "PATH")]
    pub netns: Option<PathBuf>,
    /// Become this user (`UID:GID[:GROUP,…]`, supplementary groups after
    /// the second colon) right after entering `--netns`, keeping only the
    /// handles a VMM needs (`/dev/kvm`, `/dev/userfaultfd`, its own
    /// executable), before the seccomp filter. Needs root; `spore serve`
    /// starts every instance's VMM this way. Clones it starts run as that
    /// user too.
    #[arg(long, value_name = "UID:GID[:GROUPS]", value_parser = spore_vmm::privilege::parse_identity)]
    pub user: Option<spore_vmm::privilege::Identity>,
    /// With --user: before becoming that user, enter a root of its own at
    /// this empty directory (a private mount namespace, a read-only tmpfs
    /// showing only the --bind and --bind-ro paths, each at its own path,
    /// and a /proc of its own processes). Clones it starts share it.
    #[arg(long, value_name = "DIR", requires = "user")]
    pub chroot: Option<PathBuf>,
    /// With --chroot: a host path the root shows, writable (repeatable).
    #[arg(long, value_name = "PATH", requires = "chroot")]
    pub bind: Vec<PathBuf>,
    /// With --chroot: a host path the root shows, read-only (repeatable).
    #[arg(long, value_name = "PATH", requires = "chroot")]
    pub bind_ro: Vec<PathBuf>,
    #[command(flatten)]
    pub seccomp: host::SeccompArgs,
    /// The API's request body limit (set by `firecracker
    /// --http-api-max-payload-size`; `spore vmm` keeps the default).
    #[arg(skip)]
    pub api_max_body: Option<usize>,
    /// The MMDS data store's size limit (`firecracker --mmds-size-limit`).
    #[arg(skip)]
    pub mmds_size_limit: Option<usize>,
    /// The MMDS's initial contents (`firecracker --metadata`).
    #[arg(skip)]
    pub metadata: Option<serde_json::Value>,
}

pub fn run(mut args: VmmArgs) -> anyhow::Result<u8> {
    if let Some(path) = &args.netns {
        enter_netns(path)?;
    }
    match &args.user {
        // The executable too: after the drop, /proc/self/exe is no longer
        // this process's to open.
        Some(who) => {
            spore_vmm::own_exe::open_at_start();
            let binds: Vec<spore_vmm::privilege::Bind> = (args.bind.iter().map(|p| (p, true)))
                .chain(args.bind_ro.iter().map(|p| (p, false)))
                .map(|(path, writable)| spore_vmm::privilege::Bind {
                    path: path.clone(),
                    writable,
                })
                .collect();
            let root = args.chroot.as_deref().map(|dir| (dir, &binds[..]));
            spore_vmm::privilege::drop_to(who, args.netns.is_some(), root)
                .with_context(|| format!("--user {}:{}: becoming that user", who.uid, who.gid))?;
        }
        None => spore_vmm::privilege::adopt_inherited(),
    }
    if let Some(fd) = args.clone_handoff {
        return run_clone(args, fd);
    }
    if let Some(fd) = args.clone_factory {
        return run_factory(args, fd);
    }
    if args.api_sock.is_none() && args.config_file.is_none() {
        bail!("give --api-sock PATH, --config-file FILE, or both");
    }
    host::configure_seccomp(args.seccomp.setting()?)?;
    // The main thread's filter first: every thread started from here on
    // inherits it instead of installing its own.
    spore_vmm::seccomp::apply(spore_vmm::seccomp::ThreadKind::Vmm)?;
    spore_vmm::phase::mark("vmm: seccomp filter on");
    let config = match &args.config_file {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            let config: VmConfig = serde_json::from_str(&text)
                .with_context(|| format!("parsing {}", path.display()))?;
            config
                .validate()
                .with_context(|| format!("checking {}", path.display()))?;
            config
        }
        None => VmConfig::default(),
    };
    let vmm = Arc::new(Vmm::new(
        args.id.clone(),
        config,
        Box::new(std::io::stdout()),
    ));
    host::stop_on_host_signals(vmm.clone())?;
    // KVM_CREATE_VM while the requests that configure the VM arrive (on a
    // thread started after the host signals are blocked: it inherits that).
    spore_vmm::builder::make_vm_ahead();
    // The first vCPU's thread too, its seccomp filter on, waiting for the
    // VM this process boots or restores: thread creation off the path from
    // a snapshot load to the guest's first instruction.
    if let Err(e) = spore_vmm::vm::vcpu::prespawn_threads(1) {
        tracing::warn!("cannot start a vCPU thread ahead: {e}");
    }
    if let Some(limit) = args.mmds_size_limit {
        vmm.set_mmds_size_limit(limit);
    }
    if let Some(data) = args.metadata.take() {
        vmm.put_mmds(data)
            .map_err(|e| anyhow::anyhow!("--metadata: {e}"))?;
    }
    vmm.enable_guest_fork();
    vmm.enable_background_standby();
    if let Some(path) = &args.api_sock {
        vmm.set_api_socket(path);
    }
    crate::run::clear_exit_record(args.api_sock.as_deref());
    // A config file's logger and metrics sections, as Firecracker applies them.
    vmm.configure_outputs().map_err(anyhow::Error::msg)?;
    let max_body = args.api_max_body.unwrap_or(MAX_BODY_BYTES);
    let _server = match &args.api_sock {
        Some(path) => Some(
            ApiServer::start_with_limit(path, vmm.clone(), max_body)
                .with_context(|| format!("serving the API on {}", path.display()))?,
        ),
        None => None,
    };
    spore_vmm::phase::mark("vmm: configured, API serving");
    // The spawner thread (for workers that vCPU threads start); the main
    // thread's filter is on already, before any guest code runs.
    spore_vmm::seccomp::apply_main()?;
    if args.config_file.is_some() {
        vmm.start()?;
        spore_vmm::phase::mark("vmm: VM started from the config file");
    }
    // The server (and its socket file) goes away when `_server` drops.
    crate::run::finish(&vmm, args.marks_file.as_deref(), args.api_sock.as_deref())
}

/// `--clone-handoff FD`: this process is a clone the source VMM started;
/// the library decides what the flags mean and runs it.
fn run_clone(args: VmmArgs, fd: i32) -> anyhow::Result<u8> {
    let clone_args = ClonedProcessArgs::from_flags(
        args.api_sock,
        args.id,
        fd,
        args.clone_prepare.as_deref(),
        args.marks_file,
        args.seccomp.setting()?,
    )?;
    host::configure_seccomp(clone_args.seccomp.clone())?;
    run_cloned_process(clone_args)
}

/// `--clone-factory FD`: forks clone processes for the source VMM that
/// started it (`spore_vmm::clone::factory`). Its seccomp set-up is done
/// once here, for every clone it forks.
fn run_factory(args: VmmArgs, fd: i32) -> anyhow::Result<u8> {
    host::configure_seccomp(args.seccomp.setting()?)?;
    Ok(spore_vmm::clone::factory::serve(
        fd,
        &|clone_args| match run_cloned_process(clone_args) {
            Ok(code) => code,
            Err(e) => {
                eprintln!("spore: error: {}", crate::one_line(&e));
                1
            }
        },
    ))
}

/// A clone process from its arguments, spawned or forked, once seccomp is
/// configured: restores, runs and serves the clone until it stops.
fn run_cloned_process(clone_args: ClonedProcessArgs) -> anyhow::Result<u8> {
    let vmm = Arc::new(Vmm::new(
        clone_args.id.clone(),
        VmConfig::default(),
        Box::new(std::io::stdout()),
    ));
    // Before any other thread starts, so that they inherit the signal mask.
    host::stop_on_host_signals(vmm.clone())?;
    crate::run::clear_exit_record(Some(&clone_args.api_sock));
    let Some(server) = clone_process::run(&vmm, &clone_args)? else {
        return Ok(0);
    };
    let code = crate::run::finish(
        &vmm,
        clone_args.marks_file.as_deref(),
        Some(clone_args.api_sock.as_path()),
    );
    drop(server);
    code
}

/// `--netns PATH`: moves this process (still one thread: setns changes the
/// calling thread only, and every thread started later inherits it) into
/// the network namespace the file names. Before the seccomp filters, which
/// do not allow setns in the main thread's list.
fn enter_netns(path: &std::path::Path) -> anyhow::Result<()> {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(path).with_context(|| {
        format!(
            "--netns {}: cannot open the network namespace file (make it first, e.g. `ip netns add NAME` gives /run/netns/NAME)",
            path.display()
        )
    })?;
    // SAFETY: setns on a file descriptor we own; the result is checked.
    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        bail!(
            "--netns {}: cannot enter the network namespace: {}",
            path.display(),
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}
