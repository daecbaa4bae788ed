#!/bin/sh
# L2 side of the demo: say hello and exit 7 (init passes it to spore-signal
# exit), or, with spore.demo=poweroff on the command line, power off
# (busybox poweroff: init stops the VM, spore exits 0).
if grep -qw spore.demo=poweroff /proc/cmdline; then
    echo "powering off"
    poweroff
    sleep 30
fi
echo "hello from a Linux guest on $(grep -c '^processor' /proc/cpuinfo) vCPUs: $(uname -sr)"
exit 7
