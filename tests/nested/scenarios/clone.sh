#!/bin/sh
# Tier 3, issue "clones": a booted Linux guest with vsock and a read-write
# disk is cloned twice (`spore clone -n 2`, zygote mode: new VMM processes
# mapping its memory copy-on-write). Each clone must: reseed its kernel pool
# from /dev/hwrng (spore-reseed logs a byte count > 0), answer over vsock with
# its new CID (the VMM drops packets from the old one), produce /dev/urandom
# output unlike its sibling's, and write only its own disk overlay.
. "${SPORE_ROOT:-}/lib/spore/scenario-lib.sh"
tmp=${SPORE_TMP:-/tmp}
cd "$tmp" || exit 1
boot_api_guest '{"vcpu_count":2,"mem_size_mib":256}' 8 \
    "console=ttyS0 quiet reboot=k panic=1 pci=off i8042.noaux i8042.nomux i8042.dumbkbd"
A() { "$SPORE" api "$api" "$@"; }
# Shell commands in the guest (a clone's when $vs names its vsock) over
# vsock, retried until it answers.
guest() { guest_sh "$1" "${2:-120}" "${vs:-$tmp/v.sock}"; }
# The commands each clone answers: boot_id, 16 bytes of urandom, the
# generation spore-reseed recorded, sector 2 of the disk before and after
# writing this clone's name there.
probe() {
    guest "cat /proc/sys/kernel/random/boot_id; head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n'; echo; cat /run/spore-generation 2>/dev/null || echo none; dd if=/dev/vda bs=512 skip=2 count=1 2>/dev/null | tr -d '\\000' | head -c 16; echo; printf $1 | dd of=/dev/vda bs=512 seek=2 conv=sync,fsync 2>/dev/null; dd if=/dev/vda bs=512 skip=2 count=1 2>/dev/null | tr -d '\\000' | head -c 16; echo"
}

src_boot_id=$(guest 'cat /proc/sys/kernel/random/boot_id')
if [ -n "$src_boot_id" ]; then t source-answers PASS "boot_id $src_boot_id"; else t source-answers FAIL; fi
mkdir -p "$tmp/clones"
if "$SPORE" clone "$api" -n 2 --dir "$tmp/clones" >"$tmp/clone.json" 2>"$tmp/clone.err"; then
    t clone-2 PASS "$(grep -c '"pid"' "$tmp/clone.json") clones"
else
    t clone-2 FAIL "$(cat "$tmp/clone.err")"
fi
clone_pids=$(sed -n 's/.*"pid": *\([0-9]*\).*/\1/p' "$tmp/clone.json")
for n in 1 2; do
    # Clone n: its vsock socket beside its API socket, CID = the source's + n.
    cid=$((3 + n))
    vs="$tmp/clones/api-c$n.vsock"
    out=$(probe "clone$n")
    if [ -n "$out" ]; then t "clone-$n-answers-with-cid-$cid" PASS; else t "clone-$n-answers-with-cid-$cid" FAIL "$(tail -n 3 "$tmp/clones/api-c$n.log")"; fi
    boot_id=$(echo "$out" | sed -n 1p)
    eval "rand_$n=\$(echo \"\$out\" | sed -n 2p)"
    gen=$(echo "$out" | sed -n 3p)
    before=$(echo "$out" | sed -n 4p)
    after=$(echo "$out" | sed -n 5p)
    # Every clone of a booted source gets generation 1 (the source's + 1).
    line=$(grep -a "spore-reseed: generation 1: added" "$tmp/clones/api-c$n.log" | head -n 1)
    bytes=$(echo "$line" | sed -n 's/.*added \([0-9]*\) bytes.*/\1/p')
    if [ -n "$bytes" ] && [ "$bytes" -gt 0 ] && [ "$gen" = 1 ] &&
        echo "$line" | grep -q "CRNG reseeded"; then
        t "clone-$n-reseeded" PASS "$line"
    else
        t "clone-$n-reseeded" FAIL "log '$line', /run/spore-generation '$gen'"
    fi
    if [ "$boot_id" = "$src_boot_id" ]; then
        t "clone-$n-boot-id-is-the-source's" PASS "boot_id is fixed per boot (documented)"
    else
        t "clone-$n-boot-id-is-the-source's" FAIL "$boot_id vs $src_boot_id"
    fi
    if [ -z "$before" ] && [ "$after" = "clone$n" ]; then
        t "clone-$n-private-disk" PASS "sector 2 empty before, '$after' after"
    else
        t "clone-$n-private-disk" FAIL "before '$before' after '$after'"
    fi
done
if [ -n "$rand_1" ] && [ -n "$rand_2" ] && [ "$rand_1" != "$rand_2" ]; then
    t urandom-differs-between-clones PASS "$rand_1 vs $rand_2"
else
    t urandom-differs-between-clones FAIL "'$rand_1' vs '$rand_2'"
fi
if [ -z "$(dd if="$tmp/rw.img" bs=512 skip=2 count=1 2>/dev/null | tr -d '\000')" ] &&
    [ -s "$tmp/clones/api-c1.rw.cow" ] && [ -s "$tmp/clones/api-c2.rw.cow" ]; then
    t base-image-untouched PASS "overlays $(du -k "$tmp/clones/api-c1.rw.cow" | cut -f1) KiB, $(du -k "$tmp/clones/api-c2.rw.cow" | cut -f1) KiB on disk"
else
    t base-image-untouched FAIL "$(ls -l "$tmp")"
fi
for p in $clone_pids; do kill "$p" 2>/dev/null; done
kill $vmm 2>/dev/null
wait $vmm 2>/dev/null
cp "$tmp/console.txt" "$tmp"/clones/*.log "$tmp/clone.json" "$tmp/clone.err" "$tmp/vmm.err" "$SPORE_OUT/" 2>/dev/null
true
