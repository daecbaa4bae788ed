#!/bin/sh
# Benchmark (issue 16, item 1), not a test: spore and Firecracker side by
# side in L1, booting the very same guest vmlinux and initramfs with the
# same command line, 1 vCPU, snapshot files on L1's tmpfs (/tmp), the two
# VMMs alternating in every round (spore, Firecracker, spore, ...). Both are
# started with Firecracker's command line (spore through a `firecracker`
# symlink) and driven through Firecracker's API on their Unix socket, by
# /bin/peer-tool (tests/nested/peer-tool.c: HTTP on a Unix socket, vsock
# commands, console lines stamped with CLOCK_MONOTONIC as they arrive).
# Guest side: guest/peers.sh. Run by tests/nested/peers.sh (`make
# bench-peers`), which gives /peer/firecracker, /peer/peers.conf and turns
# the raw samples this leaves in $SPORE_OUT/peers-raw.json into the report.
#
# Figures per VMM and round (milliseconds unless said):
#   boot_to_init_ms     process start (--config-file, boots at once) -> the
#                       guest init's "SPORE-INIT up" line on the console
#   init_uptime_s       the guest's uptime in that line
# Also per VMM, round and group, KVM's exit counts from L1's debugfs
# (/sys/kernel/debug/kvm/<pid>-<fd>/, the VM's files: the sum over its
# vCPUs), the change over the group; and L1's THP settings.
# SPORE-TEST lines: PASS with the figures, FAIL only when a step errors
# (a benchmark never fails on a time).
. "${SPORE_ROOT:-}/lib/spore/scenario-lib.sh"
tmp=${SPORE_TMP:-/tmp}
cd "$tmp" || exit 1
T=${SPORE_ROOT:-}/bin/peer-tool
ROUNDS=2 INITCALL=0 VMMS="spore firecracker" FC=${SPORE_ROOT:-}/peer/firecracker
[ -f "${SPORE_ROOT:-}/peer/peers.conf" ] && . "${SPORE_ROOT:-}/peer/peers.conf"
[ -x "$T" ] || { t peers-setup FAIL "no $T"; exit 0; }
[ -x "$FC" ] || { t peers-setup FAIL "no Firecracker binary at $FC"; exit 0; }

# Both VMMs by Firecracker's command line: .../<vmm>/firecracker.
mkdir -p "$tmp/bin-spore" "$tmp/bin-firecracker"
ln -sf "$SPORE" "$tmp/bin-spore/firecracker"
ln -sf "$FC" "$tmp/bin-firecracker/firecracker"
mountpoint -q /sys/kernel/debug || mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null

cmdline="console=ttyS0 quiet reboot=k panic=1 pci=off i8042.noaux i8042.nomux i8042.dumbkbd"
[ "$INITCALL" = 1 ] && cmdline="$cmdline initcall_debug"

samples="$tmp/samples.jsonl"
exits="$tmp/exits.jsonl"
: >"$samples"
: >"$exits"
# sample VMM ROUND FIGURE VALUE
sample() { echo "{\"vmm\":\"$1\",\"round\":$2,\"figure\":\"$3\",\"value\":$4}" >>"$samples"; }
# ms A_NS B_NS: B - A in milliseconds, one decimal.
ms() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", (b - a) / 1e6 }'; }
# last_t FILE FIELD: a field of peer-tool's last PEER_T line (1 start, 2 end, 3 n).
last_t() { tail -n 1 "$1" | cut -d' ' -f"$2"; }

# --- one VMM process: start_vmm KIND NAME [ARGS...] sets pid, api, con,
# err, vsock (the uds path a config gives), t_start (ns, just before exec).
pid="" stamper=""
start_vmm() {
    kind=$1 name=$2
    shift 2
    api="$tmp/$name.api" con="$tmp/$name.console" err="$tmp/$name.err" vsock="$tmp/$name.vsock" why="$tmp/$name.why"
    rm -f "$api" "$vsock" "$tmp/$name.fifo" "$why"
    mkfifo "$tmp/$name.fifo"
    "$T" stamp <"$tmp/$name.fifo" >"$con" &
    stamper=$!
    t_start=$("$T" now)
    "$tmp/bin-$kind/firecracker" --api-sock "$api" "$@" >"$tmp/$name.fifo" 2>"$err" &
    pid=$!
}
stop_vmm() {
    [ -n "$pid" ] || return 0
    kill "$pid" 2>/dev/null
    i=0
    while kill -0 "$pid" 2>/dev/null && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
    kill -9 "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    wait "$stamper" 2>/dev/null
    pid="" stamper=""
}
trap 'stop_vmm' EXIT
A() { "$T" api "$api" "$@"; }
# Runs a shell command in the guest over vsock (retrying until it answers).
# Why attempts failed goes to $why (PEER_V).
G() { PEER_V=1 "$T" vsock "$vsock" 5000 "$1" "${2:-60}" 2>>"$why"; }
gone() { kill -0 "$pid" 2>/dev/null && return 1; echo "the VMM is gone: $(tail -n 3 "$err" | tr '\n' ' ') console: $(tail -n 3 "$con" | cut -d' ' -f2- | tr '\n' ' ')"; }
# wait_line TEXT SECS [AFTER_NS]: the stamp of the first console line that
# contains TEXT (and came after AFTER_NS); empty on timeout.
wait_line() {
    i=0
    while [ $i -lt $(($2 * 10)) ]; do
        s=$(awk -v p="$1" -v a="${3:-0}" '$1 >= a && index($0, p) { print $1; exit }' "$con")
        [ -n "$s" ] && { echo "$s"; return 0; }
        kill -0 "$pid" 2>/dev/null || return 1
        sleep 0.1
        i=$((i + 1))
    done
    return 1
}

