#!/bin/sh
# Tier 3, issue 6 (virtio-balloon): a 512 MiB Linux guest (1 vCPU) with a
# balloon, configured and driven through spore's API in L1. The guest side
# (guest/balloon.sh) makes its free memory host-resident and prints
# /proc/meminfo once a second.
#   0. on the idle guest, inflate and deflate 256 MiB (timed, as the peers);
#   1. once the guest made its memory resident, inflate 256 MiB: the guest's
#      MemAvailable and the VMM's VmRSS drop;
#   2. /balloon/statistics: free/total/available memory are sane;
#   3. deflate to 0: MemAvailable comes back;
#   4. a second VM with free_page_reporting: after the guest frees memory,
#      the VMM's RSS drops without any inflation;
#   5. a third VM with deflate_on_oom: inflate 384 MiB, the guest writes
#      96 MiB more than it has left; the driver deflates instead of the OOM
#      killer killing the writer, and the VMM sees `actual` fall.
#   6. a fourth VM with free_page_hinting: after the guest freed memory,
#      PATCH /balloon/hinting/start; the driver hints its free pages and
#      reports the run finished (guest_cmd STOP), the device answers DONE
#      (acknowledge_on_stop), and the VMM's RSS has dropped.
# Inflate/deflate times (target set -> the driver's last update of actual,
# timed by the VMM) land in
# $SPORE_OUT/bench-balloon.json.
. "${SPORE_ROOT:-}/lib/spore/scenario-lib.sh"
tmp=${SPORE_TMP:-/tmp}
cd "$tmp" || exit 1
cmdline="console=ttyS0 quiet reboot=k panic=1 pci=off i8042.noaux i8042.nomux i8042.dumbkbd"

rss_kb() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"; }
field() { sed -n "s/.*\"$1\":\([0-9]*\).*/\1/p"; }
# Last BAL-MEM value of $2 (total|free|avail) in console file $1, in kB.
guest_mem() { grep '^BAL-MEM' "$1" | tail -n 1 | sed -n "s/.* $2=\([0-9]*\).*/\1/p"; }
mem_lines() { grep -c '^BAL-MEM' "$1"; }
# Waits until the guest printed two more BAL-MEM lines (a fresh reading).
fresh_mem() {
    n0=$(mem_lines "$1") i=0
    while [ "$(mem_lines "$1")" -lt $((n0 + 2)) ] && [ $i -lt 100 ]; do sleep 0.2; i=$((i + 1)); done
}
# MemAvailable once it holds still (two fresh readings within 2 MiB): just
# after the guest's fill it still climbs for a while as the kernel frees
# (one run read 18 MiB too low, and the inflate's drop looked short).
settled_avail() {
    prev=-1 i=0 cur=0
    while [ $i -lt 15 ]; do
        fresh_mem "$1"
        cur=$(guest_mem "$1" avail)
        if [ "$prev" -ge 0 ] && [ $((cur - prev)) -lt 2048 ] && [ $((prev - cur)) -lt 2048 ]; then
            break
        fi
        prev=$cur i=$((i + 1))
    done
    echo "$cur"
}
wait_for() { # FILE PATTERN TIMEOUT_S
    i=0
    while ! grep -q "$2" "$1" && [ $i -lt $(($3 * 5)) ]; do sleep 0.2; i=$((i + 1)); done
    grep -q "$2" "$1"
}

# start_vm NAME BALLOON_JSON [EXTRA_CMDLINE]: sets $vmm, $api, $console
start_vm() {
    api="$tmp/$1.sock" console="$tmp/$1-console.txt"
    "$SPORE" vmm --api-sock "$api" >"$console" 2>"$tmp/$1-vmm.err" &
    vmm=$!
    wait_for_socket "$api"
    A PUT /boot-source "{\"kernel_image_path\":\"$GUEST_KERNEL\",\"initrd_path\":\"$GUEST_INITRD\",\"boot_args\":\"$cmdline${3:+ $3}\"}" &&
        A PUT /machine-config '{"vcpu_count":1,"mem_size_mib":512}' &&
        A PUT /balloon "$2" &&
        A PUT /actions '{"action_type":"InstanceStart"}'
}
A() { "$SPORE" api "$api" "$@"; }
# set_balloon MIB: PATCHes the target and waits until actual reaches it;
# prints the milliseconds it took, from the VMM's own timestamps (target set
# -> the driver's last update of actual), so the polling here (a process
# per request, costly under TCG) neither adds to nor slows what is measured.
# Empty on timeout.
set_balloon() {
    A PATCH /balloon "{\"amount_mib\":$1}" >/dev/null || return 1
    i=0
    while [ $i -lt 600 ]; do
        sleep 0.2
        st=$(A GET /balloon)
        if [ "$(echo "$st" | field actual_mib)" = "$1" ]; then
            echo $(($(echo "$st" | field actual_updated_ms) - $(echo "$st" | field target_updated_ms)))
            return 0
        fi
        i=$((i + 1))
    done
    return 1
}
stop_vm() {
    kill "$vmm" 2>/dev/null
    wait "$vmm" 2>/dev/null
}

