//! Host-KVM end-to-end: boot the spore-uk example apps with the ring-3
//! protocol on `/dev/kvm` and check what a user would see (console output,
//! exit code, marks, idle CPU use).
//!
//! The run loop here is test scaffolding only: it collects COM1 bytes and
//! handles the signal port, sleeping for the whole timeout on WAIT (the real
//! VMM wakes early when a device has work). Without `/dev/kvm` each test
//! prints a skip line and returns.
//!
//! The apps are built from `crates/spore-uk` (its own workspace, target
//! x86_64-unknown-none) unless `SPORE_UK_DIR` names a directory holding
//! prebuilt `hello`, `idle` and `boot-mark`.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{mpsc, OnceLock};
use std::time::{Duration, Instant};

use kvm_bindings::kvm_userspace_memory_region;
use kvm_ioctls::{Kvm, VcpuExit};
use spore_abi::signal::{decode, SignalOp, SIGNAL_PORT, WAIT_TIMED_OUT};
use spore_vmm::arch::x86_64::layout::{ram_regions, KVM_TSS_ADDR, SERIAL_PORT_BASE};
use spore_vmm::arch::x86_64::unikernel::{
    configure_vcpu, is_spore_unikernel, load_unikernel, set_supported_cpuid,
};
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

fn kvm_missing(test: &str) -> bool {
    let missing = !Path::new("/dev/kvm").exists();
    if missing {
        println!("skipped: {test}: /dev/kvm is not available");
    }
    missing
}

