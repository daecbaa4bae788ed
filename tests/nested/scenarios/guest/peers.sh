#!/bin/sh
# L2 guest side of scenarios/peers.sh (spore and Firecracker side by side):
# serves shell commands on vsock port 5000 (one connection per command; the
# host ends its command with `exit`), as guest/snapshot.sh does, whichever
# VMM runs it. With `peers.memwatch` on the command line it also prints
# `PEER-MEMTOTAL <kB>` on the console whenever MemTotal changes (read every
# 20 ms without forking anything but the sleep): the L1 side timestamps
# console lines as they arrive, so that is when the guest saw a virtio-mem
# plug or unplug, or a balloon inflation. The host ends the VM.
mkfifo /tmp/cmd
serve() {
    while :; do
        spore-vsock listen 5000 </tmp/cmd | sh >/tmp/cmd 2>&1
    done
}
serve &
case " $(cat /proc/cmdline) " in
*" peers.memwatch "*)
    last=""
    while :; do
        while read -r k v _; do [ "$k" = MemTotal: ] && break; done </proc/meminfo
        if [ "$v" != "$last" ]; then
            echo "PEER-MEMTOTAL $v"
            last=$v
        fi
        sleep 0.02
    done
    ;;
esac
while :; do sleep 3600; done
