#!/usr/bin/env bash
# The first brick of the aarch64 nested tier (issue 15): does an arm64 L1
# under QEMU TCG (`-machine virt,virtualization=on,gic-version=3 -cpu max`)
# bring up KVM, and does an L2 vCPU run there? Boots Debian's arm64 cloud
# kernel with a busybox initramfs whose init runs `kvm-smoke` (a static
# arm64 program: one vCPU, KVM_ARM_VCPU_INIT with the preferred target and
# PSCI 0.2, four instructions that store 42 to an MMIO address; it expects
# that KVM_EXIT_MMIO) twice and powers off. Prints the L1 kernel's KVM lines
# and the smoke's result; exit 0 only if both runs passed.
#
# Needs: qemu-system-arm, gcc-aarch64-linux-gnu, libc6-dev-arm64-cross,
# Debian's arm64 packages. The kernel and busybox come from the nested
# harness's tests/nested/l1-kernel.sh --arch arm64 (dpkg --add-architecture
# arm64 is done there when missing), cached per version under
# ${SPORE_CACHE:-/var/cache/spore}/l1-kernel-<kernel package>_<version>-busybox_<version>-<modset>/.
# Not part of `make test`: `make probe-arm64`; the aarch64 nested tier built
# on it is `make test-nested-arm64`.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=guest/lib.sh
source "$here/../../guest/lib.sh"

timeout_s="${SPORE_ARM64_TIMEOUT:-600}"
ensure_packages qemu-system-arm gcc-aarch64-linux-gnu libc6-dev-arm64-cross cpio

cache="$("$here/../nested/l1-kernel.sh" --arch arm64 | tail -n1)"
[[ -f $cache/vmlinuz && -f $cache/busybox ]] || die "l1-kernel.sh --arch arm64 gave no vmlinuz and busybox ($cache)"

work="$(mktemp -d "${TMPDIR:-/tmp}/spore-arm64-probe.XXXXXX")"
qemu_pid=""
cleanup() {
    [[ -n $qemu_pid ]] && kill "$qemu_pid" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

root="$work/root"
mkdir -p "$root/bin" "$root/proc" "$root/sys" "$root/dev"
install -m 0755 "$cache/busybox" "$root/bin/busybox"
aarch64-linux-gnu-gcc -O2 -static -Wall -Wextra -o "$root/bin/kvm-smoke" "$here/kvm-smoke.c"
cat >"$root/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
echo "ARM64-L1 up $(cut -d' ' -f1 /proc/uptime)s"
dmesg | grep -E 'kvm \[|started at EL' | sed 's/^/ARM64-L1 dmesg: /'
/bin/kvm-smoke
/bin/kvm-smoke
echo "ARM64-L1 done"
poweroff -f
INIT
chmod 0755 "$root/init"
pack_cpio "$root" "$work/init.cpio"

log "booting the arm64 L1 under QEMU TCG (EL2 on, GICv3; timeout ${timeout_s}s)"
timeout "$timeout_s" qemu-system-aarch64 -machine virt,virtualization=on,gic-version=3 -cpu max \
    -m 2048 -smp 2 -nographic -no-reboot -net none \
    -kernel "$cache/vmlinuz" -initrd "$work/init.cpio" \
    -append "console=ttyAMA0 quiet panic=-1" </dev/null >"$work/serial.txt" 2>&1 &
qemu_pid=$!
wait "$qemu_pid" || true
qemu_pid=""
tr -d '\r' <"$work/serial.txt" | grep -aE '^(ARM64-L1|KVMPROBE)' || true
passes="$(grep -ac '^KVMPROBE PASS' "$work/serial.txt" || true)"
[[ $passes -eq 2 ]] || die "the L2 smoke did not pass twice (serial log: $(tail -n 20 "$work/serial.txt" | tr '\n' ' '))"
log "arm64 L1 with KVM: the L2 smoke passed twice"
