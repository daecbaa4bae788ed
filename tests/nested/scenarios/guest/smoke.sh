#!/bin/sh
# Guest-side smoke scenario (runs as the guest's /scenario): the drivers and
# kernel features spore's Linux guest relies on are present and work.
t() { # t NAME COMMAND... — PASS if the command succeeds
    name="$1"
    shift
    if "$@" >/dev/null 2>&1; then echo "SPORE-TEST $name PASS"; else echo "SPORE-TEST $name FAIL"; fi
}
driver_of() { # driver_of VIRTIO_DEVICE_ID — prints the bound driver name
    for d in /sys/bus/virtio/devices/*; do
        [ "$(cat "$d/device" 2>/dev/null)" = "$1" ] && basename "$(readlink "$d/driver")"
    done
}
has_virtio() { [ -n "$(driver_of "$1")" ]; }

t guest-init-mounts grep -q ' /proc proc ' /proc/mounts
t guest-devtmpfs test -c /dev/null
t guest-loopback ping -c1 -W2 127.0.0.1
t guest-signal-mark spore-signal mark 2
spore-signal bogus >/dev/null 2>&1
[ $? -eq 2 ] && echo "SPORE-TEST guest-signal-usage PASS" || echo "SPORE-TEST guest-signal-usage FAIL"

t guest-virtio-blk-driver has_virtio 0x0002
if [ -b /dev/vda ] && mount -t ext4 /dev/vda /mnt 2>/dev/null; then
    t guest-virtio-blk-ext4 grep -qx hello-from-disk /mnt/hello.txt
    umount /mnt
else
    echo "SPORE-TEST guest-virtio-blk-ext4 FAIL cannot mount /dev/vda"
fi
t guest-virtio-rng has_virtio 0x0004
# shellcheck disable=SC2016 # expanded by the inner sh
t guest-hwrng-read sh -c 'test "$(head -c 16 /dev/hwrng | wc -c)" -eq 16'
t guest-virtio-net has_virtio 0x0001
t guest-virtio-balloon has_virtio 0x0005
t guest-memory-hotplug test -d /sys/devices/system/memory
t guest-hotplug-online-movable grep -qx online_movable /sys/devices/system/memory/auto_online_blocks
# The first address from the command line (spore.ip=, spore.gw=; init.sh), then
# a clone's new identity as spore-reseed applies the notice's mac/ipv4 lines.
# shellcheck disable=SC2016 # expanded by the inner sh
t guest-net-cmdline-address sh -c 'ip -4 addr show dev eth0 | grep -q "inet 10.0.2.15/24" && ip route | grep -q "default via 10.0.2.2 dev eth0"'
printf 'generation 1\nmac eth0 06:00:0a:00:02:10\nipv4 eth0 10.0.2.16/24 10.0.2.2\n' >/tmp/notice
# shellcheck disable=SC2016 # expanded by the inner sh
t guest-net-identity-notice sh -c 'spore-reseed apply /tmp/notice && grep -qx 06:00:0a:00:02:10 /sys/class/net/eth0/address &&
    ip -4 addr show dev eth0 | grep -q "inet 10.0.2.16/24" && ! ip -4 addr show dev eth0 | grep -q 10.0.2.15 &&
    ip route | grep -q "default via 10.0.2.2 dev eth0"'
# A MAC alone: the default route survives the link bounce.
printf 'generation 2\nmac eth0 06:00:0a:00:02:11\n' >/tmp/notice
# shellcheck disable=SC2016 # expanded by the inner sh
t guest-net-mac-keeps-route sh -c 'spore-reseed apply /tmp/notice && grep -qx 06:00:0a:00:02:11 /sys/class/net/eth0/address &&
    ip route | grep -q "default via 10.0.2.2 dev eth0"'
printf 'generation 3\nmac eth0 06:00:0a:00:02\n' >/tmp/notice
t guest-net-bad-notice-refused sh -c '! spore-reseed apply /tmp/notice'
