#!/bin/sh
# Benchmark (issue 16, item 1), not a test: spore and Firecracker side by
# side in L1, booting the very same guest vmlinux and initramfs with the
# same command line, 1 vCPU, snapshot files on L1's tmpfs (/tmp), the two
# VMMs alternating in every round (spore, Firecracker, spore, ...). Both are
# started with Firecracker's command line (spore through a `firecracker`
# symlink) and driven through Firecracker's API on their Unix socket, by
# /bin/peer-tool (tests/nested/peer-tool.c: HTTP on a Unix socket, vsock
# commands, console lines stamped with CLOCK_MONOTONIC as they arrive).
# Guest side: guest/peers.sh. Run by tests/nested/peers.sh (`make
# bench-peers`), which gives /peer/firecracker, /peer/peers.conf and turns
# the raw samples this leaves in $SPORE_OUT/peers-raw.json into the report.
#
# Figures per VMM and round (milliseconds unless said; "console line" is
# the time peer-tool saw the line arrive on the VMM's stdout):
#   boot (256 MiB, booted from --config-file):
#     boot_to_init_ms       process start -> the guest init's "SPORE-INIT up"
#                           console line
#     init_uptime_s         the guest's uptime in that line
#     api_get_ms            GET / request -> response (the floor of a request)
#     pause_256_ms          PATCH /vm Paused request -> response
#   snapshot (1 GiB, configured through the API):
#     api_boot_to_vsock_ms  InstanceStart request -> the guest's first reply
#                           on vsock
#     pause_1g_ms           PATCH /vm Paused
#     snapshot_create_ms    PUT /snapshot/create (Full) request -> response
#     snapshot_mem_du_mib   the memory file's blocks on L1's tmpfs (du)
#     snapshot_load_ms      PUT /snapshot/load (resume_vm) in a new process,
#                           request -> response
#     snapshot_load_to_reply_ms  the same request -> first vsock reply
#   vmem (512 MiB + 1 GiB virtio-mem): vmem_first_plug_ms, vmem_plug_ms
#     (PATCH /hotplug/memory 512 -> the guest's console line saying MemTotal
#     grew), vmem_unplug_ms, vmem_unplug2_ms (PATCH 0 -> GET /hotplug/memory
#     says plugged_size_mib 0) and their *_guest_ms (-> MemTotal back)
#   balloon (512 MiB): balloon_inflate_ms (256 MiB), balloon_deflate_ms (to 0),
#     PATCH /balloon -> GET /balloon/statistics says actual_mib reached it
# Also per VMM, round and group, KVM's exit counts from L1's debugfs
# (/sys/kernel/debug/kvm/<pid>-<fd>/, the VM's files: the sum over its
# vCPUs), the change over the group; and L1's THP settings.
# SPORE-TEST lines: PASS with the figures, FAIL only when a step errors
# (a benchmark never fails on a time).
. "${SPORE_ROOT:-}/lib/spore/scenario-lib.sh"
tmp=${SPORE_TMP:-/tmp}
cd "$tmp" || exit 1
T=${SPORE_ROOT:-}/bin/peer-tool
ROUNDS=2 INITCALL=0 VMMS="spore firecracker" GROUPS="boot snapshot vmem balloon" FC=${SPORE_ROOT:-}/peer/firecracker
[ -f "${SPORE_ROOT:-}/peer/peers.conf" ] && . "${SPORE_ROOT:-}/peer/peers.conf"
[ -x "$T" ] || { t peers-setup FAIL "no $T"; exit 0; }
[ -x "$FC" ] || { t peers-setup FAIL "no Firecracker binary at $FC"; exit 0; }

# Both VMMs by Firecracker's command line: .../<vmm>/firecracker.
mkdir -p "$tmp/bin-spore" "$tmp/bin-firecracker"
ln -sf "$SPORE" "$tmp/bin-spore/firecracker"
ln -sf "$FC" "$tmp/bin-firecracker/firecracker"
mountpoint -q /sys/kernel/debug || mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null

cmdline="console=ttyS0 quiet reboot=k panic=1 pci=off i8042.noaux i8042.nomux i8042.dumbkbd"
[ "$INITCALL" = 1 ] && cmdline="$cmdline initcall_debug"
# --loud-boot: the kernel's messages on the console from the first one
# (earlyprintk), each stamped as it arrives: where the guest's early boot
# goes, before its own clock starts.
[ "${LOUD:-0}" = 1 ] && cmdline="$(echo "$cmdline" | sed 's/ quiet / /') earlyprintk=ttyS0"

