#!/bin/sh
# Tier 3, issue 6 (virtio-mem + snapshots): a Linux guest (2 vCPUs, 512 MiB
# boot RAM, 2 GiB hotplug region) gets 512 MiB plugged and fills a tmpfs
# file (Linux onlines plugged memory movable and places user pages there
# first); the VM (with dirty page tracking) is snapshotted (full), writes a
# second, 32 MiB file, and is snapshotted again as a diff with
# `spore snapshot create --diff --stop`: the diff holds about the new data,
# not the region. The chain is restored in a new VMM process. The restored
# guest still sees the memory (MemTotal, plugged_size_mib), both files are
# intact, and after the guest
# drops the file, setting the target to 0 unplugs everything and the
# restored VMM's RSS drops. The memory file holds the region after boot RAM
# with unplugged blocks as holes. Guest side: guest/virtio-mem-snapshot.sh.
. "${SPORE_ROOT:-}/lib/spore/scenario-lib.sh"
tmp=${SPORE_TMP:-/tmp}
cd "$tmp" || exit 1
api="$tmp/api.sock"
cmdline="console=ttyS0 quiet reboot=k panic=1 pci=off i8042.noaux i8042.nomux i8042.dumbkbd"
now_ms() { awk '{printf "%d", $1 * 1000}' /proc/uptime; }
rss_kb() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"; }
field() { sed -n "s/.*\"$1\":\([0-9]*\).*/\1/p"; }

"$SPORE" vmm --api-sock "$api" >"$tmp/console.txt" 2>"$tmp/vmm.err" &
vmm=$!
wait_for_socket "$api"
A() { "$SPORE" api "$api" "$@"; }
if A PUT /boot-source "{\"kernel_image_path\":\"$GUEST_KERNEL\",\"initrd_path\":\"$GUEST_INITRD\",\"boot_args\":\"$cmdline\"}" >/dev/null &&
    A PUT /machine-config '{"vcpu_count":2,"mem_size_mib":512,"track_dirty_pages":true}' >/dev/null &&
    A PUT /hotplug/memory '{"total_size_mib":2048,"block_size_mib":2,"slot_size_mib":128}' >/dev/null &&
    A PUT /vsock "{\"guest_cid\":3,\"uds_path\":\"$tmp/v.sock\"}" >/dev/null &&
    A PUT /actions '{"action_type":"InstanceStart"}' >/dev/null; then
    t vm-start PASS
else
    t vm-start FAIL "$(cat "$tmp/vmm.err")"
fi

# Runs shell commands in the guest over vsock; retries until it answers.
guest() {
    i=0
    while [ $i -lt ${2:-240} ]; do
        out=$(printf '%s\nexit\n' "$1" | "$SPORE" vsock connect --uds "$tmp/v.sock" --port 5000 2>/dev/null) &&
            [ -n "$out" ] && { echo "$out"; return 0; }
        sleep 0.5
        i=$((i + 1))
    done
    return 1
}
memtotal='sed -n "s/^MemTotal: *\([0-9]*\) kB/\1/p" /proc/meminfo'
# wait_memtotal CMP KB: polls the guest's MemTotal (60 s).
wait_memtotal() {
    i=0
    while [ $i -lt 60 ]; do
        m=$(guest "$memtotal")
        [ -n "$m" ] && [ "$m" "$1" "$2" ] && { echo "$m"; return 0; }
        sleep 1
        i=$((i + 1))
    done
    echo "$m"
    return 1
}

base=$(guest "$memtotal")
[ -n "$base" ] || t guest-answers FAIL "$(tail -n 5 "$tmp/console.txt")"
mib=1024
if "$SPORE" mem "$api" --set 512M --wait --timeout 120 2>"$tmp/plug.err" &&
    plugged=$(wait_memtotal -ge $((base + 512 * mib - 16 * mib))); then
    t plug-512m PASS "MemTotal ${base} -> ${plugged} kB; $(cat "$tmp/plug.err")"
else
    t plug-512m FAIL "MemTotal ${base} -> ${plugged} kB; $(cat "$tmp/plug.err")"
