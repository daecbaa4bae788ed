#!/bin/sh
# L2 guest side of scenarios/clone.sh: serves shell commands on vsock port
# 5000 (one connection per command, like guest/snapshot.sh), forever. The
# host snapshots this guest and restores it as clones; init.sh's
# spore-reseed reseeds each clone's random pool when the VMM says so.
mkfifo /tmp/cmd
serve() {
    while :; do
        spore-vsock listen 5000 </tmp/cmd | sh >/tmp/cmd 2>&1
    done
}
serve &
echo "GUEST-READY"
while :; do sleep 3600; done
