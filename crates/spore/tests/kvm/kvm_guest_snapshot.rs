//! Host-KVM tier: guest-triggered snapshot points. The `snaptest` unikernel
//! fills memory, signals `SNAPSHOT` (tag given by `point=T`), prints what the
//! signal returned and counts; the VMM writes `tag-T.state`/`tag-T.mem` into
//! the configured directory and resumes or stops the VM. A VM restored from
//! that snapshot starts right after the signal: it prints `Restored` before
//! anything else and finds its memory intact.

use std::path::Path;
use std::process::{Output, Stdio};
use std::time::Duration;

use crate::common::*;

const CMDLINE: &str = "mib=8 rounds=3 sleep_ms=10";

fn lines(o: &Output) -> Vec<String> {
    stdout_of(o).lines().map(str::to_string).collect()
}

/// Restores `tag-T` from `dir` in a new VMM process; returns its output.
fn restore(dir: &Path, tag: u32) -> Output {
    spore()
        .args(["snapshot", "restore", "--state"])
        .arg(dir.join(format!("tag-{tag}.state")))
        .arg("--mem")
        .arg(dir.join(format!("tag-{tag}.mem")))
        .output()
        .unwrap()
}

/// The restored guest resumed right after its snapshot point: the signal's
/// result comes first, then the whole count, then an intact pattern.
fn assert_continues_after_point(o: &Output, tag: u32) {
    let l = lines(o);
    assert_eq!(o.status.code(), Some(0), "{l:?}\n{}", stderr_of(o));
    assert_eq!(
        l.first().map(String::as_str),
        Some(format!("snapshot point {tag}: Restored").as_str()),
        "the restored guest must start right after the point: {l:?}"
    );
    assert!(!l.iter().any(|x| x.starts_with("filled")), "{l:?}");
    assert_eq!(&l[1..4], ["count 0", "count 1", "count 2"], "{l:?}");
    assert!(
        l[4].starts_with("verify ok") && l[4].ends_with("pages=2048"),
        "{l:?}"
    );
}

#[test]
fn kvm_guest_snapshot_point_then_exit_restores_right_after_the_point() {
    require_kvm();
    let s = Scratch::new("guest-snap-exit");
    let dir = s.path("snaps");
    std::fs::create_dir(&dir).unwrap();
    let o = spore()
        .args(["run", "--mem", "64M", "--kernel"])
        .arg(uk_image("snaptest"))
        .args(["--cmdline", &format!("{CMDLINE} point=1")])
        .arg("--guest-snapshot-dir")
        .arg(&dir)
        .args(["--guest-snapshot-after", "exit"])
        .output()
        .unwrap();
    // The VM stopped at the point: nothing after it ran.
    assert_eq!(o.status.code(), Some(0), "{}", stderr_of(&o));
    assert_eq!(lines(&o), ["filled 8 MiB"], "{}", stderr_of(&o));
    let inspect = spore()
        .args(["snapshot", "inspect"])
        .arg(dir.join("tag-1.state"))
        .output()
        .unwrap();
    assert!(inspect.status.success(), "{}", stderr_of(&inspect));
    let manifest: serde_json::Value = serde_json::from_str(&stdout_of(&inspect)).unwrap();
    assert_eq!(manifest["mem_size_bytes"], 64u64 << 20);
    // Twice from the same files.
    for _ in 0..2 {
        assert_continues_after_point(&restore(&dir, 1), 1);
    }
}

