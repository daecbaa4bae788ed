//! The language runtime as a child process: its environment (what Lambda
//! sets), starting it, and capturing what it writes on stdout and stderr.
//!
//! Both streams are pipes the agent reads: everything is copied to the
//! agent's stderr (the guest console) and kept in a log whose tail goes back
//! to the host with each result. The pipes are non-blocking so that the
//! thread answering an invocation can [`Output::pump`] what the runtime wrote
//! before it posted its response: a `print()` in a handler reaches the pipe
//! before the HTTP request that ends the invocation, but the reader thread
//! may not have woken yet.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use spore_abi::function::MAX_LOG;

use super::config::{FunctionConfig, Options, RuntimeKind};

/// Lambda's error JSON: `{"errorMessage": ..., "errorType": ...}`.
pub fn error_json(error_type: &str, message: &str) -> Vec<u8> {
    serde_json::json!({ "errorMessage": message, "errorType": error_type })
        .to_string()
        .into_bytes()
}

/// Why a runtime could not be started: Lambda's error type and a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartError {
    pub error_type: &'static str,
    pub message: String,
}

/// A started runtime.
pub struct Spawned {
    pub pid: i32,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
}

const PATH: &str = "/usr/local/bin:/usr/bin/:/bin:/opt/bin";

/// The runtime's environment, as Lambda sets it: variables a function may
/// override (PATH, LANG, TZ, LD_LIBRARY_PATH, PYTHONPATH), then the
/// function's own, then the reserved ones, which it may not. Without a
/// function (Python pre-init) only the first group and the Runtime API.
pub fn environment(
    opts: &Options,
    api: &str,
    function: Option<(&FunctionConfig, &str)>,
) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    let mut set = |k: &str, v: String| {
        env.insert(k.to_string(), v);
    };
    let rt = opts.runtime_dir.display().to_string();
    let task = function.map_or("/var/task", |(c, _)| c.code_dir.as_str());
    set("PATH", PATH.into());
    set("LANG", "en_US.UTF-8".into());
    set("TZ", ":UTC".into());
    set(
        "LD_LIBRARY_PATH",
        format!("/var/lang/lib:/lib64:/usr/lib64:{rt}:{rt}/lib:{task}:{task}/lib:/opt/lib"),
    );
    if opts.runtime == RuntimeKind::Python3 {
        set("PYTHONPATH", rt.clone());
    }
    if let Some((c, _)) = function {
        for (k, v) in &c.env {
            set(k, v.clone());
        }
    }
    set("AWS_LAMBDA_RUNTIME_API", api.into());
    set("LAMBDA_RUNTIME_DIR", rt);
    if let Some((c, log_stream)) = function {
        set("_HANDLER", c.handler.clone());
        set("LAMBDA_TASK_ROOT", c.code_dir.clone());
        set("AWS_LAMBDA_FUNCTION_NAME", c.function_name.clone());
        set("AWS_LAMBDA_FUNCTION_VERSION", c.function_version.clone());
        set("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", c.memory_mib.to_string());
        set("AWS_REGION", c.region.clone());
        set("AWS_DEFAULT_REGION", c.region.clone());
        set("AWS_LAMBDA_LOG_GROUP_NAME", c.log_group());
        set("AWS_LAMBDA_LOG_STREAM_NAME", log_stream.into());
        set("AWS_LAMBDA_INITIALIZATION_TYPE", "on-demand".into());
    }
    env
}

/// A log stream name like Lambda's: `YYYY/MM/DD/[VERSION]<32 hex>`.
pub fn log_stream_name(version: &str) -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (y, m, d) = civil_date(secs / 86_400);
    format!("{y:04}/{m:02}/{d:02}/[{version}]{}", random_hex(16))
}

/// Days since 1970-01-01 → (year, month, day), proleptic Gregorian
/// (H. Hinnant's `civil_from_days`).
fn civil_date(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

/// `n` random bytes as hex (getrandom; the time if that fails, which only
/// costs uniqueness of ids that are not secrets).
pub fn random_hex(n: usize) -> String {
    let mut buf = vec![0u8; n];
    // SAFETY: buf is valid for n bytes.
    let got = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), n, libc::GRND_NONBLOCK) };
    if got < 0 || got as usize != n {
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        for (i, b) in buf.iter_mut().enumerate() {
            // Byte i % 16 of the time, mixed with the low byte of i.
            *b = t.to_le_bytes()[i % 16] ^ i.to_le_bytes()[0];
        }
    }
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

/// Held while a runtime is being spawned. std's `spawn` reaps a child whose
/// exec failed itself (and panics if it cannot): PID 1's reaper takes this
/// lock before reaping, so it never takes that child away from std.
pub static SPAWNING: Mutex<()> = Mutex::new(());

