#!/usr/bin/env bash
# The QEMU the nested harness runs L1 under: Debian's bookworm-backports
# build of QEMU 10.0 (pinned below), fetched without installing it (a
# private apt source list, `apt-get download`, `dpkg-deb -x`) and cached.
#
# Why not Debian 12's own QEMU 7.2: its TCG emulation of AMD SVM has bugs
# that crash or corrupt the stack spore's Linux tier runs on (guest/README.md,
# the fourth and fifth shapes): it delivers L1's timer interrupt right after
# `vmrun` while GIF is clear, and L2 guests shut down in page walks done
# under emulated nested paging.
#
# Result, cached per version:
#   ${SPORE_CACHE:-/var/cache/spore}/qemu-<version>/
#       bin/qemu-system-x86_64, bin/qemu-system-aarch64 (wrappers that give
#       QEMU its own firmware and option ROM directories), root/ (the
#       unpacked packages)
# Usage: tests/nested/qemu.sh   (prints the bin directory as the last line;
#   nothing when the packages cannot be fetched and nothing is cached, and
#   the harness then runs the system's QEMU, saying so)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=guest/lib.sh
source "$here/../../guest/lib.sh"

version="1:10.0.2+ds-2+deb13u1~bpo12+1"
seabios_version="1.16.3-2~bpo12+1"
dest="$SPORE_CACHE/qemu-${version//[:+~]/_}"
if [[ -x $dest/bin/qemu-system-x86_64 && -x $dest/bin/qemu-system-aarch64 ]] &&
    grep -q -- '-audio none' "$dest/bin/qemu-system-x86_64"; then
    echo "$dest/bin"
    exit 0
fi

ensure_packages apt dpkg
tmp="$(mktemp -d "${TMPDIR:-/tmp}/spore-qemu.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/lists/partial" "$tmp/debs" "$tmp/root"
cat >"$tmp/sources.list" <<SOURCES
deb http://deb.debian.org/debian bookworm-backports main
SOURCES
apt_private=(-o "Dir::Etc::SourceList=$tmp/sources.list" -o Dir::Etc::SourceParts=/nonexistent
    -o "Dir::State::Lists=$tmp/lists" -o Debug::NoLocking=1 -o APT::Sandbox::User=root)
log "fetching QEMU $version from Debian's bookworm-backports (cached in $dest)"
if ! apt-get "${apt_private[@]}" update -q >&2 ||
    ! (cd "$tmp/debs" && apt-get "${apt_private[@]}" download -q \
        "qemu-system-x86=$version" "qemu-system-arm=$version" "qemu-system-common=$version" \
        "qemu-system-data=$version" "seabios=$seabios_version" >&2); then
    log "cannot fetch QEMU $version; the system's QEMU runs L1 (Debian 12's 7.2 has the emulator bugs of guest/README.md)"
    exit 0
fi
for deb in "$tmp"/debs/*.deb; do dpkg-deb -x "$deb" "$tmp/root"; done
# The binaries must start here: a library missing from this system fails now,
# not at L1's boot.
for q in qemu-system-x86_64 qemu-system-aarch64; do
    if ! "$tmp/root/usr/bin/$q" --version >/dev/null 2>&1; then
        log "QEMU $version's $q does not start on this system ($("$tmp/root/usr/bin/$q" --version 2>&1 | head -n1)); the system's QEMU runs L1"
        exit 0
    fi
done
rm -rf "$dest.tmp"
mkdir -p "$dest.tmp/bin"
mv "$tmp/root" "$dest.tmp/root"
# Its own firmware first (-L, searched in order), then the system's
# (option ROMs of ipxe-qemu, which the system's QEMU package brings). Its
# own modules first too; and no audio: probing for it loads the system
# QEMU's audio modules, which QEMU refuses from another build by aborting.
modules="$(cd "$dest.tmp/root" && dirname "$(find usr/lib -name "hw-*.so" | head -n1)")"
for q in qemu-system-x86_64 qemu-system-aarch64; do
    cat >"$dest.tmp/bin/$q" <<WRAPPER
#!/bin/sh
QEMU_MODULE_DIR="$dest/root/$modules" exec "$dest/root/usr/bin/$q" \\
    -L "$dest/root/usr/share/qemu" -L "$dest/root/usr/share/seabios" -L /usr/lib/ipxe/qemu -audio none "\$@"
WRAPPER
    chmod 0755 "$dest.tmp/bin/$q"
done
rm -rf "$dest"
mv "$dest.tmp" "$dest"
echo "$dest/bin"
