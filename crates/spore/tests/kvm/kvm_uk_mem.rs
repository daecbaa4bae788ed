//! Host-KVM tier: the unikernel drives virtio-mem itself (`memtest` app).
//! Random plug/unplug under the guest's model, a touch of unplugged memory
//! (the VM must stop with an error naming the address, and the VMM's RSS
//! must not grow from it), and reclaim: the VMM's RSS falls once the guest's
//! allocator frees a tenant.

use std::io::{BufRead, BufReader};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use crate::common::*;

const MIB: u64 = 1 << 20;

struct Vm {
    child: VmmChild,
    lines: Receiver<String>,
    _dir: Scratch,
}

/// Starts `spore vmm --api-sock`, configures a 64 MiB unikernel running
/// `memtest ARGS` with a hotplug region of `total_mib` (2 MiB blocks), boots
/// it and sets the target to `requested_mib`.
fn start(tag: &str, args: &str, total_mib: u64, requested_mib: u64) -> Vm {
    require_kvm();
    let dir = Scratch::new(tag);
    let sock = dir.path("api.sock");
    let mut child = spawn_vmm(&sock);
    let boot = format!(
        r#"{{"kernel_image_path": "{}", "boot_args": "{args}"}}"#,
        uk_image("memtest").display()
    );
    let put = |path: &str, body: &str| {
        let (code, resp) = http(&sock, "PUT", path, Some(body));
        assert_eq!(code, 204, "PUT {path} {body}: {resp}");
    };
    put("/boot-source", &boot);
    put(
        "/machine-config",
        r#"{"vcpu_count": 1, "mem_size_mib": 64}"#,
    );
    put(
        "/hotplug/memory",
        &format!(r#"{{"total_size_mib": {total_mib}, "block_size_mib": 2, "slot_size_mib": 128}}"#),
    );
    put("/actions", r#"{"action_type": "InstanceStart"}"#);
    let (code, resp) = http(
        &sock,
        "PATCH",
        "/hotplug/memory",
        Some(&format!(r#"{{"requested_size_mib": {requested_mib}}}"#)),
    );
    assert_eq!(code, 204, "PATCH /hotplug/memory: {resp}");
    let stdout = child.stdout.take().unwrap();
    let (tx, lines) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    Vm {
        child,
        lines,
        _dir: dir,
    }
}

impl Vm {
    /// Waits for a stdout line containing `want`; returns it and every line before.
    fn expect_line(&self, want: &str, seen: &mut Vec<String>) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    seen.push(line.clone());
                    if line.contains(want) {
                        return line;
                    }
                }
                Err(_) => panic!("no line with {want:?}; got {seen:#?}"),
            }
        }
    }

    fn rss(&self) -> u64 {
        rss_bytes(self.child.id()).expect("VmRSS of the running VMM")
    }

    /// Waits for the VMM to exit: (exit code, all stdout lines, stderr).
    fn finish(mut self, mut seen: Vec<String>) -> (Option<i32>, Vec<String>, String) {
        let status = self.child.wait().unwrap();
        seen.extend(self.lines.iter());
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            std::io::Read::read_to_string(&mut e, &mut err).unwrap();
        }
        (status.code(), seen, err)
    }
}

#[test]
fn kvm_uk_mem_random_1000_blocks() {
    // 256 blocks in the region, 128 allowed: the model sees NACKs too.
    let vm = start("ukmem-random", "mode=random blocks=1000 seed=7", 512, 256);
    let (code, out, err) = vm.finish(Vec::new());
    let out = out.join("\n");
    assert_eq!(code, Some(0), "stdout:\n{out}\nstderr:\n{err}");
    let ok = out
        .lines()
        .find(|l| l.contains("memtest: random ok ops=1000"))
        .unwrap_or_else(|| panic!("no summary in {out}"));
    // Every kind of answer was exercised.
    for field in ["plugs=", "unplugs=", "nacks=", "errors=", "states="] {
        let n: u64 = ok
            .split_whitespace()
            .find_map(|w| w.strip_prefix(field))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        assert!(n > 0, "{field}0 in {ok}");
    }
}

#[test]
fn kvm_uk_mem_touch_unplugged_stops_the_vm() {
    let vm = start("ukmem-touch", "mode=touch-unplugged hold_ms=1000", 256, 2);
    let mut seen = Vec::new();
    vm.expect_line("unplugged block 0 of", &mut seen);
    // The guest holds for a second after the unplug: the baseline.
    std::thread::sleep(Duration::from_millis(300));
    let before = vm.rss();
    vm.expect_line("touching it", &mut seen);
    // Sample until the VMM is gone: the stray write must not fault a page in.
    let pid = vm.child.id();
    let mut peak = before;
    while let Some(r) = rss_bytes(pid) {
        peak = peak.max(r);
        std::thread::sleep(Duration::from_millis(5));
    }
    let (code, out, err) = vm.finish(seen);
    let out = out.join("\n");
    assert!(
        code.is_some_and(|c| c != 0),
        "exit {code:?}\nstdout:\n{out}\nstderr:\n{err}"
    );
    assert!(!out.contains("went through"), "{out}");
    // The region starts at 4 GiB; the app writes at block 0 + 0x1008.
    assert!(
        err.contains("MMIO write at 0x100001008 hits no device or RAM"),
        "stderr:\n{err}"
    );
    // Less than one 2 MiB block: a page faulted into the region would show.
    assert!(
        peak < before + MIB,
        "VMM RSS grew from {before} to {peak} after the touch"
    );
}

#[test]
fn kvm_uk_mem_reclaim_returns_memory() {
    let vm = start(
        "ukmem-reclaim",
        "mode=reclaim size=256 hold_ms=1500",
        512,
        256,
    );
    let mut seen = Vec::new();
    vm.expect_line("memtest: filled 256 MiB", &mut seen);
    std::thread::sleep(Duration::from_millis(300));
    let filled = vm.rss();
    let line = vm.expect_line("memtest: reclaim bytes=", &mut seen);
    vm.expect_line("memtest: reclaimed", &mut seen);
    std::thread::sleep(Duration::from_millis(300));
    let reclaimed = vm.rss();
    let (code, out, err) = vm.finish(seen);
    assert_eq!(code, Some(0), "stdout:\n{}\nstderr:\n{err}", out.join("\n"));
    assert!(line.contains("bytes=268435456"), "{line}");
    assert!(
        filled >= reclaimed + 240 * MIB,
        "VMM RSS {filled} after the fill, {reclaimed} after the unplug: {line}"
    );
}

#[test]
fn kvm_uk_mem_touch_right_after_unplug_and_sync() {
    // No pause: after UNPLUG and one more answered request (`sync`), the
    // emptied chunk's KVM slot must already be gone, every time.
    for i in 0..5 {
        let vm = start("ukmem-touch-now", "mode=touch-unplugged", 256, 2);
        let (code, out, err) = vm.finish(Vec::new());
        let out = out.join("\n");
        assert!(
            code.is_some_and(|c| c != 0) && !out.contains("went through"),
            "run {i}: exit {code:?}\nstdout:\n{out}\nstderr:\n{err}"
        );
        assert!(
            err.contains("MMIO write at 0x100001008 hits no device or RAM"),
            "run {i}: stderr:\n{err}"
        );
    }
}
