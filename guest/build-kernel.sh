#!/usr/bin/env bash
# Builds the spore Linux guest kernel from Debian's linux-source-6.12:
# `make tinyconfig`, then the architecture's fragment merged over it.
#
# x86_64 (default): an ELF vmlinux with a PVH entry, and the same kernel as a
# bzImage (spore boots either format; the bzImage is what distributions ship,
# so the tests boot both), from kernel.fragment, cached under
#   ${SPORE_CACHE:-/var/cache/spore}/kernel-<sha256>/{vmlinux,bzImage,config,build.log}
# arm64 (--arch arm64): an arm64 `Image`, cross-built with Debian's
# aarch64-linux-gnu gcc from kernel-arm64.fragment, cached under
#   ${SPORE_CACHE:-/var/cache/spore}/kernel-arm64-<sha256>/{Image,config,build.log}
# Both keyed by the fragment, this script, the source package version and
# the architecture.
# Usage: guest/build-kernel.sh [--arch x86_64|arm64]
#        (prints the vmlinux or Image path as the last line)
# Env:   SPORE_CACHE, SPORE_VERBOSE=1 (stream make output to stderr)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=guest/lib.sh
source "$here/lib.sh"

usage="usage: $0 [--arch x86_64|arm64]"
arch=x86_64
while [[ $# -gt 0 ]]; do
    case $1 in
    --arch)
        [[ $# -ge 2 ]] || die "$usage"
        arch="$2"
        shift 2
        ;;
    --arch=*)
        arch="${1#--arch=}"
        shift
        ;;
    -h | --help)
        echo "$usage"
        exit 0
        ;;
    *) die "$usage" ;;
    esac
done

src_pkg=linux-source-6.12
src_tar=/usr/src/linux-source-6.12.tar.xz
packages=("$src_pkg" make gcc libc6-dev bc flex bison libelf-dev libssl-dev xz-utils)

# Per architecture: kernel ARCH, cross compiler prefix, fragment, cache entry
# prefix, make targets, and what goes into the entry (NAME:PATH in the tree;
# the first is the result).
case $arch in
x86_64 | amd64)
    karch=x86_64
    cross=""
    fragment="$here/kernel.fragment"
    entry=kernel
    targets=(vmlinux bzImage)
    products=(vmlinux:vmlinux bzImage:arch/x86/boot/bzImage)
    eta=" (about 6 minutes on 2 cores)"
    ;;
arm64 | aarch64)
    karch=arm64
    cross=aarch64-linux-gnu-
    fragment="$here/kernel-arm64.fragment"
    entry=kernel-arm64
    targets=(Image)
    products=(Image:arch/arm64/boot/Image)
    eta=" (about 6 minutes on 2 cores)"
    packages+=(gcc-aarch64-linux-gnu)
    ;;
*) die "unknown architecture '$arch' ($usage)" ;;
esac
result="${products[0]%%:*}"

ensure_packages "${packages[@]}"
[[ -f $src_tar ]] || die "$src_tar missing although $src_pkg is installed"
src_key="$src_pkg=$(pkg_version "$src_pkg")"

key="$(hash_inputs "$fragment" "$here/build-kernel.sh" "$src_key" "arch=$karch")"
dest="$SPORE_CACHE/$entry-$key"

if [[ -f $dest/$result ]]; then
    log "cached: $dest/$result"
    echo "$dest/$result"
    exit 0
fi

with_cache_lock "$dest"
if [[ -f $dest/$result ]]; then # built by a concurrent run while we waited
    echo "$dest/$result"
    exit 0
fi

work="$(mktemp -d "$SPORE_CACHE/.kernel-build.XXXXXX")"
trap 'rm -rf "$work"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
buildlog="$work/out/build.log"
mkdir -p "$work/out"

# Runs a build step, logging to build.log (and stderr when verbose); on
# failure shows the end of the log so the error is visible without digging.
step() {
    log "$1"
    shift
    if [[ ${SPORE_VERBOSE:-0} == 1 ]]; then
        "$@" 2>&1 | tee -a "$buildlog" >&2
    elif ! "$@" >>"$buildlog" 2>&1; then
        tail -n 40 "$buildlog" >&2
        die "step failed; full log was $buildlog"
    fi
}

step "extracting $src_tar" tar -xJf "$src_tar" -C "$work"
ksrc="$work/linux-source-6.12"
kenv=(ARCH="$karch")
[[ -n $cross ]] && kenv+=(CROSS_COMPILE="$cross")
kmake() { make -C "$ksrc" "${kenv[@]}" "$@"; }

step "make tinyconfig" kmake tinyconfig
step "merging $(basename "$fragment")" \
    env -C "$ksrc" "${kenv[@]}" scripts/kconfig/merge_config.sh -m .config "$fragment"
step "make olddefconfig" kmake olddefconfig

# tinyconfig + olddefconfig silently drop options whose dependencies are
# unmet; insist that every option the fragment sets survived.
missing=()
while IFS= read -r line; do
    if [[ $line =~ ^(CONFIG_[A-Za-z0-9_]+)=(.*)$ ]]; then
        grep -qxF "$line" "$ksrc/.config" || missing+=("$line (have: $(grep -E "^(# )?${BASH_REMATCH[1]}[= ]" "$ksrc/.config" || echo unset))")
    elif [[ $line =~ ^#\ (CONFIG_[A-Za-z0-9_]+)\ is\ not\ set$ ]]; then
        ! grep -qE "^${BASH_REMATCH[1]}=" "$ksrc/.config" || missing+=("$line (but it is set)")
    fi
done <"$fragment"
if [[ ${#missing[@]} -gt 0 ]]; then
    printf '  %s\n' "${missing[@]}" >&2
    die "${#missing[@]} option(s) from $(basename "$fragment") did not end up in .config (unmet dependencies?)"
fi

step "make -j$(nproc) ${targets[*]}$eta" kmake -j"$(nproc)" "${targets[@]}"
for p in "${products[@]}"; do
    cp "$ksrc/${p#*:}" "$work/out/${p%%:*}"
done
cp "$ksrc/.config" "$work/out/config"
if [[ $karch == arm64 ]]; then
    # The arm64 Image header (Documentation/arch/arm64/booting.rst): magic
    # "ARM\x64" at offset 56, what a loader checks before anything else.
    magic="$(od -An -tx1 -j56 -N4 "$work/out/Image" | tr -d ' \n')"
    [[ $magic == 41524d64 ]] || die "$ksrc/arch/arm64/boot/Image has no arm64 Image magic at offset 56 (got $magic)"
fi

# Rename into place: readers only ever see a complete cache entry.
mv "$work/out" "$dest"
log "built $dest/$result ($(du -h "$dest/$result" | cut -f1))"
echo "$dest/$result"
