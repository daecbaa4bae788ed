#!/usr/bin/env bash
# Nested end-to-end harness (test tier 3): runs scenarios inside an L1 Linux
# VM that has a real hardware-virtualization KVM, on machines whose own KVM
# cannot run Linux guests.
#
#   QEMU TCG (-machine q35 -cpu EPYC,+svm)          <- this script
#     L1: Debian cloud kernel + kvm/kvm_amd modules  <- l1-init.sh, /scenarios/*
#       L2: spore guest (guest/build-kernel.sh, guest/build-initramfs.sh)
#           run by the spore binary given with --spore
#
# --arch arm64 (issue 15) runs the same stack for aarch64: QEMU TCG
# `-machine virt,virtualization=on,gic-version=3 -cpu max` (EL2, so L1's KVM
# runs in VHE mode), Debian's arm64 cloud kernel (KVM built in) with
# busybox-static:arm64 (both from l1-kernel.sh --arch arm64), the arm64 guest
# (build-kernel.sh/build-initramfs.sh --arch arm64), and a static aarch64 spore.
#
# One L1 boot runs every --scenario given, in order (l1-init.sh): each in a
# fresh directory of its own, with its own guest initramfs, and what it left
# running killed after it. A scenario is a busybox sh script run as root in L1 with
#   SPORE=/bin/spore  GUEST_KERNEL=/guest/vmlinux  GUEST_BZIMAGE=/guest/bzImage
#   GUEST_INITRD=<its guest initramfs>  SPORE_OUT=<its output directory>
#   SPORE_TMP=<its own directory, also its cwd>
# (arm64: GUEST_KERNEL=/guest/Image, the arm64 Image; no GUEST_BZIMAGE).
# It reports results as lines `SPORE-TEST <name> PASS|FAIL|SKIP [detail]`
# (from L1 or relayed from an L2 console). Files it leaves in $SPORE_OUT come
# back to its --out-dir (base64 tar over the serial console).
#
# Each scenario gets its own results, log and "<name>: P passed, F failed, S
# skipped" line. It passes only if there was at least one result, no FAIL,
# /dev/kvm came up in L1, the scenario exited 0 within its --timeout, and L1
# kept making progress. When L1 stops (a stall, a crash, a timeout), the
# scenario that was running gets the problem and those after it are reported
# as not run (run-all.sh runs them in a fresh L1). Exit status 0 only if
# every scenario passed.

set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
# shellcheck source=guest/lib.sh
source "$repo/guest/lib.sh"

