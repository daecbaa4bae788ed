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
# Debian's arm64 packages (dpkg --add-architecture arm64 is done here when
# missing). The kernel and busybox debs are cached per version under
# ${SPORE_CACHE:-/var/cache/spore}/arm64-l1-<kernel package>_<version>/.
# Not part of `make test` yet: `make probe-arm64`.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=guest/lib.sh
source "$here/../../guest/lib.sh"

timeout_s="${SPORE_ARM64_TIMEOUT:-600}"
ensure_packages qemu-system-arm gcc-aarch64-linux-gnu libc6-dev-arm64-cross cpio dpkg apt

if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    log "adding Debian's arm64 architecture to dpkg (for the arm64 kernel and busybox packages)"
    dpkg --add-architecture arm64
    DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
fi
resolve() { apt-cache depends linux-image-cloud-arm64:arm64 2>/dev/null | sed -n 's/^ *Depends: \(linux-image-[^ ]*-cloud-arm64\)\(:arm64\)\?$/\1/p' | head -n1; }
pkg="$(resolve)"
if [[ -z $pkg ]]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
    pkg="$(resolve)"
fi
[[ -n $pkg ]] || die "apt cannot resolve linux-image-cloud-arm64:arm64"
ver="$(apt-cache policy "$pkg:arm64" | sed -n 's/^ *Candidate: //p')"
bbver="$(apt-cache policy busybox-static:arm64 | sed -n 's/^ *Candidate: //p')"
[[ -n $ver && $ver != "(none)" && -n $bbver && $bbver != "(none)" ]] || die "no candidate version for $pkg:arm64 or busybox-static:arm64"
cache="$SPORE_CACHE/arm64-l1-${pkg}_${ver}-busybox_${bbver//:/_}"

if [[ ! -f $cache/vmlinuz || ! -f $cache/busybox ]]; then
    with_cache_lock "$cache"
    if [[ ! -f $cache/vmlinuz || ! -f $cache/busybox ]]; then
        dl="$(mktemp -d "$SPORE_CACHE/.arm64-l1.XXXXXX")"
        trap 'rm -rf "$dl"' EXIT
        chmod 0755 "$dl"
        chown _apt "$dl" 2>/dev/null || true
        log "apt-get download $pkg:arm64=$ver busybox-static:arm64=$bbver"
        (cd "$dl" && apt-get download -q "$pkg:arm64=$ver" "busybox-static:arm64=$bbver" >&2)
        for d in "$dl"/*.deb; do dpkg-deb -x "$d" "$dl/x"; done
        mkdir -p "$cache.tmp"
        cp "$(find "$dl/x/boot" -name 'vmlinuz-*' | head -n1)" "$cache.tmp/vmlinuz"
        cp "$dl/x/bin/busybox" "$cache.tmp/busybox"
        rm -rf "$cache"
        mv "$cache.tmp" "$cache"
        rm -rf "$dl"
        trap - EXIT
    fi
fi

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
