#!/bin/sh
# L2 guest side of scenarios/balloon.sh. After an idle phase, makes (nearly) all free memory
# host-resident by filling a tmpfs and deleting the file, so whatever the
# balloon takes is memory the VMM really holds; then prints /proc/meminfo
# figures once a second for the host side to read. The host stops the VM.
meminfo() {
    awk '/^MemTotal:/ { t = $2 } /^MemFree:/ { f = $2 } /^MemAvailable:/ { a = $2 }
        END { print "BAL-MEM total=" t " free=" f " avail=" a }' /proc/meminfo
}
mib() { awk '/^MemAvailable:/ { print int($2 / 1024) }' /proc/meminfo; }
# The deflate-on-OOM VM (spore_balloon_oom): once the host inflated the
# balloon, write more to a tmpfs than the guest has left. With
# VIRTIO_BALLOON_F_DEFLATE_ON_OOM the driver's OOM notifier gives pages back
# from the balloon instead of the OOM killer killing the writer.
if grep -qw spore_balloon_oom /proc/cmdline; then
    avail0=$(mib)
    echo "BAL-OOM-READY $avail0 MiB"
    i=0
    while [ "$(mib)" -gt $((avail0 - 300)) ] && [ $i -lt 600 ]; do sleep 0.5; i=$((i + 1)); done
    low=$(mib)
    echo "BAL-OOM-INFLATED $low MiB"
    mkdir -p /mnt/hog
    mount -t tmpfs -o size=480m hog /mnt/hog
    want=$((low + 96))
    dd if=/dev/zero of=/mnt/hog/x bs=1M count=$want 2>/dev/null
    rc=$?
    wrote=$(($(stat -c %s /mnt/hog/x 2>/dev/null || echo 0) >> 20))
    killed=$(dmesg | grep -c 'Killed process')
    echo "BAL-OOM-RESULT want=$want wrote=$wrote rc=$rc killed=$killed avail=$(mib)"
    while :; do sleep 3600; done
fi
# Idle phase (the peers' benchmark setup): the host inflates then deflates
# 256 MiB on an idle guest. Wait until MemAvailable has dropped by 200 MiB
# and come back, or 180 s.
# A VM booted with spore_balloon_noidle (the reporting check) skips it.
start=$(mib) seen_low=0 i=0
grep -q spore_balloon_noidle /proc/cmdline && i=360
echo BAL-IDLE
while [ $i -lt 360 ]; do
    now=$(mib)
    if [ $seen_low = 0 ] && [ "$now" -lt $((start - 200)) ]; then
        seen_low=1
        echo "BAL-IDLE-LOW $now MiB"
    fi
    [ $seen_low = 1 ] && [ "$now" -gt $((start - 48)) ] && break
    sleep 0.5
    i=$((i + 1))
done
echo "BAL-IDLE-DONE $(mib) MiB"

mkdir -p /mnt/hog
mount -t tmpfs -o size=480m hog /mnt/hog
avail=$(awk '/^MemAvailable:/ { print int($2 / 1024) }' /proc/meminfo)
n=$((avail - 48))
dd if=/dev/zero of=/mnt/hog/fill bs=1M count=$n 2>/dev/null
rm -f /mnt/hog/fill
echo "BAL-FILLED ${n}MiB"
meminfo
echo BAL-READY
i=0
while [ $i -lt 900 ]; do
    meminfo
    sleep 1
    i=$((i + 1))
done
reboot -f
