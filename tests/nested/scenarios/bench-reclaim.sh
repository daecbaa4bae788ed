#!/bin/sh
# Reclaim benchmark of the Linux guest inside L1 (`spore bench reclaim`,
# the virtio-mem seed's §5.2 two-hog experiment): 1 GiB guest (2 vCPUs), a
# 768 MiB first hog kept, a second hog of each size written, removed and
# its size reclaimed with virtio-mem (target to 0) and with the balloon
# (target to the size). Medians over SPORE_RECLAIM_RUNS (3) runs; the JSON
# lands in $SPORE_OUT/bench-reclaim-linux.json. Guest side:
# guest/virtio-mem-snapshot.sh (a shell on vsock port 5000).
. "${SPORE_ROOT:-}/lib/spore/scenario-lib.sh"
tmp=${SPORE_TMP:-/tmp}
cd "$tmp" || exit 1
# Progress lines (one per run) go to the console as they come, so a run
# cut short still leaves its figures in the log.
{
    "$SPORE" bench reclaim --linux-kernel "$GUEST_KERNEL" --linux-initrd "$GUEST_INITRD" \
        --runs "${SPORE_RECLAIM_RUNS:-3}" --sizes "${SPORE_RECLAIM_SIZES:-128,256,512,1024}" \
        2>&1 >"$tmp/bench.json"
    echo "bench-rc $?"
} | tee "$tmp/bench.err"
if grep -q '^bench-rc 0$' "$tmp/bench.err"; then
    cat "$tmp/bench.json"
    cp "$tmp/bench.json" "$SPORE_OUT/bench-reclaim-linux.json"
    t bench-reclaim-linux PASS "$(grep -E '^reclaim .*median' "$tmp/bench.err" | tr '\n' ';')"
else
    t bench-reclaim-linux FAIL "$(tail -n 3 "$tmp/bench.err")"
fi
cp "$tmp/bench.err" "$SPORE_OUT/bench-reclaim-linux.err" 2>/dev/null
true
