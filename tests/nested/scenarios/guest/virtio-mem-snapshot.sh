#!/bin/sh
# L2 guest side of scenarios/virtio-mem-snapshot.sh (and of the reclaim
# bench): serves shell commands on vsock port 5000 (one connection per
# command; the host ends its command with `exit`), forever. The host plugs
# memory, fills it through these commands, snapshots the guest, restores it
# and unplugs; the server must keep answering in the restored guest.
mkfifo /tmp/cmd
serve() {
    while :; do
        spore-vsock listen 5000 </tmp/cmd | sh >/tmp/cmd 2>&1
    done
}
serve &
echo "GUEST-READY $(cut -d' ' -f1 /proc/uptime)"
while :; do sleep 3600; done
