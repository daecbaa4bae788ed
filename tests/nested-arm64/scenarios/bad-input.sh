#!/bin/sh
# aarch64 tier (issue 15): what the arm64 build refuses, each with one clear
# line and a non-zero exit, and no VM left behind:
# - an x86 kernel (the x86 guest's bzImage, at /x86/bzImage);
# - a snapshot taken on x86_64 (a spore unikernel's guest-triggered snapshot
#   point, written on the host by run-all.sh, at /x86/tag-1.state and .mem):
#   the error names both architectures.
. "${SPORE_ROOT:-}/lib/spore/scenario-lib.sh"
tmp=${SPORE_TMP:-/tmp} root=${SPORE_ROOT:-}
cd "$tmp" || exit 1

# One line on stderr naming the problem, a non-zero exit.
refused() { # NAME RC ERRFILE PATTERN...
    name=$1 rc=$2 err=$3
    shift 3
    lines=$(grep -c . "$err")
    if [ "$rc" -eq 0 ]; then
        t "$name" FAIL "accepted (exit 0): $(tail -n 2 "$err")"
        return
    fi
    for p in "$@"; do
        grep -q "$p" "$err" || { t "$name" FAIL "exit $rc, no '$p' in: $(tail -n 2 "$err")"; return; }
    done
    if [ "$lines" -eq 1 ]; then t "$name" PASS "exit $rc: $(cat "$err")"; else t "$name" FAIL "$lines lines: $(cat "$err")"; fi
}

if [ -f "$root/x86/bzImage" ]; then
    timeout 60 "$SPORE" run --kernel "$root/x86/bzImage" --initrd "$GUEST_INITRD" --mem 128M \
        >"$tmp/x86-kernel.out" 2>"$tmp/x86-kernel.err"
    refused x86-kernel-refused $? "$tmp/x86-kernel.err" "not an arm64 Linux Image"
else
    t x86-kernel-refused SKIP "no x86 bzImage given"
fi

if [ -f "$root/x86/tag-1.state" ]; then
    timeout 60 "$SPORE" snapshot restore --state "$root/x86/tag-1.state" --mem "$root/x86/tag-1.mem" \
        --api-sock "$tmp/x86.sock" >"$tmp/x86-snap.out" 2>"$tmp/x86-snap.err"
    refused x86-snapshot-refused $? "$tmp/x86-snap.err" "taken on x86_64" "runs on aarch64"
    [ ! -e "$tmp/x86.sock" ] && t x86-snapshot-leaves-nothing PASS || t x86-snapshot-leaves-nothing FAIL "the API socket was left behind"
else
    t x86-snapshot-refused SKIP "no x86 snapshot given (run-all.sh makes one with the host's KVM)"
fi