# --- 1. inflate / deflate
if start_vm main '{"amount_mib":0,"deflate_on_oom":true,"stats_polling_interval_s":1}'; then
    t balloon-api-configure-and-start PASS
else
    t balloon-api-configure-and-start FAIL "$(cat "$tmp/main-vmm.err")"
fi
# Idle guest (as the peers measured): inflate and deflate 256 MiB.
if wait_for "$console" '^BAL-IDLE' 180; then
    idle_inflate_ms=$(set_balloon 256)
    wait_for "$console" '^BAL-IDLE-LOW' 30 || echo "the guest did not see the idle inflation"
    idle_deflate_ms=$(set_balloon 0)
    if [ -n "$idle_inflate_ms" ] && [ -n "$idle_deflate_ms" ]; then
        t balloon-idle-inflate-deflate-256 PASS "inflate ${idle_inflate_ms} ms, deflate ${idle_deflate_ms} ms"
    else
        t balloon-idle-inflate-deflate-256 FAIL "$(A GET /balloon)"
    fi
else
    t balloon-idle-inflate-deflate-256 FAIL "$(tail -n 5 "$console")"
fi
if ! wait_for "$console" '^BAL-READY' 240; then
    t balloon-guest-ready FAIL "$(tail -n 5 "$console")"
    stop_vm
    exit 0
fi
bad=$(A PATCH /balloon '{"amount_mib":513}' 2>&1) && t balloon-refuses-too-large FAIL ||
    { echo "$bad" | grep -q fault_message && t balloon-refuses-too-large PASS || t balloon-refuses-too-large FAIL "$bad"; }

avail0=$(settled_avail "$console") rss0=$(rss_kb "$vmm")
inflate_ms=$(set_balloon 256)
if [ -n "$inflate_ms" ]; then t balloon-inflate-256 PASS "${inflate_ms} ms"; else t balloon-inflate-256 FAIL "$(A GET /balloon)"; fi
fresh_mem "$console"
avail1=$(guest_mem "$console" avail) rss1=$(rss_kb "$vmm")
echo "balloon: MemAvailable ${avail0} -> ${avail1} kB, VmRSS ${rss0} -> ${rss1} kB"
# MemAvailable also moves with the guest's own page cache and slab (one run
# saw 235 MiB for the 256 MiB inflate): 224 MiB, 7/8 of the balloon, is the bar.
if [ $((avail0 - avail1)) -ge $((224 * 1024)) ]; then
    t balloon-guest-memavailable-drops PASS "$(((avail0 - avail1) / 1024)) MiB"
else
    t balloon-guest-memavailable-drops FAIL "${avail0} -> ${avail1} kB"
fi
if [ $((rss0 - rss1)) -ge $((200 * 1024)) ]; then
    t balloon-vmm-rss-drops PASS "$(((rss0 - rss1) / 1024)) MiB"
else
    t balloon-vmm-rss-drops FAIL "${rss0} -> ${rss1} kB"
fi

sleep 2
stats=$(A GET /balloon/statistics)
echo "statistics: $stats"
total=$(echo "$stats" | field total_memory) free=$(echo "$stats" | field free_memory)
availb=$(echo "$stats" | field available_memory) actual=$(echo "$stats" | field actual_mib)
if [ -n "$total" ] && [ -n "$free" ] && [ -n "$availb" ] &&
    [ "$total" -gt $((400 << 20)) ] && [ "$total" -le $((512 << 20)) ] &&
    [ "$free" -lt "$total" ] && [ "$availb" -le "$total" ] &&
    [ "$availb" -lt $((512 - 200 << 20)) ] && [ "$actual" = 256 ]; then
    t balloon-statistics-sane PASS "total $((total >> 20)) MiB, free $((free >> 20)) MiB, available $((availb >> 20)) MiB"
else
    t balloon-statistics-sane FAIL "$stats"
fi
if A PATCH /balloon/statistics '{"stats_polling_interval_s":2}' &&
    A GET /balloon | grep -q '"stats_polling_interval_s":2' &&
    ! A PATCH /balloon/statistics '{"stats_polling_interval_s":0}' >/dev/null 2>&1; then
    t balloon-statistics-interval PASS
else
    t balloon-statistics-interval FAIL
fi

