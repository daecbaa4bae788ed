#!/bin/sh
# Tier 3, issue 14 "virtio-net": a Linux guest (1 vCPU, 512 MiB) with a
# virtio-net interface on tap `tap0` (10.0.0.1/24 in L1; the guest is
# 10.0.0.2/24 from its command line, spore.ip=) and vsock for commands.
#   net-address     the guest has its address and answers ping from L1
#   net-transfer    64 MiB L1 -> guest (guest wget from L1's httpd) and 64 MiB
#                   guest -> L1 (L1 wget from the guest's httpd), sha256 equal
#                   on both sides; MiB/s of each direction
#   net-rate-limit-tx, -rx  PATCH a 10 MiB/s limiter (size 10485760,
#                   refill_time 1000) on one direction: a 60 MiB transfer takes
#                   (60 - 10) / 10 = 5 s (a bucket starts full: its 10 MiB
#                   pass at once, as in Firecracker); the rate past that burst
#                   must be within 10 % of 10 MiB/s. SKIP where the unlimited
#                   rate is not above 11 MiB/s (rx here); then
#   net-rate-limit-rx-5  the rx limiter at 5 MiB/s, 30 MiB
#   net-snapshot    full snapshot, VMM stopped, restore in a new process (the
#                   tap reopened by name): new TCP connections L1 -> guest and
#                   guest -> L1 work right away
#   net-clones      two clones of the restored guest, each in its own network
#                   namespace (/run/netns/spore-{n}, its own tap0 10.0.0.1/24),
#                   keep 10.0.0.2 and reach the HTTP server of their namespace
#   net-clone-mac   a clone given a new MAC and address (10.0.0.3/24) shows
#                   both in the guest (spore-reseed applied the notice), and
#                   L1 (its namespace) reaches it and sees the new MAC
# L1's userland is busybox: `tunctl` makes persistent taps, `unshare
# --net=FILE` / `nsenter --net=FILE` stand in for `ip netns add` / `exec`.
# Busybox 1.35's `wget -T` segfaults on any failed connect (SIGSEGV at address
# 0): waits are bounded with `timeout` instead.
. "${SPORE_ROOT:-}/lib/spore/scenario-lib.sh"
tmp=${SPORE_TMP:-/tmp}
cd "$tmp" || exit 1
api="$tmp/api.sock"
MIB=1048576
SIZE_MIB=${NET_SIZE_MIB:-64}
LIMIT_MIB=${NET_LIMIT_TRANSFER_MIB:-60}
GUEST_MAC=06:00:0a:00:00:02
checks="net-address net-transfer net-rate-limit-tx net-rate-limit-rx net-rate-limit-rx-5 net-snapshot net-clones net-clone-mac"

now_ms() { awk '{printf "%d", $1 * 1000}' /proc/uptime; }
# mibps BYTES MS: MiB/s with one decimal.
mibps() { awk -v b="$1" -v ms="$2" 'BEGIN { if (ms <= 0) ms = 1; printf "%.1f", b / 1048576 / (ms / 1000) }'; }
# fail_rest DETAIL: every check not reported yet fails with DETAIL (an unmet
# precondition is never a pass).
reported=""
r() { reported="$reported $1"; t "$@"; }
fail_rest() {
    for c in $checks; do
        case " $reported " in *" $c "*) ;; *) r "$c" FAIL "$1" ;; esac
    done
}
A() { "$SPORE" api "$api" "$@"; }
# vm_state: whether the first VMM still runs (or how it ended), and the last
# lines of its console and stderr: what a failed check needs to be told apart
# (a stalled device, a guest that panicked and rebooted, a VMM that died).
vm_state() {
    if kill -0 "$vmm" 2>/dev/null; then
        st="VMM running"
    else
        wait "$vmm" 2>/dev/null
        st="VMM ended (status $?)"
    fi
    echo "$st; console: $(tail -n 4 "$tmp/console.txt" 2>/dev/null | tr '\n' ' '); vmm.err: $(tail -n 3 "$tmp/vmm.err" 2>/dev/null | tr '\n' ' ')"
}

