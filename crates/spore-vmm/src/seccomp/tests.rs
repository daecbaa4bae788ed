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
    let vmm = numbers(vmm::rules());
    let api = numbers(api::rules());
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
    assert!(Filters::from_json_file(&good).is_ok());
    let missing = write_tmp("missing.json", &format!(r#"{{"vmm":{one},"api":{one}}}"#));
    let e = Filters::from_json_file(&missing).err().unwrap().to_string();
    assert!(e.contains("\"vcpu\""), "{e}");
    let bad = write_tmp("bad.json", "{ not json");
    assert!(Filters::from_json_file(&bad).is_err());
    let gone = std::env::temp_dir().join("spore-seccomp-no-such-file.json");
    let e = Filters::from_json_file(&gone).err().unwrap().to_string();
    assert!(e.starts_with("--seccomp-filter"), "{e}");
    for p in [good, missing, bad] {
        let _ = std::fs::remove_file(p);
    }
}

/// Forks a child that installs `kind`'s filter and calls `socket(2)`;
/// returns how it ended (`wait` status).
fn child_calls_socket(kind: ThreadKind) -> i32 {
    let filters = Filters::builtin().unwrap();
    let prog = filters.get(kind).clone();
    // SAFETY: the child only calls async-signal-safe functions (prctl,
    // seccomp, socket, _exit) on memory allocated before the fork.
    unsafe {
        let pid = libc::fork();
        assert!(pid >= 0);
        if pid == 0 {
            if seccompiler::apply_filter(&prog).is_err() {
                libc::_exit(3);
            }
            let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
            libc::_exit(if fd >= 0 { 0 } else { 4 });
        }
        let mut status = 0;
        assert_eq!(libc::waitpid(pid, &mut status, 0), pid);
        status
    }
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

#[test]
fn settings_give_their_flags() {
    assert!(SeccompSetting::Default.to_args().is_empty());
    assert_eq!(SeccompSetting::Off.to_args(), vec!["--no-seccomp"]);
    assert_eq!(
        SeccompSetting::File("/f.json".into()).to_args(),
        vec!["--seccomp-filter", "/f.json"]
    );
}
