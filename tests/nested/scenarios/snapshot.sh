#!/bin/sh
# Tier 3, issue "snapshots": a Linux guest (2 vCPUs, 256 MiB, kvmclock on)
# with vsock and a read-write disk first snapshots itself (a guest-triggered
# snapshot point: `spore-signal snapshot 7`, the VM goes on), then is
# snapshotted through `spore snapshot create --stop` and restored twice from
# those files, each time in a new VMM process; finally the guest's own
# snapshot is restored. After each restore a shell command sent over vsock
# must run, the guest's clock must have moved forward, and the disk must
# still be readable and writable; in the guest's own snapshot, the
# `spore-signal` that took it must have returned "restored".
. "${SPORE_ROOT:-}/lib/spore/scenario-lib.sh"
tmp=${SPORE_TMP:-/tmp}
cd "$tmp" || exit 1
api="$tmp/api.sock"
dd if=/dev/zero of="$tmp/rw.img" bs=1M count=8 2>/dev/null

"$SPORE" vmm --api-sock "$api" >"$tmp/console.txt" 2>"$tmp/vmm.err" &
vmm=$!
wait_for_socket "$api"
A() { "$SPORE" api "$api" "$@"; }
# Milliseconds since L1 boot (busybox date has no %N).
now_ms() { awk '{printf "%d", $1 * 1000}' /proc/uptime; }
cmdline="console=ttyS0 quiet reboot=k panic=1 pci=off i8042.noaux i8042.nomux i8042.dumbkbd"
A PUT /boot-source "{\"kernel_image_path\":\"$GUEST_KERNEL\",\"initrd_path\":\"$GUEST_INITRD\",\"boot_args\":\"$cmdline\"}" >/dev/null &&
    A PUT /machine-config '{"vcpu_count":2,"mem_size_mib":256}' >/dev/null &&
    A PUT /drives/rw "{\"drive_id\":\"rw\",\"path_on_host\":\"$tmp/rw.img\",\"is_root_device\":false,\"is_read_only\":false}" >/dev/null &&
    A PUT /vsock "{\"guest_cid\":3,\"uds_path\":\"$tmp/v.sock\"}" >/dev/null &&
    A PUT /actions '{"action_type":"InstanceStart"}' >/dev/null || t boot FAIL "$(cat "$tmp/vmm.err")"

# Runs shell commands in the guest over vsock; retries (for up to a minute)
# until it answers. Each failed attempt is logged to $tmp/attempts. An
# accepted connection that never answers fails after 60 s instead of
# hanging the scenario (that was the symptom of a guest accepting a
# connection before it handled the restore's transport reset).
# The whole retry loop is bounded too (GUEST_DEADLINE_S, 150 s), so a guest that
# accepts and never answers makes a FAIL with diagnostics, not a scenario that
# hangs until the harness kills QEMU.
guest() {
    i=0
    deadline=$(($(now_ms) + ${GUEST_DEADLINE_S:-150} * 1000))
    while [ $i -lt 600 ] && [ "$(now_ms)" -lt $deadline ]; do
        out=$(printf '%s\nexit\n' "$1" | timeout 60 "$SPORE" vsock connect --uds "$tmp/v.sock" --port 5000 2>>"$tmp/attempts") &&
            [ -n "$out" ] && { echo "$out"; return 0; }
        echo "attempt $i failed at $(now_ms) ms" >>"$tmp/attempts"
        sleep 0.1
        i=$((i + 1))
    done
    return 1
}