usage() {
    cat >&2 <<'USAGE'
usage: tests/nested/run.sh --scenario FILE [scenario options] [--scenario FILE ...] [options]
  --scenario FILE          L1 scenario script (required; repeatable: one L1
                           runs them in order). The scenario options after it
                           (or before the first --scenario) are its own:
    --name NAME              its name in reports (default: FILE's base name)
    --guest-scenario FILE    becomes /scenario in its L2 guest initramfs
    --guest-file SRC[:DEST]  extra file for its L2 guest initramfs (repeatable)
    --timeout SECS           stop L1 and fail it after SECS (default 900)
    --stall-timeout SECS     stop L1 when nothing progressed for SECS (default
                             120): no result, no L1 progress line (l1-init.sh
                             prints one when the scenario's files, L1's
                             network counters or a VMM's memory changed), no
                             scenario start or end; the run stalled or hung (an
                             open bug of the emulated stack, see
                             guest/README.md); run-all.sh runs it again
    --out-dir DIR            unpack the files it left in $SPORE_OUT here
    --host-driver FILE       a script run on this host when the scenario
                             prints `SPORE-HOST-GO <name>`: it reaches L1's
                             --hostfwd ports at 127.0.0.1:$SPORE_FWD_<port>
                             (clients that live on the host, the e2b SDK's
                             Python say, drive what runs in L1); its output
                             goes to <log>.host; it reports to the scenario
                             through a forwarded port of the scenario's own
    --log FILE               its part of the serial log (default
                             /tmp/spore-nested/<name>.log)
  --spore PATH             static spore binary, installed in L1 as /bin/spore
  --file SRC[:DEST]        extra file for the L1 initramfs (repeatable)
  --l1-module NAME         a kernel module L1 loads, with its dependencies
                           (repeatable; e.g. nf_tables for spore serve's NAT)
  --l1-log FILE            the whole serial log (default: the scenario's log
                           when there is one scenario, else
                           /tmp/spore-nested/l1-<first name>.log)
  --report-dir DIR         per scenario: DIR/<name>.status (passed, failed or
                           not-run) and DIR/<name>.out (its report)
  --memory MIB --smp N     L1 size (default 3072, 2; the largest --memory given)
  --scratch-disk MIB[:DIR] a disk of MIB MiB (ext4, with DIR's contents when
                           given) that L1 mounts at /scratch and scenarios
                           find as $SPORE_SCRATCH: files whose page cache can
                           be dropped (the initramfs's cannot); QEMU opens it
                           with cache=none, so reads after a drop go to disk
  --append ARGS            extra L1 kernel command line
  --hostfwd PORT           forward a free port of this host's loopback to L1's
                           TCP PORT (repeatable; L1 gets a virtio-net NIC,
                           10.0.2.15/24, under QEMU's user network, which
                           reaches nothing else); direct mode: PORT itself
  --quiet                  do not stream the serial console to stdout
  --mode auto|qemu|direct  direct: run the scenarios on this host, without QEMU
                           (needs a KVM that runs Linux guests: kvm_intel or
                           kvm_amd, not kvm_pvm; arm64: an aarch64 host with
                           /dev/kvm); auto (default) picks direct on such a
                           host and qemu elsewhere
  --arch x86_64|arm64      the L1 and L2 architecture (default x86_64); arm64
                           needs a static aarch64 spore (make static-arm64)
USAGE
    exit 2
}

spore="" l1_log="" report_dir="" append=""
hostfwd_ports=()
memory=3072 smp=2 quiet=0 mode=auto scratch_mib="" scratch_dir="" arch=x86_64
l1_files=()
extra_modules=()
# Per scenario (index i): file, name, guest scenario, guest files (one spec
# a line), output dir, log, timeout, stall timeout.
sc_file=() sc_name=() sc_guest=() sc_gfiles=() sc_out=() sc_log=() sc_timeout=() sc_stall=() sc_driver=()
cur=0
while [[ $# -gt 0 ]]; do
    case "$1" in
    --scenario)
        [[ -n ${sc_file[cur]-} ]] && cur=$((cur + 1))
        sc_file[cur]="${2:?}"; shift 2 ;;
    --name) sc_name[cur]="${2:?}"; shift 2 ;;
    --guest-scenario) sc_guest[cur]="${2:?}"; shift 2 ;;
    --guest-file) sc_gfiles[cur]="${sc_gfiles[cur]-}${2:?}"$'\n'; shift 2 ;;
    --timeout) sc_timeout[cur]="${2:?}"; shift 2 ;;
    --stall-timeout) sc_stall[cur]="${2:?}"; shift 2 ;;
    --out-dir) sc_out[cur]="${2:?}"; shift 2 ;;
    --host-driver) sc_driver[cur]="${2:?}"; shift 2 ;;
    --hostfwd)
        [[ $2 =~ ^[0-9]+$ ]] || die "--hostfwd takes a TCP port"
        hostfwd_ports+=("$2"); shift 2 ;;
    --log) sc_log[cur]="${2:?}"; shift 2 ;;
    --spore) spore="${2:?}"; shift 2 ;;
    --file) l1_files+=("${2:?}"); shift 2 ;;
    --l1-module) extra_modules+=("${2:?}"); shift 2 ;;
    --l1-log) l1_log="${2:?}"; shift 2 ;;
    --report-dir) report_dir="${2:?}"; shift 2 ;;
    --memory)
        [[ $2 =~ ^[0-9]+$ ]] || die "--memory takes a whole number"
        ((${2} > memory)) && memory=$2
        shift 2 ;;
    --smp) smp="${2:?}"; shift 2 ;;
    --scratch-disk) scratch_mib="${2%%:*}"; [[ $2 == *:* ]] && scratch_dir="${2#*:}"; shift 2 ;;
    --append) append="$append ${2:?}"; shift 2 ;;
    --quiet) quiet=1; shift ;;
    --mode) mode="${2:?}"; shift 2 ;;
    --arch) arch="${2:?}"; shift 2 ;;
    -h | --help) usage ;;
    *) echo "unknown argument: $1" >&2; usage ;;
    esac
done
[[ -n ${sc_file[0]-} ]] || { echo "--scenario is required" >&2; usage; }
nsc=${#sc_file[@]}
for ((i = 0; i < nsc; i++)); do
    [[ -f ${sc_file[i]} ]] || die "scenario not found: ${sc_file[i]}"
    sc_name[i]="${sc_name[i]:-$(basename "${sc_file[i]}" .sh)}"
    [[ ${sc_name[i]} =~ ^[A-Za-z0-9_.-]+$ ]] || die "--name: letters, digits, ., _ and - only"
    sc_timeout[i]="${sc_timeout[i]:-900}" sc_stall[i]="${sc_stall[i]:-120}"
    sc_log[i]="${sc_log[i]:-/tmp/spore-nested/${sc_name[i]}.log}"
    [[ ${sc_timeout[i]} =~ ^[0-9]+$ && ${sc_stall[i]} =~ ^[0-9]+$ ]] ||
        die "--timeout and --stall-timeout take whole numbers"
    [[ -z ${sc_guest[i]-} || -f ${sc_guest[i]} ]] || die "guest scenario not found: ${sc_guest[i]}"
    [[ -z ${sc_driver[i]-} || -f ${sc_driver[i]} ]] || die "host driver not found: ${sc_driver[i]}"
    mkdir -p "$(dirname "${sc_log[i]}")"
done
if [[ -z $l1_log ]]; then
    if ((nsc == 1)); then l1_log="${sc_log[0]}"; else l1_log="/tmp/spore-nested/l1-${sc_name[0]}.log"; fi
fi
mkdir -p "$(dirname "$l1_log")"
[[ $smp =~ ^[0-9]+$ ]] || die "--smp takes a whole number"
[[ -z $scratch_mib || $scratch_mib =~ ^[0-9]+$ ]] || die "--scratch-disk takes MIB[:DIR]"
[[ -z $scratch_dir || -d $scratch_dir ]] || die "--scratch-disk: no directory $scratch_dir"
# arch_args: passed on to the asset scripts (none for x86_64, as before --arch).
case $arch in
x86_64 | amd64) arch=x86_64 arch_args=() musl_target=x86_64-unknown-linux-musl ;;
arm64 | aarch64) arch=arm64 arch_args=(--arch arm64) musl_target=aarch64-unknown-linux-musl ;;
*) die "--arch takes x86_64 or arm64" ;;
esac
# A KVM that runs Linux guests itself (hardware virtualization) needs no QEMU.
native_kvm() {
    if [[ $arch == arm64 ]]; then
        [[ $(uname -m) == aarch64 && -c /dev/kvm ]]
        return
    fi
    [[ -c /dev/kvm && ! -d /sys/module/kvm_pvm ]] &&
        { [[ -d /sys/module/kvm_intel ]] || [[ -d /sys/module/kvm_amd ]]; }
}
case $mode in
auto) if native_kvm; then mode=direct; else mode=qemu; fi ;;
qemu) ;;
direct)
    if [[ $arch == arm64 ]]; then
        native_kvm || die "--mode direct --arch arm64 needs an aarch64 host with /dev/kvm"
    else
        native_kvm || die "--mode direct needs kvm_intel or kvm_amd on this host"
    fi
    ;;
