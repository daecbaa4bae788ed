//! The `spore` command: `run` one microVM in the foreground, serve one
//! through the API with `vmm`, and `bench`.

mod api_client;
mod clone_cmd;
mod cluster_cmd;
mod fc_cmd;
mod fn_cmd;
mod host;
mod image_cmd;
mod jailer;
mod mem_cmd;
mod run;
mod sandbox_cmd;
mod serve_cmd;
mod snapshot_cmd;
mod vmm_cmd;
mod vsock_cmd;
mod vsock_forward;

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "spore",
    version,
    about = "KVM microVM monitor and sandbox runtime"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    global: GlobalArgs,
}

/// The options every subcommand takes.
#[derive(Args)]
struct GlobalArgs {
    /// Sign every snapshot state file this process writes with an
    /// HMAC-SHA256 under the key in FILE (32 bytes or more), and refuse
    /// state files without that MAC. Inherited by the VMM processes it
    /// starts (clones, `spore serve`'s instances) through
    /// SPORE_SNAPSHOT_KEY_FILE, which is also read when the flag is absent.
    // Listed after a subcommand's own options, however the command line
    // that carries it was built (see [`VmCli`]).
    #[arg(long, global = true, value_name = "FILE", display_order = 1000)]
    snapshot_key_file: Option<std::path::PathBuf>,
}

/// `spore vmm ...` and `spore run ...` parsed without the other
/// subcommands: the command lines VMM processes start with (`spore serve`'s
/// instances, clone processes, users, benchmarks). Building the full command
/// line cost clap 0.9 ms with musl, half of a VMM's start-up to its API.
#[derive(Parser)]
#[command(name = "spore", version)]
struct VmCli {
    #[command(subcommand)]
    command: VmCommand,
    #[command(flatten)]
    global: GlobalArgs,
}

/// The subcommands [`VmCli`] parses, as [`Command`] has them.
#[derive(Subcommand)]
enum VmCommand {
    #[command(about = RUN_ABOUT)]
    Run(run::RunArgs),
    #[command(about = VMM_ABOUT)]
    Vmm(vmm_cmd::VmmArgs),
}

impl VmCommand {
    /// Whether `VmCli` parses this subcommand.
    fn parses(name: &std::ffi::OsStr) -> bool {
        name == "vmm" || name == "run"
    }
}

impl From<VmCommand> for Command {
    fn from(c: VmCommand) -> Command {
        match c {
            VmCommand::Run(a) => Command::Run(a),
            VmCommand::Vmm(a) => Command::Vmm(a),
        }
    }
}

const RUN_ABOUT: &str = "Run one microVM in the foreground with its serial console on this \
                         terminal; exit with the guest's exit status";
const VMM_ABOUT: &str = "Run one microVM process driven through the REST API on a Unix socket \
                         (Firecracker-compatible), or from a --config-file";

/// The environment variable a process's snapshot key file is passed in.
const KEY_ENV: &str = "SPORE_SNAPSHOT_KEY_FILE";

/// Loads the snapshot key named by the flag or the environment, and passes
/// it on to child processes. Called before any thread starts.
fn set_snapshot_key(flag: Option<std::path::PathBuf>) -> anyhow::Result<()> {
    let path = match flag {
        Some(p) => {
            let p = std::path::absolute(&p).unwrap_or(p);
            std::env::set_var(KEY_ENV, &p);
            p
        }
        None => match std::env::var_os(KEY_ENV) {
            Some(p) if !p.is_empty() => p.into(),
            _ => return Ok(()),
        },
    };
    let key = spore_vmm::snapshot::integrity::SnapshotKey::from_file(&path)?;
    spore_vmm::snapshot::integrity::set_key(key)?;
    Ok(())
}

