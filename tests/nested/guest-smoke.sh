#!/usr/bin/env bash
# Boots the spore guest kernel and initramfs under plain QEMU (microvm
# machine, TCG, PVH entry, virtio-mmio devices on the command line) and runs
# scenarios/guest/smoke.sh inside: checks the guest assets on their own,
# without spore and without nested KVM.
# Usage: tests/nested/guest-smoke.sh [--timeout SECS] [--log FILE]
# Prints the SPORE-TEST lines and "N passed, N failed, N skipped"; exits
# non-zero on any FAIL, no result, or timeout.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
# shellcheck source=guest/lib.sh
source "$repo/guest/lib.sh"

timeout_s=120 log_file=/tmp/spore-nested/guest-smoke.log
while [[ $# -gt 0 ]]; do
    case "$1" in
    --timeout) timeout_s="${2:?}"; shift 2 ;;
    --log) log_file="${2:?}"; shift 2 ;;
    *) die "usage: $0 [--timeout SECS] [--log FILE]" ;;
    esac
done
ensure_packages qemu-system-x86 e2fsprogs
mkdir -p "$(dirname "$log_file")"

work="$(mktemp -d "${TMPDIR:-/tmp}/spore-guest-smoke.XXXXXX")"
trap 'rm -rf "$work"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

vmlinux="$("$repo/guest/build-kernel.sh" | tail -n1)"
initrd="$("$repo/guest/build-initramfs.sh" "$work/g.cpio.gz" "$here/scenarios/guest/smoke.sh:/scenario" | tail -n1)"
mkdir -p "$work/disk"
echo hello-from-disk >"$work/disk/hello.txt"
mkfs.ext4 -q -d "$work/disk" "$work/disk.img" 16M >&2

start=$EPOCHREALTIME
rc=0
# -no-reboot: the guest's final `reboot -f` ends QEMU.
timeout -k 5 "$timeout_s" qemu-system-x86_64 -M microvm,accel=tcg,acpi=off -cpu max \
    -m 512 -smp 2 -nographic -nodefaults -no-reboot -serial stdio \
    -kernel "$vmlinux" -initrd "$initrd" -append "console=ttyS0 quiet panic=-1 spore.ip=10.0.2.15/24 spore.gw=10.0.2.2" \
    -drive id=d0,file="$work/disk.img",format=raw,if=none -device virtio-blk-device,drive=d0 \
    -device virtio-rng-device -device virtio-balloon-device \
    -netdev user,id=n0 -device virtio-net-device,netdev=n0 \
    </dev/null 2>&1 | tr -d '\r' >"$log_file" || rc=$?
elapsed=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')

results="$(grep -aoE 'SPORE-TEST [^ ]+ (PASS|FAIL|SKIP)( .*)?$' "$log_file" || true)"
count() { grep -cE "^SPORE-TEST [^ ]+ $1( |$)" <<<"$results" || true; }
pass=$(count PASS) fail=$(count FAIL) skip=$(count SKIP)
[[ -n $results ]] && printf '%s\n' "$results" | sed 's/^SPORE-TEST /  /'
grep -a '^SPORE-INIT up' "$log_file" | sed 's/^/  /' || true
ok=1
if [[ $rc -eq 124 || $rc -eq 137 ]]; then echo "  problem: timeout after ${timeout_s}s"; ok=0
elif [[ $rc -ne 0 ]]; then echo "  problem: QEMU exited with status $rc"; ok=0; fi
((pass + fail + skip > 0)) || { echo "  problem: no SPORE-TEST results"; ok=0; }
((fail == 0)) || ok=0
printf 'guest-smoke: %d passed, %d failed, %d skipped (%ss; log %s)\n' "$pass" "$fail" "$skip" "$elapsed" "$log_file"
((ok))
