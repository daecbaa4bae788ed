#!/bin/sh
# The same three figures on every architecture's tier (issue 15's benchmark,
# `make bench-arch`): the Linux guest (1 vCPU, 256 MiB, quiet) in L1 —
# - boot: VMM start → the guest's /init (its first mark), `spore bench boot`;
# - restore: `spore snapshot restore` (lazy, a new process) → the guest's
#   first vsock reply, the snapshot taken of a booted guest serving commands;
# - clone: `spore clone` request → the clone's vCPUs start (the report's
#   start_ns), then → its first vsock reply;
# ROUNDS each (default 5), medians and ranges in $SPORE_OUT/bench-arch.json.
# A benchmark, not a test: its checks only say that each figure was measured.
. "${SPORE_ROOT:-}/lib/spore/scenario-lib.sh"
tmp=${SPORE_TMP:-/tmp}
cd "$tmp" || exit 1
rounds=${BENCH_ROUNDS:-5}
arch=$(uname -m)
now_ms() { awk '{printf "%d", $1 * 1000}' /proc/uptime; }
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
guest() { # CMD SOCKET [TRIES]: retries every 20 ms
    i=0
    while [ $i -lt ${3:-3000} ]; do
        out=$(printf '%s\nexit\n' "$1" | timeout 20 "$SPORE" vsock connect --uds "$2" --port 5000 2>/dev/null) &&
            [ -n "$out" ] && { echo "$out"; return 0; }
        sleep 0.02
        i=$((i + 1))
    done
    return 1
}

# --- boot
boot_ms=""
if "$SPORE" bench boot --linux-kernel "$GUEST_KERNEL" --linux-initrd "$GUEST_INITRD" \
    --runs "$rounds" --mem 256M --vcpus 1 >"$tmp/boot.json" 2>"$tmp/boot.err"; then
    t bench-boot PASS "$(tail -n 1 "$tmp/boot.err")"
else
    t bench-boot FAIL "$(tail -n 3 "$tmp/boot.err")"
fi

# --- a source guest serving commands (guest/snapshot.sh), snapshotted
api="$tmp/api.sock"
dd if=/dev/zero of="$tmp/rw.img" bs=1M count=8 2>/dev/null
"$SPORE" vmm --api-sock "$api" >"$tmp/console.txt" 2>"$tmp/vmm.err" &
vmm=$!
wait_for_socket "$api"
A() { "$SPORE" api "$api" "$@"; }
A PUT /boot-source "{\"kernel_image_path\":\"$GUEST_KERNEL\",\"initrd_path\":\"$GUEST_INITRD\",\"boot_args\":\"console=ttyS0 quiet reboot=k panic=1\"}" >/dev/null &&
    A PUT /machine-config '{"vcpu_count":1,"mem_size_mib":256}' >/dev/null &&
    A PUT /drives/rw "{\"drive_id\":\"rw\",\"path_on_host\":\"$tmp/rw.img\",\"is_root_device\":false,\"is_read_only\":false}" >/dev/null &&
    A PUT /vsock "{\"guest_cid\":3,\"uds_path\":\"$tmp/v.sock\"}" >/dev/null &&
    A PUT /actions '{"action_type":"InstanceStart"}' >/dev/null || t source-boot FAIL "$(cat "$tmp/vmm.err")"
guest true "$tmp/v.sock" >/dev/null || t source-boot FAIL "no vsock reply"

# --- clone: zygote clones of the source, one per round
clone_start="" clone_reply=""
mkdir -p "$tmp/clones"
n=1
while [ $n -le "$rounds" ]; do
    t0=$(now_ms)
    "$SPORE" clone "$api" -n 1 --dir "$tmp/clones/$n" >"$tmp/clone-$n.json" 2>"$tmp/clone-$n.err" || break
    ms=$(sed -n 's/.*started: pid [0-9]*, socket .*, \([0-9.]*\) ms after the request.*/\1/p' "$tmp/clone-$n.err")
    vs=$(ls "$tmp/clones/$n"/*.vsock 2>/dev/null | head -n 1)
    guest true "$vs" >/dev/null && clone_reply="$clone_reply $(($(now_ms) - t0))"
    clone_start="$clone_start $ms"
    for pid in $(sed -n 's/.*"pid": *\([0-9]*\).*/\1/p' "$tmp/clone-$n.json"); do kill "$pid" 2>/dev/null; done
    n=$((n + 1))
done
[ -n "$clone_start" ] && t bench-clone PASS "start:$clone_start ms; reply:$clone_reply ms" ||
    t bench-clone FAIL "$(cat "$tmp/clone-1.err" 2>/dev/null | tail -n 2)"
kill $vmm 2>/dev/null
wait $vmm 2>/dev/null

# --- restore: a full snapshot of a fresh source, restored lazily per round
rm -f "$api" "$tmp/v.sock"
"$SPORE" vmm --api-sock "$api" >"$tmp/console.txt" 2>"$tmp/vmm.err" &
vmm=$!
wait_for_socket "$api"
A PUT /boot-source "{\"kernel_image_path\":\"$GUEST_KERNEL\",\"initrd_path\":\"$GUEST_INITRD\",\"boot_args\":\"console=ttyS0 quiet reboot=k panic=1\"}" >/dev/null &&
    A PUT /machine-config '{"vcpu_count":1,"mem_size_mib":256}' >/dev/null &&
    A PUT /drives/rw "{\"drive_id\":\"rw\",\"path_on_host\":\"$tmp/rw.img\",\"is_root_device\":false,\"is_read_only\":false}" >/dev/null &&
    A PUT /vsock "{\"guest_cid\":3,\"uds_path\":\"$tmp/v.sock\"}" >/dev/null &&
    A PUT /actions '{"action_type":"InstanceStart"}' >/dev/null
guest true "$tmp/v.sock" >/dev/null
"$SPORE" snapshot create "$api" --state "$tmp/s.state" --mem "$tmp/s.mem" --stop >/dev/null 2>"$tmp/create.err" ||
    t bench-restore FAIL "$(cat "$tmp/create.err")"
wait $vmm
restore_reply=""
n=1
while [ $n -le "$rounds" ]; do
    rm -f "$tmp/v.sock"
    t0=$(now_ms)
    "$SPORE" snapshot restore --state "$tmp/s.state" --mem "$tmp/s.mem" --api-sock "$tmp/r.sock" \
        >/dev/null 2>"$tmp/restore.err" &
    r=$!
    guest true "$tmp/v.sock" >/dev/null && restore_reply="$restore_reply $(($(now_ms) - t0))"
    kill $r 2>/dev/null
    wait $r 2>/dev/null
    n=$((n + 1))
done
[ -n "$restore_reply" ] && t bench-restore PASS "reply:$restore_reply ms" || t bench-restore FAIL "$(tail -n 2 "$tmp/restore.err")"

cat >"$SPORE_OUT/bench-arch.json" <<JSON
{"arch":"$arch","rounds":$rounds,
 "boot":$(cat "$tmp/boot.json" 2>/dev/null || echo null),
 "clone_request_to_vcpus_start_ms":$(stats "$clone_start"),
 "clone_request_to_first_reply_ms":$(stats "$clone_reply"),
 "restore_to_first_reply_ms":$(stats "$restore_reply")}
JSON
cat "$SPORE_OUT/bench-arch.json"
