//! What the agent is told: its own options (command line, or the kernel
//! command line as PID 1) and the function a host's `Configure` names.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use spore_abi::function::INVOKE_VSOCK_PORT;

/// Which language runtime the guest runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuntimeKind {
    /// spore's Python bootstrap, started at boot (pre-init) and released by Configure.
    Python3,
    /// The function's own `bootstrap` executable, started after Configure.
    Provided,
}

impl std::str::FromStr for RuntimeKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "python3" => Ok(Self::Python3),
            "provided" => Ok(Self::Provided),
            _ => Err(format!("unknown runtime {s:?} (python3 or provided)")),
        }
    }
}

/// Where the host link listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LinkAddr {
    Vsock(u32),
    /// Host mode and tests: a Unix socket the agent listens on.
    Unix(PathBuf),
}

impl std::str::FromStr for LinkAddr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(path) = s.strip_prefix("unix:") {
            if path.is_empty() {
                return Err("unix: needs a path".into());
            }
            return Ok(Self::Unix(path.into()));
        }
        match s {
            "vsock" => Ok(Self::Vsock(INVOKE_VSOCK_PORT)),
            _ => match s.strip_prefix("vsock:").map(str::parse) {
                Some(Ok(port)) => Ok(Self::Vsock(port)),
                _ => Err(format!("bad host link {s:?} (vsock[:PORT] or unix:PATH)")),
            },
        }
    }
}

/// The agent's options.
#[derive(Clone, Debug)]
pub struct Options {
    pub host_link: LinkAddr,
    /// Do PID 1's duties (mounts, reaping, power-off, code device, reseed).
    pub pid1: bool,
    pub runtime: RuntimeKind,
    /// Where the Runtime API listens (port 0: any free port, tests).
    pub runtime_api: SocketAddr,
    /// `LAMBDA_RUNTIME_DIR`: where the runtime's own files are.
    pub runtime_dir: PathBuf,
    /// The Python interpreter for `python3`.
    pub python: PathBuf,
    /// spore's Python bootstrap (default `<runtime_dir>/bootstrap.py`).
    pub python_bootstrap: PathBuf,
}

pub const USAGE: &str = "usage: spore-agent [--host-link vsock[:PORT]|unix:PATH] [--no-pid1] \
[--runtime python3|provided] [--runtime-api ADDR:PORT] [--runtime-dir DIR] [--python PATH] \
[--python-bootstrap PATH]
As PID 1 the kernel command line's spore.runtime=python3|provided chooses the runtime.";

impl Options {
    /// Options from the command line; as PID 1, `cmdline` (the kernel's)
    /// fills in what the flags leave out.
    pub fn parse(args: &[String], is_pid1: bool, cmdline: &str) -> Result<Self, String> {
        let mut host_link = LinkAddr::Vsock(INVOKE_VSOCK_PORT);
        let mut pid1 = is_pid1;
        let mut runtime = None;
        let mut runtime_api: SocketAddr = ([127, 0, 0, 1], 9001).into();
        let mut runtime_dir = PathBuf::from("/var/runtime");
        let mut python = PathBuf::from("/usr/bin/python3");
        let mut python_bootstrap = None;
        let mut it = args.iter();
        while let Some(flag) = it.next() {
            if flag == "--no-pid1" {
                pid1 = false;
                continue;
            }
            let value = it
                .next()
                .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
            match flag.as_str() {
                "--host-link" => host_link = value.parse()?,
                "--runtime" => runtime = Some(value.parse()?),
                "--runtime-api" => {
                    runtime_api = value
                        .parse()
                        .map_err(|_| format!("bad --runtime-api {value:?} (ADDR:PORT)"))?
                }
                "--runtime-dir" => runtime_dir = value.into(),
                "--python" => python = value.into(),
                "--python-bootstrap" => python_bootstrap = Some(value.into()),
                _ => return Err(format!("unknown flag {flag:?}\n{USAGE}")),
            }
        }
        if runtime.is_none() && is_pid1 {
            runtime = cmdline_value(cmdline, "spore.runtime")
                .map(str::parse)
                .transpose()?;
        }
        let runtime = runtime.ok_or_else(|| format!("no runtime chosen\n{USAGE}"))?;
        let python_bootstrap = python_bootstrap.unwrap_or_else(|| runtime_dir.join("bootstrap.py"));
        Ok(Self {
            host_link,
            pid1,
            runtime,
            runtime_api,
            runtime_dir,
            python,
            python_bootstrap,
        })
    }
}

