#!/bin/sh
# /init of the spore Linux guest initramfs (busybox).
# Mounts the basics, brings up loopback, then runs /scenario if the image has
# one, else a shell on the console. Afterwards it asks the VMM to stop the VM
# with the scenario's exit status (signal-port EXIT); if no spore VMM is
# listening (e.g. plain QEMU), it reboots, which (x86: through the i8042,
# arm64: PSCI SYSTEM_RESET) ends a VMM started with -no-reboot.
export PATH=/bin:/sbin:/usr/bin:/usr/sbin HOME=/root TERM=linux

mount_sys_dev() {
    mount -t sysfs sysfs /sys
    mount -t devtmpfs devtmpfs /dev 2>/dev/null
}

# Boot-time mark 1: user space reached /init (harmless outside spore). On
# arm64 spore-signal needs /dev/mem and the device tree in /sys, which are not
# there yet: it fails, and marks again once they are mounted.
late_mark=""
spore-signal mark 1 2>/dev/null || late_mark=1

mount -t proc proc /proc
if [ -n "$late_mark" ]; then
    mount_sys_dev
    spore-signal mark 1 2>/dev/null
fi
# Boot benchmark (`spore bench boot --linux-kernel`): mark 1 is all it needs.
case " $(cat /proc/cmdline) " in
*" spore.bench=1 "*) spore-signal exit 0 ;;
esac
[ -n "$late_mark" ] || mount_sys_dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t tmpfs -o mode=1777 tmpfs /tmp
hostname spore-guest
ip link set lo up 2>/dev/null || ifconfig lo 127.0.0.1 up

# A first IPv4 address from the command line (CONFIG_IP_PNP is off):
# spore.ip=A.B.C.D/P [spore.gw=A.B.C.D] [spore.if=NAME, default eth0]. A clone
# given a new address gets it from spore-reseed (the generation notice).
net_if=eth0 net_ip="" net_gw=""
for w in $(cat /proc/cmdline); do
    case $w in
    spore.ip=*) net_ip=${w#spore.ip=} ;;
    spore.gw=*) net_gw=${w#spore.gw=} ;;
    spore.if=*) net_if=${w#spore.if=} ;;
    esac
done
if [ -n "$net_ip" ]; then
    { ip link set dev "$net_if" up && ip addr add "$net_ip" dev "$net_if" &&
        { [ -z "$net_gw" ] || ip route add default via "$net_gw" dev "$net_if"; }; } ||
        echo "SPORE-INIT net: configuring $net_if $net_ip${net_gw:+ via $net_gw} failed"
fi

# busybox `poweroff`, `halt` and `reboot` ask pid 1 with USR2, USR1 and TERM.
# On x86 there is no ACPI, so the kernel cannot power the machine off itself
# (a forced `poweroff -f` only halts the CPUs): end the VM through the signal
# port instead, exit status 0, as a power-off should (the same on arm64).
stop_vm() {
    sync
    spore-signal exit 0 2>/dev/null
    reboot -f
}
trap stop_vm USR1 USR2 TERM

# A clone reseeds the kernel's random pool from /dev/hwrng when the VMM tells
# it (vsock port 21328, see README "Clone identity"); without vsock it just exits.
if [ -e /dev/vsock ] || grep -q vsock /proc/misc 2>/dev/null; then
    spore-reseed >/dev/console 2>&1 &
fi

read -r up _ </proc/uptime
echo "SPORE-INIT up ${up}s"

# Children run in the background and init waits: a shell runs traps only
# between commands, and `wait` is the one that a trapped signal interrupts.
if [ -x /scenario ]; then
    /scenario &
    wait $!
    rc=$?
    echo "SPORE-INIT scenario exit $rc"
else
    setsid cttyhack sh -l &
    wait $!
    rc=$?
fi

sync
spore-signal exit "$rc" 2>/dev/null
reboot -f
# reboot -f does not return unless it failed; never let init exit (panic).
while :; do sleep 3600; done