#[derive(Subcommand)]
enum Command {
    #[command(about = RUN_ABOUT)]
    Run(run::RunArgs),
    #[command(about = VMM_ABOUT)]
    Vmm(vmm_cmd::VmmArgs),
    /// The host end of a VM's vsock: connect to a guest port, or accept a
    /// guest's connection.
    #[command(subcommand)]
    Vsock(vsock_cmd::VsockCommand),
    /// Send one request to a VMM's API socket and print the reply.
    Api(api_client::ApiArgs),
    /// Show or set a running VM's hotplug memory (virtio-mem) target size.
    Mem(mem_cmd::MemArgs),
    /// Snapshots: create one from a running VMM, restore one in a new
    /// process, inspect one.
    #[command(subcommand)]
    Snapshot(snapshot_cmd::SnapshotCommand),
    /// Clone a running VMM's microVM into new VMM processes (copy-on-write
    /// from a frozen template), or keep a pool of clones running.
    Clone(clone_cmd::CloneArgs),
    /// The serverless daemon: functions deployed and invoked through the
    /// AWS Lambda API (boto3, the AWS CLI), each instance a spore microVM.
    Serve(Box<serve_cmd::ServeArgs>),
    /// A spore serve cluster (--cluster): its nodes and catalogue.
    #[command(subcommand)]
    Cluster(cluster_cmd::ClusterCommand),
    /// Deploy, invoke, list and remove spore serve functions, read their
    /// logs and statistics (the same Lambda API the AWS CLI uses).
    Fn(fn_cmd::FnArgs),
    /// Runtime images for Linux functions (read-only ext4 root file systems
    /// from Debian packages, cached by content hash) and function code disks.
    #[command(subcommand)]
    Image(image_cmd::ImageCommand),
    /// Sandboxes for agents (E2B's API in `spore serve --sandbox-listen`):
    /// their templates.
    #[command(subcommand)]
    Sandbox(sandbox_cmd::SandboxCommand),
    /// Benchmarks; print JSON.
    #[command(subcommand)]
    Bench(spore_bench::BenchCommand),
    /// Firecracker's command line (`spore firecracker --api-sock ...`), as
    /// spore answers when called through a symlink named `firecracker`.
    #[command(disable_help_flag = true)]
    Firecracker {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
    /// Firecracker's jailer (`spore jailer --id ID --exec-file BIN --uid N
    /// --gid N ...`), as spore answers when called through a symlink named
    /// `jailer`: runs BIN chrooted, in its own mount namespace and cgroup,
    /// as an unprivileged user.
    #[command(disable_help_flag = true)]
    Jailer {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
}

fn main() -> ExitCode {
    host::init_logging();
    spore_vmm::phase::mark("main");
    // Called as `firecracker` (a symlink to spore): Firecracker's command line.
    let argv0 = std::env::args_os().next().unwrap_or_default();
    // Firecracker's command line has no positional arguments: `vmm` first is
    // a clone process that a VMM running as `firecracker` (a jailed copy
    // of spore named so) started from its own binary.
    let own_subcommand = std::env::args_os().nth(1).is_some_and(|a| a == "vmm");
    if std::path::Path::new(&argv0).file_name() == Some(std::ffi::OsStr::new("firecracker"))
        && !own_subcommand
    {
        return ExitCode::from(fc_cmd::main(std::env::args_os().collect()));
    }
    // Called as `jailer` (a symlink to spore): Firecracker's jailer.
    if std::path::Path::new(&argv0).file_name() == Some(std::ffi::OsStr::new("jailer")) {
        return ExitCode::from(jailer::main(std::env::args_os().collect()));
    }
    // Exec'd by a jailer (Firecracker's or spore's), spore gets `--id` as
    // its first argument, where its own command line has a subcommand:
    // Firecracker's command line.
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == "--id" || a.to_string_lossy().starts_with("--id="))
    {
        let argv = std::iter::once("firecracker".into())
            .chain(std::env::args_os().skip(1))
            .collect();
        return ExitCode::from(fc_cmd::main(argv));
    }
    let quick = std::env::args_os()
        .nth(1)
        .is_some_and(|a| VmCommand::parses(&a));
    let (command, global) = if quick {
        let VmCli { command, global } = VmCli::parse();
        (command.into(), global)
    } else {
        let Cli { command, global } = Cli::parse();
        (command, global)
    };
    if let Err(e) = set_snapshot_key(global.snapshot_key_file) {
        eprintln!("spore: error: {}", one_line(&e));
        return ExitCode::from(1);
    }
    let result = match command {
        Command::Run(a) => run::run(a),
        Command::Vmm(a) => vmm_cmd::run(a),
        Command::Bench(b) => spore_bench::run(b),
        Command::Vsock(v) => vsock_cmd::run(v),
        Command::Api(a) => api_client::run(a),
        Command::Mem(a) => mem_cmd::run(a),
        Command::Snapshot(s) => snapshot_cmd::run(s),
        Command::Clone(a) => clone_cmd::run(a),
        Command::Serve(a) => serve_cmd::run(*a),
        Command::Cluster(c) => cluster_cmd::run(c),
        Command::Fn(a) => fn_cmd::run(a),
        Command::Image(c) => image_cmd::run(c),
        Command::Sandbox(c) => sandbox_cmd::run(c),
        Command::Firecracker { args } => {
            let argv = std::iter::once("firecracker".into()).chain(args).collect();
            return ExitCode::from(fc_cmd::main(argv));
        }
        Command::Jailer { args } => {
            let argv = std::iter::once("jailer".into()).chain(args).collect();
            return ExitCode::from(jailer::main(argv));
        }
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("spore: error: {}", one_line(&e));
            ExitCode::from(1)
        }
    }
}

