#!/bin/sh
# L2 guest side of scenarios/virtio-mem.sh. Reports MemTotal as the host
# plugs memory, fills 900 MiB of a tmpfs (boot RAM is 512 MiB, so most of it
# lands in plugged memory), frees it, and waits for the host to unplug.
# Console lines GUEST-* are the protocol with the L1 side; SPORE-TEST lines
# are relayed results.
. "${SPORE_ROOT:-}/lib/spore/scenario-lib.sh"
# The timing VM (spore.vmem=idle) only idles while the host plugs and unplugs.
if grep -qw spore.vmem=idle /proc/cmdline; then
    echo GUEST-IDLE
    sleep 3600
fi
memtotal() { sed -n 's/^MemTotal: *\([0-9]*\) kB/\1/p' /proc/meminfo; }
# wait_for CMP KB SECS: until MemTotal CMP KB (-ge/-le), or time out.
wait_for() {
    i=0
    while [ $i -lt $(($3 * 10)) ]; do
        [ "$(memtotal)" "$1" "$2" ] && return 0
        sleep 0.1
        i=$((i + 1))
    done
    return 1
}

if grep -q virtio_mem /proc/iomem 2>/dev/null || ls /sys/bus/virtio/drivers/virtio_mem/virtio* >/dev/null 2>&1; then
    t guest-has-virtio-mem PASS
else
    t guest-has-virtio-mem FAIL "$(ls /sys/bus/virtio/devices/ 2>&1 | tr '\n' ' ')"
fi
base=$(memtotal)
echo "GUEST-MEMTOTAL0 $base"

gib=1048576
if wait_for -ge $((base + gib - 16384)) 300; then
    now=$(memtotal)
    grown=$((now - base))
    echo "GUEST-PLUGGED $now"
    if [ $grown -ge $((gib - 16384)) ] && [ $grown -le $gib ]; then
        t guest-memtotal-grows-1g PASS "+${grown} kB"
    else
        t guest-memtotal-grows-1g FAIL "+${grown} kB"
    fi
else
    t guest-memtotal-grows-1g FAIL "MemTotal stayed $(memtotal) kB (base $base)"
fi
grep -i virtio /proc/iomem

mkdir -p /mnt/big
mount -t tmpfs -o size=1200m tmpfs /mnt/big
if dd if=/dev/zero of=/mnt/big/x bs=1M count=900 2>/dev/null; then
    t guest-touches-900m PASS "$(sed -n 's/^MemFree: *//p' /proc/meminfo) free"
else
    t guest-touches-900m FAIL
fi
echo GUEST-TOUCHED
# Hold the memory while the host measures its RSS.
sleep 4
rm -f /mnt/big/x
umount /mnt/big
echo GUEST-FREED

if wait_for -le "$base" 300; then
    t guest-memtotal-back-to-base PASS "$(memtotal) kB"
else
    t guest-memtotal-back-to-base FAIL "MemTotal $(memtotal) kB, base $base"
fi
echo GUEST-UNPLUGGED
# Idle while the host times plug/unplug; the host ends the VM.
sleep 3600
