#!/bin/sh
# L2 guest side of ../boot.sh (aarch64): prints results on the console; ends
# with `reboot -f`, which must make the VMM exit 0.
. "${SPORE_ROOT:-}/lib/spore/scenario-lib.sh"

m=$(uname -m)
if [ "$m" = aarch64 ]; then t guest-is-aarch64 PASS "$(uname -r)"; else t guest-is-aarch64 FAIL "uname -m: $m"; fi
n=$(grep -c '^processor' /proc/cpuinfo)
if [ "$n" = 2 ]; then t guest-sees-2-cpus PASS; else t guest-sees-2-cpus FAIL "saw $n"; fi
echo GUEST-DONE
sync
reboot -f
