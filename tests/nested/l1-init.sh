#!/bin/sh
# /init of the nested harness's L1 VM (Debian cloud kernel under QEMU TCG
# with SVM, or with EL2 for arm64). Loads the KVM modules (load-order: none
# for KVM on arm64, where it is built in), checks /dev/kvm, runs /scenario, prints
# what the scenario left in $SPORE_OUT as a base64 tar between SPORE-OUT
# markers (run.sh unpacks it), then powers off.
export PATH=/bin:/sbin:/usr/bin:/usr/sbin HOME=/root TERM=linux

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs -o mode=1777 tmpfs /tmp
ip link set lo up 2>/dev/null

read -r up _ </proc/uptime
echo "SPORE-L1 up ${up}s"

while read -r m; do
    insmod "/lib/modules/$m" || echo "SPORE-L1 insmod $m failed"
done </lib/modules/load-order
# tun (tap devices for virtio-net): devtmpfs makes /dev/net/tun when the
# module registers it; make it by hand where that did not happen (or tun is
# built in and devtmpfs was mounted late).
if [ ! -c /dev/net/tun ] && grep -qw tun /proc/misc 2>/dev/null; then
    mkdir -p /dev/net && mknod -m 0666 /dev/net/tun c 10 200
fi
[ -c /dev/net/tun ] || echo "SPORE-L1 no /dev/net/tun (tun module missing?)"

# run.sh --scratch-disk: an ext4 disk (virtio-blk) mounted at /scratch, for
# files whose page cache a scenario drops (the initramfs's cannot be).
if grep -qw spore.scratch=1 /proc/cmdline; then
    i=0
    while [ ! -b /dev/vda ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
    mkdir -p /scratch
    if mount -t ext4 /dev/vda /scratch; then
        export SPORE_SCRATCH=/scratch
        echo "SPORE-L1 scratch disk mounted ($(df -m /scratch | awk 'NR == 2 { print $2 }') MiB)"
    else
        echo "SPORE-L1 scratch disk: mounting /dev/vda failed"
    fi
fi

# An open bug (guest/README.md): now and then a run stalls before its first
# result. If no SPORE-TEST line came after $1 seconds, print what every spore
# process is doing (threads, wait channels, kernel stacks), the scenario's
# console and error files, and the kernel log, before run.sh kills QEMU.
stall_report() {
    sleep "$1"
    grep -q 'SPORE-TEST ' /tmp/.scenario.out 2>/dev/null && return 0
    echo "SPORE-L1 stall report after $1 s"
    ps | grep -v " \[" # user processes only
    for pid in $(pidof spore); do
        for task in /proc/"$pid"/task/*; do
            echo "-- pid $pid thread $(cat "$task/comm") $(cut -d' ' -f3 "$task/stat") wchan=$(cat "$task/wchan")"
            head -n 12 "$task/stack" 2>/dev/null
        done
    done
    for f in /tmp/*.txt /tmp/*.err /tmp/*/*.txt /tmp/*/*.err; do
        [ -f "$f" ] || continue
        echo "-- tail $f"
        tail -n 15 "$f" | cut -c1-200
    done
    echo "-- dmesg"
    dmesg | tail -n 30
    echo "SPORE-L1 stall report end"
}

if [ -c /dev/kvm ]; then
    read -r up _ </proc/uptime
    echo "NESTED-KVM ok (${up}s)"
    # What a scenario may use.
    export SPORE=/bin/spore
    if [ -f /guest/Image ]; then
        # arm64 (run.sh --arch arm64): an Image, no bzImage.
        export GUEST_KERNEL=/guest/Image GUEST_INITRD=/guest/initramfs.cpio
    else
        export GUEST_KERNEL=/guest/vmlinux GUEST_BZIMAGE=/guest/bzImage GUEST_INITRD=/guest/initramfs.cpio
    fi
    export SPORE_OUT=/out
    mkdir -p /out
    cd /tmp || exit 1
    # The scenario's output also goes to a file, so that the stall reporter
    # below can tell whether any result came.
    stall_s=$(sed -n 's/.*spore\.stall_report_s=\([0-9]*\).*/\1/p' /proc/cmdline)
    [ -n "$stall_s" ] && stall_report "$stall_s" &
    reporter=$!
    { /scenario; echo "SPORE-L1 scenario exit $?"; } 2>&1 | tee /tmp/.scenario.out
    kill "$reporter" 2>/dev/null
    # L1's kernel runs quiet: its warnings (a splat from an ioctl), its
    # seccomp kill records (audit type 1326: which thread, which syscall)
    # and a fatal signal's registers (print-fatal-signals) reach the log
    # only here, so a VMM that died says why.
    dmesg | grep -E -A 30 'cut here|type=1326|fatal signal' | head -n 160 | sed 's/^/SPORE-L1-KERNEL /'
    cd /
    if [ -n "$(ls -A /out)" ]; then
        echo "SPORE-OUT-BEGIN"
        tar -C /out -cz . | base64
        echo "SPORE-OUT-END"
    fi
else
    echo "NESTED-KVM fail: no /dev/kvm after loading $(tr '\n' ' ' </lib/modules/load-order)"
    dmesg | grep -i -E 'kvm|svm|started at EL' | tail -n 20
fi

read -r up _ </proc/uptime
echo "SPORE-L1 poweroff at ${up}s"
sync
poweroff -f
while :; do sleep 3600; done
