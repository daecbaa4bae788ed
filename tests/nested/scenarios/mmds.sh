#!/bin/sh
# Tier 3, issue 32 item 6 (MMDS served to guests): a Debian guest (the `web`
# sandbox template's image: curl, iproute2) asks the MMDS with curl, under
# spore and under the reference Firecracker, in the same L1, with the same
# kernel, image, MMDS configuration (V2, 169.254.169.254, eth0) and data; the
# two answer the same statuses, content types and bodies. Commands run in the
# guests through their envd over vsock (`spore sandbox exec`; Firecracker's
# hybrid vsock speaks the same handshake). Then spore's VM is snapshotted and
# restored in a new process: its MMDS still answers, with the same data.
#   mmds-boot          both guests up, eth0 addressed, MMDS routed to eth0
#   mmds-spore         spore's answers: 401 without a token, a V2 session
#                      token, IMDS and JSON formats, a string leaf, 404, 405,
#                      a PUT without its TTL, an invalid token, methods
#   mmds-firecracker   the same requests under Firecracker give the same
#                      status, Content-Type and body, one by one
#   mmds-restored      after a snapshot and a restore in a new VMM process,
#                      a new token and the same metadata
. "${SPORE_ROOT:-}/lib/spore/scenario-lib.sh"
tmp=${SPORE_TMP:-/tmp}
cd "$tmp" || exit 1
checks="mmds-boot mmds-spore mmds-firecracker mmds-restored"
reported=""
r() { reported="$reported $1"; t "$@"; }
fail_rest() {
    for c in $checks; do
        case " $reported " in *" $c "*) ;; *) r "$c" FAIL "$1" ;; esac
    done
}
img="${SPORE_SCRATCH:-/scratch}/sandbox-web.ext4"
fc_img="${SPORE_SCRATCH:-/scratch}/sandbox-web-fc.ext4"
fc="${SPORE_ROOT:-}/bin/firecracker"
[ -f "$img" ] && [ -f "$fc_img" ] || { fail_rest "no sandbox images on the scratch disk"; exit 0; }

boot_args="console=ttyS0 quiet reboot=k panic=1 pci=off root=/dev/vda rw rootfstype=ext4 init=/sbin/spore-agent spore.mode=sandbox spore.user=user"
metadata='{"latest":{"meta-data":{"ami-id":"ami-12345678","instance-id":"i-spore","local-hostname":"sbx.internal","network":{"macs":{"06:00:0a:00:05:02":{"device-number":"0"}}}}},"tags":["a","b"]}'
mmds_config='{"version":"V2","network_interfaces":["eth0"]}'

# tap NAME CIDR: a persistent tap in L1 (no traffic leaves through it: the
# guest's MMDS frames stop in the VMM).
tap() { tunctl -t "$1" >/dev/null 2>&1 && ip addr add "$2" dev "$1" && ip link set "$1" up; }

# configure SOCK TAP MAC IMG VSOCK [EXTRA_DRIVE_JSON]: the same VM through
# Firecracker's API on either VMM.
configure() {
    _a() { "$SPORE" api "$1" "$2" "$3" "$4" >/dev/null; }
    _a "$1" PUT /boot-source "{\"kernel_image_path\":\"$GUEST_KERNEL\",\"boot_args\":\"$boot_args\"}" &&
        _a "$1" PUT /machine-config '{"vcpu_count":1,"mem_size_mib":512}' &&
        _a "$1" PUT /drives/rootfs "{\"drive_id\":\"rootfs\",\"path_on_host\":\"$4\",\"is_root_device\":true,\"is_read_only\":false${6:+,$6}}" &&
        _a "$1" PUT /network-interfaces/eth0 "{\"iface_id\":\"eth0\",\"host_dev_name\":\"$2\",\"guest_mac\":\"$3\"}" &&
        _a "$1" PUT /vsock "{\"guest_cid\":3,\"uds_path\":\"$5\"}" &&
        _a "$1" PUT /mmds/config "$mmds_config" &&
        _a "$1" PUT /mmds "$metadata" &&
        _a "$1" PUT /actions '{"action_type":"InstanceStart"}'
}

