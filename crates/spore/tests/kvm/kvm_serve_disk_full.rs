//! A full disk: CreateFunction is refused with a clear error and leaves
//! nothing behind, the daemon keeps serving, and a daemon restarted on the
//! full disk still starts.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::common::serve::{wait_for_snapshot, Daemon};
use crate::common::{require_kvm, Scratch};

/// A small tmpfs mounted at `dir`, unmounted on drop.
struct SmallFs(std::path::PathBuf);

impl SmallFs {
    fn mount(dir: &Path, size: &str) -> SmallFs {
        std::fs::create_dir_all(dir).unwrap();
        let st = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                // Others may pass through (not list): the daemon's jailed
                // VMMs reach the state directory under it.
                &format!("size={size},mode=0711"),
                "tmpfs",
            ])
            .arg(dir)
            .status()
            .expect("running mount");
        assert!(
            st.success(),
            "mounting a tmpfs at {} (needs root)",
            dir.display()
        );
        SmallFs(dir.to_path_buf())
    }

    /// Fills the file system up to `leave` free bytes.
    fn fill(&self, leave: u64) {
        let free = {
            // SAFETY: a plain C struct of integers, valid all zero.
            let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
            let c = std::ffi::CString::new(self.0.as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: a NUL-terminated path and a valid output struct.
            assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
            st.f_bavail * st.f_frsize
        };
        let bytes = free.saturating_sub(leave);
        // Filled as far as it goes (the file system's own blocks make the
        // free count approximate).
        let _ = std::fs::write(
            self.0.join("ballast"),
            vec![1u8; usize::try_from(bytes).unwrap()],
        );
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[test]
fn kvm_serve_a_full_disk_refuses_code_cleanly_and_the_daemon_still_starts() {
    require_kvm();
    let dir = Scratch::new("disk-full");
    let fs = SmallFs::mount(&dir.path("s"), "256m");
    let state = dir.path("s/state");
    let mut d = Daemon::start(&state, &[]);
    assert_eq!(
        d.create("small", "fn-echo", serde_json::json!({})).status,
        201
    );
    assert_eq!(d.invoke("small", b"{}").status, 200);
    wait_for_snapshot(&state, "small", 1, Duration::from_secs(20));
    fs.fill(64 * 1024);
    let r = d.create("big", "fn-upper", serde_json::json!({}));
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(
        r.error_type(),
        Some("CodeStorageExceededException"),
        "{}",
        r.text()
    );
    assert_eq!(r.json()["Type"], "User");
    let code = std::fs::read_dir(state.join("code")).unwrap();
    let names: Vec<String> = code
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .collect();
    assert!(
        names.iter().all(|n| !n.starts_with(".tmp-")),
        "temporary code left: {names:?}"
    );
    assert_eq!(names.len(), 1, "only the first function's code: {names:?}");
    let r = d.request("GET", "/2015-03-31/functions/big", b"", &[]);
    assert_eq!(r.status, 404, "the refused function does not exist");
    assert_eq!(
        d.invoke("small", b"{}").status,
        200,
        "the daemon keeps serving"
    );
    // A daemon killed and started again on the full disk.
    d.kill9();
    let d2 = Daemon::start(&state, &[]);
    assert_eq!(d2.invoke("small", b"{}").status, 200);
    drop(d2);
    drop(fs);
}
