//! `--seccomp-filter FILE`: filters a user gives, in either of the two forms
//! Firecracker users have.
//!
//! - seccompiler's **JSON** (keys `vmm`, `api`, `vcpu`), compiled here;
//! - Firecracker's **compiled** form, what its `seccompiler-bin` writes and
//!   `firecracker --seccomp-filter` reads: a bitcode (serde) map from thread
//!   category to BPF instructions, each instruction one little-endian `u64`
//!   (`code: u16, jt: u8, jf: u8, k: u32`). As in Firecracker, the file may be
//!   at most [`COMPILED_LIMIT`] bytes, category names are matched without
//!   case, and an empty program means no filter for that thread kind.
//!
//! The form is told by the first byte that is not white space: `{` is JSON.
//! (A compiled map starts with its length, never `{` for three categories.)

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

use seccompiler::{sock_filter, BpfProgram};

use super::{Filters, SeccompError, ThreadKind};

/// Firecracker's limit on a compiled filter file.
pub const COMPILED_LIMIT: usize = 100_000;
/// The kernel's limit on one program's length.
const BPF_MAX_LEN: usize = 4096;

/// Reads the filters in `path`, in either form.
pub fn read(path: &Path) -> Result<Filters, SeccompError> {
    let shown = path.display().to_string();
    let read_err = |source| SeccompError::Read {
        path: shown.clone(),
        source,
    };
    let file = crate::files::open_regular(path).map_err(read_err)?;
    let mut bytes = Vec::new();
    // One byte over the limit is enough to know a file is too big (a JSON
    // list of three filters is far below it too).
    file.take(COMPILED_LIMIT as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(read_err)?;
    if bytes.len() > COMPILED_LIMIT {
        return Err(SeccompError::Format {
            path: shown,
            why: format!("the file is over {COMPILED_LIMIT} bytes"),
        });
    }
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{') {
        from_json(&bytes, &shown)
    } else {
        from_compiled(&bytes, &shown)
    }
}

fn from_json(bytes: &[u8], shown: &str) -> Result<Filters, SeccompError> {
    let mut map = seccompiler::compile_from_json(bytes, super::TARGET_ARCH).map_err(|source| {
        SeccompError::Compile {
            path: shown.to_string(),
            source,
        }
    })?;
    let mut take = |kind: ThreadKind| {
        map.remove(kind.key()).ok_or(SeccompError::Missing {
            path: shown.to_string(),
            key: kind.key(),
        })
    };
    Ok(Filters {
        vmm: take(ThreadKind::Vmm)?,
        api: take(ThreadKind::Api)?,
        vcpu: take(ThreadKind::Vcpu)?,
    })
}

fn from_compiled(bytes: &[u8], shown: &str) -> Result<Filters, SeccompError> {
    let format_err = |why: String| SeccompError::Format {
        path: shown.to_string(),
        why,
    };
    let map: HashMap<String, Vec<u64>> = bitcode::deserialize(bytes).map_err(|e| {
        format_err(format!(
            "neither seccompiler JSON nor a compiled Firecracker filter ({e})"
        ))
    })?;
    let mut map: HashMap<String, Vec<u64>> = map
        .into_iter()
        .map(|(k, v)| (k.to_lowercase(), v))
        .collect();
    let mut take = |kind: ThreadKind| -> Result<BpfProgram, SeccompError> {
        let prog = map.remove(kind.key()).ok_or(SeccompError::Missing {
            path: shown.to_string(),
            key: kind.key(),
        })?;
        if prog.len() > BPF_MAX_LEN {
            return Err(format_err(format!(
                "the {:?} filter has {} instructions, over the kernel's {BPF_MAX_LEN}",
                kind.key(),
                prog.len()
            )));
        }
        Ok(prog.into_iter().map(instruction).collect())
    };
    Ok(Filters {
        vmm: take(ThreadKind::Vmm)?,
        api: take(ThreadKind::Api)?,
        vcpu: take(ThreadKind::Vcpu)?,
    })
}

/// One BPF instruction from its in-memory form read as a little-endian u64.
fn instruction(v: u64) -> sock_filter {
    sock_filter {
        code: (v & 0xffff) as u16,
        jt: ((v >> 16) & 0xff) as u8,
        jf: ((v >> 24) & 0xff) as u8,
        k: (v >> 32) as u32,
    }
}

/// The inverse of [`instruction`] (tests write compiled files with it).
#[cfg(test)]
pub(super) fn encode(i: &sock_filter) -> u64 {
    i.code as u64 | (i.jt as u64) << 16 | (i.jf as u64) << 24 | (i.k as u64) << 32
}