samples="$tmp/samples.jsonl"
exits="$tmp/exits.jsonl"
: >"$samples"
: >"$exits"
# sample VMM ROUND FIGURE VALUE
sample() {
    case $4 in
    '' | *[!0-9.]*) echo "peers: $1 round $2: no number for $3 ('$4')" ;;
    *) echo "{\"vmm\":\"$1\",\"round\":$2,\"figure\":\"$3\",\"value\":$4}" >>"$samples" ;;
    esac
}
# ms A_NS B_NS: B - A in milliseconds, one decimal.
ms() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", (b - a) / 1e6 }'; }
# last_t FILE FIELD: a field of peer-tool's last PEER_T line (1 start, 2 end, 3 n).
last_t() { tail -n 1 "$1" | cut -d' ' -f"$2"; }

# --- one VMM process: start_vmm KIND NAME [ARGS...] sets pid, api, con,
# err, vsock (the uds path a config gives), t_start (ns, just before exec).
pid="" stamper=""
start_vmm() {
    kind=$1 name=$2
    shift 2
    api="$tmp/$name.api" con="$tmp/$name.console" err="$tmp/$name.err" vsock="$tmp/$name.vsock" why="$tmp/$name.why"
    rm -f "$api" "$vsock" "$tmp/$name.fifo" "$why"
    # The VMMs' own log lines to a file of their own, not into the console
    # (Firecracker logs to stdout once its API is used; its logger opens
    # the file without creating it).
    log="$tmp/$name.log"
    : >"$log"
    mkfifo "$tmp/$name.fifo"
    # Emptied here, not only by the stamper's own redirection (which runs
    # in the background): a wait_line right after must not find the last
    # round's marker in it (seen once: a boot "took" -5,020 ms).
    : >"$con"
    "$T" stamp <"$tmp/$name.fifo" >"$con" &
    stamper=$!
    t_start=$("$T" now)
    # spore only: `env NAME=VALUE ...` in front (peers.sh checked the words).
    launch=""
    [ "$kind" = spore ] && [ -n "${SPORE_ENV:-}" ] && launch="env $SPORE_ENV"
    # shellcheck disable=SC2086 # $launch is empty or words to split
    $launch "$tmp/bin-$kind/firecracker" --api-sock "$api" --log-path "$log" "$@" >"$tmp/$name.fifo" 2>"$err" &
    pid=$!
}
stop_vmm() {
    [ -n "$pid" ] || return 0
    kill "$pid" 2>/dev/null
    i=0
    while kill -0 "$pid" 2>/dev/null && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
    kill -9 "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    wait "$stamper" 2>/dev/null
    pid="" stamper=""
}
trap 'stop_vmm' EXIT
A() { "$T" api "$api" "$@"; }
# Runs a shell command in the guest over vsock (retrying until it answers).
# Why attempts failed goes to $why (PEER_V).
G() { PEER_V=1 "$T" vsock "$vsock" 5000 "$1" "${2:-60}" 2>>"$why"; }
# At FILE METHOD PATH [BODY] and Gt FILE COMMAND [SECS]: A and G, timed into
# FILE (peer-tool's PEER_T line: start ns, end ns, status or attempts).
At() { _f=$1; shift; PEER_T=$_f "$T" api "$api" "$@"; }
Gt() { PEER_V=1 PEER_T=$1 "$T" vsock "$vsock" 5000 "$2" "${3:-60}" 2>>"$why"; }
# api_config MEM_MIB [EXTRA_CMDLINE]: boot source, machine and vsock by API.
api_config() {
    wait_for_socket "$api" 100 &&
        A PUT /boot-source "{\"kernel_image_path\":\"$GUEST_KERNEL\",\"initrd_path\":\"$GUEST_INITRD\",\"boot_args\":\"$cmdline${2:+ $2}\"}" &&
        A PUT /machine-config "{\"vcpu_count\":1,\"mem_size_mib\":$1}" &&
        A PUT /vsock "{\"guest_cid\":3,\"uds_path\":\"$vsock\"}"
}
# wait_mem ge|le KB SECS AFTER_NS: the stamp of the first PEER-MEMTOTAL line
# after AFTER_NS with MemTotal >= (or <=) KB.
wait_mem() {
    i=0
    while [ $i -lt $(($3 * 10)) ]; do
        s=$(awk -v c="$1" -v k="$2" -v a="$4" '$1 >= a && $2 == "PEER-MEMTOTAL" && ((c == "ge" && $3 + 0 >= k + 0) || (c == "le" && $3 + 0 <= k + 0)) { print $1; exit }' "$con")
        [ -n "$s" ] && { echo "$s"; return 0; }
        kill -0 "$pid" 2>/dev/null || return 1
        sleep 0.1
        i=$((i + 1))
    done
    return 1
}
# keep NAME: the console, the VMM's messages and failed vsock attempts of
# the VMM that ran as NAME go to $SPORE_OUT.
keep() {
    cp "$con" "$SPORE_OUT/console-$1.txt"
    cat "$log" "$err" >"$SPORE_OUT/vmm-$1.log" 2>/dev/null
    # When the VMM was started (CLOCK_MONOTONIC ns, as the console's stamps
    # and spore's debug-level start-up phases).
    echo "$t_start" >"$SPORE_OUT/start-$1.txt"
    [ -s "$why" ] && cp "$why" "$SPORE_OUT/vsock-$1.why"
    true
}
# trace_on / trace_off FILE: with --trace (TRACE=1), L1's ftrace of the
# step (scheduler wake-ups and switches, KVM exits, entries, interrupts and
# halt-poll wake-ups) into FILE, for a per-event timeline of both VMMs.
tracefs=/sys/kernel/tracing
[ -d $tracefs/events ] || tracefs=/sys/kernel/debug/tracing
trace_on() {
    [ "${TRACE:-0}" = 1 ] && [ -d $tracefs/events ] || return 0
    echo 0 >$tracefs/tracing_on
    echo 16384 >$tracefs/buffer_size_kb
    : >$tracefs/trace
    for e in sched/sched_switch sched/sched_wakeup kvm/kvm_exit kvm/kvm_entry kvm/kvm_userspace_exit \
        kvm/kvm_vcpu_wakeup kvm/kvm_set_irq kvm/kvm_ioapic_set_irq kvm/kvm_apic_accept_irq kvm/kvm_halt_poll_ns; do
        [ -f $tracefs/events/$e/enable ] && echo 1 >$tracefs/events/$e/enable
    done
    echo 1 >$tracefs/tracing_on
}
trace_off() {
    [ "${TRACE:-0}" = 1 ] && [ -d $tracefs/events ] || return 0
    echo 0 >$tracefs/tracing_on
    cat $tracefs/trace >"$1"
    echo 0 >$tracefs/events/enable
}
# pin_vmm_threads: with --pin (PIN=1), the VMM's vCPU threads on L1's CPU
# 0 and its other threads (device workers, API, event loop) on CPU 1, the
# same for both VMMs: where the scheduler puts a device thread decides
# whether the vCPU's halt polling sees the device's answer.
# A thread taskset cannot pin is reported, so that a run said to be pinned is.
pin_vmm_threads() {
    [ "${PIN:-0}" = 1 ] || return 0
    unpinned=""
    for task in /proc/"$pid"/task/*; do
        case $(cat "$task/comm" 2>/dev/null) in
        *vcpu*) mask=1 ;;
        *) mask=2 ;;
        esac
        taskset -p $mask "${task##*/}" >/dev/null 2>&1 || unpinned="$unpinned ${task##*/}"
    done
    [ -z "$unpinned" ] || t "peers-pin-$1" FAIL "taskset could not pin threads$unpinned"
}
gone() { kill -0 "$pid" 2>/dev/null && return 1; echo "the VMM is gone: $(tail -n 3 "$log" "$err" | tr '\n' ' ') console: $(tail -n 3 "$con" | cut -d' ' -f2- | tr '\n' ' ')"; }
# wait_line TEXT SECS [AFTER_NS]: the stamp of the first console line that
# contains TEXT (and came after AFTER_NS); empty on timeout.
wait_line() {
    i=0
    while [ $i -lt $(($2 * 10)) ]; do
        s=$(awk -v p="$1" -v a="${3:-0}" '$1 >= a && index($0, p) { print $1; exit }' "$con")
        [ -n "$s" ] && { echo "$s"; return 0; }
        kill -0 "$pid" 2>/dev/null || return 1
        sleep 0.1
        i=$((i + 1))
    done
    return 1
}

