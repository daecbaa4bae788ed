//! `spore-tmem`: the Linux guest's command-line access to the VMM's tmem pool
//! (see `spore_guest_tools::tmem` for how it reaches the device from user
//! space, and README.md, "Transcendent memory").
//!
//! ```text
//! spore-tmem put KEY [FILE]   store FILE (or stdin) under KEY
//! spore-tmem get KEY          write the value to stdout
//! spore-tmem inval KEY        drop KEY
//! spore-tmem flush            drop every object of this VM
//! spore-tmem stats            print the pool's counters, one "name value" per line
//! ```
//!
//! Exit status: 0 done, 1 key not found, 2 usage, 3 refused for the quota,
//! 4 any other failure. Needs root (port I/O and physical addresses).

use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::process::ExitCode;

use spore_abi::tmem::Status;
use spore_guest_tools::tmem::{Tmem, TmemError};

const USAGE: &str = "usage: spore-tmem put KEY [FILE]   (value from FILE or stdin)
       spore-tmem get KEY           (value to stdout)
       spore-tmem inval KEY
       spore-tmem flush
       spore-tmem stats";

const NOT_FOUND: u8 = 1;
const USAGE_ERROR: u8 = 2;
const QUOTA: u8 = 3;
const FAILED: u8 = 4;

fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let words: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
    let usage = |msg: &str| {
        eprintln!("spore-tmem: {msg}\n{USAGE}");
        ExitCode::from(USAGE_ERROR)
    };
    let (cmd, rest) = match words.split_first() {
        Some((c, r)) => (*c, r),
        None => return usage("missing command"),
    };
    let arity_ok = match cmd {
        b"put" => rest.len() == 1 || rest.len() == 2,
        b"get" | b"inval" => rest.len() == 1,
        b"flush" | b"stats" => rest.is_empty(),
        _ => {
            return usage(&format!(
                "unknown command {:?}",
                String::from_utf8_lossy(cmd)
            ))
        }
    };
    if !arity_ok {
        return usage("wrong number of arguments");
    }
    match run(cmd, rest) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("spore-tmem: {e}");
            ExitCode::from(match RunError::status(&e) {
                Some(Status::QuotaExceeded) => QUOTA,
                _ => FAILED,
            })
        }
    }
}

#[derive(Debug, thiserror::Error)]
enum RunError {
    #[error(transparent)]
    Tmem(#[from] TmemError),
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
}

impl RunError {
    fn status(&self) -> Option<Status> {
        match self {
            RunError::Tmem(e) => e.status(),
            RunError::Io { .. } => None,
        }
    }
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> RunError {
    let what = what.into();
    move |source| RunError::Io { what, source }
}

fn run(cmd: &[u8], rest: &[&[u8]]) -> Result<u8, RunError> {
    let mut tmem = Tmem::open()?;
    match cmd {
        b"put" => {
            let mut value = Vec::new();
            match rest.get(1) {
                Some(path) => {
                    let path = std::path::Path::new(std::ffi::OsStr::from_bytes(path));
                    value =
                        std::fs::read(path).map_err(io(format!("reading {}", path.display())))?;
                }
                None => {
                    std::io::stdin()
                        .read_to_end(&mut value)
                        .map_err(io("reading stdin"))?;
                }
            }
            tmem.put(rest[0], &value)?;
            Ok(0)
        }
        b"get" => match tmem.get(rest[0])? {
            Some(v) => {
                let mut out = std::io::stdout().lock();
                out.write_all(&v).map_err(io("writing stdout"))?;
                out.flush().map_err(io("writing stdout"))?;
                Ok(0)
            }
            None => {
                eprintln!("spore-tmem: not found");
                Ok(NOT_FOUND)
            }
        },
        b"inval" => Ok(if tmem.invalidate(rest[0])? {
            0
        } else {
            NOT_FOUND
        }),
        b"flush" => {
            tmem.flush()?;
            Ok(0)
        }
        _ => {
            let s = tmem.stats()?;
            for (name, v) in [
                ("objects", s.objects),
                ("bytes_used", s.bytes_used),
                ("bytes_stored", s.bytes_stored),
                ("quota_bytes", s.quota_bytes),
                ("puts", s.puts),
                ("gets", s.gets),
                ("get_hits", s.get_hits),
                ("invalidates", s.invalidates),
                ("flushes", s.flushes),
                ("batches", s.batches),
                ("refused", s.refused),
            ] {
                println!("{name} {v}");
            }
            Ok(0)
        }
    }
}