# guest CMD [VSOCK_UDS] [DEADLINE_S]: runs shell commands in the guest over
# vsock; retries until it answers, 90 s at most in all, each attempt at most
# 120 s (the 64 MiB transfers run inside one).
guest() {
    _deadline=$(($(now_ms) + ${3:-90} * 1000))
    while [ "$(now_ms)" -lt $_deadline ]; do
        # The end marker tells an answer (even an empty one) from a failed attempt.
        _out=$(printf '%s\necho __spore_end\nexit\n' "$1" | timeout 120 "$SPORE" vsock connect --uds "${2:-$vs}" --port 5000 2>>"$tmp/attempts") &&
            echo "$_out" | grep -q '^__spore_end$' && { echo "$_out" | grep -v '^__spore_end$'; return 0; }
        sleep 0.2
    done
    return 1
}
vs="$tmp/v.sock"

cleanup() {
    for p in $pids; do kill "$p" 2>/dev/null; done
    cp "$tmp"/*.txt "$tmp"/*.err "$tmp"/clones/*.log "$tmp"/*.json "$SPORE_OUT/" 2>/dev/null
}
pids=""

# --- L1 network: persistent tap0 (the VMM opens it by name; it must outlive
# the VMM for the restore), 10.0.0.1/24, and a payload behind busybox httpd.
if [ ! -c /dev/net/tun ]; then
    fail_rest "no /dev/net/tun in L1 (tun module not loaded: $(cat /lib/modules/load-order 2>/dev/null | tr '\n' ' '))"
    exit 0
fi
if ! { tunctl -t tap0 >"$tmp/tunctl.txt" 2>&1 && ip addr add 10.0.0.1/24 dev tap0 && ip link set tap0 up; }; then
    fail_rest "cannot make tap0 in L1: $(cat "$tmp/tunctl.txt")"
    exit 0
fi
mkdir -p "$tmp/www"
start=$(now_ms)
head -c $((SIZE_MIB * MIB)) /dev/urandom >"$tmp/www/blob"
head -c $((LIMIT_MIB * MIB)) /dev/urandom >"$tmp/www/limit-$LIMIT_MIB"
head -c $((30 * MIB)) "$tmp/www/limit-$LIMIT_MIB" >"$tmp/www/limit-30"
blob_sha=$(sha256sum "$tmp/www/blob" | cut -d' ' -f1)
echo "payloads made in $(($(now_ms) - start)) ms" >"$tmp/timings.txt"
echo "l1-http-ok" >"$tmp/www/hello"
httpd -f -p 10.0.0.1:8080 -h "$tmp/www" &
pids="$pids $!"

# --- boot
"$SPORE" vmm --api-sock "$api" >"$tmp/console.txt" 2>"$tmp/vmm.err" &
vmm=$!
pids="$pids $vmm"
wait_for_socket "$api"
cmdline="console=ttyS0 quiet reboot=k panic=1 pci=off i8042.noaux i8042.nomux i8042.dumbkbd spore.ip=10.0.0.2/24 spore.gw=10.0.0.1"
if ! { A PUT /boot-source "{\"kernel_image_path\":\"$GUEST_KERNEL\",\"initrd_path\":\"$GUEST_INITRD\",\"boot_args\":\"$cmdline\"}" >/dev/null &&
    A PUT /machine-config '{"vcpu_count":1,"mem_size_mib":512}' >/dev/null &&
    A PUT /network-interfaces/eth0 "{\"iface_id\":\"eth0\",\"host_dev_name\":\"tap0\",\"guest_mac\":\"$GUEST_MAC\"}" >"$tmp/put-net.txt" 2>&1 &&
    A PUT /vsock "{\"guest_cid\":3,\"uds_path\":\"$vs\"}" >/dev/null &&
    A PUT /actions '{"action_type":"InstanceStart"}' >/dev/null; } 2>>"$tmp/vmm.err"; then
    fail_rest "boot with a network interface failed: $(cat "$tmp/put-net.txt"; tail -n 3 "$tmp/vmm.err")"
    cleanup
    exit 0
fi

# --- net-address
addr=$(guest 'ip -4 addr show dev eth0; cat /sys/class/net/eth0/address')
if [ -z "$addr" ]; then
    fail_rest "the guest never answered over vsock: $(tail -n 5 "$tmp/console.txt")"
    cleanup
    exit 0
fi
ping -c 3 -W 5 10.0.0.2 >"$tmp/ping.txt" 2>&1
ping_rc=$?
if echo "$addr" | grep -q 'inet 10.0.0.2/24' && echo "$addr" | grep -qi "$GUEST_MAC" && [ $ping_rc = 0 ]; then
    r net-address PASS "10.0.0.2/24, mac $GUEST_MAC, ping: $(tail -n 1 "$tmp/ping.txt")"
else
    r net-address FAIL "guest: $(echo "$addr" | tr '\n' ' '); ping rc $ping_rc: $(tail -n 2 "$tmp/ping.txt" | tr '\n' ' ')"
fi

# spore.net_quick=1 on L1's command line (run.sh --append) skips the transfers
# and rate limits (SKIP), for debugging the snapshot and clone checks.
quick=0
grep -q 'spore.net_quick=1' /proc/cmdline 2>/dev/null && quick=1
if [ $quick = 1 ]; then
    for c in net-transfer net-rate-limit-tx net-rate-limit-rx net-rate-limit-rx-5; do r $c SKIP "spore.net_quick=1"; done
else
# --- net-transfer: times are the guest's own (/proc/uptime) around its wget,
# and L1's around its wget; checksums are of the files each side received.
down=$(guest "a=\$(cut -d' ' -f1 /proc/uptime); wget -q -O /tmp/blob http://10.0.0.1:8080/blob; rc=\$?; b=\$(cut -d' ' -f1 /proc/uptime);
    echo rc=\$rc ms=\$(awk -v a=\$a -v b=\$b 'BEGIN{printf \"%d\", (b-a)*1000}') sha=\$(sha256sum /tmp/blob | cut -d' ' -f1) size=\$(stat -c %s /tmp/blob); rm -f /tmp/blob" "" 300)
down_ms=$(echo "$down" | sed -n 's/.*ms=\([0-9]*\).*/\1/p')
down_sha=$(echo "$down" | sed -n 's/.*sha=\([0-9a-f]*\).*/\1/p')
start=$(now_ms)
made=$(guest "head -c $((SIZE_MIB * MIB)) /dev/urandom >/tmp/www/up && sha256sum /tmp/www/up | cut -d' ' -f1" "" 300)
echo "guest made its 64 MiB payload in $(($(now_ms) - start)) ms" >>"$tmp/timings.txt"
up_sha_guest=$(echo "$made" | tail -n 1)
start=$(now_ms)
timeout 150 wget -q -O "$tmp/up.bin" http://10.0.0.2:8080/up 2>"$tmp/wget-up.err"
up_rc=$?
up_ms=$(($(now_ms) - start))
up_sha=$(sha256sum "$tmp/up.bin" 2>/dev/null | cut -d' ' -f1)
rm -f "$tmp/up.bin"
guest 'rm -f /tmp/www/up' >/dev/null
down_rate="" up_rate=""
[ -n "$down_ms" ] && down_rate=$(mibps $((SIZE_MIB * MIB)) "$down_ms")
up_rate=$(mibps $((SIZE_MIB * MIB)) "$up_ms")
echo "transfer: down $down / up rc $up_rc ${up_ms} ms" >>"$tmp/timings.txt"
if [ -n "$down_sha" ] && [ "$down_sha" = "$blob_sha" ] && echo "$down" | grep -q 'rc=0' &&
    [ $up_rc = 0 ] && [ -n "$up_sha" ] && [ "$up_sha" = "$up_sha_guest" ]; then
    r net-transfer PASS "${SIZE_MIB} MiB L1->guest ${down_rate} MiB/s (${down_ms} ms), guest->L1 ${up_rate} MiB/s (${up_ms} ms), sha256 equal both ways"
else
    r net-transfer FAIL "down: '$(echo "$down" | tr '\n' ' ')' want sha $blob_sha; up: rc $up_rc $(cat "$tmp/wget-up.err") sha '$up_sha' want '$up_sha_guest'; $(vm_state)"
fi

# --- net-rate-limit-{rx,tx}: rx is what the guest receives (L1 -> guest),
# tx what it sends. A bucket starts full (Firecracker's semantics): its first
# `size` bytes pass at once, the rest at size per refill_time. So the rate
# past that burst, (bytes - size) / time, must be within 10 % of the limit.
# limit_rx MIB_PER_S TRANSFER_MIB / limit_tx ...: PATCH that limit on one
# direction, let the bucket fill, transfer, print "RATE MS" (RATE past the
# burst) or nothing on an error.
patch_limits() { # patch_limits RX_JSON TX_JSON
    A PATCH /network-interfaces/eth0 "{\"iface_id\":\"eth0\",\"rx_rate_limiter\":$1,\"tx_rate_limiter\":$2}" >"$tmp/patch.txt" 2>&1
}
lim() { echo "{\"bandwidth\":{\"size\":$(($1 * MIB)),\"refill_time\":1000}}"; }
off='{"bandwidth":{"size":0,"refill_time":0}}'
# rx_ms MIB: the guest's time (ms) to fetch MIB MiB from L1 into /dev/null.
rx_ms() {
    guest "a=\$(cut -d' ' -f1 /proc/uptime); timeout 60 wget -q -O /dev/null http://10.0.0.1:8080/limit-$1; rc=\$?; b=\$(cut -d' ' -f1 /proc/uptime);
        echo rc=\$rc ms=\$(awk -v a=\$a -v b=\$b 'BEGIN{printf \"%d\", (b-a)*1000}')" "" 120 | sed -n 's/.*rc=0 ms=\([0-9]*\).*/\1/p'
}
limit_rx() {
    patch_limits "$(lim "$1")" "$off" || return 1
    sleep 1.2
    _ms=$(rx_ms "$2")
    [ -n "$_ms" ] && echo "$(mibps $((($2 - $1) * MIB)) "$_ms") $_ms"
}
limit_tx() {
    guest "head -c $(($2 * MIB)) /dev/urandom >/tmp/www/limit" "" 300 >/dev/null
    patch_limits "$off" "$(lim "$1")" || return 1
    sleep 1.2
    _s=$(now_ms)
    timeout 60 wget -q -O /dev/null http://10.0.0.2:8080/limit 2>>"$tmp/wget-limit.err" || { echo "L1 wget rc $? after $(($(now_ms) - _s)) ms" >>"$tmp/wget-limit.err"; return 1; }
    _ms=$(($(now_ms) - _s))
    guest 'rm -f /tmp/www/limit' >/dev/null
    echo "$(mibps $((($2 - $1) * MIB)) "$_ms") $_ms"
}
# judge NAME LIMIT TRANSFER_MIB "RATE MS" [AGAIN]: PASS within 10 % of LIMIT.
# Over the limit fails at once: the limiter let too much through. Under it,
# the measurement is taken once more (AGAIN: the command that measures): a
# nested guest on a loaded host may for a while not send or read as fast as
# the limit allows, which says nothing about the limiter.
judge() {
    local name=$1 limit=$2 mib=$3 again=${5:-} earlier=""
    set -- $4
    while :; do
        if [ -z "${1:-}" ]; then
            r "$name" FAIL "no timed transfer: $(cat "$tmp/patch.txt" "$tmp/wget-limit.err" 2>/dev/null | tail -n 2 | tr '\n' ' '); $(vm_state)"
            return
        fi
        detail="$1 MiB/s past the ${limit} MiB burst ($mib MiB in $2 ms; $(mibps $((mib * MIB)) "$2") MiB/s with it); limit $limit MiB/s$earlier"
        if awk -v x="$1" -v l="$limit" 'BEGIN{exit !(x >= 0.9 * l && x <= 1.1 * l)}'; then
            r "$name" PASS "$detail"
            return
        fi
        if [ -z "$again" ] || awk -v x="$1" -v l="$limit" 'BEGIN{exit !(x > 1.1 * l)}'; then
            r "$name" FAIL "$detail"
            return
        fi
        earlier=" (measured again: $1 MiB/s the first time)"
        set -- $($again)
        again=""
    done
}
if awk -v u="$up_rate" 'BEGIN{exit !(u < 11)}'; then
    r net-rate-limit-tx SKIP "the unlimited guest->L1 rate ($up_rate MiB/s) is not above 11 MiB/s: a 10 MiB/s limit cannot be told apart"
else
    judge net-rate-limit-tx 10 "$LIMIT_MIB" "$(limit_tx 10 "$LIMIT_MIB")" "limit_tx 10 $LIMIT_MIB"
fi
# Unlimited rx into /dev/null (the 64 MiB above went to the guest's tmpfs).
free_ms=$(rx_ms 30)
[ -n "$free_ms" ] && down_rate=$(mibps $((30 * MIB)) "$free_ms")
if [ -n "$down_rate" ] && awk -v d="$down_rate" 'BEGIN{exit !(d >= 11)}'; then
    judge net-rate-limit-rx 10 "$LIMIT_MIB" "$(limit_rx 10 "$LIMIT_MIB")" "limit_rx 10 $LIMIT_MIB"
else
    r net-rate-limit-rx SKIP "the unlimited L1->guest rate (${down_rate:-?} MiB/s) is not above 11 MiB/s: a 10 MiB/s limit cannot be told apart (net-rate-limit-rx-5 checks the rx limiter at 5 MiB/s)"
fi
# The rx limiter at a rate this setup can exceed: 5 MiB/s, 30 MiB (5 s).
judge net-rate-limit-rx-5 5 30 "$(limit_rx 5 30)" "limit_rx 5 30"
patch_limits "$off" "$off" || r net-rate-limit-off FAIL "$(cat "$tmp/patch.txt")"
fi
# A VMM that is gone leaves nothing to snapshot or clone: say how it ended
# now rather than after every later step's timeout.
if ! kill -0 "$vmm" 2>/dev/null; then
    fail_rest "the first VMM is gone: $(vm_state)"
    cleanup
    exit 0
fi

# --- net-snapshot: the guest's view of the tap must survive a new VMM process.
if ! "$SPORE" snapshot create "$api" --state "$tmp/vm.state" --mem "$tmp/vm.mem" --stop >"$tmp/snapshot.json" 2>"$tmp/snapshot.err"; then
    r net-snapshot FAIL "snapshot create: $(cat "$tmp/snapshot.err")"
    fail_rest "no snapshot to restore and clone"
    cleanup
    exit 0
fi
i=0
while kill -0 $vmm 2>/dev/null && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
kill -9 $vmm 2>/dev/null
wait $vmm 2>/dev/null
api="$tmp/api-r.sock"
SPORE_LOG=${SPORE_LOG:-debug} "$SPORE" snapshot restore --state "$tmp/vm.state" --mem "$tmp/vm.mem" --api-sock "$api" \
    >"$tmp/console-restored.txt" 2>"$tmp/restore.err" &
restored=$!
pids="$pids $restored"
wait_for_socket "$api" 300
start=$(now_ms)
l1_to_guest="" i=0
while [ $i -lt 60 ]; do
    l1_to_guest=$(timeout 5 wget -q -O - http://10.0.0.2:8080/hello 2>>"$tmp/restore-wget.err") && break
    sleep 0.5
    i=$((i + 1))
done
first_ms=$(($(now_ms) - start))
guest_to_l1=$(guest 'timeout 10 wget -q -O - http://10.0.0.1:8080/hello' "" 60)
if [ "$l1_to_guest" = guest-http-ok ] && [ "$guest_to_l1" = l1-http-ok ]; then
    r net-snapshot PASS "restored in a new process; first L1->guest HTTP reply ${first_ms} ms after the restore (attempt $((i + 1))), guest->L1 HTTP ok"
else
    # Where frames stop: counters on both ends around one ping from L1.
    tapstat() { for f in carrier operstate statistics/rx_packets statistics/tx_packets statistics/tx_dropped; do printf '%s=%s ' "${f#statistics/}" "$(cat /sys/class/net/tap0/$f 2>/dev/null)"; done; }
    tcpstat() { awk '/^Tcp:/ { if (h) { for (i = 2; i <= NF; i++) printf "%s=%s ", n[i], $i } else { h = 1; for (i = 2; i <= NF; i++) n[i] = $i } }' /proc/net/snmp | tr ' ' '\n' | grep -E 'Opens|Segs|Errs|CsumErrors|Fails|Resets' | tr '\n' ' '; }
    g1=$(guest 'grep eth0 /proc/net/dev' "" 20)
    t1=$(tapstat)
    ping -c 2 -W 2 10.0.0.2 >/dev/null 2>&1 && pinged=yes || pinged=no
    t2=$(tapstat)
    timeout 5 wget -q -O /dev/null http://10.0.0.2:8080/hello 2>/dev/null && tcp=yes || tcp=no
    g2=$(guest "grep eth0 /proc/net/dev; awk '/^Tcp:/ { if (h) { for (i = 2; i <= NF; i++) printf \"%s=%s \", n[i], \$i } else { h = 1; for (i = 2; i <= NF; i++) n[i] = \$i } }' /proc/net/snmp; echo; dmesg | grep -v clocksource | tail -n 3" "" 20 | tr '\n' ' ')
    r net-snapshot FAIL "L1->guest '$l1_to_guest' (${first_ms} ms, $(tail -n 1 "$tmp/restore-wget.err")), guest->L1 '$guest_to_l1'; ping after: $pinged, one more HTTP try: $tcp; L1 tap0 before: $t1, after ping: $t2, after HTTP: $(tapstat), L1 TCP: $(tcpstat), neigh: $(ip neigh show dev tap0 | tr '\n' ' '); guest /proc/net/dev before: $g1, after: $g2; VMM: $(grep -i -E 'net|tap|error|warn' "$tmp/restore.err" | tail -n 5 | tr '\n' ' ')"
fi

# --- net-clones / net-clone-mac: namespaces spore-1..3, each with tap0
# 10.0.0.1/24 and an httpd saying which namespace it is.
mkdir -p /run/netns "$tmp/clones"
ns_ok=1
for n in 1 2 3; do
    f=/run/netns/spore-$n
    mkdir -p "$tmp/www-$n" && echo "netns-$n" >"$tmp/www-$n/id"
    { touch "$f" && unshare --net="$f" true &&
        nsenter --net="$f" sh -c 'ip link set lo up && tunctl -t tap0 >/dev/null && ip addr add 10.0.0.1/24 dev tap0 && ip link set tap0 up'; } \
        >>"$tmp/netns.err" 2>&1 || ns_ok=0
    nsenter --net="$f" httpd -f -p 10.0.0.1:8080 -h "$tmp/www-$n" &
    pids="$pids $!"
done
if [ $ns_ok = 0 ]; then
    fail_rest "cannot make network namespaces in L1: $(cat "$tmp/netns.err")"
    cleanup
    exit 0
fi

# clone_put COUNT INTERFACES_JSON: PUT /clone with a network object.
clone_put() {
    A PUT /clone "{\"count\":$1,\"socket_dir\":\"$tmp/clones\",\"network\":{\"netns_template\":\"/run/netns/spore-{n}\",\"interfaces\":[$2]}}"
}
# clone_entry INDEX: that clone's object of the PUT /clone replies, on one line
# (a CloneInfo has no nested objects).
clone_entry() { cat "$tmp"/clone-*.json | tr -d '\n' | tr '}' '\n' | grep "\"index\": *$1,"; }
# clone_vsock INDEX: its vsock socket, beside its API socket.
clone_vsock() {
    sock=$(clone_entry "$1" | sed -n 's/.*"socket": *"\([^"]*\)".*/\1/p' | head -n 1)
    echo "${sock%.sock}.vsock"
}
clone_pid() { clone_entry "$1" | sed -n 's/.*"pid": *\([0-9]*\).*/\1/p' | head -n 1; }

# Two clones keep 10.0.0.2 (each in its own namespace, so no conflict).
# Each clone gets a new MAC, 06:00:0a:01:HH:LL for clone number HHLL.
mac_tmpl='"guest_mac_template":"06:00:0a:01:{n}"'
if clone_put 2 "{\"iface_id\":\"eth0\",$mac_tmpl,\"ipv4\":\"10.0.0.2/24\",\"gateway\":\"10.0.0.1\"}" >"$tmp/clone-a.json" 2>"$tmp/clone-a.err"; then
    clones_detail="" clones_ok=1 macs=""
    for n in 1 2; do
        pids="$pids $(clone_pid $n)"
        applied=$(guest 'i=0; while [ ! -f /run/spore-net ] && [ $i -lt 100 ]; do sleep 0.2; i=$((i+1)); done; cat /run/spore-net' "$(clone_vsock $n)" 90)
        out=$(guest "ip -4 addr show dev eth0 | grep -o 'inet [0-9./]*'; cat /sys/class/net/eth0/address; timeout 10 wget -q -O - http://10.0.0.1:8080/id" "$(clone_vsock $n)" 90)
        ping_ns=$(nsenter --net=/run/netns/spore-$n ping -c 1 -W 5 10.0.0.2 >/dev/null 2>&1 && echo ok || echo no)
        mac=$(echo "$out" | sed -n 2p)
        macs="$macs $mac"
        clones_detail="$clones_detail clone $n: $(echo "$out" | tr '\n' ' ')ping from netns $ping_ns, notice '$(echo "$applied" | tr '\n' ' ')';"
        echo "$out" | grep -q 'inet 10.0.0.2/24' && [ "$(echo "$out" | sed -n 3p)" = "netns-$n" ] && [ $ping_ns = ok ] || clones_ok=0
    done
    if [ $clones_ok = 1 ]; then r net-clones PASS "$clones_detail"; else r net-clones FAIL "$clones_detail $(tail -n 3 "$tmp"/clones/*.log 2>/dev/null | tr '\n' ' ')"; fi
else
    r net-clones FAIL "PUT /clone with a network: $(cat "$tmp/clone-a.json" "$tmp/clone-a.err")"
fi

# A third clone with a new address: the notice's mac and ipv4 lines applied.
if clone_put 1 "{\"iface_id\":\"eth0\",$mac_tmpl,\"ipv4\":\"10.0.0.3/24\",\"gateway\":\"10.0.0.1\"}" >"$tmp/clone-b.json" 2>"$tmp/clone-b.err"; then
    n=$(sed -n 's/.*"index": *\([0-9]*\).*/\1/p' "$tmp/clone-b.json" | head -n 1)
    pids="$pids $(clone_pid "$n")"
    # /run/spore-net appears once spore-reseed applied the notice.
    out=$(guest "i=0; while [ ! -f /run/spore-net ] && [ \$i -lt 100 ]; do sleep 0.2; i=\$((i+1)); done; cat /sys/class/net/eth0/address; ip -4 addr show dev eth0 | grep -o 'inet [0-9./]*'; ip route | grep default; cat /run/spore-net" "$(clone_vsock "$n")" 90)
    mac=$(echo "$out" | sed -n 1p)
    nsf=/run/netns/spore-$n
    ping_ns=$(nsenter --net="$nsf" ping -c 1 -W 5 10.0.0.3 >/dev/null 2>&1 && echo ok || echo no)
    neigh=$(nsenter --net="$nsf" ip neigh show 10.0.0.3 2>&1)
    notice_mac=$(echo "$out" | sed -n 's/^mac [^ ]* \(.*\)$/\1/p' | tr 'A-F' 'a-f')
    detail="clone $n (netns spore-$n): mac $mac (source $GUEST_MAC, notice '$notice_mac', L1 neigh '$neigh'), $(echo "$out" | sed -n '2,3p' | tr '\n' ' ')ping $ping_ns;$(grep -h "spore-reseed: eth0" "$tmp"/clones/*.log 2>/dev/null | tail -n 1)"
    want_mac=$(printf '06:00:0a:01:%02x:%02x' $((n / 256)) $((n % 256)))
    detail="$detail; expected mac $want_mac"
    if [ -n "$mac" ] && [ "$mac" != "$GUEST_MAC" ] && [ "$mac" = "$notice_mac" ] && [ "$mac" = "$want_mac" ] &&
        echo "$out" | grep -q 'inet 10.0.0.3/24' && echo "$out" | grep -q 'default via 10.0.0.1' &&
        [ $ping_ns = ok ] && echo "$neigh" | grep -qi "$mac"; then
        case " $macs " in
        *" $mac "*) r net-clone-mac FAIL "its MAC is another clone's ($macs): $detail" ;;
        *) r net-clone-mac PASS "$detail" ;;
        esac
    else
        r net-clone-mac FAIL "$detail"
    fi
else
    r net-clone-mac FAIL "PUT /clone with a new address: $(cat "$tmp/clone-b.json" "$tmp/clone-b.err")"
fi

cleanup
true
