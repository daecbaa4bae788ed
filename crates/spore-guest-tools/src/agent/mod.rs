//! `spore-agent`: PID 1 of Linux function guests. It relays invocations
//! from the host (the framed protocol of `spore_abi::function`, over vsock)
//! to a language runtime speaking the AWS Lambda Runtime API on
//! 127.0.0.1:9001 inside the guest.
//!
//! - [`child`]: what every child gets between fork and exec;
//! - [`config`]: the agent's options and the Configure JSON;
//! - [`host_link`]: the host's socket and its frames;
//! - [`state`]: where the host link and the Runtime API meet;
//! - [`runtime_api`]: the HTTP server the runtime calls;
//! - [`runtime`]: the runtime process, its environment and its output;
//! - [`pid1`]: mounts, reaping, code device, reseed, power-off;
//! - [`meminfo`]: what a function's init cost in memory (logged at Ready);
//! - [`sandbox`]: sandbox mode (`spore.mode=sandbox`): PID 1 keeping spore-envd up;
//! - [`guest_net`]: a sandbox's `eth0`, from the kernel command line.
//!
//! Per host connection ([`session`]): an agent without a function sends
//! `Standby` once the runtime's pre-init is done and waits for `Configure`;
//! then, when the runtime waits in `/next`, `Ready`; then invocations. An
//! init failure is answered with `InitError`. A newer connection replaces
//! the current one (a clone or restored VM reconnects while the old
//! connection may never see its end).

pub mod child;
pub mod config;
pub mod guest_net;
pub mod host_link;
pub mod meminfo;
pub mod pid1;
pub mod runtime;
pub mod runtime_api;
pub mod sandbox;
pub mod state;

use std::net::TcpListener;
use std::process::ExitCode;
use std::sync::{mpsc, Arc, Mutex};

use config::{FunctionConfig, Options};
use host_link::{read_frame, write_frame, Link, Listener, ReadError};
use runtime::{error_json, lock};
use spore_abi::function::{Kind, MAX_LOG, MAX_PAYLOAD};
use state::{Agent, InitFailure, Invocation, Wait};

/// Runs the agent; returns only on a fatal error outside PID 1.
pub fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let as_pid1 = pid1::is_pid1() && !args.iter().any(|a| a == "--no-pid1");
    if as_pid1 {
        // Before any thread exists, so that every thread inherits the mask.
        pid1::block_stop_signals();
        pid1::halt_on_panic();
        pid1::mount_basics();
    }
    let cmdline = if as_pid1 {
        std::fs::read_to_string("/proc/cmdline").unwrap_or_default()
    } else {
        String::new()
    };
    if as_pid1 && config::cmdline_value(&cmdline, "spore.mode") == Some("sandbox") {
        sandbox::run(&cmdline);
    }
    let result = Options::parse(&args, as_pid1, &cmdline).and_then(run);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("spore-agent: {e}");
            if as_pid1 {
                // PID 1 must not exit; stop the VM instead.
                // SAFETY: sync(2) has no preconditions.
                unsafe { libc::sync() };
                if let Ok(port) = crate::port::SignalPort::open() {
                    port.write(spore_abi::signal::encode(
                        spore_abi::signal::SignalOp::Exit,
                        1,
                    ));
                }
                // SAFETY: reboot(2) as PID 1, after syncing.
                unsafe { libc::reboot(libc::RB_POWER_OFF) };
            }
            ExitCode::FAILURE
        }
    }
}

fn run(opts: Options) -> Result<(), String> {
    if opts.pid1 {
        if let Err(e) = pid1::loopback_up() {
            eprintln!("spore-agent: bringing lo up: {e}");
        }
    }
    let api = TcpListener::bind(opts.runtime_api)
        .map_err(|e| format!("runtime API on {}: {e}", opts.runtime_api))?;
    let api_addr = api.local_addr().map_err(|e| e.to_string())?;
    let links = Listener::bind(&opts.host_link)
        .map_err(|e| format!("host link {:?}: {e}", opts.host_link))?;
    let agent = Agent::new(opts, api_addr);
    if agent.opts.pid1 {
        pid1::start_reaper(Arc::clone(&agent));
        pid1::start_stop_handler(Arc::clone(&agent));
        pid1::start_generation_watcher();
    }
    {
        let agent = Arc::clone(&agent);
        std::thread::spawn(move || runtime_api::serve(agent, api));
    }
    eprintln!(
        "spore-agent: runtime {:?}, Runtime API on {api_addr}, host link {:?}",
        agent.opts.runtime, agent.opts.host_link
    );
    agent.start_preinit();

    let (tx, rx) = mpsc::channel::<(Link, u64)>();
    let active: Arc<Mutex<Option<Link>>> = Arc::default();
    {
        let agent = Arc::clone(&agent);
        let active = Arc::clone(&active);
        std::thread::spawn(move || loop {
            let link = match links.accept() {
                Ok(l) => l,
                Err(e) => {
                    eprintln!("spore-agent: host link accept: {e}");
                    std::thread::sleep(std::time::Duration::from_millis(100));
                    continue;
                }
            };
            let link_gen = agent.new_link();
            if let Some(old) = lock(&active).replace(match link.try_clone() {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("spore-agent: host link: {e}");
                    continue;
                }
            }) {
                // The newest connection wins: the old one stops.
                old.shutdown();
            }
            if tx.send((link, link_gen)).is_err() {
                return;
            }
        });
    }
    for (mut link, link_gen) in rx {
        match session(&agent, &mut link, link_gen) {
            Ok(()) => eprintln!("spore-agent: host link closed"),
            Err(e) => eprintln!("spore-agent: host link dropped: {e}"),
        }
        // The acceptor holds a clone (to end a superseded link): dropping
        // ours would not close the connection.
        link.shutdown();
    }
    Err("host link acceptor stopped".into())
}