# --- KVM exit counts: kvm_stats FILE reads every counter of the VM's
# debugfs directory; kvm_delta VMM ROUND GROUP BEFORE AFTER records the change.
kvm_stats() {
    : >"$1"
    for d in /sys/kernel/debug/kvm/"$pid"-*; do
        [ -d "$d" ] || continue
        for f in "$d"/*; do
            [ -f "$f" ] && read -r v <"$f" 2>/dev/null && echo "${f##*/} $v" >>"$1"
        done
        break
    done
}
kvm_delta() {
    o=$(awk 'NR == FNR { a[$1] = $2; next } ($2 - a[$1]) != 0 { printf "%s\"%s\":%d", (n++ ? "," : ""), $1, $2 - a[$1] }' "$4" "$5")
    echo "{\"vmm\":\"$1\",\"round\":$2,\"group\":\"$3\",\"exits\":{$o}}" >>"$exits"
}
: >"$tmp/zero.stats"

# --- figure group 1: boot from the command line.
boot_round() {
    kind=$1 r=$2
    cat >"$tmp/boot.json" <<CFG
{"boot-source":{"kernel_image_path":"$GUEST_KERNEL","initrd_path":"$GUEST_INITRD","boot_args":"$cmdline"},
 "drives":[],
 "machine-config":{"vcpu_count":1,"mem_size_mib":256},
 "vsock":{"guest_cid":3,"uds_path":"$tmp/boot-$kind.vsock"}}
CFG
    start_vmm "$kind" "boot-$kind" --config-file "$tmp/boot.json"
    if s=$(wait_line "SPORE-INIT up " 300); then
        kvm_stats "$tmp/boot.after"
        kvm_delta "$kind" "$r" boot "$tmp/zero.stats" "$tmp/boot.after"
        b=$(ms "$t_start" "$s")
        up=$(grep -m1 "SPORE-INIT up " "$con" | sed -n 's/.*SPORE-INIT up \([0-9.]*\)s.*/\1/p')
        sample "$kind" "$r" boot_to_init_ms "$b"
        sample "$kind" "$r" init_uptime_s "$up"
        t "peers-boot-$kind-r$r" PASS "process start -> init marker ${b} ms, guest uptime at init ${up} s"
    else
        t "peers-boot-$kind-r$r" FAIL "no init marker: $(gone)"
    fi
    # The guest's kernel log (printk times; initcall_debug on request).
    if [ "$r" = 1 ] || [ "$INITCALL" = 1 ]; then
        G dmesg >"$SPORE_OUT/dmesg-boot-$kind-r$r.txt" ||
            t "peers-dmesg-$kind-r$r" FAIL "$(sort "$why" | uniq -c | sort -rn | head -n 3 | tr '\n' ' ')"
    fi
    stop_vmm
    cp "$con" "$SPORE_OUT/console-boot-$kind-r$r.txt"
    cp "$err" "$SPORE_OUT/vmm-boot-$kind-r$r.err" 2>/dev/null
    cp "$why" "$SPORE_OUT/vsock-boot-$kind-r$r.why" 2>/dev/null
}

fc_version=$("$FC" --version 2>/dev/null | head -n 1)
spore_version=$("$SPORE" --version 2>/dev/null | head -n 1)
thp=$(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null)
shmem=$(cat /sys/kernel/mm/transparent_hugepage/shmem_enabled 2>/dev/null)
tmpfs=$(awk '$2 == "/tmp" { print $3 }' /proc/mounts)
echo "peers: $ROUNDS rounds; Firecracker '$fc_version', spore '$spore_version'; THP enabled '$thp', shmem_enabled '$shmem'; /tmp is $tmpfs"

r=1
while [ $r -le "$ROUNDS" ]; do
    for kind in $VMMS; do
        boot_round "$kind" $r
    done
    r=$((r + 1))
done

# --- the raw samples, for tests/nested/peers.sh.
js() { printf '%s' "$1" | sed 's/\\/\\\\/g; s/"/\\"/g'; }
{
    printf '{"meta":{"rounds":%s,"initcall_debug":%s,"firecracker_version":"%s","spore_version":"%s",' \
        "$ROUNDS" "$([ "$INITCALL" = 1 ] && echo true || echo false)" "$(js "$fc_version")" "$(js "$spore_version")"
    printf '"l1_kernel":"%s","l1_thp_enabled":"%s","l1_thp_shmem_enabled":"%s","snapshot_fs":"%s","guest_cmdline":"%s"},\n' \
        "$(uname -r)" "$(js "$thp")" "$(js "$shmem")" "$tmpfs" "$(js "$cmdline")"
    echo '"samples":['
    sed '$!s/$/,/' "$samples"
    echo '],"exits":['
    sed '$!s/$/,/' "$exits"
    echo ']}'
} >"$SPORE_OUT/peers-raw.json"
# Per figure and VMM: every sample, and the median.
awk -F'"' '{ k = $10 " " $4; v = $0; sub(/.*"value":/, "", v); sub(/}$/, "", v); s[k] = s[k] " " v }
    END { for (k in s) print k s[k] }' "$samples" | sort | while read -r fig vmm vals; do
    med=$(echo "$vals" | tr ' ' '\n' | sort -n | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }')
    t "peers-$fig-$vmm" PASS "median $med of: $vals"
done
exit 0
