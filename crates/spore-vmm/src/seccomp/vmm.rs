//! The VMM thread kind's allow list: the main thread, the virtio device
//! workers and the helper threads (host-signals, guest-fork, standby-refill,
//! clone-reaper, source-watch, uffd, ws-record, serial-in, the spawner).
//!
//! Mostly syscall level: these threads build and restore VMs
//! (KVM ioctls on every kind of fd), write snapshots, serve devices' I/O and
//! start clone processes, and a clone process inherits the filter of the
//! thread that started it (guest-fork, standby-refill), so this list holds
//! what a whole VMM process needs outside its vCPU loops, its API server
//! included ([`SERVING`]). Both glibc's and musl's names are
//! listed where they differ (`open`/`openat`, `poll`/`ppoll`, ...); the
//! older names exist on x86_64 only ([`X86_ONLY`]). A few are allowed only
//! with the arguments a VMM passes ([`conditional`]): Unix and vsock sockets,
//! network namespaces, the open flags it uses, and no exec but of spore's
//! own executable by its descriptor.

use libc::*;
use seccompiler::{SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompRule};

use super::arg_is;

/// Allowed without conditions, grouped by why.
pub(super) const SYSCALLS: &[i64] = &[
    // Files: guest images, disks, snapshot state and memory files, logs.
    SYS_read,
    SYS_write,
    SYS_readv,
    SYS_writev,
    SYS_pread64,
    SYS_pwrite64,
    SYS_preadv,
    SYS_pwritev,
    SYS_preadv2,
    SYS_pwritev2,
    SYS_close,
    SYS_close_range,
    SYS_fstat,
    SYS_newfstatat,
    SYS_statx,
    SYS_statfs,
    SYS_fstatfs,
    SYS_lseek,
    SYS_fsync,
    SYS_fdatasync,
    SYS_ftruncate,
    // Disk hole punching (discard, overlays), balloon and virtio-mem release.
    SYS_fallocate,
    SYS_copy_file_range,
    SYS_sendfile,
    SYS_renameat,
    SYS_renameat2,
    SYS_unlinkat,
    SYS_mkdirat,
    SYS_linkat,
    SYS_readlinkat,
    SYS_getdents64,
    SYS_faccessat,
    SYS_faccessat2,
    SYS_fchmod,
    SYS_fchmodat,
    SYS_getcwd,
    // Snapshot memory files carry their layer's identity in a user xattr.
    SYS_fsetxattr,
    SYS_fgetxattr,
    SYS_flock,
    SYS_fcntl,
    SYS_dup,
    SYS_dup3,
    SYS_pipe2,
    SYS_umask,
    // KVM (VM, vCPU and device fds), TUN (TUNSETIFF/TUNSETVNETHDRSZ where a
    // tap is opened, TUNSETOFFLOAD in the virtio-net worker), block device
    // sizes, terminals. The net worker otherwise needs read/writev on the
    // tap, epoll, eventfds and timerfds, all listed here.
    SYS_ioctl,
    // Guest memory: memfds (sealed for templates), mappings, page state.
    SYS_memfd_create,
    SYS_mmap,
    SYS_mprotect,
    SYS_munmap,
    SYS_mremap,
    SYS_madvise,
    SYS_mincore,
    SYS_brk,
    // Lazy restores through userfaultfd (the syscall; /dev/userfaultfd is an open).
    SYS_userfaultfd,
    // Waiting: worker loops, timers, eventfds.
    SYS_ppoll,
    SYS_pselect6,
    SYS_epoll_create1,
    SYS_epoll_ctl,
    SYS_epoll_pwait,
    SYS_epoll_pwait2,
    SYS_eventfd2,
    SYS_timerfd_create,
    SYS_timerfd_settime,
    SYS_timerfd_gettime,
    // io_engine "Async": the drive's io_uring is set up (and its eventfd
    // registered) where the drive is opened, entered by the blk worker.
    SYS_io_uring_setup,
    SYS_io_uring_enter,
    SYS_io_uring_register,
    SYS_futex,
    SYS_nanosleep,
    SYS_clock_nanosleep,
    SYS_clock_gettime,
    SYS_clock_getres,
    SYS_gettimeofday,
    SYS_sched_yield,
    SYS_sched_getaffinity,
    // Unix sockets: vsock's host side, the clone handoff (SCM_RIGHTS);
    // `socket` and `socketpair` themselves only for Unix (and vsock) sockets
    // ([`conditional`]).
    SYS_bind,
    SYS_listen,
    SYS_accept,
    SYS_accept4,
    SYS_connect,
    SYS_sendto,
    SYS_recvfrom,
    SYS_sendmsg,
    SYS_recvmsg,
    SYS_shutdown,
    SYS_getsockopt,
    SYS_setsockopt,
    SYS_getsockname,
    SYS_getpeername,
    // Threads: creation, their exit, stacks, signals (the vCPU kick).
    SYS_clone,
    SYS_clone3,
    SYS_set_robust_list,
    SYS_rseq,
    SYS_set_tid_address,
    SYS_exit,
    SYS_exit_group,
    SYS_rt_sigaction,
    SYS_rt_sigprocmask,
    SYS_rt_sigreturn,
    SYS_rt_sigtimedwait,
    SYS_sigaltstack,
    SYS_tgkill,
    SYS_tkill,
    SYS_kill,
    SYS_restart_syscall,
    // Each new thread installs its own filter (stacked on this one).
    SYS_prctl,
    SYS_seccomp,
    // Clone processes: a vfork-like clone that execs `spore vmm` by
    // descriptor (`execveat`: [`conditional`]), its process group, waiting
    // for it; and the new process's own start (dynamic loader, libc and
    // Rust runtime set-up) under this filter.
    SYS_setpgid,
    SYS_wait4,
    SYS_waitid,
    SYS_pidfd_open,
    SYS_pidfd_send_signal,
    SYS_prlimit64,
    SYS_getrlimit,
    SYS_getrandom,
    SYS_uname,
    SYS_sysinfo,
    SYS_getpid,
    SYS_getppid,
    SYS_gettid,
    SYS_getuid,
    SYS_geteuid,
    SYS_getgid,
    SYS_getegid,
    SYS_getpgid,
];

