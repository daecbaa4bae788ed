#!/bin/sh
# Issue 15's benchmark (`make bench-arch`), the same scenario on every
# architecture's tier: the Linux guest (1 vCPU, 256 MiB, quiet) in L1 —
# - boot: VMM start → the guest's /init (its first mark), `spore bench boot`;
# - restore: `spore snapshot restore` (lazy, a new process) → the guest's
#   first vsock reply; the snapshot is of a booted guest serving commands;
# - clone: `PUT /clone` → the clone's vCPUs start (the report's start_ns, the
#   closest the VMM sees to the clone's first instruction), and → its first
#   vsock reply;
# - idle clones: the PSS of each of PSS_CLONES clones, idle after one reply.
# ROUNDS each (BENCH_ROUNDS, default 5); medians and ranges in
# $SPORE_OUT/bench-arch.json. A benchmark, not a test: its checks only say
# that each figure was measured. Every wait is bounded in time.
. "${SPORE_ROOT:-}/lib/spore/scenario-lib.sh"
tmp=${SPORE_TMP:-/tmp}
cd "$tmp" || exit 1
rounds=${BENCH_ROUNDS:-5}
arch=$(uname -m)
# Milliseconds, from the finest clock this userland offers.
if [ "$(date +%N 2>/dev/null)" != "%N" ] && [ -n "$(date +%N 2>/dev/null)" ]; then
    now_ms() { echo $(($(date +%s%N) / 1000000)); }
    clock="date +%s%N"
else
    now_ms() { awk '{printf "%d", $1 * 1000}' /proc/uptime; }
    clock="/proc/uptime (10 ms)"
fi
# stats "v1 v2 ...": {"median":M,"min":A,"max":B,"runs":[...]}
stats() {
    echo "$1" | tr ' ' '\n' | grep . | sort -n | awk '
        { v[NR] = $1 }
        END {
            if (NR == 0) { printf "null"; exit }
            m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
            printf "{\"median\":%s,\"min\":%s,\"max\":%s,\"runs\":[", m, v[1], v[NR]
            for (i = 1; i <= NR; i++) printf "%s%s", (i > 1 ? "," : ""), v[i]
            printf "]}"
        }'
}
# guest CMD SOCKET [SECONDS]: the guest's answer to CMD over vsock port 5000,
# retried every 10 ms until SECONDS (default 60) have passed.
guest() {
    _deadline=$(($(now_ms) + ${3:-60} * 1000))
    while [ "$(now_ms)" -lt $_deadline ]; do
        if [ -S "$2" ]; then
            _out=$(printf '%s\nexit\n' "$1" | timeout 10 "$SPORE" vsock connect --uds "$2" --port 5000 2>/dev/null) &&
                [ -n "$_out" ] && { echo "$_out"; return 0; }
        fi
        sleep 0.01
    done
    return 1
}
cmdline="$(
    case $arch in
    x86_64) echo "console=ttyS0 quiet reboot=k panic=1 pci=off i8042.noaux i8042.nomux i8042.dumbkbd" ;;
    *) echo "console=ttyS0 quiet reboot=k panic=1" ;;
    esac
)"
A() { "$SPORE" api "$api" "$@"; }
# boot_source: a VMM on $api serving the guest's commands on $tmp/v.sock.
boot_source() {
    rm -f "$api" "$tmp/v.sock"
    "$SPORE" vmm --api-sock "$api" >"$tmp/console.txt" 2>"$tmp/vmm.err" &
    vmm=$!
    wait_for_socket "$api" || return 1
    A PUT /boot-source "{\"kernel_image_path\":\"$GUEST_KERNEL\",\"initrd_path\":\"$GUEST_INITRD\",\"boot_args\":\"$cmdline\"}" >/dev/null &&
        A PUT /machine-config '{"vcpu_count":1,"mem_size_mib":256}' >/dev/null &&
        A PUT /drives/rw "{\"drive_id\":\"rw\",\"path_on_host\":\"$tmp/rw.img\",\"is_root_device\":false,\"is_read_only\":false}" >/dev/null &&
        A PUT /vsock "{\"guest_cid\":3,\"uds_path\":\"$tmp/v.sock\"}" >/dev/null &&
        A PUT /actions '{"action_type":"InstanceStart"}' >/dev/null &&
        guest "echo ok" "$tmp/v.sock" 180 >/dev/null
}
stop_source() {
    kill "$vmm" 2>/dev/null
    wait "$vmm" 2>/dev/null
}
api="$tmp/api.sock"
dd if=/dev/zero of="$tmp/rw.img" bs=1M count=8 2>/dev/null

# --- boot
if "$SPORE" bench boot --linux-kernel "$GUEST_KERNEL" --linux-initrd "$GUEST_INITRD" \
    --runs "$rounds" --mem 256M --vcpus 1 >"$tmp/boot.json" 2>"$tmp/boot.err"; then
    t bench-boot PASS "$(tail -n 1 "$tmp/boot.err")"
else
    t bench-boot FAIL "$(tail -n 3 "$tmp/boot.err")"
    echo null >"$tmp/boot.json"
fi

