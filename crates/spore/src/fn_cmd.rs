//! `spore fn`: functions of a `spore serve` daemon for people without the
//! AWS CLI: deploy, invoke, ls, rm, logs, stats. It speaks the same Lambda API
//! (unsigned: for a daemon without `--auth`).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};
use base64::Engine;
use clap::{Args, Subcommand};
use serde_json::{json, Value};
use spore_bench::lambda_client::{error_text, Conn};

#[derive(Args)]
pub struct FnArgs {
    /// The daemon's address.
    #[arg(long, default_value = "127.0.0.1:9000", global = true)]
    endpoint: String,
    #[command(subcommand)]
    command: FnCommand,
}

#[derive(Subcommand)]
enum FnCommand {
    /// Create a function, or update its code and configuration if it exists.
    Deploy(DeployArgs),
    /// Invoke a function; prints the response (exit 1 on a function error).
    Invoke {
        name: String,
        /// The payload; `-` reads stdin; default `{}`.
        payload: Option<String>,
        /// `Tail`: also print the invocation's log (its last 4 KB) on stderr,
        /// as `aws lambda invoke --log-type Tail` returns it.
        #[arg(long, value_parser = ["None", "Tail"], default_value = "None")]
        log_type: String,
    },
    /// List the functions.
    Ls,
    /// Delete a function.
    Rm { name: String },
    /// Print a function's invocation logs (read from the daemon's state dir).
    Logs {
        name: String,
        #[arg(long, default_value = "/var/lib/spore")]
        state_dir: PathBuf,
        /// Only the last N lines.
        #[arg(long)]
        tail: Option<usize>,
    },
    /// Invocations by function and start path, errors, throttles, instances.
    Stats,
}

// `spore fn deploy`'s arguments (a plain comment: a doc comment would
// become the subcommand's help).
#[derive(Args)]
struct DeployArgs {
    name: String,
    /// A unikernel image to deploy (zipped for you) ...
    #[arg(long, conflicts_with = "zip")]
    image: Option<PathBuf>,
    /// ... or a zip holding the handler's file.
    #[arg(long)]
    zip: Option<PathBuf>,
    /// The handler (the file in the zip); default: the image's file name.
    #[arg(long)]
    handler: Option<String>,
    #[arg(long, default_value = "spore-uk")]
    runtime: String,
    /// Memory in MiB.
    #[arg(long, default_value_t = 128)]
    memory: u32,
    /// Timeout in seconds.
    #[arg(long, default_value_t = 3)]
    timeout: u32,
    /// Environment variables, KEY=VALUE (repeatable).
    #[arg(long = "env", value_name = "KEY=VALUE")]
    env: Vec<String>,
}

pub fn run(a: FnArgs) -> anyhow::Result<u8> {
    let endpoint = &a.endpoint;
    match a.command {
        FnCommand::Deploy(d) => deploy(endpoint, d),
        FnCommand::Invoke {
            name,
            payload,
            log_type,
        } => invoke(endpoint, &name, payload.as_deref(), log_type == "Tail"),
        FnCommand::Ls => list(endpoint),
        FnCommand::Rm { name } => remove(endpoint, &name),
        FnCommand::Logs {
            name,
            state_dir,
            tail,
        } => logs(&name, &state_dir, tail),
        FnCommand::Stats => stats(endpoint),
    }
}

/// The function's code as a zip, and its handler: `--image` zipped here
/// (the handler defaults to its file name), or `--zip` with `--handler`.
fn code_zip(
    image: Option<&Path>,
    zip: Option<&Path>,
    handler: Option<String>,
) -> anyhow::Result<(Vec<u8>, String)> {
    match (image, zip) {
        (Some(image), None) => {
            let file =
                handler.or_else(|| image.file_name().map(|n| n.to_string_lossy().into_owned()));
            let file = file.context("the image has no file name")?;
            let data =
                std::fs::read(image).with_context(|| format!("reading {}", image.display()))?;
            let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
            w.start_file(file.as_str(), zip::write::SimpleFileOptions::default())?;
            w.write_all(&data)?;
            Ok((w.finish()?.into_inner(), file))
        }
        (None, Some(zip)) => {
            let handler = handler.context("--zip needs --handler")?;
            let bytes = std::fs::read(zip).with_context(|| format!("reading {}", zip.display()))?;
            Ok((bytes, handler))
        }
        _ => bail!("give --image or --zip"),
    }
}

/// `--env KEY=VALUE` flags as the Lambda API's `Variables` object.
fn env_vars(env: &[String]) -> anyhow::Result<serde_json::Map<String, Value>> {
    let mut vars = serde_json::Map::new();
    for kv in env {
        let (k, v) = kv
            .split_once('=')
            .with_context(|| format!("--env {kv}: expected KEY=VALUE"))?;
        vars.insert(k.to_string(), Value::String(v.to_string()));
    }
    Ok(vars)
}

