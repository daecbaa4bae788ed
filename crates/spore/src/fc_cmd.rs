//! spore called as `firecracker` (argv[0], e.g. a symlink) or as
//! `spore firecracker`: Firecracker's command line, running the same VMM as
//! `spore vmm`.
//!
//! Every flag of Firecracker's `--help` (v1.17) is accepted with its syntax
//! (`--flag value`). What spore does with each:
//!
//! - `--api-sock`, `--id`, `--config-file`, `--no-api`: as `spore vmm`
//!   (Firecracker's defaults: `/run/firecracker.socket`, `anonymous-instance`).
//! - `--level`, `--log-path`, `--show-level`, `--show-log-origin`, `--module`:
//!   spore's log lines to that file or FIFO (`spore_vmm::logger`); `--level`
//!   without `--log-path` logs to stderr.
//! - `--metrics-path`: Firecracker's JSON-lines metrics (`spore_vmm::metrics`);
//!   `--start-time-us`, `--start-time-cpu-us`, `--parent-cpu-time-us` fill its
//!   `api_server.process_startup_time_*`.
//! - `--http-api-max-payload-size`: the API's request body limit.
//! - `--boot-timer`: logs the guest's boot time at its first signal-port mark.
//! - `--version`, `--snapshot-version`, `--describe-snapshot`: printed in
//!   Firecracker's format, for spore's versions.
//! - `--mmds-size-limit` (default: the API payload limit) and `--metadata`
//!   (the MMDS's initial contents).
//! - Accepted, validated and ignored (spore has no such thing yet):
//!   `--enable-pci`.
//!
//! Exit codes follow Firecracker's: 153 for a command line that does not
//! parse (Firecracker aborts with 134 on a bad number; spore says which flag
//! and exits 153), 152 for a bad logger level, 1 for other failures.

use std::ffi::OsString;
use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use spore_vmm::api::body::FIRECRACKER_VERSION;
use spore_vmm::config::{LogLevel, LoggerConfig, MetricsConfig};
use spore_vmm::snapshot::format::{read_state_file, FORMAT_VERSION};

use crate::host::SeccompArgs;
use crate::vmm_cmd::VmmArgs;

/// Firecracker's exit code for a command line that does not parse.
pub const EXIT_ARG_PARSING: u8 = 153;
/// Firecracker's exit code for a bad configuration (an unknown log level).
pub const EXIT_BAD_CONFIGURATION: u8 = 152;

/// Firecracker's command line (the flags of `firecracker --help`, v1.17).
#[derive(Parser, Debug)]
#[command(
    name = "firecracker",
    disable_version_flag = true,
    about = "spore, answering Firecracker's command line"
)]
pub struct FcArgs {
    /// Path to unix domain socket used by the API.
    #[arg(long, default_value = "/run/firecracker.socket")]
    api_sock: PathBuf,
    /// Whether or not to load boot timer device for logging elapsed time
    /// since InstanceStart command (spore: the guest's first signal-port mark).
    #[arg(long)]
    boot_timer: bool,
    /// Path to a file that contains the microVM configuration in JSON format.
    #[arg(long)]
    config_file: Option<PathBuf>,
    /// Print the data format version of the provided snapshot state file.
    #[arg(long, value_name = "describe-snapshot")]
    describe_snapshot: Option<PathBuf>,
    /// Enables PCIe support (accepted; spore's devices are virtio-mmio).
    #[arg(long)]
    enable_pci: bool,
    /// Http API request payload max size, in bytes.
    #[arg(long, default_value_t = 51200)]
    http_api_max_payload_size: usize,
    /// MicroVM unique identifier.
    #[arg(long, default_value = "anonymous-instance", value_parser = parse_id)]
    id: String,
    /// Set the logger level.
    #[arg(long)]
    level: Option<String>,
    /// Path to a fifo or a file used for configuring the logger on startup.
    #[arg(long)]
    log_path: Option<PathBuf>,
    /// Path to a file that contains metadata in JSON format to add to the
    /// mmds.
    #[arg(long)]
    metadata: Option<PathBuf>,
    /// Path to a fifo or a file used for configuring the metrics on startup.
    #[arg(long)]
    metrics_path: Option<PathBuf>,
    /// Mmds data store limit, in bytes (accepted; spore has no MMDS yet).
    #[arg(long)]
    mmds_size_limit: Option<usize>,
    /// Set the logger module filter.
    #[arg(long)]
    module: Option<String>,
    /// Start without an API socket, from --config-file.
    #[arg(long, requires = "config_file")]
    no_api: bool,
    /// Start without seccomp filtering.
    #[arg(long)]
    no_seccomp: bool,
    /// Parent process CPU time (wall clock, microseconds).
    #[arg(long)]
    parent_cpu_time_us: Option<u64>,
    /// Path to a custom seccomp filter (with --no-seccomp: refused, as
    /// Firecracker refuses it).
    #[arg(long, conflicts_with = "no_seccomp")]
    seccomp_filter: Option<PathBuf>,
    /// Whether or not to output the level in the logs.
    #[arg(long)]
    show_level: bool,
    /// Whether or not to include the file path and line number of the log's origin.
    #[arg(long)]
    show_log_origin: bool,
    /// Print the supported data format version.
    #[arg(long)]
    snapshot_version: bool,
    /// Process start CPU time (wall clock, microseconds).
    #[arg(long)]
    start_time_cpu_us: Option<u64>,
    /// Process start time (wall clock, microseconds).
    #[arg(long)]
    start_time_us: Option<u64>,
    /// Print the binary version number.
    #[arg(long)]
    version: bool,
}

