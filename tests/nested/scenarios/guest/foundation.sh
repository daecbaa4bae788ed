#!/bin/sh
# L2 guest side of scenarios/foundation.sh. Prints results on the console;
# ends with `reboot -f`, which must make the VMM exit 0.
. "${SPORE_ROOT:-}/lib/spore/scenario-lib.sh"

n=$(grep -c '^processor' /proc/cpuinfo)
if [ "$n" = 2 ]; then t guest-sees-2-cpus PASS; else t guest-sees-2-cpus FAIL "saw $n"; fi

mkdir -p /mnt/ro
if mount -t ext4 -o ro /dev/vda /mnt/ro; then
    echo "GUEST-RO-SHA $(sha256sum /mnt/ro/data.bin | cut -d' ' -f1)"
    umount /mnt/ro
else
    t guest-mounts-ro-disk FAIL
fi
if dd if=/dev/zero of=/dev/vda bs=512 count=1 conv=fsync 2>/dev/null; then
    t guest-ro-disk-refuses-writes FAIL
else
    t guest-ro-disk-refuses-writes PASS
fi
if printf 'spore-rw-marker-42' | dd of=/dev/vdb bs=512 conv=sync,fsync 2>/dev/null; then
    t guest-rw-disk-write PASS
else
    t guest-rw-disk-write FAIL
fi

rng=$(cat /sys/class/misc/hw_random/rng_current 2>/dev/null)
hex=$(dd if=/dev/hwrng bs=64 count=1 2>/dev/null | od -An -tx1 | tr -d ' \n')
if [ ${#hex} -eq 128 ] && [ "$hex" != "$(printf '%0128d' 0)" ]; then
    t guest-hwrng-entropy PASS "$rng"
else
    t guest-hwrng-entropy FAIL "rng '$rng' gave '$hex'"
fi

# vsock: the host connects to our port 5000; we connect to the host's 6000.
echo pong-from-guest | spore-vsock listen 5000 >/tmp/from-host.txt 2>/tmp/listen.err &
lp=$!
reply=$(echo hello-from-guest | spore-vsock connect 2 6000 2>&1)
if [ "$reply" = reply-from-host ]; then
    t guest-vsock-connect-to-host PASS
else
    t guest-vsock-connect-to-host FAIL "got '$reply'"
fi
i=0
while kill -0 $lp 2>/dev/null && [ $i -lt 1200 ]; do sleep 0.1; i=$((i + 1)); done
if grep -q ping-from-host /tmp/from-host.txt; then
    t guest-vsock-accepts-host PASS
else
    t guest-vsock-accepts-host FAIL "$(cat /tmp/listen.err)"
fi
echo GUEST-DONE
sync
reboot -f