*) die "--mode takes auto, qemu or direct" ;;
esac
if [[ -n $spore ]]; then
    [[ -x $spore ]] || die "spore binary not found or not executable: $spore"
    spore="$(realpath "$spore")"
    # An x86 spore cannot run in an arm64 L1 (or guest-side helpers): refuse
    # it here rather than as an exec format error in L1.
    if [[ $arch == arm64 ]]; then
        machine="$(LC_ALL=C readelf -h "$spore" 2>/dev/null | sed -n 's/^ *Machine: *//p')"
        [[ $machine == AArch64 ]] ||
            die "$spore is not an aarch64 binary (readelf -h Machine: ${machine:-not an ELF file}); --arch arm64 needs a static $musl_target spore (make static-arm64)"
    fi
    # L1 has no C library: a dynamically linked spore cannot start there.
    if [[ $mode == qemu ]] && LC_ALL=C readelf -l "$spore" 2>/dev/null | grep -q 'Requesting program interpreter'; then
        die "$spore is dynamically linked; build it for $musl_target"
    fi
fi

if [[ $mode == qemu && $arch == arm64 ]]; then
    ensure_packages qemu-system-arm busybox-static cpio binutils python3
elif [[ $mode == qemu ]]; then
    ensure_packages qemu-system-x86 busybox-static cpio binutils
else
    ensure_packages busybox-static cpio
