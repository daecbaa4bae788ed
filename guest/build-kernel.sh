#!/usr/bin/env bash
# Builds the spore Linux guest kernel (an ELF vmlinux with a PVH entry) from
# Debian's linux-source-6.12: `make tinyconfig`, then kernel.fragment merged
# over it. The result is cached under
#   ${SPORE_CACHE:-/var/cache/spore}/kernel-<sha256>/{vmlinux,bzImage,config,build.log}
# (the same kernel twice: spore boots either format; the bzImage is what
# distributions ship, so the tests boot both).
# keyed by the fragment, this script and the source package version.
# Usage: guest/build-kernel.sh        (prints the vmlinux path as the last line)
# Env:   SPORE_CACHE, SPORE_VERBOSE=1 (stream make output to stderr)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=guest/lib.sh
source "$here/lib.sh"

fragment="$here/kernel.fragment"
src_pkg=linux-source-6.12
src_tar=/usr/src/linux-source-6.12.tar.xz

ensure_packages "$src_pkg" make gcc libc6-dev bc flex bison libelf-dev libssl-dev xz-utils
[[ -f $src_tar ]] || die "$src_tar missing although $src_pkg is installed"

key="$(hash_inputs "$fragment" "$here/build-kernel.sh" "$src_pkg=$(pkg_version "$src_pkg")")"
dest="$SPORE_CACHE/kernel-$key"

if [[ -f $dest/vmlinux ]]; then
    log "cached: $dest/vmlinux"
    echo "$dest/vmlinux"
    exit 0
fi

with_cache_lock "$dest"
if [[ -f $dest/vmlinux ]]; then # built by a concurrent run while we waited
    echo "$dest/vmlinux"
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
kmake() { make -C "$ksrc" ARCH=x86_64 "$@"; }

step "make tinyconfig" kmake tinyconfig
step "merging $(basename "$fragment")" \
    env -C "$ksrc" ARCH=x86_64 scripts/kconfig/merge_config.sh -m .config "$fragment"
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
    die "${#missing[@]} option(s) from kernel.fragment did not end up in .config (unmet dependencies?)"
fi

step "make -j$(nproc) vmlinux bzImage (about 6 minutes on 2 cores)" kmake -j"$(nproc)" vmlinux bzImage
cp "$ksrc/vmlinux" "$work/out/vmlinux"
cp "$ksrc/arch/x86/boot/bzImage" "$work/out/bzImage"
cp "$ksrc/.config" "$work/out/config"

# Rename into place: readers only ever see a complete cache entry.
mv "$work/out" "$dest"
log "built $dest/vmlinux ($(du -h "$dest/vmlinux" | cut -f1))"
echo "$dest/vmlinux"
