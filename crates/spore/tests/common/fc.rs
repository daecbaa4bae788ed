//! The Firecracker side of the drop-in scenarios: the reference Firecracker
//! beside the repository, and VMMs started the way Firecracker is (an API
//! socket in a directory of their own, nothing on stdio).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::{wait_for_path, VmmChild};

/// The repository's root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `../shared/reference` beside the repository (CI checks it out there):
/// Firecracker's API file and its reference binary.
pub fn reference_dir() -> PathBuf {
    repo_root().join("../shared/reference")
}

/// A VMM answering Firecracker's API on `sock`, killed on drop.
pub struct ApiVmm {
    pub sock: PathBuf,
    _process: VmmChild,
}

/// Starts `bin --api-sock DIR/api.sock EXTRA...` in `dir` (made if
/// missing) and waits for its socket.
pub fn launch(bin: &Path, dir: &Path, extra: &[&str]) -> ApiVmm {
    std::fs::create_dir_all(dir).unwrap();
    let sock = dir.join("api.sock");
    let child = Command::new(bin)
        .arg("--api-sock")
        .arg(&sock)
        .args(extra)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("start {}: {e}", bin.display()));
    let process = VmmChild::new(child);
    wait_for_path(&sock, Duration::from_secs(10));
    ApiVmm {
        sock,
        _process: process,
    }
}
