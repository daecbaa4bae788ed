//! `spore jailer` (also spore called as `jailer`): Firecracker's jailer.
//! It builds a jail for one microVM and execs the VMM binary inside it:
//!
//! 1. checks every flag (`args`), closes inherited descriptors;
//! 2. makes `<base>/<exec>/<id>/root` with a copy of the exec file and the
//!    device nodes a VM needs, owned by `--uid`:`--gid` (`chroot`);
//! 3. sets resource limits, joins `--netns`, makes and joins the cgroup
//!    `<parent>/<id>` in each v1 hierarchy or in the v2 one (`cgroup`);
//! 4. enters a new mount namespace rooted at the jail (pivot_root);
//! 5. daemonizes, forks into a new PID namespace if asked (`process`);
//! 6. drops to the uid/gid and execs `/<exec> --id <id> --start-time-us ..
//!    --start-time-cpu-us .. --parent-cpu-time-us .. <args after -->`.
//!
//! A failure before step 4 removes what this run made. Paths the VMM is
//! given (the API socket, kernels, snapshots) are inside the jail, relative
//! to its root. spore run this way sees `--id` first and answers
//! Firecracker's command line (`crate::fc_cmd`).

mod args;
mod cgroup;
mod chroot;
mod process;
mod sys;

use std::ffi::OsString;
use std::fs::File;
use std::path::PathBuf;

use args::{JailerArgs, Plan};
use clap::Parser;
use sys::clock_us;

/// The jailer's exit code for every failure (a line on stderr says why).
const EXIT_FAILURE: u8 = 1;

/// Runs the jailer on `argv` (argv[0] first); returns only on failure or
/// for `--help`.
pub fn main(argv: Vec<OsString>) -> u8 {
    let start_us = clock_us(libc::CLOCK_MONOTONIC);
    let start_cpu_us = clock_us(libc::CLOCK_PROCESS_CPUTIME_ID);
    let args = match JailerArgs::try_parse_from(argv) {
        Ok(a) => a,
        Err(e) if !e.use_stderr() => {
            let _ = e.print();
            return 0;
        }
        Err(e) => {
            // clap's first paragraph says what is wrong (a missing flag's
            // name on the lines under it); the usage follows: one line.
            let text = e.to_string();
            let what: Vec<&str> = text
                .lines()
                .take_while(|l| !l.trim().is_empty())
                .map(str::trim)
                .collect();
            eprintln!("jailer: {}", what.join(" "));
            return EXIT_FAILURE;
        }
    };
    let e = match args.plan() {
        Ok(plan) => run(plan, start_us, start_cpu_us),
        Err(e) => e,
    };
    eprintln!("jailer: error: {}", crate::one_line(&e));
    EXIT_FAILURE
}

/// Builds the jail and execs; returns the error that stopped it.
fn run(plan: Plan, start_us: u64, start_cpu_us: u64) -> anyhow::Error {
    if let Err(e) = process::close_inherited_fds() {
        return e;
    }
    let mut made = chroot::Made::default();
    let mut joined = cgroup::Joined::default();
    let mut outside = || -> anyhow::Result<Option<File>> {
        chroot::prepare(&plan, &mut made)?;
        process::set_limits(&plan.limits)?;
        if let Some(ns) = &plan.netns {
            process::join_netns(ns)?;
        }
        cgroup::setup(
            plan.cgroup_version,
            &plan.id,
            &plan.parent_cgroup,
            &plan.cgroups,
            &mut joined,
        )?;
        // Opened now: there is no /dev/null inside the jail.
        let dev_null = match plan.daemonize {
            true => Some(
                File::options()
                    .read(true)
                    .write(true)
                    .open("/dev/null")
                    .map_err(|e| anyhow::anyhow!("open /dev/null: {e}"))?,
            ),
            false => None,
        };
        chroot::enter(&plan.chroot_dir)?;
        Ok(dev_null)
    };
    let dev_null = match outside() {
        Ok(d) => d,
        Err(e) => {
            joined.undo();
            made.undo();
            return e;
        }
    };
    match inside(&plan, dev_null, start_us, start_cpu_us) {
        Ok(never) => match never {},
        Err(e) => e,
    }
}

/// In the jail: daemonize, PID namespace, pid file, privileges, exec.
fn inside(
    plan: &Plan,
    dev_null: Option<File>,
    start_us: u64,
    start_cpu_us: u64,
) -> anyhow::Result<std::convert::Infallible> {
    if let Some(n) = dev_null {
        process::daemonize(n)?;
    }
    let exec_name = plan.exec_name.clone();
    if plan.new_pid_ns {
        process::fork_into_pid_ns(|child| chroot::write_pid_file(&exec_name, child))?;
    } else {
        chroot::write_pid_file(&exec_name, std::process::id() as i32)?;
    }
    process::drop_privileges(plan.uid, plan.gid)?;
    let jailer_cpu_us = clock_us(libc::CLOCK_PROCESS_CPUTIME_ID).saturating_sub(start_cpu_us);
    let mut argv: Vec<OsString> = vec![
        "--id".into(),
        plan.id.clone().into(),
        "--start-time-us".into(),
        start_us.to_string().into(),
        "--start-time-cpu-us".into(),
        start_cpu_us.to_string().into(),
        "--parent-cpu-time-us".into(),
        jailer_cpu_us.to_string().into(),
    ];
    argv.extend(plan.exec_args.iter().cloned());
    let path = PathBuf::from("/").join(&plan.exec_name);
    let e = process::exec(&path, &argv);
    let missing = e
        .downcast_ref::<std::io::Error>()
        .is_some_and(|io| io.kind() == std::io::ErrorKind::NotFound);
    if missing && path.exists() {
        // The file is there: its ELF interpreter is not (a dynamic build).
        return Err(e.context(
            "a dynamically linked exec file needs its loader and libraries inside the jail; \
             use a static build",
        ));
    }
    Err(e)
}