/// Starts the runtime: spore's Python bootstrap, or the function's
/// `bootstrap` (only with a function). It gets its own process group, so
/// that a timeout can kill it with whatever it started.
pub fn spawn(
    opts: &Options,
    env: &BTreeMap<String, String>,
    function: Option<&FunctionConfig>,
) -> Result<Spawned, StartError> {
    let invalid = |message: String| StartError {
        error_type: "Runtime.InvalidEntrypoint",
        message,
    };
    let mut cmd = match (opts.runtime, function) {
        (RuntimeKind::Python3, _) => {
            if !opts.python_bootstrap.is_file() {
                return Err(invalid(format!(
                    "spore's Python bootstrap {} is missing",
                    opts.python_bootstrap.display()
                )));
            }
            let mut c = Command::new(&opts.python);
            // Unbuffered: a handler's print() must reach the log of its own invocation.
            c.arg("-u").arg(&opts.python_bootstrap);
            c
        }
        (RuntimeKind::Provided, Some(f)) => {
            let path = Path::new(&f.code_dir).join("bootstrap");
            let meta = std::fs::metadata(&path).map_err(|e| {
                invalid(format!(
                    "Couldn't find valid bootstrap(s): [{}] ({e})",
                    path.display()
                ))
            })?;
            if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
                return Err(invalid(format!(
                    "{} is not an executable file (mode {:o}): a provided runtime needs an executable bootstrap",
                    path.display(),
                    meta.permissions().mode() & 0o7777
                )));
            }
            Command::new(path)
        }
        (RuntimeKind::Provided, None) => {
            return Err(invalid(
                "a provided runtime starts only with a function".into(),
            ))
        }
    };
    let cwd = function
        .map(|f| Path::new(&f.code_dir))
        .filter(|p| p.is_dir())
        .unwrap_or(Path::new("/"));
    cmd.env_clear()
        .envs(env)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let host_mode = !opts.pid1;
    // SAFETY: the hook makes only async-signal-safe calls (sigprocmask,
    // prctl) and touches only the child.
    unsafe {
        cmd.pre_exec(move || {
            super::child::unblock_signals_in_child()?;
            // Host mode: the runtime dies with the agent (tests kill the
            // agent). PDEATHSIG follows the thread that forked; every runtime
            // is started from the agent's main thread (start, Configure,
            // restarts in the host link's session), which lives as long as
            // the agent.
            if host_mode && libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let spawning = lock(&SPAWNING);
    let spawned = cmd.spawn();
    drop(spawning);
    let mut child = spawned.map_err(|e| {
        invalid(format!(
            "cannot start {}: {e}",
            cmd.get_program().to_string_lossy()
        ))
    })?;
    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        return Err(invalid("runtime pipes missing".into()));
    };
    let pid = child.id() as i32;
    // `child` is dropped without waiting: the waiter (host mode) or PID 1's
    // reaper collects its status with waitpid.
    Ok(Spawned {
        pid,
        stdout: stdout.into(),
        stderr: stderr.into(),
    })
}

/// Kills the runtime's process group.
pub fn kill_group(pid: i32) {
    // SAFETY: kill(2) on a process group we created; a stale one fails with ESRCH.
    unsafe {
        libc::kill(-pid, libc::SIGKILL);
    }
}

/// What an exit status says, as Lambda words it ("exit status 1", "signal: 9").
pub fn describe_status(status: libc::c_int) -> String {
    if libc::WIFEXITED(status) {
        format!("exit status {}", libc::WEXITSTATUS(status))
    } else if libc::WIFSIGNALED(status) {
        format!("signal: {}", libc::WTERMSIG(status))
    } else {
        format!("wait status {status:#x}")
    }
}

/// The runtime's output: its pipes and the log tail.
#[derive(Default)]
pub struct Output {
    inner: Mutex<OutputInner>,
}

#[derive(Default)]
struct OutputInner {
    /// The current runtime's pipes; `true` once at EOF.
    fds: Vec<(OwnedFd, bool)>,
    /// Bumped for each runtime: an old reader thread stops.
    generation: u64,
    log: Vec<u8>,
}

fn set_nonblocking(fd: RawFd) {
    // SAFETY: fcntl on a descriptor we own.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags >= 0 {
            libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
        }
    }
}

impl Output {
    /// Takes over a new runtime's pipes and starts reading them.
    pub fn attach(self: &Arc<Self>, stdout: OwnedFd, stderr: OwnedFd) {
        set_nonblocking(stdout.as_raw_fd());
        set_nonblocking(stderr.as_raw_fd());
        let generation = {
            let mut g = lock(&self.inner);
            g.fds = vec![(stdout, false), (stderr, false)];
            g.generation += 1;
            g.generation
        };
        let me = Arc::clone(self);
        std::thread::spawn(move || me.read_loop(generation));
    }

