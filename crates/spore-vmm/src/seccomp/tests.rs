//! The filters without a VM: they build, their lists nest as the stacking
//! needs, a JSON file is read or refused, and a syscall outside the vCPU list
//! kills the process.

use super::*;

fn numbers(rules: Vec<(i64, Vec<SeccompRule>)>) -> std::collections::BTreeSet<i64> {
    rules.into_iter().map(|(n, _)| n).collect()
}

#[test]
fn builtin_filters_build() {
    let f = Filters::builtin().unwrap();
    assert!(!f.vmm.is_empty() && !f.api.is_empty() && !f.vcpu.is_empty());
}

/// A vCPU thread starts from a VMM or API thread and stacks its filter on
/// theirs; a VMM thread may start from the API thread: each list must hold
/// the one stacked on it.
#[test]
fn lists_nest() {
    let vcpu = numbers(vcpu::rules().unwrap());
    let vmm = numbers(vmm::rules().unwrap());
    let api = numbers(api::rules().unwrap());
    assert!(vcpu.is_subset(&vmm), "{:?}", vcpu.difference(&vmm));
    assert!(vmm.is_subset(&api), "{:?}", vmm.difference(&api));
}

fn write_tmp(name: &str, text: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("spore-seccomp-{}-{name}", std::process::id()));
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn json_files_are_read_or_refused() {
    let one = r#"{"default_action":"kill_process","filter_action":"allow","filter":[{"syscall":"read"}]}"#;
    let good = write_tmp(
        "good.json",
        &format!(r#"{{"vmm":{one},"api":{one},"vcpu":{one}}}"#),
    );
    assert!(file::read(&good).is_ok());
    let missing = write_tmp("missing.json", &format!(r#"{{"vmm":{one},"api":{one}}}"#));
    let e = file::read(&missing).err().unwrap().to_string();
    assert!(e.contains("\"vcpu\""), "{e}");
    let bad = write_tmp("bad.json", "{ not json");
    assert!(file::read(&bad).is_err());
    let gone = std::env::temp_dir().join("spore-seccomp-no-such-file.json");
    let e = file::read(&gone).err().unwrap().to_string();
    assert!(e.starts_with("--seccomp-filter"), "{e}");
    for p in [good, missing, bad] {
        let _ = std::fs::remove_file(p);
    }
}

/// A file in Firecracker's compiled form (what its `seccompiler-bin` writes:
/// bitcode of category → instructions as u64).
fn write_compiled(name: &str, map: &std::collections::HashMap<String, Vec<u64>>) -> PathBuf {
    let p = std::env::temp_dir().join(format!("spore-seccomp-{}-{name}", std::process::id()));
    std::fs::write(&p, bitcode::serialize(map).unwrap()).unwrap();
    p
}

#[test]
fn compiled_firecracker_files_are_read_or_refused() {
    let builtin = Filters::builtin().unwrap();
    let as_u64 = |p: &BpfProgram| p.iter().map(file::encode).collect::<Vec<u64>>();
    // Category names in any case, as Firecracker lowercases them.
    let map = std::collections::HashMap::from([
        ("VMM".to_string(), as_u64(&builtin.vmm)),
        ("api".to_string(), as_u64(&builtin.api)),
        ("vcpu".to_string(), as_u64(&builtin.vcpu)),
    ]);
    let good = write_compiled("good.bpf", &map);
    let f = file::read(&good).unwrap();
    assert!(f.vmm == builtin.vmm && f.api == builtin.api && f.vcpu == builtin.vcpu);

    // An empty program: no filter for that kind (installing it is a no-op).
    let mut empty = map.clone();
    empty.insert("vcpu".into(), Vec::new());
    let empty = write_compiled("empty.bpf", &empty);
    let f = file::read(&empty).unwrap();
    assert!(f.vcpu.is_empty());
    f.install(ThreadKind::Vcpu).unwrap();

    let mut missing = map.clone();
    missing.remove("api");
    let missing = write_compiled("missing.bpf", &missing);
    let e = file::read(&missing).err().unwrap().to_string();
    assert!(e.contains("\"api\""), "{e}");

    let mut long = map.clone();
    long.insert("vcpu".into(), vec![0; 4097]);
    let long = write_compiled("long.bpf", &long);
    let e = file::read(&long).err().unwrap().to_string();
    assert!(e.contains("4097 instructions"), "{e}");

    let junk = write_tmp("junk.bpf", "\u{1}\u{2}junk");
    let e = file::read(&junk).err().unwrap().to_string();
    assert!(e.contains("neither seccompiler JSON nor"), "{e}");

    let big = write_tmp("big.bpf", &"x".repeat(file::COMPILED_LIMIT + 1));
    let e = file::read(&big).err().unwrap().to_string();
    assert!(e.contains("over 100000 bytes"), "{e}");
    for p in [good, empty, missing, long, junk, big] {
        let _ = std::fs::remove_file(p);
    }
}

/// Forks a child that installs `kind`'s filter and runs `body`, then exits
/// 0; returns how it ended (`wait` status). `body` must only make
/// async-signal-safe calls.
fn child_under(kind: ThreadKind, body: fn()) -> i32 {
    let filters = Filters::builtin().unwrap();
    let prog = filters.get(kind).clone();
    // SAFETY: the child only installs the filter (prctl, seccomp) from
    // memory allocated before the fork, runs `body` and calls _exit.
    unsafe {
        let pid = libc::fork();
        assert!(pid >= 0);
        if pid == 0 {
            if seccompiler::apply_filter(&prog).is_err() {
                libc::_exit(3);
            }
            body();
            libc::_exit(0);
        }
        let mut status = 0;
        assert_eq!(libc::waitpid(pid, &mut status, 0), pid);
        status
    }
}

/// Calls `socket(2)` under `kind`'s filter (exit 4 if it fails).
fn child_calls_socket(kind: ThreadKind) -> i32 {
    child_under(kind, || {
        // SAFETY: socket(2) with constant arguments, then _exit in the child.
        unsafe {
            if libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0) < 0 {
                libc::_exit(4);
            }
        }
    })
}

#[test]
fn a_syscall_outside_the_vcpu_list_kills_the_process() {
    let status = child_calls_socket(ThreadKind::Vcpu);
    assert!(libc::WIFSIGNALED(status), "status {status:#x}");
    assert_eq!(libc::WTERMSIG(status), libc::SIGSYS);
    // The VMM list allows it: the child exits normally.
    let status = child_calls_socket(ThreadKind::Vmm);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "status {status:#x}"
    );
}

/// What a compromised VMM thread must not do (reach the network, enter or
/// make other namespaces, open without reading): killed under every kind.
#[test]
fn narrowed_calls_kill_under_every_thread_kind() {
    let denied: &[(&str, fn())] = &[
        // SAFETY: a raw syscall on constant arguments, in the forked child.
        ("an IPv4 socket", || unsafe {
            libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        }),
        // SAFETY: a raw syscall on constant arguments, in the forked child.
        ("an IPv6 socket", || unsafe {
            libc::socket(libc::AF_INET6, libc::SOCK_DGRAM, 0);
        }),
        // SAFETY: a raw syscall on constant arguments, in the forked child.
        ("a netlink socket", || unsafe {
            libc::socket(libc::AF_NETLINK, libc::SOCK_RAW, 0);
        }),
        // SAFETY: a raw syscall on constant arguments, in the forked child.
        ("an IPv4 socket pair", || unsafe {
            let mut fds = [0; 2];
            libc::socketpair(libc::AF_INET, libc::SOCK_STREAM, 0, fds.as_mut_ptr());
        }),
        // SAFETY: a raw syscall on constant arguments, in the forked child.
        ("setns into a mount namespace", || unsafe {
            libc::setns(-1, libc::CLONE_NEWNS);
        }),
        // SAFETY: a raw syscall on constant arguments, in the forked child.
        ("setns into any namespace", || unsafe {
            libc::setns(-1, 0);
        }),
        // SAFETY: a raw syscall on constant arguments, in the forked child.
        ("unshare", || unsafe {
            libc::unshare(libc::CLONE_NEWNS);
        }),
        // SAFETY: a raw syscall on constant arguments, in the forked child.
        ("mount", || unsafe {
            let none = c"none".as_ptr();
            libc::mount(
                none,
                c"/".as_ptr(),
                none,
                libc::MS_REMOUNT,
                std::ptr::null(),
            );
        }),
        // SAFETY: a raw syscall on constant arguments, in the forked child.
        ("an O_PATH open", || unsafe {
            libc::openat(libc::AT_FDCWD, c"/".as_ptr(), libc::O_PATH);
        }),
        // SAFETY: a raw syscall on constant arguments, in the forked child.
        ("execve of a program", || unsafe {
            let argv = [c"true".as_ptr(), std::ptr::null()];
            let envp: [*const libc::c_char; 1] = [std::ptr::null()];
            libc::execve(c"/bin/true".as_ptr(), argv.as_ptr(), envp.as_ptr());
        }),
        // SAFETY: a raw syscall on constant arguments, in the forked child.
        ("execveat of a descriptor that is not spore's", || unsafe {
            let argv = [c"x".as_ptr(), std::ptr::null()];
            let envp: [*const libc::c_char; 1] = [std::ptr::null()];
            let empty = c"".as_ptr();
            let (a, e) = (argv.as_ptr(), envp.as_ptr());
            libc::syscall(libc::SYS_execveat, 0, empty, a, e, libc::AT_EMPTY_PATH);
        }),
        // SAFETY: a raw syscall on constant arguments, in the forked child.
        ("an O_TMPFILE open", || unsafe {
            libc::openat(
                libc::AT_FDCWD,
                c"/tmp".as_ptr(),
                libc::O_TMPFILE | libc::O_RDWR,
                0o600,
            );
        }),
    ];
    for kind in [ThreadKind::Vmm, ThreadKind::Api, ThreadKind::Vcpu] {
        for (what, body) in denied {
            let status = child_under(kind, *body);
            assert!(
                libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGSYS,
                "{what} under the {kind:?} filter: status {status:#x}"
            );
        }
    }
}

/// The same calls with the arguments a VMM passes go through the VMM and
/// API filters (a child exits 4 where a call failed otherwise than expected).
#[test]
fn the_narrowed_calls_pass_with_a_vmms_arguments() {
    let allowed: &[(&str, fn())] = &[
        // SAFETY: a raw syscall on constant arguments, in the forked child.
        ("a Unix socket", || unsafe {
            if libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) < 0 {
                libc::_exit(4);
            }
        }),
        // SAFETY: a raw syscall on constant arguments, in the forked child.
        ("a Unix socket pair", || unsafe {
            let mut fds = [0; 2];
            if libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET, 0, fds.as_mut_ptr()) < 0 {
                libc::_exit(4);
            }
        }),
        // A bad fd: refused by the kernel (EBADF), not by the filter.
        // SAFETY: a raw syscall on constant arguments, in the forked child.
        ("setns into a network namespace", || unsafe {
            if libc::setns(-1, libc::CLONE_NEWNET) == 0 {
                libc::_exit(4);
            }
        }),
        // SAFETY: a raw syscall on constant arguments, in the forked child.
        ("a directory opened to fsync it", || unsafe {
            let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC;
            if libc::openat(libc::AT_FDCWD, c"/".as_ptr(), flags) < 0 {
                libc::_exit(4);
            }
        }),
        // SAFETY: a raw syscall on constant arguments, in the forked child.
        ("a file created for writing", || unsafe {
            let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC;
            if libc::openat(libc::AT_FDCWD, c"/dev/null".as_ptr(), flags, 0o600) < 0 {
                libc::_exit(4);
            }
        }),
    ];
    for kind in [ThreadKind::Vmm, ThreadKind::Api] {
        for (what, body) in allowed {
            let status = child_under(kind, *body);
            assert!(
                libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
                "{what} under the {kind:?} filter: status {status:#x}"
            );
        }
    }
}

/// A fault on a vCPU thread ends the process by the fault's own signal,
/// not by a seccomp kill: std's handler may put the default action back.
#[test]
fn a_fault_under_the_vcpu_filter_ends_the_process_by_its_own_signal() {
    // std's SIGSEGV handler runs, resets the action and returns.
    let status = child_under(ThreadKind::Vcpu, || {
        let unmapped = std::hint::black_box(8usize) as *const u8;
        // SAFETY: not safe on purpose: the read faults, which is the test.
        let _ = unsafe { std::ptr::read_volatile(unmapped) };
    });
    assert!(libc::WIFSIGNALED(status), "status {status:#x}");
    assert_eq!(libc::WTERMSIG(status), libc::SIGSEGV);
}

#[test]
fn settings_give_their_flags() {
    assert!(SeccompSetting::Default.to_args().is_empty());
    assert_eq!(SeccompSetting::Off.to_args(), vec!["--no-seccomp"]);
    assert_eq!(
        SeccompSetting::File("/f.json".into()).to_args(),
        vec!["--seccomp-filter", "/f.json"]
    );
}
