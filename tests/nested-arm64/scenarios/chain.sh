#!/bin/sh
# aarch64 tier (issue 15): a base + diff snapshot chain of a Linux guest
# (2 vCPUs, dirty page tracking) that counts in a loop, restored in a new
# VMM process through every restore path — lazy, eager, userfaultfd, and
# working set (the first restore records the set, the second loads it) —
# and merged into one full snapshot, restored too. After each restore the
# guest must answer on vsock and its counter must go on from where the diff
# left it (not start over, not jump back).
. "${SPORE_ROOT:-}/lib/spore/scenario-lib.sh"
tmp=${SPORE_TMP:-/tmp}
cd "$tmp" || exit 1
boot_api_guest '{"vcpu_count":2,"mem_size_mib":256,"track_dirty_pages":true}' 8 \
    "console=ttyS0 quiet reboot=k panic=1"
A() { "$SPORE" api "$api" "$@"; }
# A shell command in the guest over vsock (guest/snapshot.sh serves them).
guest() { guest_sh "$1" "${2:-120}"; }

# The counter: a guest process adding one every 50 ms to a file in tmpfs
# (guest memory), so its value lives only in the snapshot.
if [ "$(guest '(i=0; while :; do i=$((i + 1)); echo $i >/tmp/n; sleep 0.05; done) >/dev/null 2>&1 & sleep 1; echo started')" = started ]; then
    t guest-counts PASS
else
    t guest-counts FAIL "$(tail -n 5 "$tmp/console.txt")"
fi
"$SPORE" snapshot create "$api" --state "$tmp/base.state" --mem "$tmp/base.mem" >/dev/null 2>"$tmp/create.err" &&
    t base-snapshot PASS "$(du -k "$tmp/base.mem" | cut -f1) KiB on disk" ||
    t base-snapshot FAIL "$(cat "$tmp/create.err")"
sleep 2
# The counter's value just before the diff: a restore must show at least it.
before=$(guest 'cat /tmp/n')
"$SPORE" snapshot create "$api" --diff --state "$tmp/d1.state" --mem "$tmp/d1.mem" --stop >/dev/null 2>"$tmp/create.err" &&
    t diff-snapshot PASS "$(du -k "$tmp/d1.mem" | cut -f1) KiB on disk, counter at $before" ||
    t diff-snapshot FAIL "$(cat "$tmp/create.err")"
wait $vmm

"$SPORE" snapshot merge --state "$tmp/d1.state" --mem "$tmp/d1.mem" \
    --out-state "$tmp/merged.state" --out-mem "$tmp/merged.mem" >/dev/null 2>"$tmp/merge.err" &&
    t merge PASS "$(du -k "$tmp/merged.mem" | cut -f1) KiB on disk" || t merge FAIL "$(cat "$tmp/merge.err")"

# restore NAME STATE MEM MODE [ARGS...]: a new VMM process; the counter must
# be at least $before at first (the diff's moment; it cannot have gone back)
# and less than 20 s of counting past it, then keep rising.
restore() {
    name=$1 state=$2 mem=$3 mode=$4
    shift 4
    rm -f "$tmp/v.sock"
    "$SPORE" snapshot restore --state "$state" --mem "$mem" --mode "$mode" "$@" \
        --api-sock "$tmp/api-$name.sock" >"$tmp/console-$name.txt" 2>"$tmp/restore-$name.err" &
    r=$!
    first=$(guest 'cat /tmp/n' 60)
    sleep 1
    later=$(guest 'cat /tmp/n' 20)
    if [ -n "$first" ] && [ -n "$later" ] && [ "$first" -ge "$before" ] &&
        [ "$first" -lt $((before + 400)) ] && [ "$later" -gt "$first" ]; then
        t "counter-goes-on-$name" PASS "$before at the diff, $first after the restore, $later a second later"
    else
        t "counter-goes-on-$name" FAIL "before '$before' first '$first' later '$later'; $(tail -n 3 "$tmp/restore-$name.err")"
    fi
    kill $r 2>/dev/null
    wait $r
}
restore lazy "$tmp/d1.state" "$tmp/d1.mem" lazy
restore eager "$tmp/d1.state" "$tmp/d1.mem" eager
restore uffd "$tmp/d1.state" "$tmp/d1.mem" uffd
# The first working-set restore records the pages the guest touches in its
# first 3 s beside the state file; the second loads that set first.
restore ws-record "$tmp/d1.state" "$tmp/d1.mem" working-set --record-ms 3000
if [ -s "$tmp/d1.state.ws" ]; then
    t working-set-recorded PASS "$(du -k "$tmp/d1.state.ws" | cut -f1) KiB"
else
    t working-set-recorded FAIL "no $tmp/d1.state.ws; $(ls "$tmp")"
fi
restore ws-load "$tmp/d1.state" "$tmp/d1.mem" working-set
restore merged "$tmp/merged.state" "$tmp/merged.mem" lazy
cp "$tmp"/console*.txt "$tmp"/restore-*.err "$tmp/vmm.err" "$SPORE_OUT/" 2>/dev/null
true
