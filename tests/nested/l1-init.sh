#!/bin/sh
# /init of the nested harness's L1 VM (Debian cloud kernel under QEMU TCG
# with SVM). Loads the KVM modules, checks /dev/kvm, runs /scenario, prints
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

if [ -c /dev/kvm ]; then
    read -r up _ </proc/uptime
    echo "NESTED-KVM ok (${up}s)"
    # What a scenario may use.
    export SPORE=/bin/spore
    export GUEST_KERNEL=/guest/vmlinux GUEST_BZIMAGE=/guest/bzImage GUEST_INITRD=/guest/initramfs.cpio
    export SPORE_OUT=/out
    mkdir -p /out
    cd /tmp || exit 1
    /scenario
    echo "SPORE-L1 scenario exit $?"
    cd /
    if [ -n "$(ls -A /out)" ]; then
        echo "SPORE-OUT-BEGIN"
        tar -C /out -cz . | base64
        echo "SPORE-OUT-END"
    fi
else
    echo "NESTED-KVM fail: no /dev/kvm after loading $(tr '\n' ' ' </lib/modules/load-order)"
    dmesg | grep -i -E 'kvm|svm' | tail -n 20
fi

read -r up _ </proc/uptime
echo "SPORE-L1 poweroff at ${up}s"
sync
poweroff -f
while :; do sleep 3600; done
