#!/usr/bin/env bash
# Nested end-to-end harness (test tier 3): runs a scenario inside an L1 Linux
# VM that has a real hardware-virtualization KVM, on machines whose own KVM
# cannot run Linux guests.
#
#   QEMU TCG (-machine q35 -cpu EPYC,+svm)          <- this script
#     L1: Debian cloud kernel + kvm/kvm_amd modules  <- l1-init.sh, /scenario
#       L2: spore guest (guest/build-kernel.sh, guest/build-initramfs.sh)
#           run by the spore binary given with --spore
#
# --arch arm64 (issue 15) runs the same stack for aarch64: QEMU TCG
# `-machine virt,virtualization=on,gic-version=3 -cpu max` (EL2, so L1's KVM
# runs in VHE mode), Debian's arm64 cloud kernel (KVM built in) with
# busybox-static:arm64 (both from l1-kernel.sh --arch arm64), the arm64 guest
# (build-kernel.sh/build-initramfs.sh --arch arm64), and a static aarch64 spore.
#
# A scenario is a busybox sh script run as root in L1 with
#   SPORE=/bin/spore  GUEST_KERNEL=/guest/vmlinux  GUEST_BZIMAGE=/guest/bzImage
#   GUEST_INITRD=/guest/initramfs.cpio  SPORE_OUT=/out  (cwd /tmp)
# (arm64: GUEST_KERNEL=/guest/Image, the arm64 Image; no GUEST_BZIMAGE).
# It reports results as lines `SPORE-TEST <name> PASS|FAIL|SKIP [detail]`
# (from L1 or relayed from an L2 console). Files it leaves in $SPORE_OUT come
# back to --out-dir (base64 tar over the serial console).
#
# Exit status 0 only if there was at least one result, no FAIL, /dev/kvm came
# up in L1, the scenario exited 0 and QEMU finished before the timeout.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
# shellcheck source=guest/lib.sh
source "$repo/guest/lib.sh"

usage() {
    cat >&2 <<'USAGE'
usage: tests/nested/run.sh --scenario FILE [options]
  --scenario FILE          L1 scenario script (required)
  --spore PATH             static spore binary, installed in L1 as /bin/spore
  --guest-scenario FILE    becomes /scenario in the L2 guest initramfs
  --guest-file SRC[:DEST]  extra file for the L2 guest initramfs (repeatable)
  --file SRC[:DEST]        extra file for the L1 initramfs (repeatable)
  --timeout SECS           kill QEMU and fail after SECS (default 900)
  --stall-timeout SECS     kill QEMU if no SPORE-TEST result came within SECS of
                           the start, or of the last result (default 300): the
                           run stalled or hung (an open bug of the emulated
                           stack, see guest/README.md); run-all.sh runs it again
  --out-dir DIR            unpack files the scenario left in $SPORE_OUT here
  --log FILE               serial log (default /tmp/spore-nested/<scenario>.log)
  --memory MIB --smp N     L1 size (default 3072, 2)
  --scratch-disk MIB[:DIR] a disk of MIB MiB (ext4, with DIR's contents when
                           given) that L1 mounts at /scratch and scenarios
                           find as $SPORE_SCRATCH: files whose page cache can
                           be dropped (the initramfs's cannot); QEMU opens it
                           with cache=none, so reads after a drop go to disk
  --append ARGS            extra L1 kernel command line
  --quiet                  do not stream the serial console to stdout
  --mode auto|qemu|direct  direct: run the scenario on this host, without QEMU
                           (needs a KVM that runs Linux guests: kvm_intel or
                           kvm_amd, not kvm_pvm; arm64: an aarch64 host with
                           /dev/kvm); auto (default) picks direct on such a
                           host and qemu elsewhere
  --arch x86_64|arm64      the L1 and L2 architecture (default x86_64); arm64
                           needs a static aarch64 spore (make static-arm64)
USAGE
    exit 2
}

scenario="" spore="" guest_scenario="" out_dir="" log_file="" append=""
timeout_s=900 stall_s=300 memory=3072 smp=2 quiet=0 mode=auto scratch_mib="" scratch_dir="" arch=x86_64
guest_files=() l1_files=()
while [[ $# -gt 0 ]]; do
    case "$1" in
    --scenario) scenario="${2:?}"; shift 2 ;;
    --spore) spore="${2:?}"; shift 2 ;;
    --guest-scenario) guest_scenario="${2:?}"; shift 2 ;;
    --guest-file) guest_files+=("${2:?}"); shift 2 ;;
    --file) l1_files+=("${2:?}"); shift 2 ;;
    --timeout) timeout_s="${2:?}"; shift 2 ;;
    --stall-timeout) stall_s="${2:?}"; shift 2 ;;
    --out-dir) out_dir="${2:?}"; shift 2 ;;
    --log) log_file="${2:?}"; shift 2 ;;
    --memory) memory="${2:?}"; shift 2 ;;
    --smp) smp="${2:?}"; shift 2 ;;
    --scratch-disk) scratch_mib="${2%%:*}"; [[ $2 == *:* ]] && scratch_dir="${2#*:}"; shift 2 ;;
    --append) append="${2:?}"; shift 2 ;;
    --quiet) quiet=1; shift ;;
    --mode) mode="${2:?}"; shift 2 ;;
    --arch) arch="${2:?}"; shift 2 ;;
    -h | --help) usage ;;
    *) echo "unknown argument: $1" >&2; usage ;;
    esac
