#!/usr/bin/env bash
# Tier 3: every nested scenario, in one QEMU (L1) boot where they can share it
# (run.sh runs them in turn; serve-linux has its own), with per-scenario
# results; what an L1 stall or crash kept from running goes to a fresh L1.
#   tests/nested/run-all.sh --spore STATIC_SPORE [--only NAME]
# NAME: foundation (Linux guest through the API: CPUs, disks, rng, vsock,
# pause/resume, reboot), demo (a plain `spore run` boot), balloon (virtio-balloon
# inflate/deflate, statistics, free page reporting), bench (boot benchmark),
# tmem (spore-tmem in a Linux guest: put/get of 1 MiB values, quota, lz4),
# virtio-mem (plug, fill, unplug, host RSS), snapshot (a Linux guest with vsock
# and a rw disk snapshots itself, is snapshotted through the API and restored
# three times in new processes), clone (a Linux guest restored twice as clones:
# reseed from /dev/hwrng, new vsock CID, urandom differs, private disks),
# virtio-mem-snapshot (512 MiB plugged, snapshot, a diff on top, the chain restored in
# a new process, contents intact, unplug, RSS drops), fc-sdk (firecracker-go-sdk v1.0.0 with its default
# launcher: start, pause, snapshot, stop, load with WithSnapshot, resume, balloon),
# net (virtio-net on a tap in L1: address and ping, 64 MiB each way with sha256,
# 10 MiB/s rate limiters, a new TCP connection after a snapshot restore, clones in
# their own network namespaces, a clone's new MAC and address applied by the guest).
# serve-linux (`spore serve` runs python3 and provided functions: the runtime
# images of guest/build-rootfs.sh with this tree's spore-agent, and the guest
# kernel; deploy, three invocations each, an init error; the runtime base
# snapshot shared by two Python functions, each with its own diff, restored as
# a chain after a daemon restart, instances drawing different random bytes).
# sandbox-envd (the sandbox-base image with spore-envd in a Linux guest, driven
# from this host by the e2b SDK through forwarded ports: commands, PTYs, files,
# then the sandbox paused (full snapshot), resumed and forked). mmds (the web
# template's Debian guest asks the MMDS with curl under spore and under the
# reference Firecracker: the same answers; then after a snapshot restore).
# Opt-in (only with --only NAME, not in `make test`): snapshot-diff (a diff chain over
# a guest whose page cache was filled by virtio-blk; an intermittent hang, see above),
# bench-reclaim (`spore bench reclaim` on the Linux guest: virtio-mem and balloon,
# 128 MiB-1 GiB), bench-serve-linux (`spore bench serve --linux`: SnapFaaS's
# start strategies on Python functions; make bench-serve-linux) and bench (the Linux boot
# benchmark, 10 boots: a benchmark, not a test; late in session 1 it hung in 3
# of about 30 boots, an open bug; each run now fails after 120 s instead).
# Prints each scenario's results and a final "N passed, N failed, N skipped".
#
# --arch arm64 (issue 15; make test-nested-arm64) runs the aarch64 tier instead,
# its own list below (tests/nested-arm64/scenarios/) with a static aarch64 spore
# (make static-arm64), through the same run.sh and the same retries:
# boot (a Linux guest with 2 vCPUs through the API, its init, reboot -> exit
# 0); opt-in: l1-kvm (the harness alone: /dev/kvm in L1, the guest assets;
# spore only if it runs). Their logs are /tmp/spore-nested/arm64-NAME.log.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
# shellcheck source=guest/lib.sh
source "$repo/guest/lib.sh"

spore="" only="" arch=x86_64
while (($#)); do
    case $1 in
        --spore) spore="${2:?}"; shift 2 ;;
        --only) only="${2:?}"; shift 2 ;;
        --arch) arch="${2:?}"; shift 2 ;;
        *) die "usage: $0 --spore STATIC_SPORE [--only foundation|demo|balloon|virtio-mem|virtio-mem-snapshot|bench|bench-reclaim|tmem|snapshot|snapshot-diff|clone|fc-sdk|net|serve-linux|sandbox-envd|bench-serve-linux|bench-arch]
       $0 --arch arm64 --spore STATIC_AARCH64_SPORE [--only boot|foundation|snapshot|snapshot-diff|chain|clone|virtio-mem|balloon|net|bad-input|bench-arch|l1-kvm]" ;;
    esac
done
# arch_args go to run.sh (none for x86_64, as before --arch); log_prefix
# keeps the arm64 tier's logs apart from the x86 ones.
case $arch in
    x86_64 | amd64) arch=x86_64 arch_args=() log_prefix="" ;;
    arm64 | aarch64) arch=arm64 arch_args=(--arch arm64) log_prefix=arm64- ;;
    *) die "--arch takes x86_64 or arm64" ;;
esac
[[ -x $spore ]] || die "--spore: no executable at '$spore'"
ensure_packages e2fsprogs

