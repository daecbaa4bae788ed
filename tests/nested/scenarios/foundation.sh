#!/bin/sh
# Tier 3, issue "VMM foundation": a Linux guest (2 vCPUs, 256 MiB) configured
# and started through spore's API in L1, with a read-only and a read-write
# virtio-blk disk, virtio-rng and vsock. The guest side is
# guest/foundation.sh; its SPORE-TEST lines are relayed from its console.
. "${SPORE_ROOT:-}/lib/spore/scenario-lib.sh"
tmp=${SPORE_TMP:-/tmp} root=${SPORE_ROOT:-}
cd "$tmp" || exit 1
api="$tmp/api.sock"
dd if=/dev/zero of="$tmp/rw.img" bs=1M count=8 2>/dev/null

# Guest-initiated vsock: the host side listens on <uds>_6000 before boot.
echo reply-from-host | "$SPORE" vsock listen --uds "$tmp/v.sock" --port 6000 \
    >"$tmp/from-guest.txt" 2>"$tmp/listen.err" &

"$SPORE" vmm --api-sock "$api" >"$tmp/console.txt" 2>"$tmp/vmm.err" &
vmm=$!
wait_for_socket "$api"

A() { "$SPORE" api "$api" "$@"; }
cmdline="console=ttyS0 quiet reboot=k panic=1 pci=off i8042.noaux i8042.nomux i8042.dumbkbd"
if A PUT /boot-source "{\"kernel_image_path\":\"$GUEST_KERNEL\",\"initrd_path\":\"$GUEST_INITRD\",\"boot_args\":\"$cmdline\"}" &&
    A PUT /machine-config '{"vcpu_count":2,"mem_size_mib":256}' &&
    A PUT /drives/ro "{\"drive_id\":\"ro\",\"path_on_host\":\"$root/disks/ro.img\",\"is_root_device\":false,\"is_read_only\":true}" &&
    A PUT /drives/rw "{\"drive_id\":\"rw\",\"path_on_host\":\"$tmp/rw.img\",\"is_root_device\":false,\"is_read_only\":false}" &&
    A PUT /vsock "{\"guest_cid\":3,\"uds_path\":\"$tmp/v.sock\"}" &&
    A GET /machine-config | grep -q '"vcpu_count":2' &&
    A PUT /actions '{"action_type":"InstanceStart"}'; then
    t api-configure-and-start PASS
else
    t api-configure-and-start FAIL "$(cat "$tmp/vmm.err")"
fi

if A PATCH /vm '{"state":"Paused"}' && A GET / | grep -q '"Paused"' && sleep 1 &&
    A PATCH /vm '{"state":"Resumed"}' && A GET / | grep -q '"Running"'; then
    t api-pause-resume PASS
else
    t api-pause-resume FAIL
fi

# Host-initiated vsock: retry until the guest listens on port 5000.
out=""
i=0
while [ $i -lt 240 ]; do
    out=$(echo ping-from-host | "$SPORE" vsock connect --uds "$tmp/v.sock" --port 5000 2>/dev/null) && break
    sleep 0.5
    i=$((i + 1))
done
if [ "$out" = pong-from-guest ]; then t vsock-host-to-guest PASS; else t vsock-host-to-guest FAIL "got '$out'"; fi

wait $vmm
rc=$?
if [ $rc -eq 0 ] && grep -q GUEST-DONE "$tmp/console.txt"; then
    t reboot-f-exits-0 PASS
else
    t reboot-f-exits-0 FAIL "vmm exit $rc: $(tail -n 3 "$tmp/vmm.err")"
fi

if grep -q "SPORE-INIT up" "$tmp/console.txt"; then t linux-boots-to-init PASS; else t linux-boots-to-init FAIL; fi
expected=$(cut -d" " -f1 "$root/disks/data.sha256")
if grep -q "GUEST-RO-SHA $expected" "$tmp/console.txt"; then
    t ro-disk-file-checksum PASS
else
    t ro-disk-file-checksum FAIL "want $expected, guest said: $(grep GUEST-RO-SHA "$tmp/console.txt")"
fi
if dd if="$tmp/rw.img" bs=512 count=1 2>/dev/null | grep -q spore-rw-marker-42; then
    t rw-disk-host-sees-write PASS
else
    t rw-disk-host-sees-write FAIL
fi
if grep -q hello-from-guest "$tmp/from-guest.txt"; then
    t vsock-guest-to-host PASS
else
    t vsock-guest-to-host FAIL "$(cat "$tmp/listen.err")"
fi
# Relay the guest's own results.
grep '^SPORE-TEST ' "$tmp/console.txt"
cp "$tmp/console.txt" "$SPORE_OUT/foundation-console.txt"
cp "$tmp/vmm.err" "$SPORE_OUT/foundation-vmm.err"