/// Directory of the built apps; builds them once per test process.
fn apps_dir() -> PathBuf {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    DIR.get_or_init(|| {
        if let Some(dir) = std::env::var_os("SPORE_UK_DIR") {
            return Ok(PathBuf::from(dir));
        }
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
        let uk = manifest.join("../spore-uk");
        // A target dir of its own: the outer `cargo test` may still hold the
        // lock of the shared one.
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
            .unwrap_or_else(|| manifest.join("../../target"))
            .join("spore-uk");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        // Run from the crate directory so its .cargo/config.toml (target
        // x86_64-unknown-none) applies.
        let out = Command::new(cargo)
            .current_dir(&uk)
            .args(["build", "--release", "--target-dir"])
            .arg(&target)
            .output()
            .map_err(|e| format!("running cargo failed: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "building spore-uk failed (is the target installed? \
                 `rustup target add x86_64-unknown-none`):\n{}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(target.join("x86_64-unknown-none/release"))
    })
    .clone()
    .unwrap_or_else(|e| panic!("{e}"))
}

#[derive(Debug)]
struct Run {
    serial: String,
    exit_code: Option<u32>,
    marks: Vec<u32>,
    wall: Duration,
    /// CPU time of the vCPU thread while the guest ran.
    cpu: Duration,
}

fn thread_cpu_time() -> Duration {
    // SAFETY: getrusage fills the struct we pass; RUSAGE_THREAD is Linux's.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    assert_eq!(rc, 0, "getrusage failed");
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Creates a VM, loads `app`, runs it to its EXIT signal.
fn run_vm(app: &Path, cmdline: &str, mem_mib: u64) -> Result<Run, String> {
    let kvm = Kvm::new().map_err(|e| format!("open /dev/kvm: {e}"))?;
    let vm = kvm.create_vm().map_err(|e| format!("KVM_CREATE_VM: {e}"))?;
    vm.set_tss_address(KVM_TSS_ADDR as usize)
        .map_err(|e| format!("KVM_SET_TSS_ADDR: {e}"))?;
    let ranges: Vec<(GuestAddress, usize)> = ram_regions(mem_mib << 20)
        .into_iter()
        .map(|(a, s)| (GuestAddress(a), s as usize))
        .collect();
    let mem: GuestMemoryMmap = GuestMemoryMmap::from_ranges(&ranges).map_err(|e| e.to_string())?;
    for (slot, region) in mem.iter().enumerate() {
        let host = mem
            .get_host_address(region.start_addr())
            .map_err(|e| e.to_string())?;
        let r = kvm_userspace_memory_region {
            slot: slot as u32,
            flags: 0,
            guest_phys_addr: region.start_addr().0,
            memory_size: region.len(),
            userspace_addr: host as u64,
        };
        // SAFETY: the mapping lives in `mem`, which outlives the VM here.
        unsafe { vm.set_user_memory_region(r) }.map_err(|e| format!("memory slot: {e}"))?;
    }
    let mut vcpu = vm
        .create_vcpu(0)
        .map_err(|e| format!("KVM_CREATE_VCPU: {e}"))?;
    set_supported_cpuid(&kvm, &vcpu).map_err(|e| e.to_string())?;
    let tsc_khz = vcpu.get_tsc_khz().map(u64::from).unwrap_or(0);

    let mut image = File::open(app).map_err(|e| format!("{}: {e}", app.display()))?;
    if !is_spore_unikernel(&mut image).map_err(|e| e.to_string())? {
        return Err(format!("{} is not a spore unikernel", app.display()));
    }
    let entry =
        load_unikernel(&mem, &mut image, cmdline, &[], tsc_khz).map_err(|e| e.to_string())?;
    configure_vcpu(&vcpu, &entry).map_err(|e| e.to_string())?;

    let mut serial = Vec::new();
    let mut marks = Vec::new();
    let mut last_result = WAIT_TIMED_OUT;
    let (start, cpu_start) = (Instant::now(), thread_cpu_time());
    let exit_code = loop {
        match vcpu.run() {
            Ok(VcpuExit::IoOut(port, data)) => {
                if u64::from(port) == SERIAL_PORT_BASE {
                    serial.extend_from_slice(data);
                } else if port == SIGNAL_PORT && data.len() == 4 {
                    let value = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
                    match decode(value) {
                        Some((SignalOp::Exit, code)) => break Some(code),
                        Some((SignalOp::Mark, n)) => marks.push(n),
                        Some((SignalOp::Wait, us)) => {
                            std::thread::sleep(Duration::from_micros(u64::from(us)));
                            last_result = WAIT_TIMED_OUT;
                        }
                        _ => {}
                    }
                }
            }
            Ok(VcpuExit::IoIn(port, data)) => {
                if port == SIGNAL_PORT && data.len() == 4 {
                    data.copy_from_slice(&last_result.to_le_bytes());
                } else {
                    data.fill(0xff);
                }
            }
            Ok(other) => {
                let what = format!("{other:?}");
                let regs = vcpu
                    .get_regs()
                    .map(|r| format!("rip={:#x} rsp={:#x} rflags={:#x}", r.rip, r.rsp, r.rflags));
                return Err(format!(
                    "unexpected exit {what} ({regs:?}); console: {}",
                    String::from_utf8_lossy(&serial)
                ));
            }
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {}
            Err(e) => return Err(format!("KVM_RUN: {e}")),
        }
    };
    Ok(Run {
        serial: String::from_utf8_lossy(&serial).into_owned(),
        exit_code,
        marks,
        wall: start.elapsed(),
        cpu: thread_cpu_time() - cpu_start,
    })
}

/// Boots `app` on its own thread (so its CPU time is its own) with a deadline:
/// a guest that never exits fails the test instead of hanging it.
fn boot(app: &str, cmdline: &str, mem_mib: u64) -> Run {
    let path = apps_dir().join(app);
    let cmdline = cmdline.to_string();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(run_vm(&path, &cmdline, mem_mib));
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(Ok(run)) => run,
        Ok(Err(e)) => panic!("{app}: {e}"),
        Err(_) => panic!("{app}: the VM did not exit within 60 s"),
    }
}

#[test]
fn hello_prints_checks_heap_and_exits_with_requested_code() {
    if kvm_missing("hello_prints_checks_heap_and_exits_with_requested_code") {
        return;
    }
    let run = boot("hello", "exit=7", 128);
    println!("{}", run.serial);
    assert!(run.serial.contains("hello from spore-uk"), "{run:?}");
    assert!(run.serial.contains("cmdline: \"exit=7\""), "{run:?}");
    assert!(run.serial.contains("heap check passed"), "{run:?}");
    assert_eq!(run.exit_code, Some(7), "{run:?}");

    let run = boot("hello", "", 128);
    assert_eq!(run.exit_code, Some(0), "{run:?}");
}

#[test]
fn hello_fails_cleanly_when_the_heap_is_too_small() {
    if kvm_missing("hello_fails_cleanly_when_the_heap_is_too_small") {
        return;
    }
    let run = boot("hello", "exit=7", 32);
    assert!(run.serial.contains("heap check failed"), "{run:?}");
    assert_eq!(run.exit_code, Some(1), "{run:?}");
}

#[test]
fn a_panicking_app_prints_and_exits_101() {
    if kvm_missing("a_panicking_app_prints_and_exits_101") {
        return;
    }
    let run = boot("hello", "panic exit=3", 32);
    assert!(run.serial.contains("asked to panic"), "{run:?}");
    assert_eq!(run.exit_code, Some(101), "{run:?}");
}

#[test]
fn idle_guest_uses_almost_no_cpu() {
    if kvm_missing("idle_guest_uses_almost_no_cpu") {
        return;
    }
    let run = boot("idle", "secs=2", 64);
    println!(
        "{} (wall {:?}, cpu {:?})",
        run.serial.trim(),
        run.wall,
        run.cpu
    );
    assert_eq!(run.exit_code, Some(0), "{run:?}");
    assert!(run.serial.contains("idle: "), "{run:?}");
    assert!(run.wall >= Duration::from_millis(1900), "{run:?}");
    let share = run.cpu.as_secs_f64() / run.wall.as_secs_f64();
    assert!(
        share < 0.05,
        "idle guest used {:.1}% of a core: {run:?}",
        share * 100.0
    );
}

#[test]
fn boot_mark_signals_mark_one() {
    if kvm_missing("boot_mark_signals_mark_one") {
        return;
    }
    let run = boot("boot-mark", "", 32);
    assert_eq!(run.marks, vec![1], "{run:?}");
    assert_eq!(run.exit_code, Some(0), "{run:?}");
}

#[test]
fn built_apps_are_recognised_and_host_binaries_are_not() {
    if kvm_missing("built_apps_are_recognised_and_host_binaries_are_not") {
        return;
    }
    for app in ["hello", "idle", "boot-mark"] {
        let mut f = File::open(apps_dir().join(app)).unwrap();
        assert!(is_spore_unikernel(&mut f).unwrap(), "{app}");
    }
    let mut me = File::open("/proc/self/exe").unwrap();
    assert!(!is_spore_unikernel(&mut me).unwrap());
}