/// Firecracker's instance id rule: 1 to 64 ASCII letters, digits and `-`.
fn parse_id(s: &str) -> Result<String, String> {
    if s.is_empty() || s.len() > 64 {
        return Err(format!(
            "invalid instance id: {} characters (1 to 64)",
            s.len()
        ));
    }
    if let Some(c) = s
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '-'))
    {
        return Err(format!(
            "invalid instance id: {c:?} (only letters, digits and '-')"
        ));
    }
    Ok(s.to_string())
}

/// Parses Firecracker's command line (`args[0]` is the program name) and
/// runs it; returns the exit code.
pub fn main(args: Vec<OsString>) -> u8 {
    let fc = match FcArgs::try_parse_from(args) {
        Ok(a) => a,
        Err(e) => {
            let code = if e.use_stderr() { EXIT_ARG_PARSING } else { 0 };
            let _ = e.print();
            return code;
        }
    };
    match run(fc) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("spore: error: {}", crate::one_line(&e));
            e.downcast_ref::<ExitCode>().map_or(1, |c| c.0)
        }
    }
}

/// An error that exits with a given code.
#[derive(Debug, thiserror::Error)]
#[error("{1}")]
struct ExitCode(u8, String);

fn run(fc: FcArgs) -> anyhow::Result<u8> {
    if fc.version {
        // Firecracker's first line, so that tools which parse
        // `firecracker --version` (to gate features on the version) read
        // the Firecracker API version spore answers as; spore's own next.
        println!("Firecracker v{FIRECRACKER_VERSION}\n");
        println!(
            "spore v{} (Firecracker-compatible)",
            env!("CARGO_PKG_VERSION")
        );
        return Ok(0);
    }
    if fc.snapshot_version {
        println!("v{FORMAT_VERSION}.0.0");
        return Ok(0);
    }
    if let Some(path) = &fc.describe_snapshot {
        // Firecracker prints the state file's data format version.
        let (manifest, _) = read_state_file(path)
            .with_context(|| "when printing the snapshot data format".to_string())?;
        println!("v{}.0.0", manifest.format_version);
        return Ok(0);
    }
    let level = match &fc.level {
        Some(l) => Some(
            l.parse::<LogLevel>()
                .map_err(|e| anyhow::Error::new(ExitCode(EXIT_BAD_CONFIGURATION, e)))?,
        ),
        None => None,
    };
    // Read now, so a bad file fails before anything starts; put into the
    // MMDS by `spore vmm` once the VMM exists.
    let metadata = match &fc.metadata {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("--metadata: reading {}", path.display()))?;
            Some(
                serde_json::from_str::<serde_json::Value>(&text)
                    .with_context(|| format!("--metadata: {} is not JSON", path.display()))?,
            )
        }
        None => None,
    };
    let _ = fc.enable_pci;
    if fc.log_path.is_some() || level.is_some() {
        let path = fc
            .log_path
            .clone()
            .unwrap_or_else(|| PathBuf::from("/dev/stderr"));
        let c = LoggerConfig {
            log_path: Some(path.to_string_lossy().into_owned()),
            level,
            show_level: Some(fc.show_level),
            show_log_origin: Some(fc.show_log_origin),
            module: fc.module.clone(),
        };
        spore_vmm::logger::configure(&c, &fc.id).map_err(anyhow::Error::msg)?;
    }
    if let Some(path) = &fc.metrics_path {
        let c = MetricsConfig {
            metrics_path: path.to_string_lossy().into_owned(),
            emit_id: None,
        };
        spore_vmm::metrics::configure(&c, &fc.id).map_err(anyhow::Error::msg)?;
    }
    if fc.boot_timer {
        spore_vmm::boot_timer::arm();
    }
    tracing::info!(
        "Running Firecracker v{FIRECRACKER_VERSION} (spore v{})",
        env!("CARGO_PKG_VERSION")
    );
    let mut vmm = vmm_args(&fc);
    vmm.api_max_body = Some(fc.http_api_max_payload_size);
    // Firecracker's default MMDS limit is the API payload limit.
    vmm.mmds_size_limit = Some(fc.mmds_size_limit.unwrap_or(fc.http_api_max_payload_size));
    vmm.metadata = metadata;
    spore_vmm::metrics::record_startup(
        fc.start_time_us,
        fc.start_time_cpu_us,
        fc.parent_cpu_time_us.unwrap_or(0),
    );
    crate::vmm_cmd::run(vmm)
}