/// The syscalls x86_64 keeps beside their successors (`open` beside
/// `openat`, `poll` beside `ppoll`, `fork` beside `clone`, ...), which
/// glibc and musl still call there; aarch64 never had them.
#[cfg(target_arch = "x86_64")]
pub(super) const X86_ONLY: &[i64] = &[
    SYS_stat,
    SYS_lstat,
    SYS_rename,
    SYS_unlink,
    SYS_mkdir,
    SYS_rmdir,
    SYS_link,
    SYS_readlink,
    SYS_access,
    SYS_chmod,
    SYS_dup2,
    SYS_poll,
    SYS_select,
    SYS_epoll_create,
    SYS_epoll_wait,
    SYS_eventfd,
    SYS_vfork,
    SYS_fork,
    // The runtime's thread-pointer set-up in a new process.
    SYS_arch_prctl,
    SYS_getpgrp,
];
#[cfg(not(target_arch = "x86_64"))]
pub(super) const X86_ONLY: &[i64] = &[];

/// What serving the API adds (on the API thread, and in a clone process
/// this filter is inherited by): tokio's reactor (epoll, its eventfd waker),
/// accepting connections and talking on them (`epoll_wait` on x86_64 is in
/// [`X86_ONLY`]).
pub(super) const SERVING: &[i64] = &[
    SYS_epoll_create1,
    SYS_epoll_ctl,
    SYS_epoll_pwait,
    SYS_eventfd2,
    SYS_accept4,
    SYS_recvfrom,
    SYS_sendto,
    SYS_recvmsg,
    SYS_sendmsg,
    SYS_shutdown,
    SYS_getsockopt,
    SYS_setsockopt,
    SYS_getsockname,
    SYS_getpeername,
    SYS_read,
    SYS_write,
    SYS_writev,
    SYS_close,
    SYS_futex,
];