/// The value of `key=value` on a kernel command line (the last one wins, as
/// in the kernel).
pub fn cmdline_value<'a>(cmdline: &'a str, key: &str) -> Option<&'a str> {
    cmdline
        .split_ascii_whitespace()
        .filter_map(|w| w.strip_prefix(key)?.strip_prefix('='))
        .next_back()
}

/// The function a `Configure` frame names (its JSON is documented in
/// `spore_abi::function`; spore-abi is `no_std` without serde, so the type
/// lives here).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionConfig {
    pub function_name: String,
    #[serde(default = "latest")]
    pub function_version: String,
    pub handler: String,
    pub memory_mib: u32,
    pub timeout_s: u32,
    pub region: String,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub code_device: Option<String>,
    #[serde(default = "var_task")]
    pub code_dir: String,
}

fn latest() -> String {
    "$LATEST".into()
}

fn var_task() -> String {
    "/var/task".into()
}

/// Longest value the agent puts in an HTTP header or a path.
const MAX_NAME: usize = 256;

impl FunctionConfig {
    /// Parses and checks a Configure JSON. The host is trusted more than the
    /// runtime but not blindly: names end up in HTTP headers and paths, so
    /// they must not carry line breaks or NULs.
    pub fn from_json(json: &[u8]) -> Result<Self, String> {
        let c: Self = serde_json::from_slice(json).map_err(|e| format!("Configure JSON: {e}"))?;
        c.check()?;
        Ok(c)
    }

    fn check(&self) -> Result<(), String> {
        let token = |what: &str, v: &str, extra: &str| {
            let ok = !v.is_empty()
                && v.len() <= MAX_NAME
                && v.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_".contains(c) || extra.contains(c));
            if ok {
                Ok(())
            } else {
                Err(format!("bad {what} {v:?}"))
            }
        };
        token("function_name", &self.function_name, "")?;
        token("function_version", &self.function_version, "$")?;
        token("region", &self.region, "")?;
        // Handlers name files and symbols: `dir/module.function`, or anything
        // a provided runtime makes of it; only printable ASCII.
        if self.handler.is_empty()
            || self.handler.len() > MAX_NAME
            || !self.handler.chars().all(|c| c.is_ascii_graphic())
        {
            return Err(format!("bad handler {:?}", self.handler));
        }
        if self.memory_mib == 0 {
            return Err("memory_mib must be > 0".into());
        }
        if self.timeout_s == 0 {
            return Err("timeout_s must be > 0".into());
        }
        let abs_path = |what: &str, v: &str| {
            if v.starts_with('/') && !v.contains('\0') && !v.split('/').any(|c| c == "..") {
                Ok(())
            } else {
                Err(format!("bad {what} {v:?} (an absolute path without '..')"))
            }
        };
        abs_path("code_dir", &self.code_dir)?;
        if let Some(dev) = &self.code_device {
            abs_path("code_device", dev)?;
        }
        for (k, v) in &self.env {
            if k.is_empty() || k.contains(['=', '\0']) || v.contains('\0') {
                return Err(format!("bad env entry {k:?}"));
            }
        }
        Ok(())
    }

    /// The function's ARN as Lambda gives it to the runtime (spore has no
    /// accounts: the account id is all zeros).
    pub fn arn(&self) -> String {
        format!(
            "arn:aws:lambda:{}:000000000000:function:{}",
            self.region, self.function_name
        )
    }

