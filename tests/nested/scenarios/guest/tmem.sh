#!/bin/sh
# L2 guest side of scenarios/tmem.sh: drives the VMM's tmem pool from Linux
# user space with /bin/spore-tmem. Values are random (incompressible). The
# VM runs with a 4 MiB tmem quota; prints SPORE-TEST lines; exits 0.
. "${SPORE_ROOT:-}/lib/spore/scenario-lib.sh"
mode=$(sed -n 's/.*spore.tmem=\([a-z0-9]*\).*/\1/p' /proc/cmdline)
mode=${mode:-none}
cd /tmp || exit 1

head -c 1048576 /dev/urandom >big
head -c 4096 /dev/urandom >page
printf 'x' >one

roundtrip() { # NAME FILE
    if spore-tmem put "$1" "$2" && spore-tmem get "$1" >"$1.back" && cmp -s "$2" "$1.back"; then
        t "tmem-$mode-roundtrip-$1" PASS "$(wc -c <"$2") bytes"
    else
        t "tmem-$mode-roundtrip-$1" FAIL
    fi
}
roundtrip one one
roundtrip page page
roundtrip big big

# From stdin, and a key that is not ASCII-clean.
if head -c 1048576 big | spore-tmem put "$(printf 'k\tey')" &&
    spore-tmem get "$(printf 'k\tey')" | cmp -s big -; then
    t "tmem-$mode-stdin-put" PASS
else
    t "tmem-$mode-stdin-put" FAIL
fi

# Replacing a 1 MiB value with a small one, then invalidating.
printf 'small' | spore-tmem put big
if [ "$(spore-tmem get big)" = small ]; then t "tmem-$mode-replace" PASS; else t "tmem-$mode-replace" FAIL; fi
spore-tmem inval big
spore-tmem get big >/dev/null 2>&1
rc=$?
if [ $rc -eq 1 ]; then t "tmem-$mode-get-after-inval-not-found" PASS; else t "tmem-$mode-get-after-inval-not-found" FAIL "exit $rc"; fi
spore-tmem inval big 2>/dev/null
rc=$?
if [ $rc -eq 1 ]; then t "tmem-$mode-inval-twice-not-found" PASS; else t "tmem-$mode-inval-twice-not-found" FAIL "exit $rc"; fi

# Quota (4 MiB): 1 MiB values fit until the pool is full; the refused put
# exits 3 and every value stored before reads back identical.
spore-tmem flush
i=0 refused=""
while [ $i -lt 8 ]; do
    head -c 1048576 /dev/urandom >"q$i"
    spore-tmem put "q$i" "q$i"
    rc=$?
    if [ $rc -eq 3 ]; then refused=$i; break; fi
    [ $rc -eq 0 ] || { t "tmem-$mode-quota" FAIL "put q$i exit $rc"; break; }
    i=$((i + 1))
done
intact=yes
j=0
while [ -n "$refused" ] && [ $j -lt "$refused" ]; do
    spore-tmem get "q$j" | cmp -s "q$j" - || intact="no (q$j)"
    j=$((j + 1))
done
if [ -n "$refused" ] && [ "$refused" -ge 2 ] && [ "$intact" = yes ]; then
    t "tmem-$mode-quota-refuses-and-keeps" PASS "refused at q$refused"
else
    t "tmem-$mode-quota-refuses-and-keeps" FAIL "refused=${refused:-never} intact=$intact"
fi
spore-tmem get "q$refused" >/dev/null 2>&1
rc=$?
if [ $rc -eq 1 ]; then t "tmem-$mode-refused-put-left-nothing" PASS; else t "tmem-$mode-refused-put-left-nothing" FAIL "exit $rc"; fi

spore-tmem stats >stats.txt
objects=$(sed -n 's/^objects //p' stats.txt)
refusals=$(sed -n 's/^refused //p' stats.txt)
if [ "$objects" -gt 0 ] && [ "$refusals" -ge 1 ] && grep -q '^quota_bytes 4194304$' stats.txt; then
    t "tmem-$mode-stats" PASS "objects=$objects refused=$refusals"
else
    t "tmem-$mode-stats" FAIL "$(tr '\n' ' ' <stats.txt)"
fi
exit 0