/// `spore fn deploy`: creates the function, or updates its code then its
/// configuration if it exists.
fn deploy(endpoint: &str, d: DeployArgs) -> anyhow::Result<u8> {
    let name = &d.name;
    let (zip, handler) = code_zip(d.image.as_deref(), d.zip.as_deref(), d.handler)?;
    let vars = env_vars(&d.env)?;
    let zip_b64 = base64::engine::general_purpose::STANDARD.encode(zip);
    let mut c = Conn::open(endpoint)?;
    let exists = c
        .request("GET", &format!("/2015-03-31/functions/{name}"), b"")?
        .status
        == 200;
    let config = json!({
        "Runtime": d.runtime, "Handler": handler, "MemorySize": d.memory, "Timeout": d.timeout,
        "Environment": {"Variables": vars},
    });
    let r = if exists {
        let r = c.request(
            "PUT",
            &format!("/2015-03-31/functions/{name}/code"),
            json!({"ZipFile": zip_b64}).to_string().as_bytes(),
        )?;
        if r.status != 200 {
            bail!("updating the code of {name}: {}", error_text(&r));
        }
        c.request(
            "PUT",
            &format!("/2015-03-31/functions/{name}/configuration"),
            config.to_string().as_bytes(),
        )?
    } else {
        let mut body = config;
        body["FunctionName"] = json!(name);
        body["Role"] = json!("spore");
        body["Code"] = json!({"ZipFile": zip_b64});
        c.request("POST", "/2015-03-31/functions", body.to_string().as_bytes())?
    };
    if !(200..300).contains(&r.status) {
        bail!("deploying {name}: {}", error_text(&r));
    }
    let v: Value = serde_json::from_slice(&r.body)?;
    eprintln!(
        "spore fn: {} {name} ({} bytes of code, {} MiB, {} s)",
        if exists { "updated" } else { "created" },
        v["CodeSize"],
        v["MemorySize"],
        v["Timeout"]
    );
    Ok(0)
}

/// `spore fn invoke`: prints the response; with `tail`, the log's tail on
/// stderr. Exit code 1 on a function error.
fn invoke(endpoint: &str, name: &str, payload: Option<&str>, tail: bool) -> anyhow::Result<u8> {
    let payload = match payload {
        None => b"{}".to_vec(),
        Some("-") => {
            let mut b = Vec::new();
            std::io::stdin().read_to_end(&mut b)?;
            b
        }
        Some(p) => p.as_bytes().to_vec(),
    };
    let r = Conn::open(endpoint)?.invoke_with_log(name, &payload, tail)?;
    std::io::stdout().write_all(&r.body)?;
    println!();
    eprintln!(
        "spore fn: {} start, {:.2} ms in the daemon",
        r.path,
        r.server_us / 1e3
    );
    if tail {
        let log = r
            .log_result
            .as_deref()
            .map(|b64| base64::engine::general_purpose::STANDARD.decode(b64.trim()))
            .transpose()
            .context("the reply's X-Amz-Log-Result is not base64")?
            .unwrap_or_default();
        eprintln!("spore fn: log tail ({} bytes):", log.len());
        std::io::stderr().write_all(&log)?;
    }
    Ok(if r.function_error { 1 } else { 0 })
}

/// `spore fn ls`: one line per function.
fn list(endpoint: &str) -> anyhow::Result<u8> {
    let r = Conn::open(endpoint)?.request("GET", "/2015-03-31/functions", b"")?;
    if r.status != 200 {
        bail!("listing functions: {}", error_text(&r));
    }
    let v: Value = serde_json::from_slice(&r.body)?;
    println!(
        "{:<32} {:<10} {:>7} {:>7}  LAST MODIFIED",
        "NAME", "RUNTIME", "MEM MiB", "TIMEOUT"
    );
    for f in v["Functions"].as_array().into_iter().flatten() {
        println!(
            "{:<32} {:<10} {:>7} {:>7}  {}",
            f["FunctionName"].as_str().unwrap_or("?"),
            f["Runtime"].as_str().unwrap_or("?"),
            f["MemorySize"],
            f["Timeout"],
            f["LastModified"].as_str().unwrap_or("?")
        );
    }
    Ok(0)
}

/// `spore fn rm`.
fn remove(endpoint: &str, name: &str) -> anyhow::Result<u8> {
    let r =
        Conn::open(endpoint)?.request("DELETE", &format!("/2015-03-31/functions/{name}"), b"")?;
    if r.status != 204 {
        bail!("deleting {name}: {}", error_text(&r));
    }
    eprintln!("spore fn: deleted {name}");
    Ok(0)
}

/// `spore fn logs`: the function's log file in the daemon's state
/// directory, or its last `tail` lines.
fn logs(name: &str, state_dir: &Path, tail: Option<usize>) -> anyhow::Result<u8> {
    if name.is_empty()
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        bail!("{name:?} is not a function name");
    }
    let path = state_dir.join("logs").join(format!("{name}.log"));
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let lines: Vec<&str> = text.lines().collect();
    let from = tail.map_or(0, |n| lines.len().saturating_sub(n));
    for l in &lines[from..] {
        println!("{l}");
    }
    Ok(0)
}

/// The `/metrics` lines `spore fn stats` shows.
const STATS_METRICS: &[&str] = &[
    "spore_invocations_total",
    "spore_errors_total",
    "spore_throttles_total",
    "spore_instances",
    "spore_memory_bytes",
    "spore_invoke_duration_seconds_count",
    "spore_base_snapshot",
    "spore_function_diff_bytes",
];

/// `spore fn stats`: the daemon's invocation, error and instance metrics.
fn stats(endpoint: &str) -> anyhow::Result<u8> {
    let r = Conn::open(endpoint)?.request("GET", "/metrics", b"")?;
    for line in String::from_utf8_lossy(&r.body).lines() {
        if STATS_METRICS.iter().any(|m| line.starts_with(m)) {
            println!("{line}");
        }
    }
    Ok(0)
}