/// The kernel's `O_LARGEFILE` (libc's constant is 0 on 64-bit targets,
/// but musl passes the kernel's bit on every open).
#[cfg(target_arch = "x86_64")]
const KERNEL_O_LARGEFILE: i32 = 0o100_000;
#[cfg(target_arch = "aarch64")]
const KERNEL_O_LARGEFILE: i32 = 0o400_000;

/// The open flags a VMM uses: access modes, creating and truncating its
/// snapshot files and logs, appending, non-blocking terminals and taps,
/// synchronous and direct disk I/O, directories (to fsync them), no
/// following of links, close-on-exec. Left out: `O_PATH` (an fd for `*at`
/// calls and `execveat` without opening the file) and `O_TMPFILE`.
const OPEN_FLAGS: i32 = O_ACCMODE
    | O_CREAT
    | O_EXCL
    | O_NOCTTY
    | O_TRUNC
    | O_APPEND
    | O_NONBLOCK
    | O_SYNC
    | O_DSYNC
    | O_DIRECT
    | O_DIRECTORY
    | O_NOFOLLOW
    | O_NOATIME
    | O_CLOEXEC
    | KERNEL_O_LARGEFILE;

/// A rule that lets the syscall through when its argument `index` (open
/// flags) has no bit outside [`OPEN_FLAGS`].
fn flags_within(index: u8) -> seccompiler::Result<SeccompRule> {
    let outside = u64::from(!OPEN_FLAGS.cast_unsigned());
    let cond = SeccompCondition::new(
        index,
        SeccompCmpArgLen::Dword,
        SeccompCmpOp::MaskedEq(outside),
        0,
    )?;
    Ok(SeccompRule::new(vec![cond])?)
}

/// The syscalls allowed only with some arguments, as Firecracker's filters
/// narrow theirs: a compromised VMM thread cannot reach the network or the
/// host's other namespaces through them.
fn conditional() -> seccompiler::Result<Vec<(i64, Vec<SeccompRule>)>> {
    let unix = u64::from(AF_UNIX.cast_unsigned());
    let vsock = u64::from(AF_VSOCK.cast_unsigned());
    let mut rules = vec![
        // Unix sockets (API, vsock's host side, clone handoffs) and vsock:
        // never an IP or netlink socket.
        (SYS_socket, vec![arg_is(0, unix)?, arg_is(0, vsock)?]),
        (SYS_socketpair, vec![arg_is(0, unix)?]),
        // A clone process enters its function's network namespace before
        // opening its taps (`clone::network`), under the filter it
        // inherited: network namespaces only, never mount, user or pid ones.
        (
            SYS_setns,
            vec![arg_is(1, u64::from(CLONE_NEWNET.cast_unsigned()))?],
        ),
        (SYS_openat, vec![flags_within(2)?]),
    ];
    // No `execve`: only spore itself, by the descriptor opened before the
    // filter (`own_exe`), and never a path.
    if let Some(fd) = crate::own_exe::fd() {
        let fd = SeccompCondition::new(
            0,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::Eq,
            u64::from(fd.cast_unsigned()),
        )?;
        let empty_path = SeccompCondition::new(
            4,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::Eq,
            u64::from(AT_EMPTY_PATH.cast_unsigned()),
        )?;
        rules.push((SYS_execveat, vec![SeccompRule::new(vec![fd, empty_path])?]));
    }
    #[cfg(target_arch = "x86_64")]
    rules.push((SYS_open, vec![flags_within(1)?]));
    Ok(rules)
}

/// The VMM kind's rules: every syscall in [`SYSCALLS`] (and [`X86_ONLY`]
/// there) and the API server's ([`SERVING`]) without conditions, and the
/// [`conditional`] ones.
pub(super) fn rules() -> seccompiler::Result<Vec<(i64, Vec<SeccompRule>)>> {
    let mut rules: Vec<(i64, Vec<SeccompRule>)> = SYSCALLS
        .iter()
        .chain(X86_ONLY)
        .chain(SERVING)
        .map(|&n| (n, Vec::new()))
        .collect();
    rules.extend(conditional()?);
    Ok(rules)
}