# run_in VSOCK CMD: CMD as root in the guest (bounded).
run_in() { "$SPORE" sandbox exec --vsock "$1" --user root --timeout 60 -- "$2"; }

# up VSOCK ADDR: waits for envd (up to 180 s), then addresses eth0 and
# routes the MMDS address to it, as Firecracker's guide says.
up() {
    _i=0
    until run_in "$1" true >/dev/null 2>&1; do
        _i=$((_i + 1))
        [ $_i -ge 90 ] && return 1
        sleep 2
    done
    run_in "$1" "ip addr add $2/24 dev eth0 && ip link set eth0 up && ip route add 169.254.169.254 dev eth0"
}

# The requests, one line of output each: "STATUS CONTENT-TYPE BODY" (the
# body's newlines as |). Tokens differ between VMMs: only whether one was
# issued is printed.
requests='
m=http://169.254.169.254
ask() { b=$(mktemp); s=$(curl -s -m 10 -o "$b" -w "%{http_code} %{content_type}" "$@"); printf "%s %s\n" "$s" "$(tr "\n" "|" <"$b")"; rm -f "$b"; }
ask $m/latest/meta-data
T=$(curl -s -m 10 -X PUT $m/latest/api/token -H "X-metadata-token-ttl-seconds: 60")
[ -n "$T" ] && echo "token issued" || echo "no token"
ask -H "X-metadata-token: $T" $m/latest/meta-data
ask -H "X-metadata-token: $T" $m/latest/meta-data/
ask -H "X-metadata-token: $T" -H "Accept: application/json" $m/latest/meta-data
ask -H "X-aws-ec2-metadata-token: $T" $m/latest/meta-data/instance-id
ask -H "X-metadata-token: $T" -H "Accept: application/json" $m/tags
ask -H "X-metadata-token: $T" $m/tags
ask -H "X-metadata-token: $T" $m/latest/nope
ask -H "X-metadata-token: not-a-token" $m/latest/meta-data
ask -X PUT $m/latest/api/token
ask -X PUT -H "X-metadata-token-ttl-seconds: 0" $m/latest/api/token
ask -X PUT -H "X-metadata-token-ttl-seconds: 60" $m/latest/meta-data
ask -X POST -H "X-metadata-token: $T" $m/latest/meta-data
ask -X DELETE -H "X-metadata-token: $T" $m/latest/meta-data
ask -H "X-metadata-token: $T" "$m/latest/meta-data?x=1"
ask -H "X-metadata-token: $T" $m
'

cleanup() {
    kill "$vmm" "$fcpid" 2>/dev/null
    wait 2>/dev/null
}
trap cleanup EXIT

tap mmds0 10.0.5.1/24 && tap mmds1 10.0.6.1/24 || { fail_rest "cannot make taps in L1"; exit 0; }
"$SPORE" vmm --api-sock "$tmp/api.sock" >"$tmp/console.txt" 2>"$tmp/vmm.err" &
vmm=$!
wait_for_socket "$tmp/api.sock" || { fail_rest "spore's API socket never appeared: $(tail -n 3 "$tmp/vmm.err")"; exit 0; }
configure "$tmp/api.sock" mmds0 06:00:0a:00:05:02 "$img" "$tmp/v.sock" \
    "\"cow_overlay\":{\"path\":\"$tmp/rootfs.cow\"}" ||
    { fail_rest "spore refused the configuration: $(tail -n 3 "$tmp/vmm.err")"; exit 0; }
fcpid=""
if [ -x "$fc" ]; then
    "$fc" --api-sock "$tmp/fc.sock" >"$tmp/fc-console.txt" 2>&1 &
    fcpid=$!
    wait_for_socket "$tmp/fc.sock" &&
        configure "$tmp/fc.sock" mmds1 06:00:0a:00:06:02 "$fc_img" "$tmp/fc-v.sock" ||
        { echo "firecracker: $(tail -n 5 "$tmp/fc-console.txt")"; fcpid=""; }
fi

if up "$tmp/v.sock" 10.0.5.2; then
    spore_up=yes
else
    fail_rest "spore's guest never answered through envd; console: $(tail -n 5 "$tmp/console.txt" | tr '\n' '|')"
    exit 0
