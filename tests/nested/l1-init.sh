#!/bin/sh
# /init of the nested harness's L1 VM (Debian cloud kernel under QEMU TCG
# with SVM, or with EL2 for arm64). Loads the KVM modules (load-order: none
# for KVM on arm64, where it is built in), checks /dev/kvm, runs each scenario
# of /scenarios/list in turn (run_scenario), then powers off.
export PATH=/bin:/sbin:/usr/bin:/usr/sbin HOME=/root TERM=linux

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs -o mode=1777 tmpfs /tmp
# cgroup v2 where a systemd host has it: spore serve makes a cgroup per
# instance VMM there.
mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null || echo "SPORE-L1 no cgroup v2"
ip link set lo up 2>/dev/null

read -r up _ </proc/uptime
echo "SPORE-L1 up ${up}s"

# spore.kvm_amd=P1,P2 on the command line (run.sh): kvm_amd's parameters
# (npt=0: L1's KVM shadows L2's page tables instead of nested paging).
kvm_amd_params=$(sed -n 's/.*spore\.kvm_amd=\([^ ]*\).*/\1/p' /proc/cmdline | tr ',' ' ')
while read -r m; do
    case $m in
    kvm_amd.ko | kvm-amd.ko) set -- $kvm_amd_params ;;
    *) set -- ;;
    esac
    insmod "/lib/modules/$m" "$@" || echo "SPORE-L1 insmod $m failed"
done </lib/modules/load-order
[ -n "$kvm_amd_params" ] && echo "SPORE-L1 kvm_amd $kvm_amd_params: npt $(cat /sys/module/kvm_amd/parameters/npt 2>/dev/null)"
# tun (tap devices for virtio-net): devtmpfs makes /dev/net/tun when the
# module registers it; make it by hand where that did not happen (or tun is
# built in and devtmpfs was mounted late).
if [ ! -c /dev/net/tun ] && grep -qw tun /proc/misc 2>/dev/null; then
    mkdir -p /dev/net && mknod -m 0666 /dev/net/tun c 10 200
fi
[ -c /dev/net/tun ] || echo "SPORE-L1 no /dev/net/tun (tun module missing?)"

# An L2 guest's triple fault (the open "fourth shape", guest/README.md):
# AMD's KVM resets the vCPU at the SHUTDOWN exit, so the VMM reads only the
# reset state; KVM's kvm_exit tracepoint still records the guest's rip at
# that exit. Only SHUTDOWN exits (SVM_EXIT_SHUTDOWN, 0x7f) are traced, so
# nothing else pays for it; run_scenario keeps what fired.
kvm_trace=/sys/kernel/tracing
if [ -d /sys/module/kvm_amd ] && { [ -f $kvm_trace/trace ] || mount -t tracefs tracefs $kvm_trace 2>/dev/null; } &&
    echo 'exit_reason == 127' >$kvm_trace/events/kvm/kvm_exit/filter 2>/dev/null &&
    echo 1 >$kvm_trace/events/kvm/kvm_exit/enable 2>/dev/null; then
    echo "SPORE-L1 tracing L2 guests' triple faults (kvm_exit SHUTDOWN)"
else
    kvm_trace=
fi