done
[[ -n $scenario ]] || { echo "--scenario is required" >&2; usage; }
[[ -f $scenario ]] || die "scenario not found: $scenario"
[[ $timeout_s =~ ^[0-9]+$ && $stall_s =~ ^[0-9]+$ && $memory =~ ^[0-9]+$ && $smp =~ ^[0-9]+$ ]] ||
    die "--timeout, --stall-timeout, --memory and --smp take whole numbers"
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
[[ -z $guest_scenario || -f $guest_scenario ]] || die "guest scenario not found: $guest_scenario"

if [[ $mode == qemu && $arch == arm64 ]]; then
    ensure_packages qemu-system-arm busybox-static cpio binutils python3
elif [[ $mode == qemu ]]; then
    ensure_packages qemu-system-x86 busybox-static cpio binutils
else
    ensure_packages busybox-static cpio
fi
name="$(basename "$scenario" .sh)"
log_file="${log_file:-/tmp/spore-nested/$name.log}"
mkdir -p "$(dirname "$log_file")"

work="$(mktemp -d "${TMPDIR:-/tmp}/spore-nested.XXXXXX")"
qemu_pid=""
cleanup() {
    [[ -n $qemu_pid ]] && kill "$qemu_pid" 2>/dev/null
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
gspecs=("${guest_files[@]}" "$scenario_lib")
[[ -n $guest_scenario ]] && gspecs+=("$guest_scenario:/scenario")
guest_initrd="$("$repo/guest/build-initramfs.sh" "${arch_args[@]}" "$work/guest.cpio" "${gspecs[@]}" | tail -n1)"
l1_modules=()
[[ -n $scratch_mib ]] && l1_modules=(virtio_pci virtio_blk)
l1="$("$here/l1-kernel.sh" "${arch_args[@]}" "${l1_modules[@]}" | tail -n1)"

# --- direct: the scenario runs on this host with the same environment an L1
# gives it (files under $SPORE_ROOT instead of /, scratch in $SPORE_TMP).
run_direct() {
    local root="$work/root"
    mkdir -p "$root" "$work/out" "$work/tmp"
    local scratch=""
    if [[ -n $scratch_mib ]]; then
        scratch="$work/scratch"
        mkdir -p "$scratch"
        [[ -n $scratch_dir ]] && cp -a "$scratch_dir/." "$scratch/"
    fi
    for spec in "${l1_files[@]}" "$scenario_lib"; do add_file_spec "$root" "$spec"; done
    log "running $name directly on this host's KVM (timeout ${timeout_s}s, log $log_file)"
    start=$EPOCHREALTIME
    {
        echo "NESTED-KVM ok (direct, $(uname -r))"
        (
            if [[ -n $bzimage ]]; then export GUEST_BZIMAGE="$bzimage"; else unset GUEST_BZIMAGE; fi
            cd "$work/tmp" &&
                SPORE="$spore" GUEST_KERNEL="$guest_kernel" GUEST_INITRD="$guest_initrd" \
                    SPORE_OUT="$work/out" SPORE_ROOT="$root" SPORE_TMP="$work/tmp" SPORE_SCRATCH="$scratch" \
                    timeout --kill-after=10 "$timeout_s" sh "$scenario"
        )
        local rc=$?
        ((rc == 124 || rc == 137)) && echo "SPORE-DIRECT timeout"
        echo "SPORE-L1 scenario exit $rc"
    } >"$log_file" 2>&1
    [[ $quiet == 1 ]] || cat "$log_file"
    timed_out=0
    grep -q '^SPORE-DIRECT timeout' "$log_file" && timed_out=1
    qemu_rc=0
    if [[ -n $out_dir && -n "$(ls -A "$work/out")" ]]; then
        mkdir -p "$out_dir" && cp -a "$work/out/." "$out_dir/"
    fi
}

if [[ $mode == direct ]]; then
    run_direct
else
# --- L1 initramfs. Uncompressed: under TCG the L1 kernel unpacks plain cpio
# faster than it inflates gzip, and it is rebuilt each run (spore changes).
log "building L1 initramfs"
root="$work/l1root"
populate_busybox_root "$root"
# arm64: the applet links are the host's busybox-static's (the same Debian
# version builds the same applets), the binary is busybox-static:arm64's.
[[ $arch == arm64 ]] && install -m 0755 "$l1/busybox" "$root/bin/busybox"
install -m 0755 "$here/l1-init.sh" "$root/init"
install -m 0755 "$scenario" "$root/scenario"
mkdir -p "$root/lib/modules" "$root/guest"
cp "$l1/load-order" "$root/lib/modules/"
find "$l1/modules" -name '*.ko' -exec cp -t "$root/lib/modules/" {} +
if [[ $arch == arm64 ]]; then
    cp "$guest_kernel" "$root/guest/Image"
else
    cp "$guest_kernel" "$root/guest/vmlinux"
    cp "$bzimage" "$root/guest/bzImage"
fi
cp "$guest_initrd" "$root/guest/initramfs.cpio"
[[ -n $spore ]] && install -m 0755 "$spore" "$root/bin/spore"
for spec in "${l1_files[@]}" "$scenario_lib"; do add_file_spec "$root" "$spec"; done
pack_cpio "$root" "$work/l1.cpio"

# --- the scratch disk (sparse; mke2fs -d copies DIR in, no mount needed).
# cache=none (O_DIRECT) where the host's file system takes it: a page
# dropped in L1 is then read from the host's disk again, not from its cache.
scratch_args=()
if [[ -n $scratch_mib ]]; then
    ensure_packages e2fsprogs
    img="$work/scratch.img"
    mke2fs -q -t ext4 -L spore-scratch -E lazy_itable_init=0,lazy_journal_init=0 \
        ${scratch_dir:+-d "$scratch_dir"} "$img" "${scratch_mib}M"
    cache=none
    dd if=/dev/zero of="$work/.odirect" bs=4096 count=1 oflag=direct status=none 2>/dev/null || cache=writeback
    rm -f "$work/.odirect"
    scratch_args=(-drive "file=$img,if=virtio,format=raw,cache=$cache,aio=threads")
    append="$append spore.scratch=1"
    log "scratch disk: $scratch_mib MiB (cache=$cache)${scratch_dir:+ from $scratch_dir}"
fi

# --- run
if [[ $arch == arm64 ]]; then
    log "booting the arm64 L1 under QEMU TCG with EL2 (timeout ${timeout_s}s, log $log_file)"
else
    log "booting L1 under QEMU TCG+SVM (timeout ${timeout_s}s, log $log_file)"
fi
start=$EPOCHREALTIME
# no_timer_check: on a loaded host, TCG is too slow for L1's check that the
# timer interrupt works, and L1 panicked ("IO-APIC + timer doesn't work").
# shellcheck disable=SC2054 # the commas are QEMU option syntax
# The monitor on a socket of its own: on a stall, qemu-state.py asks it where
# L1's CPUs are (nokaslr: a kernel RIP is the same address in every run).
monitor="$work/qemu-monitor.sock"
qemu=(qemu-system-x86_64 -machine q35,accel=tcg -cpu EPYC,+svm -m "$memory" -smp "$smp"
    -nographic -no-reboot -net none -monitor "unix:$monitor,server=on,wait=off"
    -kernel "$l1/vmlinuz" -initrd "$work/l1.cpio" "${scratch_args[@]}"
    -append "console=ttyS0 quiet panic=-1 audit=1 print-fatal-signals=1 no_timer_check nokaslr spore.stall_report_s=$((stall_s * 2 / 3)) $append")
# arm64: the machine of tests/nested-arm64/probe.sh (EL2 for L1's KVM,
# GICv3); its console is the PL011, ttyAMA0.
if [[ $arch == arm64 ]]; then
    # shellcheck disable=SC2054 # the commas are QEMU option syntax
    qemu=(qemu-system-aarch64 -machine virt,accel=tcg,virtualization=on,gic-version=3 -cpu max -m "$memory" -smp "$smp"
        -nographic -no-reboot -net none -monitor "unix:$monitor,server=on,wait=off"
        -kernel "$l1/vmlinuz" -initrd "$work/l1.cpio" "${scratch_args[@]}"
        -append "console=ttyAMA0 quiet panic=-1 audit=1 print-fatal-signals=1 nokaslr spore.stall_report_s=$((stall_s * 2 / 3)) $append")
fi
: >"$log_file"
# QEMU runs in the background so the timeout can kill exactly it.
"${qemu[@]}" </dev/null >"$log_file" 2>&1 &
qemu_pid=$!
if [[ $quiet == 0 ]]; then
    # Drop carriage returns and the firmware's terminal resets (SeaBIOS
    # clears the screen), and hide QEMU's list of EPYC features TCG lacks;
    # the log keeps everything.
    tail -n +1 -f --pid="$qemu_pid" "$log_file" |
        sed -u -e 's/\r//g' -e 's/\x1bc//g' -e 's/\x1b\[[0-9;?]*[A-Za-z]//g' |
        grep -av --line-buffered "TCG doesn't support requested feature" &
fi
timed_out=0 stalled=0 lockup=0 hung=0 crashed=0
deadline=$((SECONDS + timeout_s))
stall_deadline=$((SECONDS + stall_s))
# After the first result: a run whose results stop coming for stall_s
# seconds is hung (scenarios bound every wait well below that). Seen twice
# in the first restore of the snapshot scenario: both L1 CPUs spinning in
# L1's kernel with interrupts off, in `__schedule` and `asm_exc_int3` (QEMU
# monitor state), the shape of int3-based text patching (KVM flips static
# keys as VMs come and go) under the emulated stack; guest/README.md.
results_seen=0 progress_deadline=0
while kill -0 "$qemu_pid" 2>/dev/null; do
    if ((stall_deadline > 0 && SECONDS >= stall_deadline)); then
        if grep -aq 'SPORE-TEST ' "$log_file"; then
            stall_deadline=0
        else
            stalled=1 deadline=0
        fi
    fi
    n=$(grep -ac 'SPORE-TEST ' "$log_file" || true)
    if ((n != results_seen)); then
        results_seen=$n progress_deadline=$((SECONDS + stall_s))
    elif ((progress_deadline > 0 && SECONDS >= progress_deadline && !hung)); then
        hung=1 deadline=0
    fi
    # L1's own watchdog saw a CPU stuck in its kernel (an open bug of the
    # emulated stack, guest/README.md): the run cannot finish; stop it now.
    if ((!lockup)) && grep -aq 'watchdog: BUG: soft lockup' "$log_file"; then
        lockup=1 deadline=0
    fi
    if ((SECONDS >= deadline)); then
        ((stalled || lockup || hung)) || timed_out=1
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
    sleep 0.2
done
qemu_rc=0
wait "$qemu_pid" || qemu_rc=$?
# L1's kernel crashed (seen: "corrupted stack end detected inside scheduler"
# as a vCPU thread of a VMM ran, spore's or Firecracker's; guest/README.md):
# with panic=-1 and -no-reboot QEMU ends at once, before L1's orderly
# poweroff. A user process cannot do that to a kernel: it is the emulated
# stack's bug, and the run could not finish.
if ((!stalled && !lockup && !hung && !timed_out)) && ! grep -aq 'SPORE-L1 poweroff' "$log_file" &&
    grep -aq 'Kernel panic - not syncing' "$log_file"; then
    crashed=1
fi
qemu_pid=""
[[ -f $work/qemu-state.txt ]] && cat "$work/qemu-state.txt" >>"$log_file"
wait 2>/dev/null || true # the log follower
fi
elapsed=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')

# --- results
clean="$work/serial.txt"
tr -d '\r' <"$log_file" >"$clean"
results="$(grep -aoE 'SPORE-TEST [^ ]+ (PASS|FAIL|SKIP)( .*)?$' "$clean" || true)"
count() { grep -cE "^SPORE-TEST [^ ]+ $1( |$)" <<<"$results" || true; }
pass=$(count PASS) fail=$(count FAIL) skip=$(count SKIP)

problems=()
((timed_out)) && problems+=("timeout after ${timeout_s}s (QEMU killed)")
((stalled)) && problems+=("stalled: no SPORE-TEST result within ${stall_s}s (QEMU killed; the L1 stall report is in the log)")
((lockup)) && problems+=("L1 soft lockup: L1's watchdog reported a CPU stuck in its kernel (QEMU killed; see the log)")
((hung)) && problems+=("L1 hang: no new SPORE-TEST result within ${stall_s}s after the last (QEMU killed; where L1's CPUs were is in the log)")
((crashed)) && problems+=("L1 kernel crash: L1's kernel panicked (QEMU stopped; the oops is in the log)")
((!timed_out && !stalled && !lockup && !hung && !crashed && qemu_rc != 0)) && problems+=("QEMU exited with status $qemu_rc")
grep -aq '^NESTED-KVM ok' "$clean" || problems+=("nested KVM did not come up in L1 ($(grep -a '^NESTED-KVM' "$clean" || echo 'no NESTED-KVM line'))")
scenario_rc="$(sed -n 's/^SPORE-L1 scenario exit \([0-9]*\)$/\1/p' "$clean" | tail -n1)"
if grep -aq '^NESTED-KVM ok' "$clean"; then
    [[ -n $scenario_rc ]] || problems+=("scenario did not finish")
    [[ -z $scenario_rc || $scenario_rc == 0 ]] || problems+=("scenario exited with status $scenario_rc")
fi
((pass + fail + skip > 0)) || problems+=("no SPORE-TEST results")
# What L1's kernel said of the run (l1-init.sh prints it after the scenario):
# a seccomp kill record (audit type 1326 with SIGSYS, 31; L1 boots with
# audit=1; SPORE_SECCOMP_LOG's records have no signal) names the VMM thread
# and the syscall its filter refused, and a process killed by a fault
# (print-fatal-signals=1) has its registers printed; neither is retried
# (a fault only counts as a problem in a run with failed checks). A kernel warning (a splat from an ioctl) in a run with
# failed checks and neither of those is the emulated stack's: seen once as
# an arm64 guest reset before its first console line, at L1's first VM;
# run-all.sh runs it again, as it does L1's crashes.
kernel_lines="$(grep -a '^SPORE-L1-KERNEL ' "$clean" | sed 's/^SPORE-L1-KERNEL //' || true)"
if grep -q 'type=1326.* sig=31 ' <<<"$kernel_lines"; then
    problems+=("seccomp kill in L1: $(grep -m1 'type=1326.* sig=31 ' <<<"$kernel_lines" | grep -o 'comm=.*')")
elif ((fail > 0)) && grep -q 'fatal signal' <<<"$kernel_lines"; then
    problems+=("a process in L1 was killed by $(grep -m1 -o 'fatal signal [0-9]*' <<<"$kernel_lines") (its registers are below)")
elif ((fail > 0)) && grep -q 'cut here' <<<"$kernel_lines"; then
    problems+=("L1 kernel warning: L1's kernel warned during the run (its report is below and in the log)")
fi

if [[ $mode == qemu && -n $out_dir ]] && grep -aq '^SPORE-OUT-BEGIN$' "$clean"; then
    mkdir -p "$out_dir"
    if sed -n '/^SPORE-OUT-BEGIN$/,/^SPORE-OUT-END$/p' "$clean" | sed '1d;$d' | base64 -d | tar -xz -C "$out_dir"; then
        log "scenario output unpacked into $out_dir"
    else
        problems+=("could not unpack the scenario's \$SPORE_OUT into $out_dir")
    fi
fi

echo
if [[ -n $results ]]; then
    printf '%s\n' "$results" | sed 's/^SPORE-TEST /  /'
fi
for p in "${problems[@]}"; do echo "  problem: $p"; done
[[ -z $kernel_lines ]] || head -n 60 <<<"$kernel_lines" | sed 's/^/  L1 kernel: /'
printf '%s: %d passed, %d failed, %d skipped (%ss; log %s)\n' \
    "$name" "$pass" "$fail" "$skip" "$elapsed" "$log_file"
[[ $fail -eq 0 && ${#problems[@]} -eq 0 ]]