fi
fc_up=no
[ -n "$fcpid" ] && up "$tmp/fc-v.sock" 10.0.6.2 && fc_up=yes
r mmds-boot PASS "spore's guest up${fcpid:+, Firecracker's guest up: $fc_up}"

run_in "$tmp/v.sock" "$requests" >"$tmp/spore.out" 2>"$tmp/spore.err"
cp "$tmp/spore.out" "$SPORE_OUT/spore-answers.txt" 2>/dev/null
# What spore must answer, whatever Firecracker says (status and content type).
expect="401 text/plain|token issued|200 text/plain|200 text/plain|200 application/json|200 text/plain|200 application/json|501 text/plain|404 text/plain|401 text/plain|400 text/plain|400 text/plain|404 text/plain|501 application/json|405 text/plain|404 text/plain|200 text/plain"
got=$(cut -d' ' -f1-2 "$tmp/spore.out" | tr '\n' '|' | sed 's/|$//')
bodies_ok=yes
grep -q '^200 text/plain ami-id|instance-id|local-hostname|network/$' "$tmp/spore.out" || bodies_ok="IMDS listing"
grep -q '^200 text/plain i-spore$' "$tmp/spore.out" || bodies_ok="string leaf"
grep -q '^200 application/json \["a","b"\]$' "$tmp/spore.out" || bodies_ok="JSON array"
if [ "$got" = "$expect" ] && [ "$bodies_ok" = yes ]; then
    r mmds-spore PASS "$(wc -l <"$tmp/spore.out") answers as expected"
else
    r mmds-spore FAIL "got [$got] ($bodies_ok); output: $(tr '\n' '#' <"$tmp/spore.out" | cut -c1-600) $(cut -c1-200 "$tmp/spore.err")"
fi

if [ "$fc_up" = yes ]; then
    run_in "$tmp/fc-v.sock" "$requests" >"$tmp/fc.out" 2>"$tmp/fc.err"
    cp "$tmp/fc.out" "$SPORE_OUT/firecracker-answers.txt" 2>/dev/null
    if [ -s "$tmp/fc.out" ] && cmp -s "$tmp/spore.out" "$tmp/fc.out"; then
        r mmds-firecracker PASS "$(wc -l <"$tmp/fc.out") answers identical to Firecracker's"
    else
        r mmds-firecracker FAIL "differs from Firecracker's: $(diff "$tmp/fc.out" "$tmp/spore.out" 2>&1 | tr '\n' '#' | cut -c1-700)"
    fi
elif [ -x "$fc" ]; then
    r mmds-firecracker FAIL "Firecracker's guest never came up: $(tail -n 5 "$tmp/fc-console.txt" | tr '\n' '|')"
else
    r mmds-firecracker SKIP "no reference Firecracker in L1 (../shared/reference/firecracker)"
fi

# Snapshot, stop, restore in a new process: the store and its address come back.
if "$SPORE" snapshot create "$tmp/api.sock" --state "$tmp/vm.state" --mem "$tmp/vm.mem" --stop \
    >/dev/null 2>"$tmp/snap.err"; then
    wait "$vmm" 2>/dev/null
    "$SPORE" snapshot restore --state "$tmp/vm.state" --mem "$tmp/vm.mem" --api-sock "$tmp/api2.sock" \
        >"$tmp/console2.txt" 2>"$tmp/restore.err" &
    vmm=$!
    i=0
    until run_in "$tmp/v.sock" true >/dev/null 2>&1 || [ $i -ge 60 ]; do
        i=$((i + 1))
        sleep 1
    done
    after=$(run_in "$tmp/v.sock" 'T=$(curl -s -m 10 -X PUT http://169.254.169.254/latest/api/token -H "X-metadata-token-ttl-seconds: 30"); curl -s -m 10 -H "X-metadata-token: $T" http://169.254.169.254/latest/meta-data/instance-id' 2>&1)
    if [ "$after" = "i-spore" ]; then
        r mmds-restored PASS
    else
        r mmds-restored FAIL "after the restore: [$after]; $(tail -n 3 "$tmp/restore.err" | tr '\n' '|')"
    fi
else
    r mmds-restored FAIL "snapshot: $(cat "$tmp/snap.err")"
fi
fail_rest "not reached"