# pss_kib PID: the process's proportional set size (shared pages split
# among their mappers), KiB.
pss_kib() {
    awk '/^Pss:/ { print $2; exit }' "/proc/$1/smaps_rollup" 2>/dev/null
}
# clone_idle_pss: PSS_CLONES (default 8) clones of the source in one
# request, each answering once, then idle for 3 s: each clone's PSS
# (issue 16: <= 5 MiB per idle Linux clone).
clone_pss="" pss_count=${PSS_CLONES:-8}
clone_idle_pss() {
    if ! "$SPORE" clone "$api" -n "$pss_count" --dir "$tmp/clones" >"$tmp/pss.json" 2>"$tmp/pss.err"; then
        t bench-clone-pss FAIL "$(tail -n 2 "$tmp/pss.err")"
        return
    fi
    _pids=$(sed -n 's/.*"pid": *\([0-9]*\).*/\1/p' "$tmp/pss.json")
    _answered=0
    for _name in $(sed -n 's/.*"name": *"\([^"]*\)".*/\1/p' "$tmp/pss.json"); do
        guest "echo ok" "$tmp/clones/$_name.vsock" 60 >/dev/null && _answered=$((_answered + 1))
    done
    sleep 3
    for _pid in $_pids; do
        _k=$(pss_kib "$_pid")
        [ -n "$_k" ] && clone_pss="$clone_pss $_k"
    done
    source_pss=$(pss_kib "$vmm")
    if [ "$_answered" -eq "$pss_count" ] && [ -n "$clone_pss" ]; then
        t bench-clone-pss PASS "$pss_count idle clones, PSS KiB:$clone_pss (source ${source_pss:-?})"
    else
        t bench-clone-pss FAIL "$_answered of $pss_count clones answered; PSS KiB:$clone_pss"
    fi
    for _pid in $_pids; do kill "$_pid" 2>/dev/null; done
}

# --- clone: zygote clones of one source, one per round, each stopped after
# its first reply. The clone's vsock socket is `<name>.vsock` beside its API
# socket (the report's "socket").
clone_start="" clone_reply=""
if boot_source; then
    mkdir -p "$tmp/clones"
    n=1
    while [ $n -le "$rounds" ]; do
        t0=$(now_ms)
        if ! "$SPORE" clone "$api" -n 1 --dir "$tmp/clones" >"$tmp/clone-$n.json" 2>"$tmp/clone-$n.err"; then
            t bench-clone FAIL "round $n: $(tail -n 2 "$tmp/clone-$n.err")"
            break
        fi
        ms=$(sed -n 's/.*started: pid [0-9]*, socket .*, \([0-9.]*\) ms after the request.*/\1/p' "$tmp/clone-$n.err")
        sock=$(sed -n 's/.*"socket": *"\([^"]*\)".*/\1/p' "$tmp/clone-$n.json" | head -n 1)
        name=$(sed -n 's/.*"name": *"\([^"]*\)".*/\1/p' "$tmp/clone-$n.json" | head -n 1)
        vs="$(dirname "$sock")/$name.vsock"
        if guest "echo ok" "$vs" 60 >/dev/null; then
            clone_reply="$clone_reply $(($(now_ms) - t0))"
            clone_start="$clone_start $ms"
        else
            t bench-clone FAIL "round $n: clone $name did not answer on $vs within 60 s"
        fi
        for pid in $(sed -n 's/.*"pid": *\([0-9]*\).*/\1/p' "$tmp/clone-$n.json"); do kill "$pid" 2>/dev/null; done
        n=$((n + 1))
    done
    [ -n "$clone_start" ] && t bench-clone PASS "vCPUs start:$clone_start ms; first reply:$clone_reply ms"
    clone_idle_pss
else
    t bench-clone FAIL "source did not boot: $(tail -n 2 "$tmp/vmm.err")"
fi
stop_source

# --- restore: a full snapshot of a fresh source, restored lazily per round.
restore_reply=""
if boot_source &&
    "$SPORE" snapshot create "$api" --state "$tmp/s.state" --mem "$tmp/s.mem" --stop >/dev/null 2>"$tmp/create.err"; then
    wait "$vmm" 2>/dev/null
    n=1
    while [ $n -le "$rounds" ]; do
        rm -f "$tmp/v.sock" "$tmp/r.sock"
        t0=$(now_ms)
        "$SPORE" snapshot restore --state "$tmp/s.state" --mem "$tmp/s.mem" --api-sock "$tmp/r.sock" \
            >/dev/null 2>"$tmp/restore.err" &
        r=$!
        if guest "echo ok" "$tmp/v.sock" 60 >/dev/null; then
            restore_reply="$restore_reply $(($(now_ms) - t0))"
        else
            t bench-restore FAIL "round $n: no reply within 60 s: $(tail -n 2 "$tmp/restore.err")"
        fi
        kill $r 2>/dev/null
        wait $r 2>/dev/null
        n=$((n + 1))
    done
    [ -n "$restore_reply" ] && t bench-restore PASS "first reply:$restore_reply ms"
else
    t bench-restore FAIL "$(tail -n 2 "$tmp/vmm.err") $(cat "$tmp/create.err" 2>/dev/null)"
    stop_source
fi

cat >"$SPORE_OUT/bench-arch.json" <<JSON
{"benchmark":"bench-arch","arch":"$arch","rounds":$rounds,"clock":"$clock",
 "guest":{"vcpus":1,"mem_mib":256,"cmdline":"$cmdline"},
 "l1_kernel":"$(uname -r)",
 "boot":$(cat "$tmp/boot.json"),
 "clone_request_to_vcpus_start_ms":$(stats "$clone_start"),
 "clone_request_to_first_reply_ms":$(stats "$clone_reply"),
 "clone_idle_pss_kib":{"clones":$pss_count,"each":$(stats "$clone_pss"),"source":${source_pss:-null}},
 "restore_to_first_reply_ms":$(stats "$restore_reply")}
JSON
cat "$SPORE_OUT/bench-arch.json"
