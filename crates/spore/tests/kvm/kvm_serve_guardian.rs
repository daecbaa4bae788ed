//! A daemon killed with SIGKILL leaves nothing running: its guardian ends
//! its instances, zygotes and clones and removes their run directories at
//! once, without waiting for the next daemon.

use std::thread;
use std::time::{Duration, Instant};

use crate::common::serve::{guardian_pid, Daemon};
use crate::common::{require_kvm, Scratch};

#[test]
fn kvm_serve_a_killed_daemons_instances_end_without_a_restart() {
    require_kvm();
    let dir = Scratch::new("serve-guardian");
    let state = dir.path("state");
    let mut d = Daemon::start(&state, &[]);
    assert_eq!(d.create("f", "fn-echo", serde_json::json!({})).status, 201);
    assert_eq!(d.invoke("f", b"{}").status, 200);
    // Invocations at once: clones of the zygote beside the warm instance.
    let addr = d.addr.clone();
    let busy: Vec<_> = (0..4)
        .map(|i| {
            let addr = addr.clone();
            thread::spawn(move || {
                crate::common::serve::http(
                    &addr,
                    "POST",
                    "/2015-03-31/functions/f/invocations",
                    format!("{{\"i\":{i},\"sleep_ms\":300}}").as_bytes(),
                    &[],
                )
                .status
            })
        })
        .collect();
    for h in busy {
        assert_eq!(h.join().unwrap(), 200);
    }
    let before = d.vmm_pids();
    assert!(before.len() >= 2, "instances and a zygote run: {before:?}");
    let guardian = guardian_pid(&state).expect("the daemon's guardian runs");
    d.kill9();
    let deadline = Instant::now() + Duration::from_secs(20);
    let run = state.join("run");
    loop {
        let left = d.vmm_pids();
        let run_left = run.exists() && run.read_dir().is_ok_and(|mut r| r.next().is_some());
        if left.is_empty() && !run_left {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "20 s after the kill: VMMs {left:?} (of {before:?}), run directories left: {run_left}"
        );
        thread::sleep(Duration::from_millis(100));
    }
    // Its work done, the guardian is gone too.
    while std::path::Path::new(&format!("/proc/{guardian}")).exists()
        && !std::fs::read_to_string(format!("/proc/{guardian}/stat"))
            .is_ok_and(|s| s.contains(") Z "))
    {
        assert!(
            Instant::now() < deadline,
            "the guardian {guardian} still runs"
        );
        thread::sleep(Duration::from_millis(50));
    }
    // The next daemon starts at once and serves the function.
    let d2 = Daemon::start(&state, &[]);
    assert_eq!(d2.invoke("f", b"{}").status, 200);
}
