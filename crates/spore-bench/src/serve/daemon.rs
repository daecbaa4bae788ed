//! A `spore serve` daemon the serve benches start, deploy functions to
//! and end: its Lambda API address is the first line it prints.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{bail, Context as _};
use base64::Engine;
use serde_json::{json, Value};

use crate::lambda_client::Conn;

/// Flags every daemon of the bench gets (`--daemon-arg`), set once.
static EXTRA_ARGS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();

pub(crate) fn set_extra_args(args: Vec<String>) {
    let _ = EXTRA_ARGS.set(args);
}

/// A `spore serve` for the bench, ended on drop.
pub(crate) struct Daemon {
    child: Child,
    pub(crate) addr: String,
    /// The sandbox API's address, when started with `--sandbox-listen`.
    pub(crate) sandbox_addr: Option<String>,
    pub(crate) state: PathBuf,
    /// Leave the state directory when ended (a later daemon reuses it).
    keep_state: bool,
}

impl Daemon {
    pub(crate) fn start(state: &Path, extra: &[&str]) -> anyhow::Result<Daemon> {
        let log = std::env::var_os("SPORE_BENCH_DAEMON_LOG").map(PathBuf::from);
        Self::spawn("127.0.0.1:0", state, extra, false, log.as_deref(), false)
    }

    /// [`Daemon::start`] listening on `listen` (a cluster node's address
    /// is known before it starts).
    pub(crate) fn start_on(listen: &str, state: &Path, extra: &[&str]) -> anyhow::Result<Daemon> {
        let log = std::env::var_os("SPORE_BENCH_DAEMON_LOG").map(PathBuf::from);
        Self::spawn(listen, state, extra, false, log.as_deref(), false)
    }

    /// A daemon on `state` that leaves it in place when ended; its messages
    /// are appended to `log`.
    pub(crate) fn start_keeping(
        state: &Path,
        extra: &[&str],
        log: Option<&Path>,
    ) -> anyhow::Result<Daemon> {
        Self::spawn("127.0.0.1:0", state, extra, true, log, true)
    }

    fn spawn(
        listen: &str,
        state: &Path,
        extra: &[&str],
        keep_state: bool,
        log: Option<&Path>,
        append: bool,
    ) -> anyhow::Result<Daemon> {
        let exe = std::env::current_exe()?;
        let stderr = match log {
            Some(p) => std::fs::OpenOptions::new()
                .create(true)
                .write(true)
                .append(append)
                .truncate(!append)
                .open(p)
                .map(Stdio::from)
                .unwrap_or_else(|_| Stdio::null()),
            None => Stdio::null(),
        };
        let mut child = Command::new(exe)
            .args(["serve", "--listen", listen, "--state-dir"])
            .arg(state)
            .args(extra)
            .args(EXTRA_ARGS.get().map_or(&[][..], Vec::as_slice))
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()?;
        let mut line = String::new();
        BufReader::new(child.stdout.take().context("daemon stdout")?).read_line(&mut line)?;
        let v: Value = match serde_json::from_str(&line) {
            Ok(v) => v,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                bail!("spore serve did not start (it said {line:?}: {e}); see its log");
            }
        };
        let addr = v["listen"]
            .as_str()
            .context("no listen address")?
            .to_string();
        Ok(Daemon {
            child,
            addr,
            sandbox_addr: v["sandbox_listen"].as_str().map(str::to_string),
            state: state.to_path_buf(),
            keep_state,
        })
    }

    pub(crate) fn deploy(&self, name: &str, image: &Path, memory_mib: u32) -> anyhow::Result<()> {
        self.deploy_configured(name, image, memory_mib, json!({}))
    }

    /// Deploys a unikernel function with more configuration (`config`'s
    /// fields added to CreateFunction's body, e.g. `SporeNetwork`).
    pub(crate) fn deploy_configured(
        &self,
        name: &str,
        image: &Path,
        memory_mib: u32,
        config: Value,
    ) -> anyhow::Result<()> {
        let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
        zip.start_file("fn", zip::write::SimpleFileOptions::default())?;
        zip.write_all(
            &std::fs::read(image).with_context(|| format!("reading {}", image.display()))?,
        )?;
        let zip = zip.finish()?.into_inner();
        let mut body = function_body(name, "spore-uk", "fn", &zip, memory_mib, 60);
        if let (Some(body), Value::Object(more)) = (body.as_object_mut(), config) {
            body.extend(more);
        }
        self.create(name, &body)
    }

    /// Deploys a function from a zip (its bytes).
    pub(crate) fn deploy_zip(
        &self,
        name: &str,
        runtime: &str,
        handler: &str,
        zip: &[u8],
        memory_mib: u32,
        timeout_s: u32,
    ) -> anyhow::Result<()> {
        let body = function_body(name, runtime, handler, zip, memory_mib, timeout_s);
        self.create(name, &body)
    }

    fn create(&self, name: &str, body: &Value) -> anyhow::Result<()> {
        let mut c = Conn::open(&self.addr)?;
        let r = c.request("POST", "/2015-03-31/functions", body.to_string().as_bytes())?;
        if r.status != 201 {
            bail!(
                "deploying {name}: {} {}",
                r.status,
                String::from_utf8_lossy(&r.body)
            );
        }
        Ok(())
    }
}

/// CreateFunction's body for a function from `zip`.
fn function_body(
    name: &str,
    runtime: &str,
    handler: &str,
    zip: &[u8],
    memory_mib: u32,
    timeout_s: u32,
) -> Value {
    json!({
        "FunctionName": name, "Runtime": runtime, "Handler": handler, "Role": "bench",
        "MemorySize": memory_mib, "Timeout": timeout_s,
        "Code": {"ZipFile": base64::engine::general_purpose::STANDARD.encode(zip)},
    })
}

impl Daemon {
    /// Kills the daemon with SIGKILL (its guardian ends its instances) and
    /// leaves its state directory for a successor.
    pub(crate) fn kill9(mut self) -> PathBuf {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.keep_state = true;
        self.state.clone()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // SAFETY: signalling our own child: SIGTERM ends its instances.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
        if !self.keep_state {
            let _ = std::fs::remove_dir_all(&self.state);
        }
    }
}