# --- KVM exit counts: kvm_stats FILE reads every counter of the VM's
# debugfs directory (/sys/kernel/debug/kvm/<tid>-<fd>, <tid> the thread
# that made the VM: the VM's counters, summed over its vCPUs) into FILE, its
# first line "@dir <name> <comm>/<parent pid>". The VM is the one made by a
# thread of the VMM process or by a child of it, the newest (highest fd) if
# there are several.
# kvm_delta VMM ROUND GROUP BEFORE AFTER records what changed; a BEFORE
# of another VM (or none) counts as zeros.
kvm_stats() {
    echo "@dir none" >"$1"
    best="" bestfd=-1 other=""
    for d in /sys/kernel/debug/kvm/[0-9]*-[0-9]*; do
        [ -d "$d" ] || continue
        n=${d##*/}
        p=${n%-*} fd=${n#*-}
        # KVM names the directory after the thread that made the VM.
        if [ "$p" != "$pid" ] && [ ! -d "/proc/$pid/task/$p" ]; then
            pp=""
            [ -r "/proc/$p/stat" ] && pp=$(sed -n 's/^[0-9]* (.*) [A-Za-z] \([0-9]*\) .*/\1/p' "/proc/$p/stat")
            # Not the VMM's nor its child's: taken only if it is the one VM
            # there is (one VMM runs at a time here).
            [ "$pp" = "$pid" ] || { [ -z "$best" ] && other=$d; continue; }
        fi
        [ "$fd" -gt "$bestfd" ] && best=$d bestfd=$fd
    done
    [ -z "$best" ] && [ -n "$other" ] && [ "$(ls -d /sys/kernel/debug/kvm/[0-9]*-[0-9]* | wc -l)" = 1 ] && best=$other
    [ -n "$best" ] || return 0
    p=${best##*/}
    p=${p%-*}
    echo "@dir ${best##*/} $(cat "/proc/$p/comm" 2>/dev/null)/$(sed -n 's/^[0-9]* (.*) [A-Za-z] \([0-9]*\) .*/\1/p' "/proc/$p/stat" 2>/dev/null | head -n 1)" >"$1"
    for f in "$best"/*; do
        [ -f "$f" ] && read -r v <"$f" 2>/dev/null && echo "${f##*/} $v" >>"$1"
    done
    return 0
}
kvm_delta() {
    o=$(awk 'FILENAME == ARGV[1] { if ($1 == "@dir") d = $2; else a[$1] = $2; next }
        $1 == "@dir" { if ($2 != d) delete a; next }
        ($2 - a[$1]) != 0 { printf "%s\"%s\":%.0f", (n++ ? "," : ""), $1, $2 - a[$1] }' "$4" "$5")
    vm=$(sed -n '1s/^@dir //p' "$5") # <pid>-<fd> <comm>/<parent pid>
    echo "{\"vmm\":\"$1\",\"round\":$2,\"group\":\"$3\",\"vm\":\"$vm\",\"exits\":{$o}}" >>"$exits"
}
: >"$tmp/zero.stats"

# --- figure group 1: boot from the command line.
boot_round() {
    kind=$1 r=$2
    cat >"$tmp/boot.json" <<CFG
{"boot-source":{"kernel_image_path":"$GUEST_KERNEL","initrd_path":"$GUEST_INITRD","boot_args":"$cmdline"},
 "drives":[],
 "machine-config":{"vcpu_count":1,"mem_size_mib":256},
 "vsock":{"guest_cid":3,"uds_path":"$tmp/boot-$kind.vsock"}}
CFG
    start_vmm "$kind" "boot-$kind" --config-file "$tmp/boot.json"
    if s=$(wait_line "SPORE-INIT up " 300 "$t_start"); then
        kvm_stats "$tmp/boot.after"
        kvm_delta "$kind" "$r" boot "$tmp/zero.stats" "$tmp/boot.after"
        b=$(ms "$t_start" "$s")
        up=$(awk -v s="$s" '$1 == s { for (i = 2; i < NF; i++) if ($i == "up") { sub(/s$/, "", $(i + 1)); print $(i + 1); exit } }' "$con")
        sample "$kind" "$r" boot_to_init_ms "$b"
        sample "$kind" "$r" init_uptime_s "$up"
        t "peers-boot-$kind-r$r" PASS "process start -> init marker ${b} ms, guest uptime at init ${up} s"
    else
        t "peers-boot-$kind-r$r" FAIL "no init marker: $(gone)"
    fi
    # The guest's kernel log (printk times; initcall_debug on request).
    if [ "$r" = 1 ] || [ "$INITCALL" = 1 ]; then
        G dmesg >"$SPORE_OUT/dmesg-boot-$kind-r$r.txt" ||
            t "peers-dmesg-$kind-r$r" FAIL "$(why_summary)"
    fi
    # PATCH /vm Paused on this 256 MiB guest, request -> response; a GET /
    # first, as the floor of one request through peer-tool.
    if G true >/dev/null && sleep 1 && At "$tmp/t.get" GET / >/dev/null &&
        kvm_stats "$tmp/pause.before" && At "$tmp/t.pause" PATCH /vm '{"state":"Paused"}'; then
        kvm_stats "$tmp/pause.after"
        kvm_delta "$kind" "$r" pause_256 "$tmp/pause.before" "$tmp/pause.after"
        g=$(ms "$(last_t "$tmp/t.get" 1)" "$(last_t "$tmp/t.get" 2)")
        p=$(ms "$(last_t "$tmp/t.pause" 1)" "$(last_t "$tmp/t.pause" 2)")
        sample "$kind" "$r" api_get_ms "$g"
        sample "$kind" "$r" pause_256_ms "$p"
        # The same pause again, its code now run once (warm): what is left
        # of a difference is the mechanism, not first-run costs.
        p2=""
        if A PATCH /vm '{"state":"Resumed"}' >/dev/null && sleep 0.5 &&
            At "$tmp/t.pause2" PATCH /vm '{"state":"Paused"}' >/dev/null; then
            p2=$(ms "$(last_t "$tmp/t.pause2" 1)" "$(last_t "$tmp/t.pause2" 2)")
            sample "$kind" "$r" pause_256_again_ms "$p2"
        fi
        t "peers-pause-$kind-r$r" PASS "PATCH /vm Paused (256 MiB) ${p} ms, again after a resume ${p2:-?} ms; GET / ${g} ms"
    else
        t "peers-pause-$kind-r$r" FAIL "$(why_summary) $(gone)"
    fi
    stop_vmm
    keep "boot-$kind-r$r"
}
why_summary() { sort "$why" 2>/dev/null | uniq -c | sort -rn | head -n 3 | tr '\n' ' '; }

# --- figure group 2: a 1 GiB guest configured through the API, started
# (InstanceStart -> the guest answers on vsock), paused, snapshotted (Full,
# on L1's tmpfs), then loaded in a new process (request -> response, and
# request -> the guest's first reply on vsock).
snapshot_round() {
    kind=$1 r=$2
    snap="$tmp/snap"
    mkdir -p "$snap"
    rm -f "$snap"/*
    start_vmm "$kind" "api-$kind"
    if ! api_config 1024; then
        t "peers-api-boot-$kind-r$r" FAIL "configuring: $(cat "$log" "$err" 2>/dev/null | tail -n 3 | tr '\n' ' ') $(gone)"
        stop_vmm
        return
    fi
    kvm_stats "$tmp/ab.before"
    # The first vsock attempt waits for the init marker on the console: a
    # connection attempted earlier only loads the booting guest (and one
    # made before its vsock driver is up waits for a timeout).
    if At "$tmp/t.start" PUT /actions '{"action_type":"InstanceStart"}' && wait_line "SPORE-INIT up " 300 >/dev/null &&
        Gt "$tmp/t.reply" 'cut -d" " -f1 /proc/uptime' 300 >"$tmp/up"; then
        kvm_stats "$tmp/ab.after"
        kvm_delta "$kind" "$r" api_boot "$tmp/ab.before" "$tmp/ab.after"
        b=$(ms "$(last_t "$tmp/t.start" 1)" "$(last_t "$tmp/t.reply" 2)")
        sample "$kind" "$r" api_boot_to_vsock_ms "$b"
        t "peers-api-boot-$kind-r$r" PASS "InstanceStart -> vsock reply ${b} ms (1 GiB; guest uptime $(cat "$tmp/up") s)"
    else
        t "peers-api-boot-$kind-r$r" FAIL "$(why_summary) $(gone)"
        stop_vmm
        keep "api-$kind-r$r"
        return
    fi
    sleep 1
    kvm_stats "$tmp/sc.before"
    if At "$tmp/t.pause" PATCH /vm '{"state":"Paused"}' >/dev/null &&
        At "$tmp/t.create" PUT /snapshot/create "{\"snapshot_type\":\"Full\",\"snapshot_path\":\"$snap/vm.state\",\"mem_file_path\":\"$snap/vm.mem\"}" >"$tmp/create.out" 2>&1; then
        kvm_stats "$tmp/sc.after"
        kvm_delta "$kind" "$r" snapshot_create "$tmp/sc.before" "$tmp/sc.after"
        p=$(ms "$(last_t "$tmp/t.pause" 1)" "$(last_t "$tmp/t.pause" 2)")
        c=$(ms "$(last_t "$tmp/t.create" 1)" "$(last_t "$tmp/t.create" 2)")
        du=$(du -k "$snap/vm.mem" | cut -f1)
        size=$(stat -c %s "$snap/vm.mem")
        sample "$kind" "$r" pause_1g_ms "$p"
        sample "$kind" "$r" snapshot_create_ms "$c"
        sample "$kind" "$r" snapshot_mem_du_mib "$(awk -v k="$du" 'BEGIN { printf "%.1f", k / 1024 }')"
        t "peers-snapshot-create-$kind-r$r" PASS "PATCH /vm Paused (1 GiB) ${p} ms, full snapshot ${c} ms, memory file ${du} KiB on disk of ${size} bytes"
    else
        t "peers-snapshot-create-$kind-r$r" FAIL "$(cat "$tmp/create.out") $(gone)"
        stop_vmm
        keep "api-$kind-r$r"
        return
    fi
    stop_vmm
    keep "api-$kind-r$r"
    old_vsock=$vsock
    start_vmm "$kind" "load-$kind"
    # The restored vsock device listens where the snapshotted one did.
    vsock=$old_vsock
    rm -f "$vsock"
    if wait_for_socket "$api" 100 &&
        At "$tmp/t.load" PUT /snapshot/load "{\"snapshot_path\":\"$snap/vm.state\",\"mem_backend\":{\"backend_type\":\"File\",\"backend_path\":\"$snap/vm.mem\"},\"resume_vm\":true}" >"$tmp/load.out" 2>&1 &&
        Gt "$tmp/t.reply" 'cut -d" " -f1 /proc/uptime' 120 >"$tmp/up2"; then
        kvm_stats "$tmp/ld.after"
        kvm_delta "$kind" "$r" snapshot_load "$tmp/zero.stats" "$tmp/ld.after"
        l=$(ms "$(last_t "$tmp/t.load" 1)" "$(last_t "$tmp/t.load" 2)")
        f=$(ms "$(last_t "$tmp/t.load" 1)" "$(last_t "$tmp/t.reply" 2)")
        sample "$kind" "$r" snapshot_load_ms "$l"
        sample "$kind" "$r" snapshot_load_to_reply_ms "$f"
        t "peers-snapshot-load-$kind-r$r" PASS "load request -> response ${l} ms, -> first vsock reply ${f} ms ($(last_t "$tmp/t.reply" 3) vsock attempts; guest uptime $(cat "$tmp/up") -> $(cat "$tmp/up2") s)"
    else
        t "peers-snapshot-load-$kind-r$r" FAIL "$(cat "$tmp/load.out" 2>/dev/null) $(why_summary) $(gone)"
    fi
    stop_vmm
    keep "load-$kind-r$r"
    rm -f "$snap"/*
}

# --- figure group 3: virtio-mem. 512 MiB of boot memory and 1 GiB of
# hotpluggable memory (slot 128 MiB, block 2 MiB: the defaults of both);
# plug 0 -> 512 MiB (the first plug after boot), unplug to 0, plug again,
# unplug again. A plug is timed from the PATCH request to the console line
# of the guest seeing MemTotal grow by 512 MiB (less 16 MiB); an unplug to
# the VMM's GET /hotplug/memory saying plugged_size_mib 0 (polled every
# 10 ms), and to the guest seeing MemTotal back at its boot value.
vmem_round() {
    kind=$1 r=$2
    start_vmm "$kind" "vmem-$kind"
    if ! { api_config 512 peers.memwatch && A PUT /hotplug/memory '{"total_size_mib":1024}' &&
        A PUT /actions '{"action_type":"InstanceStart"}' && wait_line "SPORE-INIT up " 300 >/dev/null && G true 300 >/dev/null; }; then
        t "peers-vmem-$kind-r$r" FAIL "booting: $(why_summary) $(cat "$log" "$err" 2>/dev/null | tail -n 3 | tr '\n' ' ') $(gone)"
        stop_vmm
        keep "vmem-$kind-r$r"
        return
    fi
    wait_line PEER-MEMTOTAL 30 >/dev/null
    base=$(awk '$2 == "PEER-MEMTOTAL" { print $3; exit }' "$con")
    sleep 1
    msg="" ok=1
    for step in first_plug unplug plug unplug2; do
        kvm_stats "$tmp/vm.before"
        case $step in
        unplug | unplug2)
            At "$tmp/t.req" PATCH /hotplug/memory '{"requested_size_mib":0}' >/dev/null || { ok=0; break; }
            req=$(last_t "$tmp/t.req" 1)
            PEER_T="$tmp/t.done" "$T" until "$api" /hotplug/memory '"plugged_size_mib":0' 120 >/dev/null 2>"$tmp/until.err" &
            u=$!
            seen=$(wait_mem le "$base" 120 "$req") || { ok=0; kill $u 2>/dev/null; wait $u; break; }
            wait $u || { ok=0; break; }
            done_ms=$(ms "$req" "$(last_t "$tmp/t.done" 2)")
            seen_ms=$(ms "$req" "$seen")
            sample "$kind" "$r" "vmem_${step}_ms" "$done_ms"
            sample "$kind" "$r" "vmem_${step}_guest_ms" "$seen_ms"
            msg="$msg $step ${done_ms} ms (guest ${seen_ms} ms);"
            ;;
        *)
            At "$tmp/t.req" PATCH /hotplug/memory '{"requested_size_mib":512}' >/dev/null || { ok=0; break; }
            req=$(last_t "$tmp/t.req" 1)
            seen=$(wait_mem ge $((base + 524288 - 16384)) 120 "$req") || { ok=0; break; }
            seen_ms=$(ms "$req" "$seen")
            sample "$kind" "$r" "vmem_${step}_ms" "$seen_ms"
            msg="$msg $step ${seen_ms} ms;"
            ;;
        esac
        kvm_stats "$tmp/vm.after"
        kvm_delta "$kind" "$r" "vmem_$step" "$tmp/vm.before" "$tmp/vm.after"
        sleep 1
    done
    if [ $ok = 1 ]; then
        t "peers-vmem-$kind-r$r" PASS "512 MiB:$msg guest MemTotal at boot $base kB"
    else
        t "peers-vmem-$kind-r$r" FAIL "at $step:$msg $(cat "$tmp/until.err" 2>/dev/null) $(A GET /hotplug/memory 2>&1) $(grep PEER-MEMTOTAL "$con" | tail -n 3 | cut -d' ' -f2- | tr '\n' ' ') $(gone)"
    fi
    stop_vmm
    keep "vmem-$kind-r$r"
}

# --- figure group 5 (not in the default GROUPS; `--groups api`): the floor
# of one request, 10 GET / in a row (0.2 s apart) on a VMM with no VM yet,
# then 10 on a booted 256 MiB guest sitting idle: what a request costs,
# and whether a running guest makes it cost more.
api_round() {
    kind=$1 r=$2
    start_vmm "$kind" "api-$kind"
    if ! wait_for_socket "$api" 100; then
        t "peers-api-$kind-r$r" FAIL "no API socket: $(gone)"
        stop_vmm
        return
    fi
    msg=""
    for phase in idle running; do
        if [ $phase = running ] &&
            ! { api_config 256 && A PUT /actions '{"action_type":"InstanceStart"}' >/dev/null &&
                wait_line "SPORE-INIT up " 300 >/dev/null && G true 300 >/dev/null && sleep 1; }; then
            msg="$msg booting failed: $(why_summary) $(gone)"
            break
        fi
        : >"$tmp/t.api"
        i=0
        while [ $i -lt 10 ]; do
            At "$tmp/t.api" GET / >/dev/null || break
            sleep 0.2
            i=$((i + 1))
        done
        v=$(awk '{ printf "%.1f\n", ($2 - $1) / 1e6 }' "$tmp/t.api" | sort -n | awk '{ a[NR] = $1 } END { if (NR) print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }')
        sample "$kind" "$r" "api_get_${phase}_ms" "$v"
        msg="$msg $phase: $(awk '{ printf " %.1f", ($2 - $1) / 1e6 }' "$tmp/t.api") ms;"
    done
    t "peers-api-$kind-r$r" PASS "GET /:$msg"
    stop_vmm
    keep "api-$kind-r$r"
}

# --- figure group 4: balloon, 512 MiB guest idle: inflate to 256 MiB and
# deflate to 0, each from the PATCH request until GET /balloon/statistics
# says actual_mib reached the target (polled every 10 ms; both VMMs read it
# from the device's config space at each request).
balloon_round() {
    kind=$1 r=$2
    start_vmm "$kind" "balloon-$kind"
    if ! { api_config 512 && A PUT /balloon '{"amount_mib":0,"deflate_on_oom":false,"stats_polling_interval_s":1}' &&
        A PUT /actions '{"action_type":"InstanceStart"}' && wait_line "SPORE-INIT up " 300 >/dev/null && G true 300 >/dev/null; }; then
        t "peers-balloon-$kind-r$r" FAIL "booting: $(why_summary) $(cat "$log" "$err" 2>/dev/null | tail -n 3 | tr '\n' ' ') $(gone)"
        stop_vmm
        keep "balloon-$kind-r$r"
        return
    fi
    pin_vmm_threads "$kind-r$r"
    sleep 2
    msg="" ok=1
    for step in inflate:256 deflate:0; do
        name=${step%:*} mib=${step#*:}
        kvm_stats "$tmp/bl.before"
        trace_on
        if At "$tmp/t.req" PATCH /balloon "{\"amount_mib\":$mib}" >/dev/null &&
            PEER_T="$tmp/t.done" "$T" until "$api" /balloon/statistics "\"actual_mib\":$mib" 300 >/dev/null 2>"$tmp/until.err"; then
            kvm_stats "$tmp/bl.after"
            trace_off "$SPORE_OUT/trace-balloon-$name-$kind-r$r.txt"
            kvm_delta "$kind" "$r" "balloon_$name" "$tmp/bl.before" "$tmp/bl.after"
            x=$(ms "$(last_t "$tmp/t.req" 1)" "$(last_t "$tmp/t.done" 2)")
            sample "$kind" "$r" "balloon_${name}_ms" "$x"
            msg="$msg $name ${x} ms;"
            # spore's statistics also say what the host's release cost
            # (`host`: release_calls, release_us).
            A GET /balloon/statistics >"$SPORE_OUT/balloon-stats-$kind-r$r-$name.json" 2>/dev/null || true
        else
            trace_off "$SPORE_OUT/trace-balloon-$name-$kind-r$r.txt"
            ok=0
            msg="$msg $name failed: $(cat "$tmp/until.err");"
            break
        fi
        sleep 1
    done
    if [ $ok = 1 ]; then
        t "peers-balloon-$kind-r$r" PASS "256 MiB of 512:$msg"
    else
        t "peers-balloon-$kind-r$r" FAIL "$msg $(gone)"
    fi
    stop_vmm
    keep "balloon-$kind-r$r"
}

fc_version=$("$FC" --version 2>/dev/null | head -n 1)
spore_version=$("$SPORE" --version 2>/dev/null | head -n 1)
thp=$(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null)
shmem=$(cat /sys/kernel/mm/transparent_hugepage/shmem_enabled 2>/dev/null)
tmpfs=$(awk '$2 == "/tmp" { print $3 }' /proc/mounts)
echo "peers: $ROUNDS rounds; Firecracker '$fc_version', spore '$spore_version'; THP enabled '$thp', shmem_enabled '$shmem'; /tmp is $tmpfs"

r=1
while [ $r -le "$ROUNDS" ]; do
    for kind in $VMMS; do
        for group in $GROUPS; do
            "${group}_round" "$kind" $r
        done
    done
    r=$((r + 1))
done

# --- the raw samples, for tests/nested/peers.sh.
js() { printf '%s' "$1" | sed 's/\\/\\\\/g; s/"/\\"/g'; }
{
    printf '{"meta":{"rounds":%s,"initcall_debug":%s,"firecracker_version":"%s","spore_version":"%s",' \
        "$ROUNDS" "$([ "$INITCALL" = 1 ] && echo true || echo false)" "$(js "$fc_version")" "$(js "$spore_version")"
    printf '"l1_kernel":"%s","l1_thp_enabled":"%s","l1_thp_shmem_enabled":"%s","snapshot_fs":"%s","guest_cmdline":"%s"},\n' \
        "$(uname -r)" "$(js "$thp")" "$(js "$shmem")" "$tmpfs" "$(js "$cmdline")"
    echo '"samples":['
    sed '$!s/$/,/' "$samples"
    echo '],"exits":['
    sed '$!s/$/,/' "$exits"
    echo ']}'
} >"$SPORE_OUT/peers-raw.json"
# Per figure and VMM: every sample, and the median.
awk -F'"' '{ k = $10 " " $4; v = $0; sub(/.*"value":/, "", v); sub(/}$/, "", v); s[k] = s[k] " " v }
    END { for (k in s) print k s[k] }' "$samples" | sort | while read -r fig vmm vals; do
    med=$(echo "$vals" | tr ' ' '\n' | sort -n | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }')
    t "peers-$fig-$vmm" PASS "median $med of: $vals"
done
exit 0
