#!/bin/sh
# L2 side of the demo: say hello and exit 7 (init passes it to spore-signal exit).
echo "hello from a Linux guest on $(grep -c '^processor' /proc/cpuinfo) vCPUs: $(uname -sr)"
exit 7
