#!/bin/sh
# tmem from a Linux guest: `spore run` a guest whose /scenario
# (scenarios/guest/tmem.sh) puts and gets values through /bin/spore-tmem,
# once with an uncompressed pool and once with lz4. The guest's SPORE-TEST
# lines come back on its console; here they are relayed.
. "${SPORE_ROOT:-}/lib/spore/scenario-lib.sh"
tmp=${SPORE_TMP:-/tmp}
cd "$tmp" || exit 1
for mode in none lz4; do
    "$SPORE" run --kernel "$GUEST_KERNEL" --initrd "$GUEST_INITRD" --mem 256M \
        --tmem-quota 4M --tmem-compression "$mode" \
        --cmdline "console=ttyS0 quiet reboot=k panic=1 pci=off i8042.noaux i8042.nomux i8042.dumbkbd spore.tmem=$mode" \
        </dev/null >"$tmp/tmem-$mode.txt" 2>"$tmp/tmem-$mode.err"
    rc=$?
    tr -d '\r' <"$tmp/tmem-$mode.txt" | grep -E '^(SPORE-TEST|spore-tmem)'
    n=$(tr -d '\r' <"$tmp/tmem-$mode.txt" | grep -c "^SPORE-TEST tmem-$mode-.* PASS")
    if [ $rc -eq 0 ] && [ "$n" -eq 10 ]; then
        t "tmem-$mode-guest-ran" PASS "$n guest checks passed"
    else
        t "tmem-$mode-guest-ran" FAIL "exit $rc, $n passes: $(tail -n 3 "$tmp/tmem-$mode.err" | tr '\n' ' ')"
    fi
done
