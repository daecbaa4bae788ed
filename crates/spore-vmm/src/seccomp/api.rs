//! The API thread kind's allow list.
//!
//! The API server (a single-threaded tokio runtime, hyper, on a Unix socket)
//! runs every request on its own thread: `InstanceStart` builds the VM and
//! starts its vCPU threads, snapshot requests write files, `PUT /clone`
//! starts clone processes, `PUT /snapshot/load` restores. So this thread
//! needs the VMM kind's list ([`super::vmm::SYSCALLS`]) plus serving HTTP,
//! [`SERVING`]. (Firecracker's API thread only forwards requests to its VMM
//! thread, hence its much shorter list.)

use libc::*;
use seccompiler::SeccompRule;

/// What serving the API adds: tokio's reactor (epoll, its eventfd waker),
/// accepting connections and talking on them (`epoll_wait` on x86_64 is in
/// [`super::vmm::X86_ONLY`]).
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

/// The API kind's rules: [`SERVING`] and the VMM kind's list.
pub(super) fn rules() -> Vec<(i64, Vec<SeccompRule>)> {
    SERVING
        .iter()
        .chain(super::vmm::SYSCALLS)
        .chain(super::vmm::X86_ONLY)
        .map(|&n| (n, Vec::new()))
        .collect()
}