work="$(mktemp -d /tmp/spore-nested-all.XXXXXX)"
# Scenario outputs (daemon logs, JSON) outlive the run, beside the logs.
keep_outputs() {
    local o
    for o in "$work"/out-*; do
        [[ -d $o ]] || continue
        rm -rf "/tmp/spore-nested/${o##*/}"
        cp -r "$o" /tmp/spore-nested/ 2>/dev/null || true
    done
    rm -rf "$work"
}
trap keep_outputs EXIT

# A read-only ext4 disk holding a random file whose checksum the guest reports.
mkdir -p "$work/rofs"
head -c 1048576 /dev/urandom >"$work/rofs/data.bin"
(cd "$work/rofs" && sha256sum data.bin) >"$work/data.sha256"
mke2fs -q -t ext4 -L spore-ro -d "$work/rofs" "$work/ro.img" 16M

# run_one NAME [--own-l1] RUN_SH_ARGS...: queues scenario NAME; run_queue
# (at the end) runs the queue. The scenarios share one L1 boot (run.sh runs
# them in turn, each in a directory of its own, with what it left running
# killed after it); --own-l1: NAME gets an L1 of its own. An L1 option of
# one scenario (--memory, --file, --append) holds for its whole L1.
queue=()
declare -A q_args q_group q_out
run_one() {
    local name=$1 group=shared
    shift
    [[ ${1-} == --own-l1 ]] && { group=$name; shift; }
    [[ -z $only || $only == "$name" ]] || return 0
    local file="" args=()
    while (($#)); do
        if [[ $1 == --scenario ]]; then file=$2; shift 2; continue; fi
        [[ $1 == --out-dir ]] && q_out[$name]=$2
        args+=("$1")
        shift
    done
    queue+=("$name") q_group[$name]=$group
    q_args[$name]="$(printf '%q ' --scenario "$file" --name "$name" \
        --log "/tmp/spore-nested/$log_prefix$name.log" "${args[@]}")"
}

passed=0 failed=0 skipped=0 status=0 boots=0 retried=()
# count NAME REPORT_FILE: adds the scenario's final counts to the tier's.
count() {
    # run.sh ends each report with "<name>: P passed, F failed, S skipped (...)".
    local counts p=0 f=0 s=0 st
    st="$(cat "${2%.out}.status" 2>/dev/null || echo failed)"
    counts="$(sed -n "s/^$1: \([0-9]*\) passed, \([0-9]*\) failed, \([0-9]*\) skipped.*$/\1 \2 \3/p" "$2" | tail -n1)"
    [[ -n $counts ]] && read -r p f s <<<"$counts"
    passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
    [[ $st == passed ]] || { status=1; ((f > 0)) || failed=$((failed + 1)); }
}

# retries: "; N runs again: NAME: SHAPE, ..." for the summary line, or nothing.
retries() {
    ((${#retried[@]})) || return 0
    local IFS=,
    echo "; ${#retried[@]} runs again: ${retried[*]}"
}

# run_queue: one L1 boot per group (in the order of their first scenario),
# then, in a fresh L1, whatever that boot did not finish: the scenario that
# stopped L1 when it is one of the retried shapes below (logged, never
# hidden), and the scenarios L1 had not started yet.
# triple_fault_where DIR: where the L2 guests that triple-faulted were, from
# L1's trace of KVM's SHUTDOWN exits among DIR's outputs (l1-init.sh): each
# rip with the guest kernel's function there (x86's guest vmlinux).
triple_fault_where() {
    local exits vmlinux rip
    exits="$(find "$1" -name l1-kvm-shutdown-exits.txt 2>/dev/null | head -n 1)"
    [[ -n $exits ]] || { log "  (no SHUTDOWN exit was traced in L1)"; return 0; }
    vmlinux="$("$repo/guest/build-kernel.sh" 2>/dev/null | tail -n 1)"
    for rip in $(grep -o 'rip 0x[0-9a-f]*' "$exits" | awk '{print $2}' | sort -u | head -n 8); do
        log "  triple fault at rip $rip: $(addr2line -f -e "$vmlinux" "$rip" 2>/dev/null | head -n 1)"
    done
}
run_queue() {
    # A scenario past its --timeout while L1 kept making progress is one too:
    # seen once (snapshot, 2026-11-30: its L2 guest booted and never answered
    # on vsock, then its VMM was gone with nothing in its log; the scenario
    # alone passed 14/14 in 16 s right after). A hang of spore's own fails
    # its retries as well.
    local shapes="no SPORE-TEST results|L1 soft lockup|L1 hang|L1 kernel crash|L1 kernel warning|timeout after [0-9]+s"
    # retry_shape NAME REPORT: the retried shape REPORT shows, or nothing. A
    # Linux guest (L2) that died by a triple fault, silent on its console, is
    # one: an open bug (guest/README.md, "Fourth shape"), seen in net,
    # virtio-mem and fc-sdk runs; it is reported with the retry, never
    # hidden. A check names it, or (fc-sdk: the Go program only sees the
    # VMM's socket gone) the VMM's log among the scenario's outputs does, or
    # L1's trace of KVM's SHUTDOWN exits does (run.sh's problem line; mmds,
    # 2026-12-01: the guest's VMM log was not among its outputs).
    retry_shape() {
        local triple='the guest reset the VM by a triple fault'
        grep -m1 -oE "$shapes" "$2" && return
        if grep -qE "FAIL .*$triple|^  problem: L2 guest triple fault" "$2" ||
            { [[ -n ${q_out[$1]-} && -d ${q_out[$1]} ]] && grep -rqs "$triple" "${q_out[$1]}"; }; then
            echo "L2 guest triple fault"
        fi
    }
    local -A attempt counted
    local pending=("${queue[@]}") name
    for name in "${pending[@]}"; do attempt[$name]=1; done
    while ((${#pending[@]})); do
        local group=${q_group[${pending[0]}]} batch=() rest=() args=()
        for name in "${pending[@]}"; do
            if [[ ${q_group[$name]} == "$group" ]]; then batch+=("$name"); else rest+=("$name"); fi
        done
        for name in "${batch[@]}"; do eval "args+=(${q_args[$name]})"; done
        boots=$((boots + 1))
        local report="$work/report-$boots" quiet=(--quiet)
        # The demo's point is its console: shown when it runs alone.
        [[ ${batch[*]} == demo ]] && quiet=()
        log "== nested L1 boot $boots: ${batch[*]}"
        "$here/run.sh" --spore "$spore" "${quiet[@]}" "${arch_args[@]}" --report-dir "$report" \
            --l1-log "/tmp/spore-nested/${log_prefix}l1-$boots.log" "${args[@]}" || true
        local again=() out st
        for name in "${batch[@]}"; do
            out="$report/$name.out" st="$(cat "$report/$name.status" 2>/dev/null || echo failed)"
            if [[ $st == not-run ]]; then
                again+=("$name")
            elif [[ $st == failed ]] && ((attempt[$name] < 3)) && [[ -n $(retry_shape "$name" "$out") ]]; then
                # An open bug: now and then (1 of 4 snapshot runs on a loaded
                # host) the nested stack stalls right after L1's KVM comes up,
                # before the scenario reports anything (the same shape as the
                # rare `bench boot` hang). run.sh stops such a run once
                # nothing progressed for its --stall-timeout, with L1's stall
                # report in the log. It tested nothing; it is run again (at
                # most twice: a CI run needed both for serve-linux), and each
                # retry is logged, not hidden. The same
                # bug also shows as L1's watchdog reporting a soft lockup in
                # the VMM's KVM_RUN after some results: run.sh stops that run
                # at once, and it is run again from the start too (every check
                # must pass in one run). So is a run that stopped progressing
                # (L1 hang: both L1 CPUs spinning with interrupts off, see
                # run.sh), and one whose L1 kernel panicked (the emulated
                # stack's bug too: seen under Firecracker's VMs as well as
                # spore's, guest/README.md), and one with failed checks while
                # L1's kernel warned (run.sh: never when it also recorded a
                # seccomp kill, which is spore's).
                attempt[$name]=$((attempt[$name] + 1))
                local shape
                shape="$(retry_shape "$name" "$out")"
                retried+=("$name: $shape")
                local saved="/tmp/spore-nested/$log_prefix$name.stalled-${attempt[$name]}.log"
                cp "$(sed -n 's/^.*; log \(.*\))$/\1/p' "$out" | tail -n1)" "$saved" 2>/dev/null || true
                # The failed run's outputs (VMM logs) are kept beside its log;
                # the next run starts with an empty output directory.
                if [[ ${q_out[$name]-} == "$work"/* && -d ${q_out[$name]} ]]; then
                    rm -rf "${saved%.log}.out"
                    mv "${q_out[$name]}" "${saved%.log}.out" 2>/dev/null || true
                fi
                log "RETRY $name (attempt ${attempt[$name]}): $shape (open bug of the emulated stack, see guest/README.md; log of that run: $saved)"
                [[ $shape == "L2 guest triple fault" ]] && triple_fault_where "${saved%.log}.out"
                again+=("$name")
            else
                count "$name" "$out"
                counted[$name]=1
                if [[ $st == failed ]] && grep -q 'nested KVM did not come up' "$out"; then
                    # No L1 here brings KVM up: the rest cannot run either.
                    for name in "${queue[@]}"; do
                        [[ -n ${counted[$name]-} ]] && continue
                        echo "$name: not run (nested KVM did not come up in L1)"
                        status=1 failed=$((failed + 1))
                    done
                    return
                fi
            fi
        done
        pending=("${again[@]}" "${rest[@]}")
    done
}

if [[ $arch == arm64 ]]; then
    # The aarch64 tier's list (issue 15). Each scenario NAME.sh runs in L1;
    # its guest side, if any, is guest/NAME.sh beside it.
    a64="$repo/tests/nested-arm64/scenarios"
    run_one boot --scenario "$a64/boot.sh" --guest-scenario "$a64/guest/boot.sh" \
        --out-dir "$work/out-${log_prefix}boot"
    # The x86 tier's scenarios, unchanged: they drive spore through its API
    # and CLI and the guest through vsock and the signal register, none of
    # which differs by architecture.
    run_one foundation --scenario "$here/scenarios/foundation.sh" \
        --guest-scenario "$here/scenarios/guest/foundation.sh" \
        --file "$work/ro.img:/disks/ro.img" --file "$work/data.sha256:/disks/data.sha256" \
        --out-dir "$work/out-${log_prefix}foundation"
    run_one snapshot --scenario "$here/scenarios/snapshot.sh" \
        --guest-scenario "$here/scenarios/guest/snapshot.sh" --out-dir "$work/out-${log_prefix}snapshot"
    run_one snapshot-diff --timeout 400 --scenario "$here/scenarios/snapshot-diff.sh" \
        --guest-scenario "$here/scenarios/guest/snapshot.sh" --out-dir "$work/out-${log_prefix}snapshot-diff"
    run_one chain --scenario "$a64/chain.sh" \
        --guest-scenario "$here/scenarios/guest/snapshot.sh" --out-dir "$work/out-${log_prefix}chain"
    run_one clone --scenario "$here/scenarios/clone.sh" \
        --guest-scenario "$here/scenarios/guest/clone.sh" --out-dir "$work/out-${log_prefix}clone"
    run_one virtio-mem --memory 4096 --scenario "$here/scenarios/virtio-mem.sh" \
        --guest-scenario "$here/scenarios/guest/virtio-mem.sh" --out-dir "$work/out-${log_prefix}virtio-mem"
    run_one balloon --scenario "$here/scenarios/balloon.sh" \
        --guest-scenario "$here/scenarios/guest/balloon.sh" --out-dir "$work/out-${log_prefix}balloon"
    # spore.net_quick=1: the address, snapshot and clone checks; the transfer
    # and rate-limiter timings are reported as skipped (under arm64 TCG the
    # limited rx rate came out at 40 % of its limit in a loaded run, an open
    # question). SPORE_ARM64_NET_APPEND= (empty) runs them too.
    net_append=()
    [[ -n ${SPORE_ARM64_NET_APPEND-spore.net_quick=1} ]] &&
        net_append=(--append "${SPORE_ARM64_NET_APPEND-spore.net_quick=1}")
    run_one net --memory 4096 "${net_append[@]}" \
        --scenario "$here/scenarios/net.sh" \
        --guest-scenario "$here/scenarios/guest/net.sh" --out-dir "$work/out-${log_prefix}net"
    if [[ $only == bench-arch ]]; then
        # A benchmark, opt-in (make bench-arch): the same figures as the x86 tier's.
        run_one bench-arch --scenario "$here/scenarios/bench-arch.sh" \
            --guest-scenario "$here/scenarios/guest/snapshot.sh" --out-dir "${SPORE_BENCH_OUT:-$work/out-${log_prefix}bench-arch}"
    fi
    if [[ -z $only || $only == bad-input ]]; then
        bad_files=(--file "$(dirname "$("$repo/guest/build-kernel.sh" | tail -n1)")/bzImage:/x86/bzImage")
        # A snapshot taken on x86_64: the snaptest unikernel's snapshot point,
        # written by the host's x86 spore on its KVM (make static uk; a
        # release build, make build, serves too).
        x86_spore="$repo/target/x86_64-unknown-linux-musl/release/spore" uk="${SPORE_UK_DIR:-$repo/crates/spore-uk/target/x86_64-unknown-none/release}"
        [[ -x $x86_spore ]] || x86_spore="$repo/target/release/spore"
        if [[ $(uname -m) == x86_64 && -c /dev/kvm && -x $x86_spore && -f $uk/snaptest ]]; then
            mkdir -p "$work/x86snap"
            "$x86_spore" run --mem 32M --kernel "$uk/snaptest" --cmdline "mib=1 rounds=1 point=1" \
                --guest-snapshot-dir "$work/x86snap" --guest-snapshot-after exit >/dev/null ||
                die "the host's spore could not take the x86 snapshot"
            bad_files+=(--file "$work/x86snap/tag-1.state:/x86/tag-1.state" --file "$work/x86snap/tag-1.mem:/x86/tag-1.mem")
        else
            log "bad-input: no x86 snapshot (needs an x86_64 host with /dev/kvm, make static uk)"
        fi
        run_one bad-input --scenario "$a64/bad-input.sh" "${bad_files[@]}"
    fi
    if [[ $only == l1-kvm ]]; then
        # Opt-in: the harness alone (no spore needed to pass).
        run_one l1-kvm --scenario "$a64/l1-kvm.sh"
    fi
    run_queue
    echo "nested (arm64): $passed passed, $failed failed, $skipped skipped ($boots L1 boots for ${#queue[@]} scenarios$(retries))"
    exit $status
fi

run_one foundation --scenario "$here/scenarios/foundation.sh" \
    --guest-scenario "$here/scenarios/guest/foundation.sh" \
    --file "$work/ro.img:/disks/ro.img" --file "$work/data.sha256:/disks/data.sha256" \
    --out-dir "$work/out-foundation"
run_one demo --scenario "$here/scenarios/demo.sh" \
    --guest-scenario "$here/scenarios/guest/demo.sh"
run_one cpu-config --scenario "$here/scenarios/cpu-config.sh" \
    --guest-scenario "$here/scenarios/guest/cpu.sh"
run_one balloon --scenario "$here/scenarios/balloon.sh" \
    --guest-scenario "$here/scenarios/guest/balloon.sh" --out-dir "${SPORE_BENCH_OUT:-$work/out-balloon}"
# Its guest grows to 1.5 GiB and fills 900 MiB: give L1 room (3 GiB was tight).
run_one virtio-mem --memory 4096 --scenario "$here/scenarios/virtio-mem.sh" \
    --guest-scenario "$here/scenarios/guest/virtio-mem.sh" --out-dir "$work/out-virtio-mem"
run_one snapshot --scenario "$here/scenarios/snapshot.sh" \
    --guest-scenario "$here/scenarios/guest/snapshot.sh" --out-dir "$work/out-snapshot"
run_one clone --scenario "$here/scenarios/clone.sh" \
    --guest-scenario "$here/scenarios/guest/clone.sh" --out-dir "$work/out-clone"
# L1 holds the payloads (about 190 MiB), the 512 MiB snapshot and the clones.
run_one net --memory 4096 --scenario "$here/scenarios/net.sh" \
    --guest-scenario "$here/scenarios/guest/net.sh" --out-dir "$work/out-net"
if [[ -z $only || $only == fc-sdk ]]; then
    # The firecracker-go-sdk program (Go, static; cached by its sources' hash).
    fc_sdk_bin="$("$repo/tests/fc-sdk/build.sh" | tail -n1)"
    [[ -x $fc_sdk_bin ]] || die "the fc-sdk program was not built"
    run_one fc-sdk --scenario "$here/scenarios/fc-sdk.sh" \
        --guest-scenario "$here/scenarios/guest/fc-sdk.sh" --file "$fc_sdk_bin:/bin/fc-sdk" \
        --out-dir "$work/out-fc-sdk"
fi
if [[ $only == bench-arch ]]; then
    # A benchmark, opt-in (make bench-arch): the same figures as the arm64 tier's.
    run_one bench-arch --scenario "$here/scenarios/bench-arch.sh" \
        --guest-scenario "$here/scenarios/guest/snapshot.sh" --out-dir "${SPORE_BENCH_OUT:-$work/out-bench-arch}"
fi
if [[ $only == snapshot-diff ]]; then
    # Opt-in: in 1 of about 18 runs the L1 kernel soft-locked in the VMM process
    # right after the diff snapshot (the VMM stopping; see the README), an open bug.
    run_one snapshot-diff --timeout 400 --scenario "$here/scenarios/snapshot-diff.sh" \
        --guest-scenario "$here/scenarios/guest/snapshot.sh" --out-dir "$work/out-snapshot-diff"
fi
# L1 holds the 2.5 GiB sparse memory file (about 900 MiB of data) and the VMMs.
run_one virtio-mem-snapshot --memory 4096 --scenario "$here/scenarios/virtio-mem-snapshot.sh" \
    --guest-scenario "$here/scenarios/guest/virtio-mem-snapshot.sh" --out-dir "$work/out-virtio-mem-snapshot"
if [[ $only == bench-reclaim ]]; then
    # A benchmark, opt-in: 4 sizes x 2 mechanisms x 3 runs take about 20 minutes.
    run_one bench-reclaim --memory 4096 --timeout 3600 --stall-timeout 3600 --scenario "$here/scenarios/bench-reclaim.sh" \
        --guest-scenario "$here/scenarios/guest/virtio-mem-snapshot.sh" \
        --out-dir "${SPORE_BENCH_OUT:-$work/out-bench-reclaim}"
fi
# The runtime images of `spore serve`'s Linux functions, built (cached by
# content: the recipe, the agent and the bootstrap are in the key) with this
# tree's static spore-agent: runtime_images RUNTIME... prints each image's
# path. And the host's mke2fs with its libraries (the daemon builds code
# disks at deploy time with mkfs.ext4, which L1's busybox lacks), as --file
# arguments in mkfs_files.
agent_binary() {
    (cd "$repo" && cargo build --release -q -p spore-guest-tools --bin spore-agent \
        --target x86_64-unknown-linux-musl --message-format json-render-diagnostics |
        sed -n 's/.*"executable":"\([^"]*spore-agent\)".*/\1/p' | tail -n1)
}
runtime_images() {
    local agent_bin img rt
    agent_bin="$(agent_binary)"
    [[ -x $agent_bin ]] || die "spore-agent was not built"
    for rt in "$@"; do
        img="$("$repo/guest/build-rootfs.sh" "$rt" --agent "$agent_bin" | tail -n1)"
        [[ -f $img ]] || die "the $rt runtime image was not built"
        log "$rt image $(du -m "$img" | cut -f1) MiB ($img)"
        echo "$img"
    done
}
# with_libs SRC DEST: --file arguments for this host's binary SRC at DEST in
# L1 and the shared libraries it loads (L1's userland is static busybox).
with_libs() {
    local lib
    printf '%s\n' --file "$1:$2"
    while read -r lib; do
        printf '%s\n' --file "$lib:$lib"
    done < <(ldd "$1" | grep -o '/[^ ]*' | sort -u)
}
mkfs_files=()
add_mkfs_files() {
    local mke2fs_bin
    mke2fs_bin="$(command -v mke2fs || echo /usr/sbin/mke2fs)"
    mapfile -t mkfs_files < <(with_libs "$mke2fs_bin" /sbin/mkfs.ext4)
    mkfs_files+=(--file /etc/mke2fs.conf:/etc/mke2fs.conf)
}

if [[ -z $only || $only == serve-linux ]]; then
    # The images are laid out as a cache of their own in L1.
    sl_files=()
    while read -r img; do
        d="$(dirname "$img")"
        sl_files+=(--file "$img:/cache/$(basename "$d")/rootfs.ext4"
            --file "$d/manifest.json:/cache/$(basename "$d")/manifest.json")
    done < <(runtime_images python3 provided)
    ((${#sl_files[@]} == 8)) || die "the runtime images were not built"
    add_mkfs_files
    sl_files+=("${mkfs_files[@]}")
    fns="$repo/tests/nested/fns"
    # AWS's lambda_runtime crate as a static bootstrap (built once, cached).
    rust_bootstrap="$("$repo/tests/fixtures/lambda-rust/build.sh" | tail -n1)"
    [[ -x $rust_bootstrap ]] || die "the lambda_runtime fixture was not built"
    # AWS's awslambdaric from PyPI, for the python3 image's CPython.
    agent_bin="$(agent_binary)"
    [[ -x $agent_bin ]] || die "spore-agent was not built"
    py_manifest="$(dirname "$("$repo/guest/build-rootfs.sh" python3 --agent "$agent_bin" | tail -n1)")/manifest.json"
    guest_py="$(python3 -c 'import json, sys
v = [p["version"] for p in json.load(open(sys.argv[1]))["packages"] if p["name"] == "python3"]
print(".".join(v[0].split(":")[-1].split(".")[:2]) if v else "")' "$py_manifest")"
    [[ -n $guest_py ]] || die "no python3 package in $py_manifest"
    ric_dir="$(TARGET_PYTHON="$guest_py" "$repo/tests/fixtures/awslambdaric/install.sh" | tail -n1)"
    [[ -d $ric_dir ]] || die "awslambdaric was not installed"
    python3 - "$fns" "$work" "$rust_bootstrap" "$ric_dir" <<'PY'
import os, sys, zipfile
src, out, rust, ric = sys.argv[1:5]
def make(name, files):
    with zipfile.ZipFile(f"{out}/{name}.zip", "w", zipfile.ZIP_DEFLATED) as z:
        for arc, path, mode in files:
            info = zipfile.ZipInfo(arc, date_time=(2024, 1, 1, 0, 0, 0))
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            with open(path, "rb") as f:
                z.writestr(info, f.read())
make("hello", [("hello.py", f"{src}/hello.py", 0o644)])
make("broken", [("broken.py", f"{src}/broken.py", 0o644)])
make("provided", [("bootstrap", f"{src}/bootstrap", 0o755)])
make("rust", [("bootstrap", rust, 0o755)])
make("noexec", [("bootstrap", f"{src}/bootstrap", 0o644)])
ric_files = [("handler.py", f"{src}/ric/handler.py", 0o644), ("bootstrap", f"{src}/ric/bootstrap", 0o755)]
for root, dirs, files in os.walk(ric):
    dirs[:] = sorted(d for d in dirs if d != "__pycache__")
    for f in sorted(files):
        if f != ".complete":
            p = os.path.join(root, f)
            ric_files.append((os.path.relpath(p, ric), p, 0o644))
make("ric", ric_files)
PY
    # L1 holds both images, the instances (256 MiB each: zygotes, clones)
    # and their snapshots (runtime bases and function diffs); the scenario
    # restarts the daemon once, so it has more boots than the default allows.
    # Its own L1: its initramfs carries the runtime images and mkfs with its
    # libraries (hundreds of MiB the other scenarios' L1 would hold in
    # memory), and its daemon and instances fill most of a 4 GiB L1.
    run_one serve-linux --own-l1 --memory 4096 --timeout 2400 --scenario "$here/scenarios/serve-linux.sh" \
        "${sl_files[@]}" --file "$work/hello.zip:/fns/hello.zip" \
        --file "$work/broken.zip:/fns/broken.zip" --file "$work/provided.zip:/fns/provided.zip" --file "$work/rust.zip:/fns/rust.zip" \
        --file "$work/ric.zip:/fns/ric.zip" --file "$work/noexec.zip:/fns/noexec.zip" \
        --out-dir "$work/out-serve-linux"
fi
if [[ $only == bench-serve-linux ]]; then
    # A benchmark, opt-in (make bench-serve-linux): `spore bench serve
    # --linux`, SnapFaaS's experiment. The python3 image and the guest
    # kernel go on a scratch disk (with the daemon's state directory), so a
    # cold start's dropped page cache is read from a disk again; the matrix
    # comes from SPORE_BSL_* (see the Makefile) through an env file.
    bsl="$work/bsl-scratch"
    mkdir -p "$bsl/cache"
    img="$(runtime_images python3 | tail -n1)"
    [[ -f $img ]] || die "the python3 runtime image was not built"
    d="$(dirname "$img")"
    mkdir -p "$bsl/cache/$(basename "$d")"
    cp "$img" "$d/manifest.json" "$bsl/cache/$(basename "$d")/"
    cp "$("$repo/guest/build-kernel.sh" | tail -n1)" "$bsl/vmlinux"
    add_mkfs_files
    bsl_files=("${mkfs_files[@]}")
    for f in "$repo"/tests/fixtures/python-bench/*.py; do
        bsl_files+=(--file "$f:/fns/python-bench/$(basename "$f")")
    done
    : >"$work/bsl.env"
    for v in FUNCTIONS SIZES ROUNDS STRATEGIES TEMPERATURES; do
        val="$(printenv "SPORE_BSL_$v" || true)"
        [[ $val =~ ^[A-Za-z0-9,_-]*$ ]] || die "SPORE_BSL_$v: letters, digits, commas, - and _ only"
        [[ -z $val ]] || echo "SPORE_BSL_$v=$val" >>"$work/bsl.env"
    done
    run_one bench-serve-linux --memory "${SPORE_BSL_L1_MIB:-6144}" --timeout "${SPORE_BSL_TIMEOUT:-5400}" \
        --stall-timeout "${SPORE_BSL_TIMEOUT:-5400}" --scratch-disk "${SPORE_BSL_DISK_MIB:-16384}:$bsl" \
        --scenario "$here/scenarios/bench-serve-linux.sh" "${bsl_files[@]}" \
        --file "$work/bsl.env:/etc/spore-bench-serve-linux.env" \
        --out-dir "${SPORE_BENCH_OUT:-$work/out-bench-serve-linux}"
fi
if [[ $only == bench ]]; then
    run_one bench --stall-timeout 900 --scenario "$here/scenarios/bench.sh" --out-dir "${SPORE_BENCH_OUT:-$work/out-bench}"
fi
if [[ -z $only || $only == tmem ]]; then
    # The guest's tmem client, built like the other guest tools (static musl).
    tmem_bin="$(cd "$repo" && cargo build --release -q -p spore-guest-tools --bin spore-tmem \
        --target x86_64-unknown-linux-musl --message-format json-render-diagnostics |
        sed -n 's/.*"executable":"\([^"]*spore-tmem\)".*/\1/p' | tail -n1)"
    [[ -x $tmem_bin ]] || die "spore-tmem was not built"
    run_one tmem --scenario "$here/scenarios/tmem.sh" \
        --guest-scenario "$here/scenarios/guest/tmem.sh" \
        --guest-file "$tmem_bin:/bin/spore-tmem"
fi
# The `base` and `web` sandbox templates (spore sandbox template build;
# web: tests/sandbox/web/spec.toml) with this tree's spore-agent and
# spore-envd (static musl; the images are cached by content); their
# file systems are 2 GiB, sparse. Built for sandbox-envd and mmds.
if [[ -z $only || $only == sandbox-envd || $only == mmds ]]; then
    envd_bin="$(cd "$repo" && cargo build --release -q -p spore-envd --bin spore-envd \
        --target x86_64-unknown-linux-musl --message-format json-render-diagnostics |
        sed -n 's/.*"executable":"\([^"]*spore-envd\)".*/\1/p' | tail -n1)"
    [[ -x $envd_bin ]] || die "spore-envd was not built"
    tpl_args=(--kernel "$("$repo/guest/build-kernel.sh" | tail -n1)" --agent "$(agent_binary)" --envd "$envd_bin")
    for t in base web; do
        spec=()
        [[ $t == base ]] || spec=(--spec "$repo/tests/sandbox/$t/spec.toml")
        SPORE_GUEST_DIR="$repo/guest" "$spore" sandbox template build "$t" "${spec[@]}" "${tpl_args[@]}" \
            --out "$work/$t.toml" >/dev/null || die "the $t sandbox template was not built"
    done
    rootfs_of() { sed -n 's/^rootfs = "\(.*\)"$/\1/p' "$1"; }
fi
if [[ -z $only || $only == sandbox-envd ]]; then
    # On a scratch disk; its own L1: the host drives it (the e2b SDK is
    # Python, on this host) through forwarded ports.
    mkdir -p "$work/sbx-scratch"
    cp --sparse=always "$(rootfs_of "$work/base.toml")" "$work/sbx-scratch/sandbox-base.ext4"
    cp --sparse=always "$(rootfs_of "$work/web.toml")" "$work/sbx-scratch/sandbox-web.ext4"
    # The web template's commands, for L1's own template file (its paths are L1's).
    grep -E '^(start_cmd|ready_cmd) = ' "$work/web.toml" >"$work/sbx-scratch/web.cmds"
    # SPORE_SANDBOX_BENCH="ARGS" (make bench-sandbox): the scenario also runs
    # spore bench sandbox ARGS.
    if [[ -n ${SPORE_SANDBOX_BENCH:-} ]]; then
        printf '%s\n' "$SPORE_SANDBOX_BENCH" >"$work/sbx-scratch/bench-sandbox.args"
    fi
    # Sandboxes' networks (spore serve's namespaces, veths and NAT): iproute2
    # and nftables in L1's /usr/local/sbin (the scenario puts it first in
    # spore serve's PATH; busybox's ip has no netns), and the netfilter
    # modules their rules need.
    ensure_packages iproute2 nftables
    mapfile -t sbx_tool_files < <(with_libs "$(command -v ip)" /usr/local/sbin/ip
        with_libs "$(command -v nft)" /usr/local/sbin/nft)
    # Template builds' min_free_disk_mb: e2fsprogs' dumpe2fs, e2fsck and
    # resize2fs (the daemon looks in /sbin too).
    for tool in dumpe2fs e2fsck resize2fs; do
        mapfile -t -O "${#sbx_tool_files[@]}" sbx_tool_files < <(
            with_libs "$(command -v "$tool" || echo "/usr/sbin/$tool")" "/sbin/$tool")
    done
    # Its longest quiet stretch in passing runs is under a minute; make
    # bench-sandbox's benchmark may be quiet longer.
    sbx_stall=240
    [[ -n ${SPORE_SANDBOX_BENCH:-} ]] && sbx_stall=900
    run_one sandbox-envd --own-l1 --memory 3072 --timeout 3000 --stall-timeout "$sbx_stall" \
        "${sbx_tool_files[@]}" --l1-module nf_tables --l1-module nft_chain_nat \
        --l1-module nft_masq --l1-module nft_ct \
        --scratch-disk "3600:$work/sbx-scratch" --hostfwd 49983 --hostfwd 49984 --hostfwd 49985 \
        --hostfwd 7000 --hostfwd 7001 --hostfwd 3000 \
        --host-driver "$here/host/sandbox-envd.sh" \
        --scenario "$here/scenarios/sandbox-envd.sh" --out-dir "$work/out-sandbox-envd"
fi
if [[ -z $only || $only == mmds ]]; then
    # The web image twice (one copy per VMM: spore's guest writes through a
    # copy-on-write overlay, Firecracker's to its own copy), and the
    # reference Firecracker beside the repository, to compare answers.
    mkdir -p "$work/mmds-scratch"
    cp --sparse=always "$(rootfs_of "$work/web.toml")" "$work/mmds-scratch/sandbox-web.ext4"
    cp --sparse=always "$(rootfs_of "$work/web.toml")" "$work/mmds-scratch/sandbox-web-fc.ext4"
    fc_args=()
    for cand in "$repo/../shared/reference/firecracker/firecracker" /work/shared/reference/firecracker/firecracker; do
        [[ -x $cand ]] && { fc_args=(--file "$cand:/bin/firecracker"); break; }
    done
    run_one mmds --own-l1 --memory 2048 --timeout 900 --stall-timeout 240 \
        --scratch-disk "1500:$work/mmds-scratch" "${fc_args[@]}" \
        --scenario "$here/scenarios/mmds.sh" --out-dir "$work/out-mmds"
fi

run_queue
echo "nested: $passed passed, $failed failed, $skipped skipped ($boots L1 boots for ${#queue[@]} scenarios$(retries))"
exit $status
