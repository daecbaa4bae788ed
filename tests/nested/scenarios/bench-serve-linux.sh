#!/bin/sh
# Benchmark (issue 17, SnapFaaS's experiment; make bench-serve-linux, not in
# make test): `spore bench serve --linux` inside L1. Python functions
# (tests/fixtures/python-bench, in /fns/python-bench) at each memory size,
# each started by the five strategies (cold boot, one merged full snapshot
# restored lazily, the layered base + diff lazily, layered + working set,
# clone of a zygote), each cold (L1's page cache dropped before the
# invocation) and lukewarm. The python3 image, the guest kernel and the
# daemon's state directory are on the scratch disk ($SPORE_SCRATCH, run.sh
# --scratch-disk): files on L1's initramfs stay in memory whatever is
# dropped. The matrix comes from /etc/spore-bench-serve-linux.env
# (SPORE_BSL_FUNCTIONS, _SIZES, _ROUNDS, _STRATEGIES, _TEMPERATURES). The
# JSON lands in $SPORE_OUT/bench-serve-linux.json, the table and progress
# in bench-serve-linux.txt.
. "${SPORE_ROOT:-}/lib/spore/scenario-lib.sh"
# Info lines of the daemons: bases made or reused, diffs, merges, zygotes.
export SPORE_LOG=spore_serve=info,warn
tmp=${SPORE_TMP:-/tmp}
cd "$tmp" || exit 1
env_file="${SPORE_ROOT:-}/etc/spore-bench-serve-linux.env"
# shellcheck disable=SC1090
[ -f "$env_file" ] && . "$env_file"
scratch=${SPORE_SCRATCH:-}
if [ -z "$scratch" ] || [ ! -d "$scratch/cache" ] || [ ! -f "$scratch/vmlinux" ]; then
    t bench-serve-linux FAIL "no scratch disk with the image cache and the kernel (run.sh --scratch-disk)"
    exit 0
fi
# Progress lines go to the console as they come, so a run cut short still
# leaves its figures in the log.
{
    # --no-cpu-cap: under TCG a guest's CPU time is 20-50 times its cost on
    # hardware; held to its MemorySize's share, every figure would be the cap's.
    "$SPORE" bench serve --linux --daemon-arg=--no-cpu-cap \
        --linux-kernel "$scratch/vmlinux" --image-cache "$scratch/cache" \
        --fixtures "${SPORE_ROOT:-}/fns/python-bench" --state-dir "$scratch/s" \
        --functions "${SPORE_BSL_FUNCTIONS:-lorem,thumbnail,enhance,matrix,compress}" \
        --sizes "${SPORE_BSL_SIZES:-128,256,512}" --rounds "${SPORE_BSL_ROUNDS:-3}" \
        --strategies "${SPORE_BSL_STRATEGIES:-cold-boot,merged,layered,layered-ws,clone,warm}" \
        --temperatures "${SPORE_BSL_TEMPERATURES:-lukewarm,cold}" \
        --daemon-log "$tmp/serve.err" 2>&1 >"$tmp/bench.json"
    echo "bench-rc $?"
} | tee "$tmp/bench.err"
cp "$tmp/bench.err" "$SPORE_OUT/bench-serve-linux.txt" 2>/dev/null
tail -c 200000 "$tmp/serve.err" >"$SPORE_OUT/bench-serve-linux-daemon.log" 2>/dev/null
if grep -q '^bench-rc 0$' "$tmp/bench.err"; then
    cat "$tmp/bench.json"
    cp "$tmp/bench.json" "$SPORE_OUT/bench-serve-linux.json"
    failed=$(grep -c 'FAILED' "$tmp/bench.err")
    if [ "$failed" = 0 ]; then
        t bench-serve-linux PASS "$(grep -A1 '^function ' "$tmp/bench.err" | tail -n 1)"
    else
        t bench-serve-linux FAIL "$failed cells failed: $(grep FAILED "$tmp/bench.err" | head -n 2 | tr '\n' ' ')"
    fi
else
    t bench-serve-linux FAIL "$(tail -n 3 "$tmp/bench.err")"
fi
true
