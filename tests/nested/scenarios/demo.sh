#!/bin/sh
# `make demo`: boot the spore Linux guest with `spore run` (2 vCPUs, 256 MiB)
# and show its console; the guest (guest/demo.sh) says hello and exits 7,
# which must become spore's exit status.
. "${SPORE_ROOT:-}/lib/spore/scenario-lib.sh"
tmp=${SPORE_TMP:-/tmp}
cd "$tmp" || exit 1
echo "== spore run --kernel vmlinux --initrd initramfs --vcpus 2 --mem 256M"
start=$(cut -d' ' -f1 /proc/uptime)
"$SPORE" run --kernel "$GUEST_KERNEL" --initrd "$GUEST_INITRD" --vcpus 2 --mem 256M \
        --cmdline "console=ttyS0 quiet reboot=k panic=1 pci=off i8042.noaux i8042.nomux i8042.dumbkbd" \
        </dev/null >"$tmp/demo.txt" 2>"$tmp/demo.err"
rc=$?
end=$(cut -d' ' -f1 /proc/uptime)
tr -d '\r' <"$tmp/demo.txt" | grep -v '^$'
echo "== spore exited with $rc after $(awk -v a="$start" -v b="$end" 'BEGIN{printf "%.2f", b-a}') s"
if [ $rc -eq 7 ] && grep -q "hello from a Linux guest on 2 vCPUs" "$tmp/demo.txt"; then
    t demo-spore-run-linux PASS
else
    t demo-spore-run-linux FAIL "exit $rc: $(tail -n 2 "$tmp/demo.err")"
fi

# `poweroff` in the guest: its init ends the VM; spore exits 0.
"$SPORE" run --kernel "$GUEST_KERNEL" --initrd "$GUEST_INITRD" --mem 256M \
    --cmdline "console=ttyS0 quiet reboot=k panic=1 pci=off i8042.noaux i8042.nomux i8042.dumbkbd spore.demo=poweroff" \
    </dev/null >"$tmp/poweroff.txt" 2>"$tmp/poweroff.err"
rc=$?
if [ $rc -eq 0 ] && grep -q "powering off" "$tmp/poweroff.txt"; then
    t poweroff-exits-0 PASS
else
    t poweroff-exits-0 FAIL "exit $rc: $(tail -n 2 "$tmp/poweroff.err")"
fi

# The same kernel as a bzImage (what distributions ship).
"$SPORE" run --kernel "$GUEST_BZIMAGE" --initrd "$GUEST_INITRD" --mem 256M \
    --cmdline "console=ttyS0 quiet reboot=k panic=1 pci=off i8042.noaux i8042.nomux i8042.dumbkbd" \
    </dev/null >"$tmp/bzimage.txt" 2>"$tmp/bzimage.err"
rc=$?
if [ $rc -eq 7 ] && grep -q "hello from a Linux guest on 1 vCPUs" "$tmp/bzimage.txt"; then
    t bzimage-boots PASS
else
    t bzimage-boots FAIL "exit $rc: $(tail -n 2 "$tmp/bzimage.err")"
fi