    /// The ARN the runtime is told it was invoked by: qualified with the
    /// version unless `$LATEST`, as Lambda does for a qualified invoke.
    pub fn invoked_arn(&self) -> String {
        if self.function_version == "$LATEST" {
            self.arn()
        } else {
            format!("{}:{}", self.arn(), self.function_version)
        }
    }

    pub fn log_group(&self) -> String {
        format!("/aws/lambda/{}", self.function_name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn options_from_flags_and_cmdline() {
        let o = Options::parse(
            &args("--host-link unix:/tmp/x.sock --no-pid1 --runtime provided --runtime-api 127.0.0.1:0"),
            false,
            "",
        )
        .unwrap();
        assert_eq!(o.host_link, LinkAddr::Unix("/tmp/x.sock".into()));
        assert!(!o.pid1);
        assert_eq!(o.runtime, RuntimeKind::Provided);
        assert_eq!(o.runtime_api.port(), 0);
        let o = Options::parse(&[], true, "console=ttyS0 spore.runtime=python3 quiet").unwrap();
        assert!(o.pid1);
        assert_eq!(o.runtime, RuntimeKind::Python3);
        assert_eq!(o.host_link, LinkAddr::Vsock(INVOKE_VSOCK_PORT));
        assert_eq!(
            o.python_bootstrap,
            PathBuf::from("/var/runtime/bootstrap.py")
        );
        // Not PID 1: the kernel's command line is not ours to read.
        assert!(Options::parse(&[], false, "spore.runtime=python3").is_err());
        assert!(Options::parse(&args("--runtime ruby"), false, "").is_err());
        assert!(Options::parse(&args("--runtime"), false, "").is_err());
        assert!(Options::parse(&args("--bogus 1"), false, "").is_err());
        assert!("vsock:12".parse::<LinkAddr>() == Ok(LinkAddr::Vsock(12)));
        assert!("vsock:x".parse::<LinkAddr>().is_err());
        assert!("unix:".parse::<LinkAddr>().is_err());
    }

    #[test]
    fn configure_json() {
        let c = FunctionConfig::from_json(
            br#"{"function_name":"hello","handler":"app.handler","memory_mib":128,
                "timeout_s":3,"region":"us-east-1","env":{"A":"1"},"code_device":null}"#,
        )
        .unwrap();
        assert_eq!(c.function_version, "$LATEST");
        assert_eq!(c.code_dir, "/var/task");
        assert_eq!(c.code_device, None);
        assert_eq!(
            c.arn(),
            "arn:aws:lambda:us-east-1:000000000000:function:hello"
        );
        let bad = [
            &br#"{"function_name":"a\r\nX: y","handler":"a.b","memory_mib":1,"timeout_s":1,"region":"r"}"#[..],
            br#"{"function_name":"a","handler":"a b","memory_mib":1,"timeout_s":1,"region":"r"}"#,
            br#"{"function_name":"a","handler":"a.b","memory_mib":0,"timeout_s":1,"region":"r"}"#,
            br#"{"function_name":"a","handler":"a.b","memory_mib":1,"timeout_s":1,"region":"r","code_dir":"rel"}"#,
            br#"{"function_name":"a","handler":"a.b","memory_mib":1,"timeout_s":1,"region":"r","code_device":"/dev/../x"}"#,
            br#"{"function_name":"a","handler":"a.b","memory_mib":1,"timeout_s":1,"region":"r","env":{"A=B":"1"}}"#,
            br#"{"function_name":"a"}"#,
            b"\xff",
        ];
        for b in bad {
            assert!(
                FunctionConfig::from_json(b).is_err(),
                "{}",
                String::from_utf8_lossy(b)
            );
        }
    }

    #[test]
    fn cmdline_values() {
        assert_eq!(
            cmdline_value("a=1 spore.runtime=x b", "spore.runtime"),
            Some("x")
        );
        assert_eq!(
            cmdline_value("spore.runtime=x spore.runtime=y", "spore.runtime"),
            Some("y")
        );
        assert_eq!(cmdline_value("spore.runtimes=x", "spore.runtime"), None);
    }
}
