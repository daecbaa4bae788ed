#!/bin/sh
# L2 guest side of scenarios/net.sh: its address comes from the kernel command
# line (spore.ip=, spore.gw=; init.sh sets it up). Serves shell commands on
# vsock port 5000 (one connection per command, like guest/clone.sh) and HTTP
# on port 8080 from /tmp/www (busybox httpd: what L1 fetches from the guest),
# forever. The host transfers, rate-limits, snapshots and clones this guest.
mkdir -p /tmp/www
echo "guest-http-ok" >/tmp/www/hello
httpd -f -p 8080 -h /tmp/www &
mkfifo /tmp/cmd
serve() {
    while :; do
        spore-vsock listen 5000 </tmp/cmd | sh >/tmp/cmd 2>&1
    done
}
serve &
echo "GUEST-READY $(ip -4 addr show dev eth0 2>&1 | sed -n 's/.*inet \([^ ]*\).*/\1/p')"
while :; do sleep 3600; done