/// Firecracker's flags as `spore vmm`'s (the seccomp flags are the same;
/// [`FcArgs`] refused both at once), made directly rather than by parsing a
/// second command line: start-up time.
fn vmm_args(fc: &FcArgs) -> VmmArgs {
    VmmArgs {
        api_sock: (!fc.no_api).then(|| fc.api_sock.clone()),
        config_file: fc.config_file.clone(),
        id: fc.id.clone(),
        marks_file: None,
        clone_handoff: None,
        clone_prepare: None,
        clone_factory: None,
        clone_dir: None,
        netns: None,
        user: None,
        chroot: None,
        bind: Vec::new(),
        bind_ro: Vec::new(),
        seccomp: SeccompArgs {
            no_seccomp: fc.no_seccomp,
            seccomp_filter: fc.seccomp_filter.clone(),
        },
        api_max_body: None,
        mmds_size_limit: None,
        metadata: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<FcArgs, clap::Error> {
        FcArgs::try_parse_from(std::iter::once("firecracker").chain(args.iter().copied()))
    }

    #[test]
    fn every_flag_of_firecrackers_help_parses() {
        let a = parse(&[
            "--api-sock",
            "/s",
            "--boot-timer",
            "--config-file",
            "/c",
            "--enable-pci",
            "--http-api-max-payload-size",
            "1000",
            "--id",
            "vm-1",
            "--level",
            "Debug",
            "--log-path",
            "/l",
            "--metadata",
            "/m",
            "--metrics-path",
            "/mt",
            "--mmds-size-limit",
            "10",
            "--module",
            "api",
            "--no-api",
            "--parent-cpu-time-us",
            "1",
            "--seccomp-filter",
            "/f",
            "--show-level",
            "--show-log-origin",
            "--start-time-cpu-us",
            "2",
            "--start-time-us",
            "3",
        ])
        .unwrap();
        assert_eq!(a.id, "vm-1");
        assert_eq!(a.http_api_max_payload_size, 1000);
        assert!(a.no_api && a.boot_timer && a.show_level);
        for flag in ["--version", "--snapshot-version"] {
            parse(&[flag]).unwrap();
        }
        // As in Firecracker: either flag, not both.
        parse(&["--no-seccomp"]).unwrap();
        assert!(parse(&["--no-seccomp", "--seccomp-filter", "/f"]).is_err());
        parse(&["--describe-snapshot", "/x"]).unwrap();
        let d = parse(&[]).unwrap();
        assert_eq!(d.api_sock, PathBuf::from("/run/firecracker.socket"));
        assert_eq!(d.id, "anonymous-instance");
        assert_eq!(d.http_api_max_payload_size, 51200);
    }

    /// The translation makes what `spore vmm` parses from the same flags.
    #[test]
    fn flags_translate_as_spore_vmm_parses_them() {
        #[derive(Parser)]
        struct Vmm {
            #[command(flatten)]
            args: VmmArgs,
        }
        let cases: [(&[&str], &[&str]); 4] = [
            (&[], &["--api-sock", "/run/firecracker.socket"]),
            (
                &[
                    "--api-sock",
                    "/s",
                    "--config-file",
                    "/c",
                    "--id",
                    "vm-1",
                    "--no-seccomp",
                ],
                &["--api-sock", "/s", "--config-file", "/c", "--no-seccomp"],
            ),
            (
                &["--no-api", "--config-file", "/c", "--seccomp-filter", "/f"],
                &["--config-file", "/c", "--seccomp-filter", "/f"],
            ),
            (&["--api-sock", "/s", "--id", "x"], &["--api-sock", "/s"]),
        ];
        for (fc_flags, vmm_flags) in cases {
            let fc = parse(fc_flags).unwrap();
            // (the id is always passed on: Firecracker has a default one)
            let mut argv = vec!["vmm", "--id", fc.id.as_str()];
            argv.extend_from_slice(vmm_flags);
            let parsed = Vmm::try_parse_from(argv).unwrap().args;
            assert_eq!(
                format!("{:?}", vmm_args(&fc)),
                format!("{parsed:?}"),
                "{fc_flags:?}"
            );
        }
    }

    #[test]
    fn bad_values_are_refused() {
        for args in [
            &["--id", "bad_id"][..],
            &["--id", &"a".repeat(65)],
            &["--http-api-max-payload-size", "x"],
            &["--mmds-size-limit", "-1"],
            &["--start-time-us", "abc"],
            &["--parent-cpu-time-us", "-1"],
            &["--no-api"],
            &["--module"],
            &["--bogus"],
            &["-api-sock", "/s"],
        ] {
            assert!(parse(args).is_err(), "{args:?}");
        }
    }
}
