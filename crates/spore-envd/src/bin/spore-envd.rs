//! spore-envd: E2B's envd for spore's Linux sandboxes (see the `spore_envd`
//! crate). In a guest: `spore-envd` (vsock port 49983, clock from `/init`).
//! On a host, for tests: `spore-envd --listen tcp:127.0.0.1:0`.

use std::process::ExitCode;

use spore_envd::server::{Listen, Options};
use spore_envd::state::{Settings, State};

/// envd's vsock port (E2B's envd port).
const ENVD_PORT: u32 = 49983;

const USAGE: &str = "usage: spore-envd [--listen tcp:HOST:PORT|vsock:PORT] [--access-token TOKEN] \
[--default-user USER] [--default-workdir DIR] [--home DIR] [--manage-clock]";

fn parse(args: &[String]) -> Result<(Options, Settings), String> {
    let mut options = Options {
        listen: Listen::Vsock(ENVD_PORT),
        manage_clock: false,
    };
    let mut settings = Settings::default();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{arg} needs a value"))
        };
        match arg.as_str() {
            "--listen" => options.listen = value()?.parse()?,
            "--access-token" => settings.access_token = Some(value()?),
            "--default-user" => settings.default_user = Some(value()?),
            "--default-workdir" => settings.default_workdir = Some(value()?),
            "--manage-clock" => options.manage_clock = true,
            "--home" => settings.home_override = Some(value()?.into()),
            "-h" | "--help" => return Err(USAGE.to_owned()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    Ok((options, settings))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (options, settings) = match parse(&args) {
        Ok(parsed) => parsed,
        Err(e) => {
            eprintln!("spore-envd: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("spore-envd: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(spore_envd::server::serve(State::new(settings), options)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("spore-envd: {e}");
            ExitCode::FAILURE
        }
    }
}