    fn read_loop(&self, generation: u64) {
        loop {
            let mut pfds: Vec<libc::pollfd> = {
                let g = lock(&self.inner);
                if g.generation != generation {
                    return;
                }
                g.fds
                    .iter()
                    .filter(|(_, eof)| !eof)
                    .map(|(fd, _)| libc::pollfd {
                        fd: fd.as_raw_fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    })
                    .collect()
            };
            if pfds.is_empty() {
                return;
            }
            // A timeout bounds how long a replaced runtime's descriptors are
            // polled after they were closed.
            // SAFETY: pfds is a valid array of pollfd.
            unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, 1000) };
            self.pump();
        }
    }

    /// Reads whatever the runtime has written so far into the log and the console.
    pub fn pump(&self) {
        let mut g = lock(&self.inner);
        let mut buf = [0u8; 16 * 1024];
        let mut got = Vec::new();
        for (fd, eof) in g.fds.iter_mut().filter(|(_, eof)| !*eof) {
            loop {
                // SAFETY: buf is valid for its length; fd is open (owned here).
                let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
                if n > 0 {
                    got.extend_from_slice(&buf[..n as usize]);
                    continue;
                }
                if n == 0 {
                    *eof = true;
                } else if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                break;
            }
        }
        if got.is_empty() {
            return;
        }
        let _ = io::stderr().lock().write_all(&got);
        g.log.extend_from_slice(&got);
        let cap = MAX_LOG as usize;
        if g.log.len() > cap {
            let cut = g.log.len() - cap;
            g.log.drain(..cut);
        }
    }

    /// Drops what the log holds (a new invocation starts).
    pub fn clear_log(&self) {
        lock(&self.inner).log.clear();
    }

    /// Reads what is pending and takes the log.
    pub fn take_log(&self) -> Vec<u8> {
        self.pump();
        std::mem::take(&mut lock(&self.inner).log)
    }
}

/// Locks a mutex; a panicked holder leaves data that is still usable (logs,
/// flags), so poisoning is ignored.
pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(civil_date(0), (1970, 1, 1));
        assert_eq!(civil_date(19_723), (2024, 1, 1));
        assert_eq!(civil_date(19_782), (2024, 2, 29));
        assert_eq!(random_hex(16).len(), 32);
        let s = log_stream_name("$LATEST");
        assert!(s.contains("/[$LATEST]"), "{s}");
    }

    #[test]
    fn lambda_environment() {
        let opts = Options::parse(
            &["--runtime".into(), "python3".into(), "--no-pid1".into()],
            false,
            "",
        )
        .unwrap();
        let pre = environment(&opts, "127.0.0.1:9001", None);
        assert_eq!(pre["AWS_LAMBDA_RUNTIME_API"], "127.0.0.1:9001");
        assert_eq!(pre["PYTHONPATH"], "/var/runtime");
        assert!(!pre.contains_key("_HANDLER"));
        let mut c = FunctionConfig::from_json(
            br#"{"function_name":"f","handler":"app.h","memory_mib":256,"timeout_s":3,
                "region":"eu-west-1","env":{"TZ":"Europe/Paris","_HANDLER":"evil.x","MINE":"1"}}"#,
        )
        .unwrap();
        c.code_dir = "/code".into();
        let env = environment(&opts, "127.0.0.1:9001", Some((&c, "stream")));
        assert_eq!(env["_HANDLER"], "app.h", "reserved variables win");
        assert_eq!(env["TZ"], "Europe/Paris", "others may be overridden");
        assert_eq!(env["MINE"], "1");
        assert_eq!(env["LAMBDA_TASK_ROOT"], "/code");
        assert_eq!(env["AWS_LAMBDA_FUNCTION_MEMORY_SIZE"], "256");
        assert_eq!(env["AWS_DEFAULT_REGION"], "eu-west-1");
        assert_eq!(env["AWS_LAMBDA_LOG_GROUP_NAME"], "/aws/lambda/f");
        assert!(env["LD_LIBRARY_PATH"].contains(":/code:/code/lib:"));
    }

    #[test]
    fn statuses() {
        assert_eq!(describe_status(1 << 8), "exit status 1");
        assert_eq!(describe_status(9), "signal: 9");
        assert_eq!(
            error_json("Runtime.ExitError", "x \"y\""),
            br#"{"errorMessage":"x \"y\"","errorType":"Runtime.ExitError"}"#.to_vec()
        );
    }
}
