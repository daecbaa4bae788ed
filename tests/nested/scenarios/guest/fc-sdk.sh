#!/bin/sh
# L2 guest side of scenarios/fc-sdk.sh: serves shell commands on vsock port
# 5000 (one connection per command; the host ends its command with `exit`),
# forever, through the SDK's snapshot, load and balloon steps.
mkfifo /tmp/cmd
serve() {
    while :; do
        spore-vsock listen 5000 </tmp/cmd | sh >/tmp/cmd 2>&1
    done
}
serve &
echo "GUEST-READY"
while :; do sleep 3600; done