fi
# L1 runs under the pinned QEMU 10.0 of qemu.sh (Debian 12's own 7.2 has
# emulator bugs this stack meets, guest/README.md); SPORE_NESTED_QEMU=system
# runs the system's QEMU instead, as does a machine that cannot fetch 10.0.
if [[ $mode == qemu ]]; then
    qemu_bin=""
    if [[ ${SPORE_NESTED_QEMU:-} != system ]]; then qemu_bin="$("$here/qemu.sh" | tail -n1)"; fi
    if [[ -n $qemu_bin ]]; then
        PATH="$qemu_bin:$PATH"
    fi
    if [[ $arch == arm64 ]]; then qemu_name=qemu-system-aarch64; else qemu_name=qemu-system-x86_64; fi
    log "L1 runs under $($qemu_name --version | head -n1)"
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/spore-nested.XXXXXX")"
qemu_pid=""
driver_pids=()
cleanup() {
    [[ -n $qemu_pid ]] && kill "$qemu_pid" 2>/dev/null
    stop_host_drivers
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- assets (each cached by content). arm64: the kernel is an Image, and
# there is no bzImage.
guest_kernel="$("$repo/guest/build-kernel.sh" "${arch_args[@]}" | tail -n1)"
bzimage=""
if [[ $arch == x86_64 ]]; then
    bzimage="$(dirname "$guest_kernel")/bzImage"
    [[ -f $bzimage ]] || die "no bzImage beside $guest_kernel"
fi
# The scenarios' shared helpers, at the same path in L1 and in the L2 guest.
scenario_lib="$here/scenarios/lib.sh:/lib/spore/scenario-lib.sh"
# Each scenario's guest initramfs (its guest scenario and guest files).
sc_initrd=()
for ((i = 0; i < nsc; i++)); do
    gspecs=("$scenario_lib")
    while IFS= read -r spec; do [[ -n $spec ]] && gspecs+=("$spec"); done <<<"${sc_gfiles[i]-}"
    [[ -n ${sc_guest[i]-} ]] && gspecs+=("${sc_guest[i]}:/scenario")
    sc_initrd[i]="$("$repo/guest/build-initramfs.sh" "${arch_args[@]}" "$work/guest-$i.cpio" "${gspecs[@]}" | tail -n1)"
done
l1_modules=()
[[ -n $scratch_mib ]] && l1_modules=(virtio_pci virtio_blk)
# --hostfwd: L1's NIC on QEMU's user network, and the host ports forwarded
# (SPORE_FWD_<L1 port>=<host port>, for the host drivers).
net_args=()
if ((${#hostfwd_ports[@]})); then
    l1_modules+=(virtio_pci virtio_net)
    fwd=""
    for p in "${hostfwd_ports[@]}"; do
        if [[ $mode == direct ]]; then
            hp=$p
        else
            hp="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
            fwd="$fwd,hostfwd=tcp:127.0.0.1:$hp-10.0.2.15:$p"
        fi
        export "SPORE_FWD_$p=$hp"
    done
    # restrict=on: L1 reaches nothing outside; the forwards still come in.
    # shellcheck disable=SC2054 # the commas are QEMU option syntax
    [[ $mode == direct ]] || net_args=(-netdev "user,id=n0,restrict=on$fwd" -device virtio-net-pci,netdev=n0)
    append="$append spore.l1net=1"
fi
# SPORE_NESTED_KVM_AMD=P1,P2: L1's kvm_amd parameters (l1-init.sh), e.g.
# npt=0 for shadow paging of L2 guests instead of emulated nested paging.
[[ -n ${SPORE_NESTED_KVM_AMD:-} ]] && append="$append spore.kvm_amd=$SPORE_NESTED_KVM_AMD"
l1_modules+=("${extra_modules[@]}")
l1="$("$here/l1-kernel.sh" "${arch_args[@]}" "${l1_modules[@]}" | tail -n1)"

# What one scenario's run left, for report_scenario: sc_section[i] (its part
# of the serial log, carriage returns dropped), sc_elapsed[i] (s), sc_begun[i]
# (1 if it started), sc_problem[i] (newline-separated: what stopped L1 while
# it ran, or what kept it from starting).
sc_section=() sc_elapsed=() sc_begun=() sc_problem=()

# start_host_driver I: runs scenario I's --host-driver in the background (its
# own process group, killed at exit), once.
start_host_driver() {
    local i=$1
    [[ -n ${sc_driver[i]-} && -z ${driver_started[i]-} ]] || return 0
    driver_started[i]=1
    log "scenario ${sc_name[i]} is ready: starting its host driver ${sc_driver[i]} (log ${sc_log[i]}.host)"
    setsid bash "${sc_driver[i]}" >"${sc_log[i]}.host" 2>&1 &
    driver_pids+=($!)
}
driver_started=()
stop_host_drivers() {
    local p
    for p in "${driver_pids[@]}"; do kill -- "-$p" 2>/dev/null || kill "$p" 2>/dev/null || true; done
    driver_pids=()
}

# --- direct: each scenario runs on this host with the same environment an
# L1 gives it (files under $SPORE_ROOT instead of /, scratch in $SPORE_TMP).
run_direct_one() {
    local i=$1 root="$work/root" name=${sc_name[i]} log_file=${sc_log[i]}
    local tmp="$work/tmp-$i" out="$work/out-$i"
    mkdir -p "$root" "$out" "$tmp"
    local scratch=""
    if [[ -n $scratch_mib ]]; then
        scratch="$work/scratch-$i"
        mkdir -p "$scratch"
        [[ -n $scratch_dir ]] && cp -a "$scratch_dir/." "$scratch/"
    fi
    for spec in "${l1_files[@]}" "$scenario_lib"; do add_file_spec "$root" "$spec"; done
    log "running $name directly on this host's KVM (timeout ${sc_timeout[i]}s, log $log_file)"
    local start=$EPOCHREALTIME rc=0 watcher=""
    : >"$log_file"
    if [[ -n ${sc_driver[i]-} ]]; then
        # The host driver starts when the scenario says it is ready.
        (
            until grep -aq "^SPORE-HOST-GO $name\$" "$log_file" 2>/dev/null; do sleep 0.5; done
            start_host_driver "$i"
            wait
        ) &
        watcher=$!
    fi
    {
        echo "NESTED-KVM ok (direct, $(uname -r))"
        (
            if [[ -n $bzimage ]]; then export GUEST_BZIMAGE="$bzimage"; else unset GUEST_BZIMAGE; fi
            cd "$tmp" &&
                SPORE="$spore" GUEST_KERNEL="$guest_kernel" GUEST_INITRD="${sc_initrd[i]}" \
                    SPORE_OUT="$out" SPORE_ROOT="$root" SPORE_TMP="$tmp" SPORE_SCRATCH="$scratch" \
                    timeout --kill-after=10 "${sc_timeout[i]}" sh "${sc_file[i]}"
        ) || rc=$?
        ((rc == 124 || rc == 137)) && echo "SPORE-DIRECT timeout"
        echo "SPORE-L1 scenario exit $rc"
    } >>"$log_file" 2>&1
    if [[ -n $watcher ]]; then
        kill "$watcher" 2>/dev/null || true
        pkill -P "$watcher" 2>/dev/null || true
    fi
    [[ $quiet == 1 ]] || cat "$log_file"
    sc_begun[i]=1
    sc_section[i]="$(tr -d '\r' <"$log_file")"
    sc_elapsed[i]=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
    grep -q '^SPORE-DIRECT timeout' "$log_file" && sc_problem[i]="timeout after ${sc_timeout[i]}s (killed)"
    if [[ -n ${sc_out[i]-} && -n "$(ls -A "$out")" ]]; then
        mkdir -p "${sc_out[i]}" && cp -a "$out/." "${sc_out[i]}/"
    fi
}

# --- qemu: one L1 initramfs with every scenario (/scenarios/list: index and
# name a line; /scenarios/I/{scenario,initramfs.cpio,stall_report_s}).
# Uncompressed: under TCG the L1 kernel unpacks plain cpio faster than it
# inflates gzip, and it is rebuilt each run (spore changes).
build_l1_initramfs() {
    log "building the L1 initramfs ($nsc scenario(s))"
    local root="$work/l1root" i d
    populate_busybox_root "$root"
    # arm64: the applet links are the host's busybox-static's (the same Debian
    # version builds the same applets), the binary is busybox-static:arm64's.
    [[ $arch == arm64 ]] && install -m 0755 "$l1/busybox" "$root/bin/busybox"
    install -m 0755 "$here/l1-init.sh" "$root/init"
    mkdir -p "$root/lib/modules" "$root/guest" "$root/scenarios"
    cp "$l1/load-order" "$root/lib/modules/"
    find "$l1/modules" -name '*.ko' -exec cp -t "$root/lib/modules/" {} +
    if [[ $arch == arm64 ]]; then
        cp "$guest_kernel" "$root/guest/Image"
    else
        cp "$guest_kernel" "$root/guest/vmlinux"
        cp "$bzimage" "$root/guest/bzImage"
    fi
    : >"$root/scenarios/list"
    for ((i = 0; i < nsc; i++)); do
        d="$root/scenarios/$i"
        mkdir -p "$d"
        install -m 0755 "${sc_file[i]}" "$d/scenario"
        cp "${sc_initrd[i]}" "$d/initramfs.cpio"
        # L1's own stall report (l1-init.sh) comes before run.sh gives up.
        echo $((sc_stall[i] * 2 / 3)) >"$d/stall_report_s"
        echo "$i ${sc_name[i]}" >>"$root/scenarios/list"
    done
    [[ -n $spore ]] && install -m 0755 "$spore" "$root/bin/spore"
    for spec in "${l1_files[@]}" "$scenario_lib"; do add_file_spec "$root" "$spec"; done
    pack_cpio "$root" "$work/l1.cpio"
}

# --- the scratch disk (sparse; mke2fs -d copies DIR in, no mount needed).
# cache=none (O_DIRECT) where the host's file system takes it: a page
# dropped in L1 is then read from the host's disk again, not from its cache.
scratch_args=()
make_scratch_disk() {
    [[ -n $scratch_mib ]] || return 0
    ensure_packages e2fsprogs
    local img="$work/scratch.img" cache=none
    mke2fs -q -t ext4 -L spore-scratch -E lazy_itable_init=0,lazy_journal_init=0 \
        ${scratch_dir:+-d "$scratch_dir"} "$img" "${scratch_mib}M"
    dd if=/dev/zero of="$work/.odirect" bs=4096 count=1 oflag=direct status=none 2>/dev/null || cache=writeback
    rm -f "$work/.odirect"
    scratch_args=(-drive "file=$img,if=virtio,format=raw,cache=$cache,aio=threads")
    append="$append spore.scratch=1"
    log "scratch disk: $scratch_mib MiB (cache=$cache)${scratch_dir:+ from $scratch_dir}"
}

start_qemu() {
    local monitor=$1
    # no_timer_check: on a loaded host, TCG is too slow for L1's check that the
    # timer interrupt works, and L1 panicked ("IO-APIC + timer doesn't work").
    # The monitor on a socket of its own: on a stall, qemu-state.py asks it where
    # L1's CPUs are (nokaslr: a kernel RIP is the same address in every run).
    # shellcheck disable=SC2054 # the commas are QEMU option syntax
    local qemu=(qemu-system-x86_64 -machine q35,accel=tcg -cpu EPYC,+svm -m "$memory" -smp "$smp"
        -nographic -no-reboot -net none -monitor "unix:$monitor,server=on,wait=off"
        -kernel "$l1/vmlinuz" -initrd "$work/l1.cpio" "${scratch_args[@]}" "${net_args[@]}"
        -append "console=ttyS0 quiet panic=-1 audit=1 print-fatal-signals=1 no_timer_check nokaslr $append")
    # arm64: the machine of tests/nested-arm64/probe.sh (EL2 for L1's KVM,
    # GICv3); its console is the PL011, ttyAMA0.
    if [[ $arch == arm64 ]]; then
        # shellcheck disable=SC2054 # the commas are QEMU option syntax
        qemu=(qemu-system-aarch64 -machine virt,accel=tcg,virtualization=on,gic-version=3 -cpu max -m "$memory" -smp "$smp"
            -nographic -no-reboot -net none -monitor "unix:$monitor,server=on,wait=off"
            -kernel "$l1/vmlinuz" -initrd "$work/l1.cpio" "${scratch_args[@]}"
            -append "console=ttyAMA0 quiet panic=-1 audit=1 print-fatal-signals=1 nokaslr $append")
    fi
    : >"$l1_log"
    # QEMU runs in the background so the watch can kill exactly it.
    "${qemu[@]}" </dev/null >"$l1_log" 2>&1 &
    qemu_pid=$!
    if [[ $quiet == 0 ]]; then
        # Drop carriage returns and the firmware's terminal resets (SeaBIOS
        # clears the screen), and hide QEMU's list of EPYC features TCG lacks;
        # the log keeps everything.
        tail -n +1 -f --pid="$qemu_pid" "$l1_log" |
            sed -u -e 's/\r//g' -e 's/\x1bc//g' -e 's/\x1b\[[0-9;?]*[A-Za-z]//g' |
            grep -av --line-buffered "TCG doesn't support requested feature" &
    fi
}

# Progress, as run.sh sees it: a line of one of these kinds. l1-init.sh prints
# `SPORE-L1 progress` (at most every 10 s) while the running scenario's files,
# L1's network counters or a VMM's resident memory change; an L1 whose CPUs
# spin with interrupts off (seen: both in L1's kernel, in `__schedule` and
# `asm_exc_int3`, the shape of int3-based text patching as KVM flips static
# keys, guest/README.md) prints nothing, and neither does a stuck L2.
progress_re='SPORE-TEST |SPORE-L1 up|SPORE-L1 progress|SPORE-SCENARIO-(BEGIN|END) |NESTED-KVM'

# watch_l1: waits for QEMU, stopping it when the running scenario's
# --timeout passed (timed_out), nothing progressed for its --stall-timeout
# (hung; before the first scenario: the first one's), or L1's watchdog saw a
# CPU stuck in its kernel (lockup: an open bug of the emulated stack, the run
# cannot finish). Records when each scenario began and ended (sc_t0, sc_t1).
watch_l1() {
    local monitor=$1 n seen=0 begun=0 ended=0 b e cur_deadline=0
    # L1's boot up to its init's first line (quiet: the kernel prints nothing
    # before) has twice the window: under TCG on a loaded host it unpacks an
    # initramfs of every scenario's files.
    local progress_deadline=$((SECONDS + 2 * sc_stall[0]))
    # L1's boot (before the first scenario) is bounded too.
    local boot_deadline=$((SECONDS + 900))
    timed_out=0 lockup=0 hung=0 max_quiet=0
    local last_progress=$SECONDS
    while kill -0 "$qemu_pid" 2>/dev/null; do
        sleep 1
        n=$(grep -acE "$progress_re" "$l1_log" || true)
        b=$(grep -ac 'SPORE-SCENARIO-BEGIN ' "$l1_log" || true)
        e=$(grep -ac 'SPORE-SCENARIO-END ' "$l1_log" || true)
        while ((begun < b)); do
            sc_t0[begun]=$EPOCHREALTIME
            cur_deadline=$((SECONDS + sc_timeout[begun]))
            begun=$((begun + 1))
        done
        while ((ended < e)); do sc_t1[ended]=$EPOCHREALTIME ended=$((ended + 1)); done
        if ((begun > ended)) && [[ -n ${sc_driver[begun - 1]-} && -z ${driver_started[begun - 1]-} ]] &&
            grep -aq "SPORE-HOST-GO ${sc_name[begun - 1]}" "$l1_log"; then
            start_host_driver $((begun - 1))
        fi
        # The window of the scenario running (or about to).
        local cur=$((begun > ended ? begun - 1 : (ended < nsc ? ended : nsc - 1)))
        if ((n != seen)); then
            # The longest quiet stretch after the boot (run_qemu logs it): how
            # close a passing run came to the stall timeout.
            ((seen > 0 && SECONDS - last_progress > max_quiet)) && max_quiet=$((SECONDS - last_progress))
            seen=$n progress_deadline=$((SECONDS + sc_stall[cur])) last_progress=$SECONDS
        fi
        if ((!lockup)) && grep -aq 'watchdog: BUG: soft lockup' "$l1_log"; then
            lockup=1
        elif ((SECONDS >= progress_deadline)); then
            hung=1
        elif ((begun > ended && SECONDS >= cur_deadline)) || ((begun == 0 && SECONDS >= boot_deadline)); then
            timed_out=1
        fi
        if ((lockup || hung || timed_out)); then
            # Where every L1 CPU is, twice a second apart (a CPU that is stuck
            # stays put); added to the log once QEMU, which writes it, is gone.
            for _ in 1 2; do
                "$here/qemu-state.py" "$monitor" >>"$work/qemu-state.txt" 2>&1 || true
                sleep 1
            done
            kill "$qemu_pid" 2>/dev/null || true
            sleep 2
            kill -KILL "$qemu_pid" 2>/dev/null || true
            break
        fi
    done
}

run_qemu() {
    build_l1_initramfs
    make_scratch_disk
    local monitor="$work/qemu-monitor.sock"
    if [[ $arch == arm64 ]]; then
        log "booting the arm64 L1 under QEMU TCG with EL2 for ${sc_name[*]} (log $l1_log)"
    else
        log "booting L1 under QEMU TCG+SVM for ${sc_name[*]} (log $l1_log)"
    fi
    local start=$EPOCHREALTIME
    sc_t0=() sc_t1=()
    start_qemu "$monitor"
    watch_l1 "$monitor"
    local qemu_rc=0
    wait "$qemu_pid" || qemu_rc=$?
    qemu_pid=""
    # L1 is gone: so is what its host drivers talk to (and `wait` below
    # would wait for them).
    stop_host_drivers
    [[ -f $work/qemu-state.txt ]] && cat "$work/qemu-state.txt" >>"$l1_log"
    wait 2>/dev/null || true # the log follower
    local clean="$work/serial.txt"
    tr -d '\r' <"$l1_log" >"$clean"
    # L1's kernel crashed (seen: "corrupted stack end detected inside scheduler"
    # as a vCPU thread of a VMM ran, spore's or Firecracker's; guest/README.md):
    # with panic=-1 and -no-reboot QEMU ends at once, before L1's orderly
    # poweroff. A user process cannot do that to a kernel: it is the emulated
    # stack's bug, and the run could not finish.
    local crashed=0
    if ((!lockup && !hung && !timed_out)) && ! grep -aq 'SPORE-L1 poweroff' "$clean" &&
        grep -aq 'Kernel panic - not syncing' "$clean"; then
        crashed=1
    fi
    # What stopped L1 belongs to the scenario that ran (or was next).
    local i stopper=-1 why=()
    local kvm_ok=1
    grep -aq '^NESTED-KVM ok' "$clean" || kvm_ok=0
    for ((i = 0; i < nsc; i++)); do
        sc_begun[i]=0
        if grep -aqx "SPORE-SCENARIO-BEGIN ${sc_name[i]}" "$clean"; then
            sc_begun[i]=1
            sc_section[i]="$(sed -n "/^SPORE-SCENARIO-BEGIN ${sc_name[i]}\$/,/^SPORE-SCENARIO-END ${sc_name[i]}\$/p" "$clean")"
            grep -aqx "SPORE-SCENARIO-END ${sc_name[i]}" "$clean" || stopper=$i
        fi
    done
    if ((stopper < 0)); then
        for ((i = 0; i < nsc; i++)); do ((sc_begun[i])) || { stopper=$i; break; }; done
    fi
    ((timed_out)) && why+=("timeout after ${sc_timeout[stopper]}s (QEMU killed)")
    ((lockup)) && why+=("L1 soft lockup: L1's watchdog reported a CPU stuck in its kernel (QEMU killed; see the log)")
    ((hung)) && why+=("L1 hang: nothing progressed for ${sc_stall[stopper]}s (QEMU killed; L1's stall report, if L1 still ran, and where L1's CPUs were are in the log)")
    ((crashed)) && why+=("L1 kernel crash: L1's kernel panicked (QEMU stopped; the oops is in the log)")
    ((!timed_out && !lockup && !hung && !crashed && qemu_rc != 0)) && why+=("QEMU exited with status $qemu_rc")
    ((kvm_ok)) || why+=("nested KVM did not come up in L1 ($(grep -a '^NESTED-KVM' "$clean" || echo 'no NESTED-KVM line'))")
    if ((stopper >= 0)); then
        sc_problem[stopper]="$(printf '%s\n' "${why[@]}")"
        # Its part of the log runs to the end: the stall report, the CPU state.
        if ((sc_begun[stopper])); then
            sc_section[stopper]="$(sed -n "/^SPORE-SCENARIO-BEGIN ${sc_name[stopper]}\$/,\$p" "$clean")"
        else
            sc_section[stopper]="$(cat "$clean")"
            sc_begun[stopper]=1
        fi
    elif ((${#why[@]})); then
        # Every scenario ended, and then L1 did not power off cleanly.
        sc_problem[nsc - 1]="$(printf '%s\n' "${why[@]}")"
    fi
    local t_end=$EPOCHREALTIME
    for ((i = 0; i < nsc; i++)); do
        ((sc_begun[i])) || continue
        local t0=${sc_t0[i]:-$start} t1=${sc_t1[i]:-$t_end}
        ((i == 0)) && t0=$start # the first scenario's time includes L1's boot
        sc_elapsed[i]=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
        if [[ ${sc_log[i]} != "$l1_log" ]]; then
            { echo "(part of the L1 serial log $l1_log)"; printf '%s\n' "${sc_section[i]}"; } >"${sc_log[i]}"
        fi
    done
    log "L1 ran $(awk -v a="$start" -v b="$t_end" 'BEGIN { printf "%.1f", b - a }')s, at most ${max_quiet}s without progress after its boot (log $l1_log)"
}

# report_scenario I: prints scenario I's results and problems, and the line
# "<name>: P passed, F failed, S skipped (...)"; returns 0 if it passed.
report_scenario() {
    local i=$1 name=${sc_name[i]} section results pass fail skip
    section="${sc_section[i]}"
    results="$(grep -aoE 'SPORE-TEST [^ ]+ (PASS|FAIL|SKIP)( .*)?$' <<<"$section" || true)"
    count() { grep -cE "^SPORE-TEST [^ ]+ $1( |$)" <<<"$results" || true; }
    pass=$(count PASS) fail=$(count FAIL) skip=$(count SKIP)
    local problems=()
    while IFS= read -r p; do [[ -n $p ]] && problems+=("$p"); done <<<"${sc_problem[i]-}"
    # (Without KVM in L1 no scenario ran: that problem is the first one's.)
    if [[ $mode == direct ]] || grep -aq '^NESTED-KVM ok' "$work/serial.txt"; then
        local scenario_rc
        scenario_rc="$(sed -n 's/^SPORE-L1 scenario exit \([0-9]*\)$/\1/p' <<<"$section" | tail -n1)"
        [[ -n $scenario_rc ]] || problems+=("scenario did not finish")
        [[ -z $scenario_rc || $scenario_rc == 0 ]] || problems+=("scenario exited with status $scenario_rc")
    fi
    ((pass + fail + skip > 0)) || problems+=("no SPORE-TEST results")
    # What L1's kernel said during the scenario (l1-init.sh prints it after
    # each): a seccomp kill record (audit type 1326 with SIGSYS, 31; L1 boots
    # with audit=1; SPORE_SECCOMP_LOG's records have no signal) names the VMM
    # thread and the syscall its filter refused, and a process killed by a
    # fault (print-fatal-signals=1) has its registers printed; neither is
    # retried (a fault only counts as a problem in a run with failed checks).
    # A kernel warning (a splat from an ioctl) in a run with failed checks
    # and neither of those is the emulated stack's: seen once as an arm64
    # guest reset before its first console line, at L1's first VM; run-all.sh
    # runs it again, as it does L1's crashes.
    local kernel_lines
    kernel_lines="$(grep -a '^SPORE-L1-KERNEL ' <<<"$section" | sed 's/^SPORE-L1-KERNEL //' || true)"
    if grep -q 'type=1326.* sig=31 ' <<<"$kernel_lines"; then
        problems+=("seccomp kill in L1: $(grep -m1 'type=1326.* sig=31 ' <<<"$kernel_lines" | grep -o 'comm=.*')")
    elif ((fail > 0)) && grep -q 'fatal signal' <<<"$kernel_lines"; then
        problems+=("a process in L1 was killed by $(grep -m1 -o 'fatal signal [0-9]*' <<<"$kernel_lines") (its registers are below)")
    elif ((fail > 0)) && grep -q '^L2 triple fault: ' <<<"$kernel_lines"; then
        # L1's KVM saw an L2 guest shut down by a triple fault (l1-init.sh
        # traces KVM's SHUTDOWN exits): the open "fourth shape"
        # (guest/README.md), retried by run-all.sh like a VMM log naming it.
        problems+=("L2 guest triple fault: L1's KVM saw a guest reset by a triple fault (its trace is below)")
    elif ((fail > 0)) && grep -q 'cut here' <<<"$kernel_lines"; then
        problems+=("L1 kernel warning: L1's kernel warned during the run (its report is below and in the log)")
    fi
    if [[ $mode == qemu && -n ${sc_out[i]-} ]] && grep -aq '^SPORE-OUT-BEGIN$' <<<"$section"; then
        mkdir -p "${sc_out[i]}"
        if sed -n '/^SPORE-OUT-BEGIN$/,/^SPORE-OUT-END$/p' <<<"$section" | sed '1d;$d' | base64 -d | tar -xz -C "${sc_out[i]}"; then
            log "$name: scenario output unpacked into ${sc_out[i]}"
        else
            problems+=("could not unpack the scenario's \$SPORE_OUT into ${sc_out[i]}")
        fi
    fi
    echo
    [[ -z $results ]] || printf '%s\n' "$results" | sed 's/^SPORE-TEST /  /'
    local p
    for p in "${problems[@]}"; do echo "  problem: $p"; done
    [[ -z $kernel_lines ]] || head -n 60 <<<"$kernel_lines" | sed 's/^/  L1 kernel: /'
    printf '%s: %d passed, %d failed, %d skipped (%ss; log %s)\n' \
        "$name" "$pass" "$fail" "$skip" "${sc_elapsed[i]}" "${sc_log[i]}"
    [[ $fail -eq 0 && ${#problems[@]} -eq 0 ]]
}

if [[ $mode == direct ]]; then
    : >"$work/serial.txt"
    for ((i = 0; i < nsc; i++)); do run_direct_one "$i"; done
else
    run_qemu
fi

# --- results, per scenario (a report dir gets each one's status and report)
[[ -z $report_dir ]] || mkdir -p "$report_dir"
status=0
for ((i = 0; i < nsc; i++)); do
    if ((!sc_begun[i])); then
        report="$(printf '\n%s: not run (L1 stopped before it; log %s)\n' "${sc_name[i]}" "$l1_log")"
        st=not-run status=1
    elif report="$(report_scenario "$i")"; then
        st=passed
    else
        st=failed status=1
    fi
    printf '%s\n' "$report"
    if [[ -n $report_dir ]]; then
        printf '%s\n' "$report" >"$report_dir/${sc_name[i]}.out"
        echo "$st" >"$report_dir/${sc_name[i]}.status"
    fi
done
exit $status