# run.sh --scratch-disk: an ext4 disk (virtio-blk) mounted at /scratch, for
# files whose page cache a scenario drops (the initramfs's cannot be).
if grep -qw spore.scratch=1 /proc/cmdline; then
    i=0
    while [ ! -b /dev/vda ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
    mkdir -p /scratch
    if mount -t ext4 /dev/vda /scratch; then
        export SPORE_SCRATCH=/scratch
        echo "SPORE-L1 scratch disk mounted ($(df -m /scratch | awk 'NR == 2 { print $2 }') MiB)"
    else
        echo "SPORE-L1 scratch disk: mounting /dev/vda failed"
    fi
fi

# run.sh --hostfwd: L1's NIC on QEMU's user network (its forwarded ports
# come in to 10.0.2.15).
if grep -qw spore.l1net=1 /proc/cmdline; then
    i=0
    while [ ! -d /sys/class/net/eth0 ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
    if ip addr add 10.0.2.15/24 dev eth0 && ip link set eth0 up; then
        echo "SPORE-L1 network up (10.0.2.15)"
    else
        echo "SPORE-L1 network: no eth0"
    fi
fi

# An open bug (guest/README.md): now and then a run stalls. If nothing
# progressed for $1 seconds, print what every spore process is doing (threads,
# wait channels, kernel stacks), the scenario's console and error files, and
# the kernel log, before run.sh kills QEMU.
stall_report() {
    echo "SPORE-L1 stall report after $1 s without progress"
    ps | grep -v " \[" # user processes only
    for pid in $(pidof spore); do
        for task in /proc/"$pid"/task/*; do
            echo "-- pid $pid thread $(cat "$task/comm") $(cut -d' ' -f3 "$task/stat") wchan=$(cat "$task/wchan")"
            head -n 12 "$task/stack" 2>/dev/null
        done
    done
    for f in "$SPORE_TMP"/*.txt "$SPORE_TMP"/*.err "$SPORE_TMP"/*/*.txt "$SPORE_TMP"/*/*.err; do
        [ -f "$f" ] || continue
        echo "-- tail $f"
        tail -n 15 "$f" | cut -c1-200
    done
    echo "-- dmesg"
    dmesg | tail -n 30
    echo "SPORE-L1 stall report end"
}

# What the running scenario does, as a line that changes when it makes
# progress: L1's network byte counters (taps, veths), the resident memory of
# every process over 16 MiB (a VMM whose guest touches memory, spore's or a
# peer's; a restore loading pages). Files the scenario writes count too
# (progress_watch).
activity() {
    awk 'NR > 2 { s += $2 + $10 } END { printf "net=%.0f", s }' /proc/net/dev
    cat /proc/[0-9]*/statm 2>/dev/null | awk '$2 > 4096 { printf " %s", $2 }'
}

# progress_watch DIR REPORT_S: every 10 s, `SPORE-L1 progress` if anything
# under DIR or $SPORE_OUT changed or activity() did (run.sh's stall watch
# counts these lines); L1's stall report once nothing has for REPORT_S s.
progress_watch() {
    stamp=/tmp/.progress-stamp last="" idle=0 reported=0
    touch "$stamp"
    while sleep 10; do
        now=$(activity)
        if [ "$now" != "$last" ] || [ -n "$(find "$1" "$SPORE_OUT" -newer "$stamp" 2>/dev/null | head -n 1)" ]; then
            echo "SPORE-L1 progress"
            idle=0
        else
            idle=$((idle + 10))
        fi
        last=$now
        touch "$stamp"
        if [ -n "$2" ] && [ "$idle" -ge "$2" ] && [ $reported = 0 ]; then
            stall_report "$idle"
            reported=1
        fi
    done
}

# kill_leftovers: every user process but init (VMMs, daemons, servers a
# scenario left running), so the next scenario starts from a quiet L1.
kill_leftovers() {
    for p in /proc/[0-9]*; do
        pid=${p#/proc/}
        [ "$pid" = 1 ] && continue
        readlink "$p/exe" >/dev/null 2>&1 || continue # a kernel thread
        kill -9 "$pid" 2>/dev/null
    done
    sleep 1
}

# run_scenario DIR NAME: /scenarios/I (run.sh): its script, its guest
# initramfs; between SPORE-SCENARIO-BEGIN and -END lines: its output, its
# exit status, L1's kernel messages during it, and what it left in
# $SPORE_OUT as a base64 tar between SPORE-OUT markers (run.sh unpacks it).
run_scenario() {
    echo "SPORE-SCENARIO-BEGIN $2"
    export GUEST_INITRD="$1/initramfs.cpio" SPORE_OUT="/out/$2" SPORE_TMP="/tmp/sc/$2"
    mkdir -p "$SPORE_OUT" "$SPORE_TMP"
    cd "$SPORE_TMP" || return
    progress_watch "$SPORE_TMP" "$(cat "$1/stall_report_s" 2>/dev/null)" &
    watcher=$!
    { "$1/scenario"; echo "SPORE-L1 scenario exit $?"; } 2>&1 | tee "$SPORE_TMP/.scenario.out"
    kill "$watcher" 2>/dev/null
    # L1's kernel runs quiet: its warnings (a splat from an ioctl), its
    # seccomp kill records (audit type 1326: which thread, which syscall)
    # and a fatal signal's registers (print-fatal-signals) reach the log
    # only here, so a VMM that died says why. Cleared for the next scenario.
    dmesg | grep -E -A 30 'cut here|type=1326|fatal signal' | head -n 160 | sed 's/^/SPORE-L1-KERNEL /'
    dmesg -c >/dev/null
    kill_leftovers
    # A triple fault's rip (see kvm_trace above), also in the outputs.
    if [ -n "$kvm_trace" ] && grep -q 'kvm_exit' $kvm_trace/trace 2>/dev/null; then
        grep 'kvm_exit' $kvm_trace/trace | tee "$SPORE_OUT/l1-kvm-shutdown-exits.txt" |
            head -n 20 | sed 's/^/SPORE-L1-KERNEL L2 triple fault: /'
        echo >$kvm_trace/trace
    fi
    cd /
    if [ -n "$(ls -A "$SPORE_OUT")" ]; then
        echo "SPORE-OUT-BEGIN"
        tar -C "$SPORE_OUT" -cz . | base64
        echo "SPORE-OUT-END"
    fi
    # Its files are in L1's memory: free them for the next scenario.
    rm -rf "$SPORE_TMP" "$SPORE_OUT"
    echo "SPORE-SCENARIO-END $2"
}

if [ -c /dev/kvm ]; then
    read -r up _ </proc/uptime
    echo "NESTED-KVM ok (${up}s)"
    # What a scenario may use.
    export SPORE=/bin/spore
    if [ -f /guest/Image ]; then
        # arm64 (run.sh --arch arm64): an Image, no bzImage.
        export GUEST_KERNEL=/guest/Image
    else
        export GUEST_KERNEL=/guest/vmlinux GUEST_BZIMAGE=/guest/bzImage
    fi
    # The list is read first: a scenario's stdin stays the console.
    # shellcheck disable=SC2046 # index and name pairs, no spaces
    set -- $(cat /scenarios/list)
    while [ $# -ge 2 ]; do
        run_scenario "/scenarios/$1" "$2"
        shift 2
    done
else
    echo "NESTED-KVM fail: no /dev/kvm after loading $(tr '\n' ' ' </lib/modules/load-order)"
    dmesg | grep -i -E 'kvm|svm|started at EL' | tail -n 20
fi

read -r up _ </proc/uptime
echo "SPORE-L1 poweroff at ${up}s"
sync
poweroff -f
while :; do sleep 3600; done