/// Request ids go into HTTP headers and paths: a conservative alphabet.
fn valid_request_id(id: &str) -> bool {
    !id.is_empty()
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c))
}

fn send_init_error(link: &mut Link, f: &InitFailure) -> Result<(), String> {
    let body = &f.body[..f.body.len().min(MAX_PAYLOAD as usize)];
    let log = tail(&f.log, MAX_LOG as usize);
    write_frame(link, Kind::InitError, body, log, f.init_ns).map_err(|e| e.to_string())
}

fn tail(b: &[u8], max: usize) -> &[u8] {
    &b[b.len().saturating_sub(max)..]
}

/// Why a Configure could not be applied; the agent stays unconfigured.
fn refuse_configure(link: &mut Link, error_type: &str, message: &str) -> Result<(), String> {
    eprintln!("spore-agent: Configure refused: {message}");
    let f = InitFailure {
        body: error_json(error_type, message),
        log: Vec::new(),
        init_ns: 0,
    };
    send_init_error(link, &f)?;
    Err(format!("Configure refused: {message}"))
}

/// One host connection, until it ends.
pub fn session(agent: &Arc<Agent>, link: &mut Link, link_gen: u64) -> Result<(), String> {
    let io = |e: std::io::Error| e.to_string();
    if !agent.is_configured() {
        match agent.wait_standby(link_gen) {
            Wait::Done(()) => {}
            Wait::InitFailed(f) => return send_init_error(link, &f),
            Wait::Superseded => return Ok(()),
        }
        let since_start = state::saturating_u64(agent.started.elapsed().as_micros());
        write_frame(link, Kind::Standby, &[], &[], since_start).map_err(io)?;
        let frame = match read_frame(link) {
            Ok(f) => f,
            // The host took its base snapshot and let go.
            Err(ReadError::Closed) => return Ok(()),
            Err(e) => return Err(e.to_string()),
        };
        if frame.header.kind != Kind::Configure {
            return Err(format!("expected Configure, got {:?}", frame.header.kind));
        }
        let config = match FunctionConfig::from_json(&frame.a) {
            Ok(c) => c,
            Err(e) => return refuse_configure(link, "Spore.InvalidConfigure", &e),
        };
        if let Some(dev) = &config.code_device {
            if agent.opts.pid1 {
                if let Err(e) = pid1::mount_code(dev, &config.code_dir) {
                    return refuse_configure(link, "Spore.CodeDeviceError", &e);
                }
            } else {
                eprintln!(
                    "spore-agent: not PID 1: code_device {dev} not mounted, using {} as it is",
                    config.code_dir
                );
            }
        }
        eprintln!(
            "spore-agent: configured: {} {} ({})",
            config.function_name, config.function_version, config.handler
        );
        let before = meminfo::MemInfo::read();
        agent.configure(config);
        send_ready(agent, link, link_gen)?;
        eprintln!(
            "spore-agent: function init memory: {}",
            meminfo::MemInfo::read().delta_since(&before)
        );
    } else {
        send_ready(agent, link, link_gen)?;
    }
    loop {
        let frame = match read_frame(link) {
            Ok(f) => f,
            Err(ReadError::Closed) => return Ok(()),
            Err(e) => return Err(e.to_string()),
        };
        match frame.header.kind {
            Kind::Invoke => {
                let id = String::from_utf8(frame.a)
                    .ok()
                    .filter(|id| valid_request_id(id))
                    .ok_or("Invoke with a bad request id")?;
                let outcome = agent.invoke(Invocation {
                    id,
                    payload: frame.b,
                    deadline_ms: frame.header.arg,
                });
                let kind = if outcome.ok {
                    Kind::ResultOk
                } else {
                    Kind::ResultError
                };
                let body = if outcome.body.len() > MAX_PAYLOAD as usize {
                    error_json(
                        "Function.ResponseSizeTooLarge",
                        "Response payload size exceeded maximum allowed payload size",
                    )
                } else {
                    outcome.body
                };
                write_frame(
                    link,
                    kind,
                    &body,
                    tail(&outcome.log, MAX_LOG as usize),
                    outcome.handler_ns,
                )
                .map_err(io)?;
                if outcome.runtime_gone {
                    return Err("the runtime ended during the invocation; it restarts on the next connection".into());
                }
            }
            Kind::Configure => {
                let config = FunctionConfig::from_json(&frame.a)?;
                agent.reconfigure(config)?;
                send_ready(agent, link, link_gen)?;
            }
            k => return Err(format!("unexpected {k:?} from the host")),
        }
    }
}

/// Waits for the runtime to wait in `/next`, then says `Ready` (or
/// `InitError`).
fn send_ready(agent: &Arc<Agent>, link: &mut Link, link_gen: u64) -> Result<(), String> {
    match agent.wait_ready(link_gen) {
        Wait::Done(init_us) => {
            write_frame(link, Kind::Ready, &[], &[], init_us).map_err(|e| e.to_string())
        }
        Wait::InitFailed(f) => {
            send_init_error(link, &f)?;
            Err("the function's init failed".into())
        }
        Wait::Superseded => Err("a newer host connection took over".into()),
    }
}
