//! `spore fn`: functions of a `spore serve` daemon for people without the
//! AWS CLI: deploy, invoke, ls, rm, logs, stats. It speaks the same Lambda API
//! (unsigned: for a daemon without `--auth`).

use std::io::{Read, Write};
use std::path::PathBuf;

use anyhow::{bail, Context as _};
use base64::Engine;
use clap::{Args, Subcommand};
use serde_json::{json, Value};

use crate::lambda_client::{error_text, Conn};

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
    Deploy {
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
    },
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

pub fn run(a: FnArgs) -> anyhow::Result<u8> {
    match a.command {
        FnCommand::Deploy {
            name,
            image,
            zip,
            handler,
            runtime,
            memory,
            timeout,
            env,
        } => {
            let (zip, handler) = match (image, zip) {
                (Some(image), None) => {
                    let file = handler
                        .clone()
                        .or_else(|| image.file_name().map(|n| n.to_string_lossy().into_owned()));
                    let file = file.context("the image has no file name")?;
                    let data = std::fs::read(&image)
                        .with_context(|| format!("reading {}", image.display()))?;
                    let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
                    w.start_file(file.as_str(), zip::write::SimpleFileOptions::default())?;
                    w.write_all(&data)?;
                    (w.finish()?.into_inner(), file)
                }
                (None, Some(zip)) => {
                    let handler = handler.context("--zip needs --handler")?;
                    (
                        std::fs::read(&zip)
                            .with_context(|| format!("reading {}", zip.display()))?,
                        handler,
                    )
                }
                _ => bail!("give --image or --zip"),
            };
            let mut vars = serde_json::Map::new();
            for kv in env {
                let (k, v) = kv
                    .split_once('=')
                    .with_context(|| format!("--env {kv}: expected KEY=VALUE"))?;
                vars.insert(k.to_string(), Value::String(v.to_string()));
            }
            let zip_b64 = base64::engine::general_purpose::STANDARD.encode(zip);
            let mut c = Conn::open(&a.endpoint)?;
            let exists = c
                .request("GET", &format!("/2015-03-31/functions/{name}"), b"")?
                .status
                == 200;
            let config = json!({
                "Runtime": runtime, "Handler": handler, "MemorySize": memory, "Timeout": timeout,
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
        FnCommand::Invoke {
            name,
            payload,
            log_type,
        } => {
            let payload = match payload.as_deref() {
                None => b"{}".to_vec(),
                Some("-") => {
                    let mut b = Vec::new();
                    std::io::stdin().read_to_end(&mut b)?;
                    b
                }
                Some(p) => p.as_bytes().to_vec(),
            };
            let tail = log_type == "Tail";
            let r = Conn::open(&a.endpoint)?.invoke_with_log(&name, &payload, tail)?;
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
        FnCommand::Ls => {
            let r = Conn::open(&a.endpoint)?.request("GET", "/2015-03-31/functions", b"")?;
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
        FnCommand::Rm { name } => {
            let r = Conn::open(&a.endpoint)?.request(
                "DELETE",
                &format!("/2015-03-31/functions/{name}"),
                b"",
            )?;
            if r.status != 204 {
                bail!("deleting {name}: {}", error_text(&r));
            }
            eprintln!("spore fn: deleted {name}");
            Ok(0)
        }
        FnCommand::Logs {
            name,
            state_dir,
            tail,
        } => {
            if name.is_empty()
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            {
                bail!("{name:?} is not a function name");
            }
            let path = state_dir.join("logs").join(format!("{name}.log"));
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            let lines: Vec<&str> = text.lines().collect();
            let from = tail.map_or(0, |n| lines.len().saturating_sub(n));
            for l in &lines[from..] {
                println!("{l}");
            }
            Ok(0)
        }
        FnCommand::Stats => {
            let r = Conn::open(&a.endpoint)?.request("GET", "/metrics", b"")?;
            for line in String::from_utf8_lossy(&r.body).lines() {
                if line.starts_with("spore_invocations_total")
                    || line.starts_with("spore_errors_total")
                    || line.starts_with("spore_throttles_total")
                    || line.starts_with("spore_instances")
                    || line.starts_with("spore_memory_bytes")
                    || line.starts_with("spore_invoke_duration_seconds_count")
                    || line.starts_with("spore_base_snapshot")
                    || line.starts_with("spore_function_diff_bytes")
                {
                    println!("{line}");
                }
            }
            Ok(0)
        }
    }
}