# What a stuck process is doing: each thread's name, state, wait channel and
# kernel stack, and the VMM's last messages.
stuck_report() {
    for task in /proc/$1/task/*; do
        echo "thread $(cat $task/comm 2>/dev/null) $(awk '{print $3}' $task/stat 2>/dev/null) wchan=$(cat $task/wchan 2>/dev/null)"
        cat $task/stack 2>/dev/null | head -n 8
    done
    tail -n 5 "$tmp/vmm.err"
}

before=$(guest 'cut -d" " -f1 /proc/uptime')
if [ -n "$before" ]; then t vsock-command-before-snapshot PASS "uptime $before"; else t vsock-command-before-snapshot FAIL; fi

# A guest-triggered snapshot point; the guest runs on ("taken"). Its result
# also goes to a file, which a VM restored from it rewrites ("restored").
mkdir -p "$tmp/guest-snaps"
A PUT /snapshot/guest-triggered "{\"directory\":\"$tmp/guest-snaps\",\"after\":\"resume\"}" >/dev/null 2>"$tmp/gs.err" ||
    t guest-snapshot-point FAIL "$(cat "$tmp/gs.err")"
start=$(now_ms)
said=$(guest 'spore-signal snapshot 7 >/tmp/point7 2>&1; cat /tmp/point7')
ms=$(($(now_ms) - start))
if [ "$said" = taken ] && [ -s "$tmp/guest-snaps/tag-7.state" ] && [ -s "$tmp/guest-snaps/tag-7.mem" ]; then
    t guest-snapshot-point PASS "${ms} ms, $(du -k "$tmp/guest-snaps/tag-7.mem" | cut -f1) KiB on disk"
else
    t guest-snapshot-point FAIL "guest said '$said'; $(ls -l "$tmp/guest-snaps"; tail -n 3 "$tmp/vmm.err")"
fi

start=$(now_ms)
if "$SPORE" snapshot create "$api" --state "$tmp/vm.state" --mem "$tmp/vm.mem" --stop >"$tmp/manifest.json" 2>"$tmp/create.err"; then
    ms=$(($(now_ms) - start))
    t snapshot-create PASS "${ms} ms, $(du -k "$tmp/vm.mem" | cut -f1) KiB on disk of $(stat -c %s "$tmp/vm.mem") bytes"
else
    t snapshot-create FAIL "$(cat "$tmp/create.err")"
fi
# The VMM must exit after --stop. An open bug made one run hang here or in the
# first restore: a VMM still alive after 30 s is a FAIL with its threads' kernel
# stacks, then killed, so the scenario goes on and the log says where it stuck.
i=0
while kill -0 $vmm 2>/dev/null && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
if kill -0 $vmm 2>/dev/null; then
    t vmm-exits-after-snapshot-stop FAIL "$(stuck_report $vmm)"
    kill -9 $vmm
else
    t vmm-exits-after-snapshot-stop PASS
fi
wait $vmm
"$SPORE" snapshot inspect "$tmp/vm.state" >"$SPORE_OUT/snapshot-manifest.json" 2>&1

# restore_round NAME STATE MEM: restores in a new VMM process and checks the
# guest answers over vsock, its clock moves forward and its disk works.
restore_round() {
    round=$1
    SPORE_LOG=${SPORE_LOG:-debug} "$SPORE" snapshot restore --state "$2" --mem "$3" \
        --api-sock "$tmp/api-$round.sock" >"$tmp/console-$round.txt" 2>"$tmp/restore-$round.err" &
    r=$!
    start=$(now_ms)
    : >"$tmp/attempts"
    after=$(guest 'cut -d" " -f1 /proc/uptime')
    ms=$(($(now_ms) - start))
    cp "$tmp/attempts" "$SPORE_OUT/attempts-$round.txt"
    if [ -n "$after" ]; then
        t "vsock-command-after-restore-$round" PASS "first reply after ${ms} ms ($(grep -c failed "$tmp/attempts") failed attempts before)"
    else
        t "vsock-command-after-restore-$round" FAIL "VM $("$SPORE" api "$tmp/api-$round.sock" GET / 2>&1); $(tail -n 3 "$tmp/restore-$round.err"); $(tail -n 5 "$tmp/attempts")"
    fi
    sleep 1
    later=$(guest 'cut -d" " -f1 /proc/uptime')
    if [ -n "$after" ] && [ -n "$later" ] &&
        awk -v b="$before" -v a="$after" -v l="$later" 'BEGIN{exit !(a >= b && l > a + 0.5)}'; then
        t "clock-moves-forward-$round" PASS "uptime $before -> $after -> $later"
    else
        t "clock-moves-forward-$round" FAIL "uptime $before -> $after -> $later"
    fi
    disk=$(guest "dd if=/dev/vda bs=512 count=1 2>/dev/null | head -c 21; echo; printf spore-after-restore-$round | dd of=/dev/vda bs=512 seek=1 conv=sync,fsync 2>/dev/null && echo written")
    if echo "$disk" | grep -q spore-before-snapshot && echo "$disk" | grep -q written &&
        dd if="$tmp/rw.img" bs=512 skip=1 count=1 2>/dev/null | grep -q "spore-after-restore-$round"; then
        t "rw-disk-after-restore-$round" PASS
    else
        t "rw-disk-after-restore-$round" FAIL "guest said: $disk"
    fi
}

for round in 1 2; do
    restore_round $round "$tmp/vm.state" "$tmp/vm.mem"
    kill $r
    wait $r
done

restore_round guest-point "$tmp/guest-snaps/tag-7.state" "$tmp/guest-snaps/tag-7.mem"
said=$(guest 'cat /tmp/point7')
if [ "$said" = restored ]; then
    t guest-snapshot-point-restored PASS
else
    t guest-snapshot-point-restored FAIL "spore-signal said '$said' in the restored guest"
fi
kill $r
wait $r
cp "$tmp/console.txt" "$tmp"/console-*.txt "$tmp"/restore-*.err "$tmp/vmm.err" "$SPORE_OUT/" 2>/dev/null
true
