#!/bin/sh
# L2 side of scenarios/cpu-config.sh: print what the guest kernel made of
# its CPUID (cpu0's flags, its SMT siblings, the vCPU count) and exit 3.
flags=$(awk -F': ' '/^flags/ { print $2; exit }' /proc/cpuinfo)
siblings=$(cat /sys/devices/system/cpu/cpu0/topology/thread_siblings_list 2>/dev/null)
echo "CPU-FLAGS $flags"
echo "CPU-TOPO cpus=$(grep -c '^processor' /proc/cpuinfo) cpu0_siblings=$siblings"
exit 3