fi
# 320 MiB of non-zero data (zero pages are holes in the memory file).
sum0=$(guest 'mkdir -p /mnt/big && mount -t tmpfs -o size=1200m tmpfs /mnt/big &&
    yes spore-virtio-mem-snapshot | head -c 335544320 >/mnt/big/x && md5sum /mnt/big/x | cut -d" " -f1')
if [ ${#sum0} -eq 32 ]; then t guest-fills-320m PASS "md5 $sum0"; else t guest-fills-320m FAIL "$sum0"; fi

start=$(now_ms)
if "$SPORE" snapshot create "$api" --state "$tmp/vm.state" --mem "$tmp/vm.mem" >"$tmp/manifest.json" 2>"$tmp/create.err"; then
    t snapshot-create PASS "$(($(now_ms) - start)) ms, $(du -k "$tmp/vm.mem" | cut -f1) KiB on disk of $(stat -c %s "$tmp/vm.mem") bytes"
else
    t snapshot-create FAIL "$(cat "$tmp/create.err")"
fi
# 32 MiB more, then a diff on top of the full snapshot.
sumy0=$(guest 'yes spore-virtio-mem-diff | head -c 33554432 >/mnt/big/y && md5sum /mnt/big/y | cut -d" " -f1')
start=$(now_ms)
if "$SPORE" snapshot create "$api" --diff --state "$tmp/d.state" --mem "$tmp/d.mem" --stop >"$tmp/diff.json" 2>"$tmp/diff.err"; then
    t snapshot-diff PASS "$(($(now_ms) - start)) ms, $(du -k "$tmp/d.mem" | cut -f1) KiB on disk"
else
    t snapshot-diff FAIL "$(cat "$tmp/diff.err")"
fi
wait $vmm
"$SPORE" snapshot inspect "$tmp/d.state" >"$SPORE_OUT/virtio-mem-snapshot-diff-manifest.json" 2>&1
dd=$(tr -d ' \n' <"$SPORE_OUT/virtio-mem-snapshot-diff-manifest.json" | field data_bytes)
# The region's data in the diff: the new file (and what the guest kernel
# moved or wrote meanwhile), far from the 320 MiB of the first file.
if [ -n "$dd" ] && [ "$dd" -ge $((32 << 20)) ] && [ "$dd" -le $((128 << 20)) ]; then
    t diff-holds-the-changes PASS "$((dd >> 10)) KiB of the region in the diff, $(du -k "$tmp/d.mem" | cut -f1) KiB on disk, full $(du -k "$tmp/vm.mem" | cut -f1) KiB"
else
    t diff-holds-the-changes FAIL "${dd:-none} bytes of the region in the diff"
fi
"$SPORE" snapshot inspect "$tmp/vm.state" >"$SPORE_OUT/virtio-mem-snapshot-manifest.json" 2>&1
off=$(tr -d ' \n' <"$SPORE_OUT/virtio-mem-snapshot-manifest.json" | field file_offset)
pl=$(tr -d ' \n' <"$SPORE_OUT/virtio-mem-snapshot-manifest.json" | field plugged_bytes)
# The memory file: boot RAM, the hotplug region, then the 4 KiB trailer naming the snapshot.
if [ "$off" = $((512 << 20)) ] && [ "$pl" = $((512 << 20)) ] && [ "$(stat -c %s "$tmp/vm.mem")" = $((((512 + 2048) << 20) + 4096)) ]; then
    t manifest-shows-region PASS "file_offset $off, plugged_bytes $pl"
else
    t manifest-shows-region FAIL "file_offset $off, plugged_bytes $pl, file $(stat -c %s "$tmp/vm.mem")"
fi
# Boot RAM + plugged memory at most: the 1.5 GiB never plugged is a hole.
kib=$(du -k "$tmp/vm.mem" | cut -f1)
if [ "$kib" -le $(((512 + 512 + 16) * 1024)) ]; then
    t mem-file-has-no-unplugged-blocks PASS "${kib} KiB allocated"
else
    t mem-file-has-no-unplugged-blocks FAIL "${kib} KiB allocated"
fi

api2="$tmp/api2.sock"
start=$(now_ms)
"$SPORE" snapshot restore --state "$tmp/d.state" --mem "$tmp/d.mem" --api-sock "$api2" \
    >"$tmp/console-restored.txt" 2>"$tmp/restore.err" &
r=$!
after=$(guest "$memtotal")
if [ -n "$after" ] && [ "$after" = "$plugged" ]; then
    t guest-still-sees-plugged-memory PASS "MemTotal ${after} kB, first reply $(($(now_ms) - start)) ms after restore"
else
    t guest-still-sees-plugged-memory FAIL "MemTotal ${after:-none} kB, before the snapshot ${plugged}; $(tail -n 3 "$tmp/restore.err")"
fi
st=$("$SPORE" api "$api2" GET /hotplug/memory)
if [ "$(echo "$st" | field plugged_size_mib)" = 512 ]; then
    t restored-device-plugged-512m PASS
else
    t restored-device-plugged-512m FAIL "$st"
fi
sum1=$(guest 'md5sum /mnt/big/x | cut -d" " -f1')
if [ -n "$sum1" ] && [ "$sum1" = "$sum0" ]; then t contents-intact PASS; else t contents-intact FAIL "md5 $sum1, before $sum0"; fi
sumy1=$(guest 'md5sum /mnt/big/y | cut -d" " -f1')
if [ ${#sumy0} -eq 32 ] && [ "$sumy1" = "$sumy0" ]; then t diff-contents-intact PASS; else t diff-contents-intact FAIL "md5 $sumy1, before $sumy0"; fi
rss1=$(rss_kb $r)
guest 'rm -f /mnt/big/x /mnt/big/y; umount /mnt/big; echo dropped' >/dev/null
start=$(now_ms)
if "$SPORE" mem "$api2" --set 0 --wait --timeout 300 2>"$tmp/unplug.err"; then
    t unplug-after-restore PASS "$(cat "$tmp/unplug.err")"
else
    t unplug-after-restore FAIL "$(cat "$tmp/unplug.err"; "$SPORE" api "$api2" GET /hotplug/memory)"
fi
sleep 0.5
rss2=$(rss_kb $r)
drop=$(((rss1 - rss2) / 1024))
if [ "$drop" -ge 200 ]; then
    t restored-vmm-rss-drops PASS "VmRSS ${rss1} -> ${rss2} kB: ${drop} MiB"
else
    t restored-vmm-rss-drops FAIL "VmRSS ${rss1} -> ${rss2} kB: ${drop} MiB"
fi
back=$(wait_memtotal -le "$base")
if [ "$back" = "$base" ]; then t guest-memtotal-back-to-base PASS; else t guest-memtotal-back-to-base FAIL "${back} kB, base ${base}"; fi
kill $r
wait $r
cp "$tmp/console.txt" "$tmp/console-restored.txt" "$tmp/restore.err" "$tmp/vmm.err" "$SPORE_OUT/" 2>/dev/null
true
