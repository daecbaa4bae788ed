#!/bin/sh
# aarch64 tier (issue 15), the first scenario, in the style of the x86
# foundation scenario (tests/nested/scenarios/foundation.sh): the arm64 Linux
# guest (2 vCPUs, 256 MiB) configured and started through spore's API in L1,
# its init's marker on the console, and `reboot -f` in the guest (PSCI
# SYSTEM_RESET) ending the VMM with status 0. The guest side is
# guest/boot.sh; its SPORE-TEST lines are relayed from its console.
. "${SPORE_ROOT:-}/lib/spore/scenario-lib.sh"
tmp=${SPORE_TMP:-/tmp}
cd "$tmp" || exit 1
api="$tmp/api.sock"

"$SPORE" vmm --api-sock "$api" >"$tmp/console.txt" 2>"$tmp/vmm.err" &
vmm=$!
wait_for_socket "$api"

A() { "$SPORE" api "$api" "$@"; }
# The arm64 console is the device tree's 16550 (ttyS0); spore adds earlycon.
cmdline="console=ttyS0 quiet reboot=k panic=1"
if A PUT /boot-source "{\"kernel_image_path\":\"$GUEST_KERNEL\",\"initrd_path\":\"$GUEST_INITRD\",\"boot_args\":\"$cmdline\"}" &&
    A PUT /machine-config '{"vcpu_count":2,"mem_size_mib":256}' &&
    A GET /machine-config | grep -q '"vcpu_count":2' &&
    A PUT /actions '{"action_type":"InstanceStart"}'; then
    t api-configure-and-start PASS
else
    t api-configure-and-start FAIL "$(tail -n 3 "$tmp/vmm.err")"
fi

# The guest reboots when its checks are done; bound the wait (well below
# run.sh's stall timeout) so that a VMM that does not end is reported here.
i=0
while kill -0 $vmm 2>/dev/null && [ $i -lt 1800 ]; do
    sleep 0.1
    i=$((i + 1))
done
if kill -0 $vmm 2>/dev/null; then
    kill -9 $vmm
    wait $vmm
    t reboot-f-exits-0 FAIL "the VMM still ran 180 s after the start; console: $(tr -d '\r' <"$tmp/console.txt" | tail -n 5 | tr '\n' '|')"
else
    wait $vmm
    rc=$?
    if [ $rc -eq 0 ] && grep -q GUEST-DONE "$tmp/console.txt"; then
        t reboot-f-exits-0 PASS
    else
        t reboot-f-exits-0 FAIL "vmm exit $rc: $(tail -n 3 "$tmp/vmm.err")"
    fi
fi

if grep -q "SPORE-INIT up" "$tmp/console.txt"; then
    t linux-boots-to-init PASS "$(grep -o 'SPORE-INIT up [0-9.]*s' "$tmp/console.txt")"
else
    t linux-boots-to-init FAIL "$(tr -d '\r' <"$tmp/console.txt" | tail -n 5 | tr '\n' '|')"
fi
# Relay the guest's own results.
grep '^SPORE-TEST ' "$tmp/console.txt" | tr -d '\r'
cp "$tmp/console.txt" "$SPORE_OUT/boot-console.txt"
cp "$tmp/vmm.err" "$SPORE_OUT/boot-vmm.err"
