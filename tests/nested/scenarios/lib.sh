# Shared by every nested scenario (host side in L1 and guest side in L2):
#     . "${SPORE_ROOT:-}/lib/spore/scenario-lib.sh"
# run.sh installs this file at /lib/spore/scenario-lib.sh in L1 and in the L2
# initramfs (under $SPORE_ROOT when a scenario runs directly on a host).
# POSIX sh (busybox ash): no bash-isms.

# t NAME PASS|FAIL|SKIP [DETAIL]: one result line, which run.sh collects.
t() { echo "SPORE-TEST $1 $2${3:+ $3}"; }

# wait_for_socket PATH [TENTHS]: waits until PATH is a socket, up to TENTHS
# tenths of a second (default 100); fails if it never appears.
wait_for_socket() {
    _i=0
    while [ ! -S "$1" ] && [ $_i -lt "${2:-100}" ]; do
        sleep 0.1
        _i=$((_i + 1))
    done
    [ -S "$1" ]
}
