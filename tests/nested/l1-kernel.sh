#!/usr/bin/env bash
# Fetches Debian's cloud kernel for the nested harness's L1 VM without
# installing it: `apt-get download` of the versioned linux-image-*-cloud-amd64
# package that linux-image-cloud-amd64 points at, `dpkg-deb -x`, then keeps
# vmlinuz and the modules kvm-amd needs (irqbypass, kvm, kvm-amd and whatever
# else `modinfo` names), plus the network modules the `net` scenario uses (tun
# for tap devices, veth), each with its dependencies, decompressed so busybox
# insmod can load them. A module the package builds into the kernel
# (modules.builtin) is skipped.
# Result, cached per package version and module set:
#   ${SPORE_CACHE:-/var/cache/spore}/l1-kernel-<package>_<version>-<modset>/
#       vmlinuz  modules/*.ko  load-order (module file names, load order)
# Usage: tests/nested/l1-kernel.sh [--arch x86_64|arm64] [MODULE...]   (prints
#   the directory as the last line; MODULEs are loaded too, e.g. virtio_pci
#   virtio_blk for run.sh's --scratch-disk, and are part of the cache key)
#
# --arch arm64 (the aarch64 tier, issue 15): Debian's arm64 cloud kernel
# (linux-image-cloud-arm64:arm64; dpkg gets the arm64 architecture added when
# it lacks it) and, as L1 has no other userland, the static busybox of
# busybox-static:arm64. KVM is built into that kernel (CONFIG_KVM=y, checked
# here; a kernel with KVM as a module gets kvm and its dependencies loaded),
# so load-order holds only tun, veth and the MODULEs, each where it is a module.
# Cached per kernel and busybox version and module set:
#   ${SPORE_CACHE:-/var/cache/spore}/l1-kernel-<package>_<version>-busybox_<version>-<modset>/
#       vmlinuz  busybox  modules/*.ko  load-order
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=guest/lib.sh
source "$here/../../guest/lib.sh"

arch=x86_64
case ${1:-} in
--arch) arch="${2:?--arch takes x86_64 or arm64}"; shift 2 ;;
--arch=*) arch="${1#--arch=}"; shift ;;
esac
# The modules L1 loads (with their dependencies). Part of the cache key: a
# cache entry made for another list is not reused.
case $arch in
x86_64 | amd64)
    arch=x86_64 meta=linux-image-cloud-amd64 flavour=cloud-amd64 qual="" qual_re=""
    wanted=(kvm_amd tun veth "$@")
    ;;
arm64 | aarch64)
    # qual: apt's name for the foreign architecture's packages (none where
    # arm64 is the host's own, hence optional in apt's answers).
    arch=arm64 meta=linux-image-cloud-arm64 flavour=cloud-arm64 qual=":arm64" qual_re='\(:arm64\)\?'
    wanted=(tun veth "$@")
    ;;
*) die "--arch takes x86_64 or arm64, not '$arch'" ;;
esac
modset="$(printf '%s\n' "${wanted[@]}" | sha256sum | cut -c1-8)"
ensure_packages apt dpkg kmod xz-utils zstd
if [[ $arch == arm64 && $(dpkg --print-architecture) != arm64 ]] &&
    ! dpkg --print-foreign-architectures | grep -qx arm64; then
    log "adding Debian's arm64 architecture to dpkg (for the arm64 kernel and busybox packages)"
    dpkg --add-architecture arm64
    DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
fi

# The versioned package the metapackage depends on, e.g.
# linux-image-6.1.0-56-cloud-amd64; refresh the package lists once if apt
# does not know the metapackage yet.
resolve() { apt-cache depends "$meta$qual" 2>/dev/null | sed -n "s/^ *Depends: \(linux-image-[^ ]*-$flavour\)$qual_re\$/\1/p" | head -n1; }
pkg="$(resolve)"
if [[ -z $pkg ]]; then
    log "apt does not know $meta; running apt-get update"
    DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
    pkg="$(resolve)"
fi
if [[ -z $pkg ]]; then
    # Offline: fall back to the newest kernel already in the cache.
    dest="$(find "$SPORE_CACHE" -maxdepth 1 -name "l1-kernel-*-${flavour}_*-$modset" -type d 2>/dev/null | LC_ALL=C sort | tail -n1)"
    [[ -n $dest && -f $dest/load-order ]] || die "cannot resolve $meta with apt and nothing is cached"
    log "apt cannot resolve $meta; using cached $dest"
    echo "$dest"
    exit 0
fi
ver="$(apt-cache policy "$pkg$qual" | sed -n 's/^ *Candidate: //p')"
[[ -n $ver && $ver != "(none)" ]] || die "no candidate version for $pkg"
dest="$SPORE_CACHE/l1-kernel-${pkg}_${ver}-$modset"
downloads=("$pkg$qual=$ver")
if [[ $arch == arm64 ]]; then
    bbver="$(apt-cache policy busybox-static:arm64 | sed -n 's/^ *Candidate: //p')"
    [[ -n $bbver && $bbver != "(none)" ]] || die "no candidate version for busybox-static:arm64"
    dest="$SPORE_CACHE/l1-kernel-${pkg}_${ver}-busybox_${bbver//:/_}-$modset"
    downloads+=("busybox-static:arm64=$bbver")
fi

if [[ -f $dest/load-order ]]; then
    log "cached: $dest"
    echo "$dest"
    exit 0