#[test]
fn kvm_guest_snapshot_point_through_the_api_resumes_the_guest() {
    require_kvm();
    let s = Scratch::new("guest-snap-api");
    let (sock, dir) = (s.path("api.sock"), s.path("snaps"));
    std::fs::create_dir(&dir).unwrap();
    let vmm = spore()
        .args(["vmm", "--api-sock"])
        .arg(&sock)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_path(&sock, Duration::from_secs(10));
    let (code, body) = http(&sock, "GET", "/snapshot/guest-triggered", None);
    assert_eq!(code, 400, "{body}");
    // A directory that does not exist is refused up front.
    let missing = format!(r#"{{"directory": "{}"}}"#, s.path("nope").display());
    let (code, body) = http(&sock, "PUT", "/snapshot/guest-triggered", Some(&missing));
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("not a directory"), "{body}");
    let (code, body) = http(
        &sock,
        "PUT",
        "/snapshot/guest-triggered",
        Some(r#"{"directory": "/tmp", "after": "later"}"#),
    );
    assert_eq!(code, 400, "{body}");
    let config = format!(
        r#"{{"directory": "{}", "snapshot_type": "Full", "after": "resume"}}"#,
        dir.display()
    );
    let (code, body) = http(&sock, "PUT", "/snapshot/guest-triggered", Some(&config));
    assert_eq!(code, 204, "{body}");
    let (code, body) = http(&sock, "GET", "/snapshot/guest-triggered", None);
    assert_eq!(code, 200, "{body}");
    let got: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(got["after"], "resume");
    assert_eq!(got["directory"], dir.display().to_string());

    let boot = format!(
        r#"{{"kernel_image_path": "{}", "boot_args": "{CMDLINE} point=77"}}"#,
        uk_image("snaptest").display()
    );
    assert_eq!(http(&sock, "PUT", "/boot-source", Some(&boot)).0, 204);
    let mc = r#"{"vcpu_count": 1, "mem_size_mib": 64}"#;
    assert_eq!(http(&sock, "PUT", "/machine-config", Some(mc)).0, 204);
    let (code, body) = http(
        &sock,
        "PUT",
        "/actions",
        Some(r#"{"action_type": "InstanceStart"}"#),
    );
    assert_eq!(code, 204, "{body}");
    let o = vmm.wait_with_output().unwrap();
    let l = lines(&o);
    assert_eq!(o.status.code(), Some(0), "{l:?}\n{}", stderr_of(&o));
    assert_eq!(
        &l[..5],
        [
            "filled 8 MiB",
            "snapshot point 77: Taken",
            "count 0",
            "count 1",
            "count 2"
        ],
        "{l:?}"
    );
    assert!(l[5].starts_with("verify ok"), "{l:?}");
    assert_continues_after_point(&restore(&dir, 77), 77);
}

#[test]
fn kvm_guest_snapshot_point_failures_are_reported_to_the_guest() {
    require_kvm();
    let s = Scratch::new("guest-snap-fail");
    // Not configured: ignored, the guest is told and goes on.
    let o = spore()
        .args(["run", "--mem", "64M", "--kernel"])
        .arg(uk_image("snaptest"))
        .args(["--cmdline", &format!("{CMDLINE} point=3")])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr_of(&o));
    assert_eq!(lines(&o)[1], "snapshot point 3: NotConfigured");
    assert!(
        stderr_of(&o).contains("no snapshot directory"),
        "{}",
        stderr_of(&o)
    );

    // Configured in a config file, but the directory is gone when the guest
    // asks: the snapshot fails, the guest is told and is not stopped even
    // though `after` is `exit`.
    let config = serde_json::json!({
        "boot-source": {
            "kernel_image_path": uk_image("snaptest"),
            "boot_args": format!("{CMDLINE} point=4"),
        },
        "machine-config": {"vcpu_count": 1, "mem_size_mib": 64},
        "guest-snapshots": {
            "directory": s.path("gone").display().to_string(),
            "after": "exit",
        },
    });
    let file = s.path("vm.json");
    std::fs::write(&file, config.to_string()).unwrap();
    let o = spore()
        .args(["vmm", "--config-file"])
        .arg(&file)
        .output()
        .unwrap();
    let l = lines(&o);
    assert_eq!(o.status.code(), Some(0), "{l:?}\n{}", stderr_of(&o));
    assert_eq!(l[1], "snapshot point 4: Failed", "{l:?}");
    assert!(l.last().unwrap().starts_with("verify ok"), "{l:?}");
    assert!(
        stderr_of(&o).contains("guest-triggered snapshot failed"),
        "{}",
        stderr_of(&o)
    );
    assert!(!s.path("gone").exists());
}
