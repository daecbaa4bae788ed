#!/bin/sh
# aarch64 tier, the harness alone (opt-in: run-all.sh --arch arm64 --only
# l1-kvm, or run.sh --arch arm64 --scenario this file without --spore): L1's
# /dev/kvm and KVM mode, the arm64 guest assets the harness put in L1, and
# whether $SPORE runs (SKIP without one).
. "${SPORE_ROOT:-}/lib/spore/scenario-lib.sh"

if [ -c /dev/kvm ]; then t l1-dev-kvm PASS "$(uname -m) $(uname -r)"; else t l1-dev-kvm FAIL; fi
mode=$(dmesg | grep -o 'kvm \[[0-9]*\]: [A-Za-z]* mode initialized successfully' | head -n1)
case $mode in
*VHE*) t l1-kvm-vhe PASS "$mode" ;;
*) t l1-kvm-vhe FAIL "${mode:-no KVM mode line in dmesg}" ;;
esac
# The guest kernel is an arm64 Image ("ARM\x64" at offset 56), no bzImage.
magic=$(dd if="$GUEST_KERNEL" bs=1 skip=56 count=4 2>/dev/null)
if [ "$magic" = ARMd ] && [ -s "$GUEST_INITRD" ] && [ -z "${GUEST_BZIMAGE:-}" ]; then
    t l1-guest-assets PASS "$GUEST_KERNEL $(wc -c <"$GUEST_KERNEL") bytes, $GUEST_INITRD $(wc -c <"$GUEST_INITRD") bytes"
else
    t l1-guest-assets FAIL "kernel '$GUEST_KERNEL' magic '$magic', initrd '$GUEST_INITRD', GUEST_BZIMAGE '${GUEST_BZIMAGE:-}'"
fi
if [ ! -x "$SPORE" ]; then
    t l1-spore-runs SKIP "no --spore"
elif out=$("$SPORE" --version 2>&1); then
    t l1-spore-runs PASS "$(echo "$out" | tail -n 1)"
else
    t l1-spore-runs FAIL "$(echo "$out" | tail -n 1)"
fi
