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

# guest_sh CMD [TRIES] [UDS]: runs shell command CMD in the L2 guest over
# vsock port 5000 (the guest scenarios serve one shell per connection) and
# prints its output; retries every 0.5 s, up to TRIES times (default 120),
# until an attempt answers. Each attempt is bounded (20 s), so a connection
# the guest never answers cannot hang the run. UDS defaults to $tmp/v.sock.
guest_sh() {
    _i=0
    while [ $_i -lt "${2:-120}" ]; do
        _out=$(printf '%s\nexit\n' "$1" | timeout 20 "$SPORE" vsock connect --uds "${3:-$tmp/v.sock}" --port 5000 2>/dev/null) &&
            [ -n "$_out" ] && { echo "$_out"; return 0; }
        sleep 0.5
        _i=$((_i + 1))
    done
    return 1
}

# boot_api_guest MACHINE_JSON DISK_MIB CMDLINE: starts `spore vmm` on
# $tmp/api.sock (console to $tmp/console.txt, stderr to $tmp/vmm.err; its
# pid in $vmm, the socket in $api) and boots the guest kernel and initramfs
# through the API with /machine-config MACHINE_JSON, a zeroed read-write
# disk $tmp/rw.img of DISK_MIB MiB (unless the file exists already) and
# vsock CID 3 on $tmp/v.sock. A failed step is reported as `boot FAIL`.
boot_api_guest() {
    api="$tmp/api.sock"
    [ -e "$tmp/rw.img" ] || dd if=/dev/zero of="$tmp/rw.img" bs=1M count="$2" 2>/dev/null
    "$SPORE" vmm --api-sock "$api" >"$tmp/console.txt" 2>"$tmp/vmm.err" &
    vmm=$!
    wait_for_socket "$api"
    "$SPORE" api "$api" PUT /boot-source "{\"kernel_image_path\":\"$GUEST_KERNEL\",\"initrd_path\":\"$GUEST_INITRD\",\"boot_args\":\"$3\"}" >/dev/null &&
        "$SPORE" api "$api" PUT /machine-config "$1" >/dev/null &&
        "$SPORE" api "$api" PUT /drives/rw "{\"drive_id\":\"rw\",\"path_on_host\":\"$tmp/rw.img\",\"is_root_device\":false,\"is_read_only\":false}" >/dev/null &&
        "$SPORE" api "$api" PUT /vsock "{\"guest_cid\":3,\"uds_path\":\"$tmp/v.sock\"}" >/dev/null &&
        "$SPORE" api "$api" PUT /actions '{"action_type":"InstanceStart"}' >/dev/null || t boot FAIL "$(cat "$tmp/vmm.err")"
}