deflate_ms=$(set_balloon 0)
if [ -n "$deflate_ms" ]; then t balloon-deflate PASS "${deflate_ms} ms"; else t balloon-deflate FAIL "$(A GET /balloon)"; fi
# Deflated pages reach the free lists over a few seconds (per-CPU lists);
# on a loaded host that took longer than 8 readings once (MemAvailable still
# 41 MiB short), so up to 20 readings are waited for.
i=0
while [ $i -lt 20 ]; do
    fresh_mem "$console"
    avail2=$(guest_mem "$console" avail)
    [ $((avail0 - avail2)) -le $((16 * 1024)) ] && break
    i=$((i + 1))
done
echo "balloon: MemAvailable after deflate ${avail2} kB"
if [ $((avail0 - avail2)) -le $((32 * 1024)) ]; then
    t balloon-deflate-restores-memavailable PASS "$((avail2 / 1024)) MiB"
else
    t balloon-deflate-restores-memavailable FAIL "${avail0} -> ${avail2} kB"
fi
stop_vm
printf '{"idle_inflate_256_mib_ms":%s,"idle_deflate_256_mib_ms":%s,"resident_inflate_256_mib_ms":%s,"resident_deflate_256_mib_ms":%s,"rss_drop_kib":%s}\n' \
    "${idle_inflate_ms:-null}" "${idle_deflate_ms:-null}" "${inflate_ms:-null}" "${deflate_ms:-null}" \
    "$((rss0 - rss1))" >"$SPORE_OUT/bench-balloon.json"
cat "$SPORE_OUT/bench-balloon.json"
cp "$console" "$SPORE_OUT/balloon-console.txt"
cp "$tmp/main-vmm.err" "$SPORE_OUT/balloon-vmm.err"

# --- 2. free page reporting: freed guest memory leaves the VMM by itself.
if start_vm report '{"amount_mib":0,"deflate_on_oom":false,"free_page_reporting":true}' spore_balloon_noidle &&
    wait_for "$console" '^BAL-READY' 180; then
    # The guest filled then freed most of its memory; reporting (2 s delay
    # in Linux) must bring the VMM's RSS well below what it touched.
    filled=$(sed -n 's/^BAL-FILLED \([0-9]*\)MiB/\1/p' "$console")
    i=0 rss=$(rss_kb "$vmm")
    while [ "$rss" -gt $(((filled - 200) * 1024)) ] && [ $i -lt 60 ]; do
        sleep 0.5
        rss=$(rss_kb "$vmm") i=$((i + 1))
    done
    if [ "$rss" -le $(((filled - 200) * 1024)) ]; then
        t balloon-free-page-reporting PASS "filled ${filled} MiB, VmRSS now $((rss / 1024)) MiB"
    else
        t balloon-free-page-reporting FAIL "filled ${filled} MiB, VmRSS still $((rss / 1024)) MiB"
    fi
else
    t balloon-free-page-reporting FAIL "no BAL-READY: $(tail -n 2 "$console" | tr "\n" " ") $(tail -n 2 "$tmp/report-vmm.err" | tr "\n" " ")"
fi
stop_vm

# --- 3. deflate on OOM.
if start_vm oom '{"amount_mib":0,"deflate_on_oom":true,"stats_polling_interval_s":1}' spore_balloon_oom &&
    wait_for "$console" '^BAL-OOM-READY' 180; then
    ms=$(set_balloon 384)
    [ -n "$ms" ] || echo "balloon: the oom VM did not reach 384 MiB: $(A GET /balloon)"
    if wait_for "$console" '^BAL-OOM-RESULT' 300; then
        res=$(grep '^BAL-OOM-RESULT' "$console")
        st=$(A GET /balloon)
        deflated=$(A GET /balloon/statistics | sed -n 's/.*"deflated_pages":\([0-9]*\).*/\1/p')
        actual=$(echo "$st" | field actual_mib)
        if echo "$res" | grep -q ' rc=0 ' && echo "$res" | grep -q ' killed=0 ' &&
            [ -n "$actual" ] && [ "$actual" -lt 384 ] && [ "${deflated:-0}" -gt 0 ]; then
            t balloon-deflate-on-oom PASS "${res#BAL-OOM-RESULT }; balloon actual ${actual} MiB of target 384, ${deflated} pages deflated"
        else
            t balloon-deflate-on-oom FAIL "$res; $st; deflated ${deflated:-?}; $(grep -i 'killed process\|out of memory' "$console" | head -n 2 | tr '\n' ' ')"
        fi
    else
        t balloon-deflate-on-oom FAIL "no BAL-OOM-RESULT: $(tail -n 3 "$console" | tr '\n' ' ')"
    fi
