#!/bin/sh
# Boot benchmark of the Linux guest inside L1 (1 vCPU, 256 MiB, `quiet`):
# VMM start to the guest's /init (its first mark), medians over 10 runs.
# The JSON lands in $SPORE_OUT/bench-boot-linux.json.
. "${SPORE_ROOT:-}/lib/spore/scenario-lib.sh"
tmp=${SPORE_TMP:-/tmp}
cd "$tmp" || exit 1
if "$SPORE" bench boot --linux-kernel "$GUEST_KERNEL" --linux-initrd "$GUEST_INITRD" \
    --runs 10 --mem 256M --vcpus 1 >"$tmp/bench.json" 2>"$tmp/bench.err"; then
    cat "$tmp/bench.json"
    cat "$tmp/bench.err"
    cp "$tmp/bench.json" "$SPORE_OUT/bench-boot-linux.json"
    t bench-boot-linux PASS "$(tail -n 1 "$tmp/bench.err")"
else
    t bench-boot-linux FAIL "$(tail -n 3 "$tmp/bench.err")"
fi
