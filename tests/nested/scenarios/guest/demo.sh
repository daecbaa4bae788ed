#!/bin/sh
# L2 side of the demo: say hello and exit 7 (init passes it to spore-signal
# exit), or, with spore.demo=poweroff on the command line, power off.
if grep -qw spore.demo=poweroff /proc/cmdline; then
    echo "powering off"
    poweroff -f
fi
echo "hello from a Linux guest on $(grep -c '^processor' /proc/cpuinfo) vCPUs: $(uname -sr)"
exit 7