fi

with_cache_lock "$dest"
if [[ -f $dest/load-order ]]; then
    echo "$dest"
    exit 0
fi

work="$(mktemp -d "$SPORE_CACHE/.l1-kernel.XXXXXX")"
trap 'rm -rf "$work"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
# apt-get download drops privileges to _apt, which must be able to write here.
chmod 0755 "$work"
mkdir -p "$work/dl" "$work/x" "$work/out/modules"
chown _apt "$work/dl" 2>/dev/null || true

log "apt-get download ${downloads[*]}"
(cd "$work/dl" && apt-get download -q "${downloads[@]}" >&2)
deb="$(find "$work/dl" -name 'linux-image-*.deb' | head -n1)"
[[ -n $deb ]] || die "apt-get download produced no .deb"
dpkg-deb -x "$deb" "$work/x"
if [[ $arch == arm64 ]]; then
    # L1's userland: busybox-static's binary, checked static (L1 has no libc).
    bbdeb="$(find "$work/dl" -name 'busybox-static_*.deb' | head -n1)"
    [[ -n $bbdeb ]] || die "apt-get download produced no busybox-static .deb"
    dpkg-deb -x "$bbdeb" "$work/bb"
    install -m 0755 "$work/bb/bin/busybox" "$work/out/busybox"
    LC_ALL=C readelf -h "$work/out/busybox" | grep -q 'Machine: *AArch64' || die "busybox-static:arm64 is not an AArch64 binary"
    LC_ALL=C readelf -l "$work/out/busybox" | grep -q 'Requesting program interpreter' && die "busybox-static:arm64 is not static"
fi

vmlinuz="$(find "$work/x/boot" -name 'vmlinuz-*' | head -n1)"
[[ -n $vmlinuz ]] || die "$pkg has no /boot/vmlinuz-*"
cp "$vmlinuz" "$work/out/vmlinuz"
moddir="$(find "$work/x/lib/modules" "$work/x/usr/lib/modules" -mindepth 1 -maxdepth 1 -type d 2>/dev/null | head -n1 || true)"
[[ -n $moddir ]] || die "$pkg has no lib/modules/<version>"

# Finds a module file by name (kernel module names treat - and _ alike) and
# copies it, decompressed, to out/modules/NAME.ko.
fetch_module() {
    local name="$1" pattern f
    pattern="$(printf '%s' "$name" | sed 's/[-_]/[-_]/g')"
    f="$(find "$moddir" -regextype posix-extended -regex ".*/${pattern}\.ko(\.xz|\.zst|\.gz)?" | head -n1)"
    [[ -n $f ]] || die "module $name not found in $pkg"
    case "$f" in
    *.ko.xz) xz -dc "$f" >"$work/out/modules/$name.ko" ;;
    *.ko.zst) zstd -qdc "$f" >"$work/out/modules/$name.ko" ;;
    *.ko.gz) gzip -dc "$f" >"$work/out/modules/$name.ko" ;;
    *) cp "$f" "$work/out/modules/$name.ko" ;;
    esac
}

# Depth-first over `modinfo -F depends`: dependencies are listed before the
# modules that need them, which is the order insmod must follow.
declare -A seen=()
order=()
# Built into this kernel (modules.builtin lists kernel/.../NAME.ko).
builtin() {
    local pattern
    pattern="$(printf '%s' "$1" | sed 's/[-_]/[-_]/g')"
    grep -qE "(^|/)${pattern}\.ko$" "$moddir/modules.builtin" 2>/dev/null
}
visit() {
    local name="${1//-/_}" dep
    [[ -n ${seen[$name]:-} ]] && return 0
    seen[$name]=1
    if builtin "$name"; then
        log "$name is built into $pkg"
        return 0
    fi
    fetch_module "$name"
    for dep in $(modinfo -F depends "$work/out/modules/$name.ko" | tr ',' ' '); do
        visit "$dep"
    done
    order+=("$name.ko")
}
if [[ $arch == arm64 ]]; then
    # arm64 KVM is a bool in Linux 6.1 (built in or absent); should a kernel
    # have it as a module, L1 loads kvm with its dependencies first.
    kconfig="$(find "$work/x/boot" -name 'config-*' | head -n1)"
    [[ -n $kconfig ]] || die "$pkg has no /boot/config-*"
    case "$(sed -n 's/^CONFIG_KVM=//p' "$kconfig")" in
    y) log "KVM is built into $pkg (CONFIG_KVM=y)" ;;
    m) wanted=(kvm "${wanted[@]}") ;;
    *) die "$pkg has no KVM (CONFIG_KVM is neither y nor m)" ;;
    esac
fi
for m in "${wanted[@]}"; do visit "$m"; done
if [[ $arch == x86_64 ]]; then
    for m in irqbypass kvm kvm_amd; do
        [[ -n ${seen[$m]:-} ]] || die "expected $m among kvm_amd's dependencies"
    done
fi
: >"$work/out/load-order"
((${#order[@]} == 0)) || printf '%s\n' "${order[@]}" >"$work/out/load-order"
printf '%s=%s\n' "$pkg" "$ver" >"$work/out/package"
[[ $arch == x86_64 ]] || printf 'busybox-static:arm64=%s\n' "$bbver" >>"$work/out/package"

mv "$work/out" "$dest"
log "L1 kernel $pkg $ver: modules $(tr '\n' ' ' <"$dest/load-order")"
echo "$dest"
