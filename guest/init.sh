#!/bin/sh
# /init of the spore Linux guest initramfs (busybox).
# Mounts the basics, brings up loopback, then runs /scenario if the image has
# one, else a shell on the console. Afterwards it asks the VMM to stop the VM
# with the scenario's exit status (signal-port EXIT); if no spore VMM is
# listening (e.g. plain QEMU), it reboots, which through the i8042 ends a VMM
# started with -no-reboot.
export PATH=/bin:/sbin:/usr/bin:/usr/sbin HOME=/root TERM=linux

# Boot-time mark 1: user space reached /init (harmless outside spore).
spore-signal mark 1 2>/dev/null

mount -t proc proc /proc
# Boot benchmark (`spore bench boot --linux-kernel`): mark 1 is all it needs.
case " $(cat /proc/cmdline) " in
*" spore.bench=1 "*) spore-signal exit 0 ;;
esac
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t tmpfs -o mode=1777 tmpfs /tmp
hostname spore-guest
ip link set lo up 2>/dev/null || ifconfig lo 127.0.0.1 up

read -r up _ </proc/uptime
echo "SPORE-INIT up ${up}s"

if [ -x /scenario ]; then
    /scenario
    rc=$?
    echo "SPORE-INIT scenario exit $rc"
else
    setsid cttyhack sh -l
    rc=$?
fi

sync
spore-signal exit "$rc" 2>/dev/null
reboot -f
# reboot -f does not return unless it failed; never let init exit (panic).
while :; do sleep 3600; done
