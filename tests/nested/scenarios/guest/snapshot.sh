#!/bin/sh
# L2 guest side of scenarios/snapshot.sh: writes a marker to the rw disk,
# then serves shell commands on vsock port 5000 (one connection per
# command; the host ends its command with `exit`), forever. The host
# snapshots this guest and restores it; the command server must keep
# answering in the restored guest.
printf 'spore-before-snapshot' | dd of=/dev/vda bs=512 conv=sync,fsync 2>/dev/null
mkfifo /tmp/cmd
serve() {
    while :; do
        spore-vsock listen 5000 </tmp/cmd | sh >/tmp/cmd 2>&1
    done
}
serve &
read -r up _ </proc/uptime
echo "GUEST-READY uptime ${up}"
while :; do sleep 3600; done