else
    t balloon-deflate-on-oom FAIL "no BAL-OOM-READY: $(tail -n 2 "$console" | tr '\n' ' ')"
fi
cp "$console" "$SPORE_OUT/balloon-oom-console.txt"
stop_vm

# --- 4. free page hinting: a run on demand releases the guest's free memory.
# Statistics on too: the hinting queue then follows the stats queue (index
# 3), and /balloon/statistics shows the bytes the device released.
hinted() { A GET /balloon/statistics | field hinted_bytes; }
if start_vm hint '{"amount_mib":0,"deflate_on_oom":false,"stats_polling_interval_s":1,"free_page_hinting":true}' spore_balloon_noidle &&
    wait_for "$console" '^BAL-READY' 180; then
    filled=$(sed -n 's/^BAL-FILLED \([0-9]*\)MiB/\1/p' "$console")
    before=$(A GET /balloon/hinting/status)
    sleep 1
    rss0=$(rss_kb "$vmm")
    started=$(A PATCH /balloon/hinting/start '{}' 2>&1) || echo "balloon: hinting start refused: $started"
    running=$(A GET /balloon/hinting/status)
    # Done: the driver sent STOP (guest_cmd 0) and the device answered DONE.
    i=0 st=$running
    while ! { echo "$st" | grep -q '"guest_cmd":0' && echo "$st" | grep -q '"host_cmd":1'; } && [ $i -lt 300 ]; do
        sleep 0.2
        st=$(A GET /balloon/hinting/status) i=$((i + 1))
    done
    rss1=$(rss_kb "$vmm")
    echo "balloon hinting: status before ${before}, after start ${running}, at the end ${st}; VmRSS ${rss0} -> ${rss1} kB (filled ${filled} MiB)"
    # Right after the start the run is in progress (host_cmd 2), or already
    # over (the guest hinted everything before the first status read: with
    # huge pages under guest RAM a run takes milliseconds); the hinted
    # bytes and the RSS drop show it ran either way.
    if echo "$before" | grep -q '"host_cmd":0' &&
        { echo "$running" | grep -q '"host_cmd":2' || echo "$running" | grep -q '"guest_cmd":0,"host_cmd":1'; } &&
        [ "$(hinted)" -gt 0 ] &&
        echo "$st" | grep -q '"guest_cmd":0' && echo "$st" | grep -q '"host_cmd":1' &&
        [ $((rss0 - rss1)) -ge $(((filled - 200) * 1024)) ]; then
        t balloon-free-page-hinting PASS "run 2 done ($i status polls after the first), $(($(hinted) >> 20)) MiB hinted, VmRSS ${rss0} -> ${rss1} kB (filled ${filled} MiB)"
    else
        t balloon-free-page-hinting FAIL "before ${before}; started ${running}; end ${st}; VmRSS ${rss0} -> ${rss1} kB, filled ${filled} MiB; $(tail -n 2 "$tmp/hint-vmm.err" | tr '\n' ' ')"
    fi
    # The guest keeps running on the pages it got back (DONE): a new run
    # gets the next id and hints again; without acknowledge_on_stop the
    # device waits for stop.
    h0=$(hinted)
    A PATCH /balloon/hinting/start '{"acknowledge_on_stop":false}' >/dev/null 2>&1
    i=0 st=$(A GET /balloon/hinting/status) h1=$h0
    while ! { echo "$st" | grep -q '"guest_cmd":0' && [ "${h1:-0}" -gt "${h0:-0}" ]; } && [ $i -lt 300 ]; do
        sleep 0.2
        st=$(A GET /balloon/hinting/status) h1=$(hinted) i=$((i + 1))
    done
    A PATCH /balloon/hinting/stop >/dev/null 2>&1
    end=$(A GET /balloon/hinting/status)
    if echo "$st" | grep -q '"host_cmd":3' && echo "$st" | grep -q '"guest_cmd":0' &&
        [ "${h1:-0}" -gt "${h0:-0}" ] && echo "$end" | grep -q '"host_cmd":1' && kill -0 "$vmm" 2>/dev/null; then
        t balloon-free-page-hinting-stop PASS "second run hinted $(((h1 - h0) >> 20)) MiB: ${st}, after stop ${end}"
    else
        t balloon-free-page-hinting-stop FAIL "second run: ${st}, hinted ${h0} -> ${h1}, after stop ${end}"
    fi
else
    t balloon-free-page-hinting FAIL "no BAL-READY: $(tail -n 2 "$console" | tr "\n" " ") $(tail -n 2 "$tmp/hint-vmm.err" | tr "\n" " ")"
fi
cp "$console" "$SPORE_OUT/balloon-hint-console.txt"
stop_vm
exit 0
