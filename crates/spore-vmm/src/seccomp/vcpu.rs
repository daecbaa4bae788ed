//! The vCPU thread kind's allow list: a `KVM_RUN` loop and what its exits
//! do on the vCPU's thread (port I/O and MMIO through the buses, so device
//! register writes and activations; the signal port, whose `WAIT` sleeps;
//! tmem copies; serial output; logging).
//!
//! `ioctl` is allowed only with the KVM request numbers a vCPU thread makes
//! (`KVM_RUN`, and reading its registers after a guest crash),
//! `openat` only read-only.
//! Threads a vCPU thread needs (a device worker activated by the guest) are
//! started by the spawner thread (`super::spawn`), so no thread creation here.

use std::mem::size_of;

use libc::*;
use seccompiler::SeccompRule;
use vmm_sys_util::ioctl::ioctl_expr;
#[cfg(target_arch = "x86_64")]
use vmm_sys_util::ioctl::_IOC_READ;
#[cfg(target_arch = "aarch64")]
use vmm_sys_util::ioctl::_IOC_WRITE;

use super::arg_is;

/// `_IO(KVMIO, 0x80)`: KVM_RUN.
const KVM_RUN: u64 = 0xAE80;

/// A KVM request number (`_IOR`/`_IOW(KVMIO, nr, T)`).
#[allow(
    clippy::cast_possible_truncation,
    reason = "size is that of a KVM ioctl's argument struct, a few KiB at most"
)]
const fn kvm_request(dir: u32, nr: u32, size: usize) -> u64 {
    ioctl_expr(dir, kvm_bindings::KVMIO, nr, size as u32) as u64
}

/// Read-only requests for the report of where a crashed guest stopped
/// (`arch::crash_report`, on a triple fault's exit).
#[cfg(target_arch = "x86_64")]
const CRASH_REPORT: &[u64] = &[
    kvm_request(_IOC_READ, 0x81, size_of::<kvm_bindings::kvm_regs>()), // KVM_GET_REGS
    kvm_request(_IOC_READ, 0x83, size_of::<kvm_bindings::kvm_sregs>()), // KVM_GET_SREGS
    kvm_request(_IOC_READ, 0x9f, size_of::<kvm_bindings::kvm_vcpu_events>()), // KVM_GET_VCPU_EVENTS
];
#[cfg(target_arch = "aarch64")]
const CRASH_REPORT: &[u64] = &[
    kvm_request(_IOC_WRITE, 0xab, size_of::<kvm_bindings::kvm_one_reg>()), // KVM_GET_ONE_REG
];

/// Allowed without conditions, grouped by why.
const SYSCALLS: &[i64] = &[
    // Serial output, eventfd signals (irqfds, queue wakes), log lines.
    SYS_read,
    SYS_write,
    SYS_writev,
    // Allocation (tmem values, buffers) and its release.
    SYS_mmap,
    SYS_munmap,
    SYS_mremap,
    SYS_madvise,
    SYS_brk,
    // malloc growing a thread arena (seen in the host tests).
    SYS_mprotect,
    // A std HashMap's first random seed on this thread.
    SYS_getrandom,
    // Locks, the signal port's WAIT, pause/resume parking.
    SYS_futex,
    SYS_ppoll,
    SYS_nanosleep,
    SYS_clock_nanosleep,
    SYS_clock_gettime,
    SYS_sched_yield,
    // A WAIT's poll interrupted by SIGSTOP/SIGCONT (job control, ptrace, a
    // cgroup freezer) resumes through restart_syscall.
    SYS_restart_syscall,
    // The kick signal's handler returning.
    SYS_rt_sigreturn,
    SYS_rt_sigprocmask,
    SYS_sigaltstack,
    // A panic's abort raises SIGABRT at its own thread: glibc with tgkill,
    // musl (the static builds) with tkill. Without them the abort would be
    // a seccomp kill (SIGSYS) that hides the panic's signal.
    SYS_tgkill,
    SYS_tkill,
    SYS_getpid,
    SYS_gettid,
    // A device activated by the guest makes its stop eventfd here.
    SYS_eventfd2,
    // ... and the balloon its worker's epoll and statistics timer (the
    // activation runs on the vCPU thread that wrote DRIVER_OK; only a Linux
    // guest's balloon driver gets here, so the nested tier found it).
    SYS_epoll_create1,
    SYS_timerfd_create,
    SYS_timerfd_settime,
    // The vsock device, activated by the guest's MMIO write, registers its
    // sockets with its muxer's epoll (seen in the host tests).
    SYS_epoll_ctl,
    SYS_fcntl,
    SYS_close,
    // The tmem host-wide cap: its shared file's slots and OFD locks
    // (`devices::tmem::host_cap`; `fcntl` is above).
    SYS_pread64,
    SYS_pwrite64,
    // The thread's end (and a panic's abort).
    SYS_exit,
    SYS_exit_group,
];

/// The vCPU kind's rules: [`SYSCALLS`], `ioctl` on KVM_RUN and the
/// [`CRASH_REPORT`] reads only, and `rt_sigaction` on SIGSEGV and SIGBUS.
pub(super) fn rules() -> seccompiler::Result<Vec<(i64, Vec<SeccompRule>)>> {
    let mut rules: Vec<(i64, Vec<SeccompRule>)> =
        SYSCALLS.iter().map(|&n| (n, Vec::new())).collect();
    let mut requests = vec![arg_is(1, KVM_RUN)?];
    for &req in CRASH_REPORT {
        requests.push(arg_is(1, req)?);
    }
    rules.push((SYS_ioctl, requests));
    // A fault on this thread (SIGSEGV, SIGBUS) that is not a stack overflow:
    // std's handler puts the signal's default action back and returns, so
    // the fault kills the process by its own signal. Refused, that reset
    // would be a seccomp kill (SIGSYS) that hides which fault it was.
    rules.push((
        SYS_rt_sigaction,
        vec![arg_is(0, SIGSEGV as u64)?, arg_is(0, SIGBUS as u64)?],
    ));
    // The WAIT's sleep and the wake eventfd: glibc's poll() is `poll` on
    // x86_64 (aarch64 has only `ppoll`, listed above).
    #[cfg(target_arch = "x86_64")]
    rules.push((SYS_poll, Vec::new()));
    // glibc's malloc reads /proc/sys/vm/overcommit_memory the first time a
    // thread arena's heap shrinks (a free on this thread after a tmem call,
    // seen in `spore bench tmem`): read-only, close-on-exec opens only.
    let read_only = arg_is(2, (O_RDONLY | O_CLOEXEC) as u64)?;
    rules.push((SYS_openat, vec![read_only]));
    Ok(rules)
}
