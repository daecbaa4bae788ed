#!/bin/sh
# Smoke scenario: the L1 VM has a working /dev/kvm (KVM_GET_API_VERSION is
# not reachable from busybox, so opening the device stands in for it).
if [ -c /dev/kvm ] && exec 3<>/dev/kvm; then
    exec 3>&-
    echo "SPORE-TEST nested-kvm PASS"
else
    echo "SPORE-TEST nested-kvm FAIL /dev/kvm missing or cannot be opened"
fi
if [ -x "$SPORE" ]; then
    echo "SPORE-TEST spore-binary-runs $("$SPORE" --help >/dev/null 2>&1 && echo PASS || echo FAIL "$SPORE --help failed")"
else
    echo "SPORE-TEST spore-binary-runs SKIP no --spore given"
fi
if [ -s "$GUEST_KERNEL" ] && [ -s "$GUEST_INITRD" ]; then
    echo "SPORE-TEST guest-assets-present PASS"
else
    echo "SPORE-TEST guest-assets-present FAIL"
fi
# Exercise the copy-back path: run.sh --out-dir receives this file.
uname -a >"$SPORE_OUT/l1-uname.txt"
