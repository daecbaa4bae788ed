//! The API thread kind's allow list.
//!
//! The API server (a single-threaded tokio runtime, hyper, on a Unix socket)
//! runs every request on its own thread: `InstanceStart` builds the VM and
//! starts its vCPU threads, snapshot requests write files, `PUT /clone`
//! starts clone processes, `PUT /snapshot/load` restores. So this thread
//! needs the VMM kind's list ([`super::vmm::SYSCALLS`]) plus serving HTTP
//! ([`super::vmm::SERVING`]), which the VMM list holds already: a clone
//! process started from a VMM thread serves its own API under that filter.
//! The two lists are one. (Firecracker's API thread only forwards requests
//! to its VMM thread, hence its much shorter list.)

use seccompiler::SeccompRule;

/// The API kind's rules: the VMM kind's, which hold serving the API too.
pub(super) fn rules() -> seccompiler::Result<Vec<(i64, Vec<SeccompRule>)>> {
    super::vmm::rules()
}