/// The error and its causes on one line. Many of spore's error messages
/// already quote their source, so a cause whose text is already there is
/// not repeated.
pub(crate) fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `spore vmm ...` and `spore run ...` parsed without the other
    /// subcommands give what the full command line gives: the same
    /// arguments, errors and help.
    #[test]
    fn vm_subcommands_parse_as_the_full_command_line() {
        let render = |r: Result<(Command, GlobalArgs), clap::Error>| match r {
            Ok((Command::Vmm(a), g)) => format!("vmm {a:?} {:?}", g.snapshot_key_file),
            Ok((Command::Run(a), g)) => format!("run {a:?} {:?}", g.snapshot_key_file),
            Ok(_) => "another subcommand".into(),
            Err(e) => format!("{:?}: {e}", e.kind()),
        };
        for argv in [
            &["spore", "vmm", "--api-sock", "/s"][..],
            &[
                "spore",
                "vmm",
                "--config-file",
                "/c",
                "--id",
                "x",
                "--no-seccomp",
            ],
            &[
                "spore",
                "vmm",
                "--api-sock",
                "/s",
                "--snapshot-key-file",
                "/k",
            ],
            &[
                "spore",
                "vmm",
                "--api-sock",
                "/s",
                "--seccomp-filter",
                "/f",
                "--no-seccomp",
            ],
            &["spore", "vmm", "--bogus"],
            &["spore", "vmm", "--help"],
            &["spore", "vmm", "--clone-prepare", "128,1"],
            &["spore", "run", "--kernel", "/k"],
            &[
                "spore",
                "run",
                "--kernel",
                "/k",
                "--mem",
                "64M",
                "--snapshot-key-file",
                "/s",
            ],
            &["spore", "run", "--help"],
            &["spore", "run", "--bogus"],
            &["spore", "run"],
        ] {
            assert!(VmCommand::parses(std::ffi::OsStr::new(argv[1])));
            let full = Cli::try_parse_from(argv).map(|c| (c.command, c.global));
            let quick = VmCli::try_parse_from(argv).map(|c| (c.command.into(), c.global));
            assert_eq!(render(full), render(quick), "{argv:?}");
        }
    }
}
