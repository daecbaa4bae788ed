#!/bin/sh
# Tier 3, issue "snapshots" (diff and layered): a Linux guest with dirty
# page tracking reads 4 MiB of a disk through virtio-blk after a base
# snapshot. Those pages are written by the VMM's device (DMA into the
# guest's page cache), never by a vCPU: KVM's dirty log does not see them.
# A diff snapshot must still hold them. The disk region is then overwritten
# on the host, so a restored guest reading it again from its page cache
# gets the old bytes only if the diff captured the device's writes (a diff
# that missed them would show the base's stale memory instead). Checked on
# the base ← diff chain and on its `snapshot merge`.
. "${SPORE_ROOT:-}/lib/spore/scenario-lib.sh"
tmp=${SPORE_TMP:-/tmp}
cd "$tmp" || exit 1
dd if=/dev/zero of="$tmp/rw.img" bs=1M count=16 2>/dev/null
head -c 4194304 /dev/urandom | dd of="$tmp/rw.img" bs=1M seek=4 conv=notrunc 2>/dev/null
want=$(dd if="$tmp/rw.img" bs=1M skip=4 count=4 2>/dev/null | sha256sum | cut -d' ' -f1)

boot_api_guest '{"vcpu_count":2,"mem_size_mib":256,"track_dirty_pages":true}' 16 \
    "console=ttyS0 quiet reboot=k panic=1 pci=off i8042.noaux i8042.nomux i8042.dumbkbd"
A() { "$SPORE" api "$api" "$@"; }
# Shell commands in the guest over vsock, retried until it answers.
guest() { guest_sh "$1" "${2:-120}"; }
read_region='dd if=/dev/vda bs=1M skip=4 count=4 2>/dev/null | sha256sum | cut -d" " -f1'

# Linux drops a block device's page cache when its last opener closes it:
# keep /dev/vda open so that the cached pages outlive each dd.
if guest 'sleep 1000000 </dev/vda >/dev/null 2>&1 & echo up' >/dev/null; then
    t guest-up PASS
else
    t guest-up FAIL "$(tail -n 5 "$tmp/console.txt")"
fi
if "$SPORE" snapshot create "$api" --state "$tmp/base.state" --mem "$tmp/base.mem" >/dev/null 2>"$tmp/create.err"; then
    t base-snapshot PASS "$(du -k "$tmp/base.mem" | cut -f1) KiB on disk"
else
    t base-snapshot FAIL "$(cat "$tmp/create.err")"
fi
got=$(guest "$read_region")
if [ "$got" = "$want" ]; then t read-through-virtio-blk PASS; else t read-through-virtio-blk FAIL "got '$got' want $want"; fi
if "$SPORE" snapshot create "$api" --diff --state "$tmp/d1.state" --mem "$tmp/d1.mem" --stop >/dev/null 2>"$tmp/create.err"; then
    t diff-snapshot PASS "$(du -k "$tmp/d1.mem" | cut -f1) KiB on disk ($(cat "$tmp/create.err"))"
else
    t diff-snapshot FAIL "$(cat "$tmp/create.err")"
fi
wait $vmm
echo "spore-nested: diff written, VMM exited"
"$SPORE" snapshot inspect "$tmp/d1.state" --mem "$tmp/d1.mem" >"$SPORE_OUT/diff-manifest.json" 2>&1
# The disk changes under the snapshot: only the guest's page cache still
# holds the old bytes.
head -c 4194304 /dev/urandom | dd of="$tmp/rw.img" bs=1M seek=4 conv=notrunc 2>/dev/null
now=$(dd if="$tmp/rw.img" bs=1M skip=4 count=4 2>/dev/null | sha256sum | cut -d' ' -f1)

"$SPORE" snapshot merge --state "$tmp/d1.state" --mem "$tmp/d1.mem" \
    --out-state "$tmp/merged.state" --out-mem "$tmp/merged.mem" >/dev/null 2>"$tmp/merge.err" ||
    t merge FAIL "$(cat "$tmp/merge.err")"
for layer in d1 merged; do
    "$SPORE" snapshot restore --state "$tmp/$layer.state" --mem "$tmp/$layer.mem" \
        --api-sock "$tmp/api-$layer.sock" >"$tmp/console-$layer.txt" 2>"$tmp/restore-$layer.err" &
    r=$!
    echo "spore-nested: restoring $layer"
    got=$(guest "$read_region" 60)
    if [ "$got" = "$want" ]; then
        t "device-writes-restored-$layer" PASS
    else
        [ "$got" = "$now" ] && why="the guest read the disk again: its page cache was dropped" || why="stale memory"
        t "device-writes-restored-$layer" FAIL "got '$got' want $want ($why); $(tail -n 3 "$tmp/restore-$layer.err")"
    fi
    kill $r
    wait $r
    cp "$tmp/restore-$layer.err" "$SPORE_OUT/" 2>/dev/null
done
cp "$tmp/console.txt" "$tmp"/console-*.txt "$tmp"/restore-*.err "$tmp/vmm.err" "$SPORE_OUT/" 2>/dev/null
true
