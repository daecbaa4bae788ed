#!/usr/bin/env bash
# Builds the spore Linux guest initramfs: static busybox, /init (init.sh),
# /bin/spore-signal, /bin/spore-vsock and /bin/spore-reseed (crate spore-guest-tools, built with
# cargo for <arch>-unknown-linux-musl) and any
# extra files. Deterministic: the same inputs give the same bytes; the result
# is cached as ${SPORE_CACHE:-/var/cache/spore}/initramfs-<sha256>.cpio[.gz]
# (arm64: initramfs-arm64-<sha256>.cpio[.gz])
# and copied to OUT. OUT ending in .gz is gzip-compressed; plain .cpio is not,
# which boots faster where inflating is slow (emulated CPUs): the kernel only
# has to copy it.
# Usage: guest/build-initramfs.sh [--arch x86_64|arm64] OUT.cpio[.gz] [SRC[:DEST]...]
#   --arch      the guest's architecture (default x86_64). arm64: busybox
#               from Debian's busybox-static:arm64 (downloaded, cached under
#               $SPORE_CACHE/busybox-static-arm64_<version>/), the tools
#               cross-built for aarch64-unknown-linux-musl.
#   SRC[:DEST]  add file SRC at DEST (absolute; default /basename(SRC));
#               e.g. my-test.sh:/scenario makes /init run it.
# Env: SPORE_CACHE; SPORE_GUEST_TOOLS_DIR (a directory with prebuilt
#      spore-signal, spore-vsock and spore-reseed for that architecture instead
#      of building them); CARGO_TARGET_DIR.
# Prints OUT as the last line of stdout.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=guest/lib.sh
source "$here/lib.sh"

usage="usage: $0 [--arch x86_64|arm64] OUT.cpio[.gz] [SRC[:DEST]...]"
arch=x86_64
case ${1:-} in
--arch)
    [[ $# -ge 2 ]] || die "$usage"
    arch="$2"
    shift 2
    ;;
--arch=*)
    arch="${1#--arch=}"
    shift
    ;;
esac
case $arch in
x86_64 | amd64) arch=x86_64 rust_target=x86_64-unknown-linux-musl elf_machine=3e00 ;;
arm64 | aarch64) arch=arm64 rust_target=aarch64-unknown-linux-musl elf_machine=b700 ;;
*) die "unknown architecture '$arch' ($usage)" ;;
esac
[[ $# -ge 1 && $1 != -* ]] || die "$usage"
out="$1"
shift
extra=("$@")

# busybox_static_arm64 — path of the static busybox from Debian's
# busybox-static:arm64, downloaded once per version (apt-get download, as
# tests/nested-arm64/probe.sh does) into the cache.
busybox_static_arm64() {
    ensure_packages dpkg apt
    if ! dpkg --print-foreign-architectures | grep -x arm64 >/dev/null; then
        [[ $(id -u) -eq 0 ]] || die "dpkg does not know arm64 packages; run as root (dpkg --add-architecture arm64)"
        log "adding Debian's arm64 architecture to dpkg (for busybox-static:arm64)"
        dpkg --add-architecture arm64
        DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
    fi
    local ver
    ver="$(apt-cache policy busybox-static:arm64 | sed -n 's/^ *Candidate: //p')"
    if [[ -z $ver || $ver == "(none)" ]]; then
        [[ $(id -u) -eq 0 ]] || die "apt knows no busybox-static:arm64; run as root (apt-get update)"
        DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
        ver="$(apt-cache policy busybox-static:arm64 | sed -n 's/^ *Candidate: //p')"
    fi
    [[ -n $ver && $ver != "(none)" ]] || die "no candidate version for busybox-static:arm64"
    local cache="$SPORE_CACHE/busybox-static-arm64_${ver//:/_}"
    if [[ ! -f $cache/busybox ]]; then
        with_cache_lock "$cache"
        if [[ ! -f $cache/busybox ]]; then
            local dl
            dl="$(mktemp -d "$SPORE_CACHE/.busybox-arm64.XXXXXX")"
            # Called in a command substitution: the trap is that subshell's.
            trap 'rm -rf "$dl"' EXIT
            chmod 0755 "$dl"
            chown _apt "$dl" 2>/dev/null || true
            log "apt-get download busybox-static:arm64=$ver"
            (cd "$dl" && apt-get download -q "busybox-static:arm64=$ver" >&2)
            dpkg-deb -x "$dl"/busybox-static_*.deb "$dl/x"
            [[ -f $dl/x/bin/busybox ]] || die "busybox-static:arm64=$ver ships no bin/busybox?"
            mkdir -p "$dl/out"
            install -m 0755 "$dl/x/bin/busybox" "$dl/out/busybox"
            mv "$dl/out" "$cache"
            rm -rf "$dl"
            trap - EXIT
        fi
    fi
    echo "$cache/busybox"
}

# check_applets BUSYBOX — the root's applet symlinks come from the host's
# busybox-static (`--list-full`), which cannot run an arm64 binary: insist
# that BUSYBOX has exactly the same applets. busybox keeps its applet names
# as one table, NUL-separated in `--list` order and ended by a second NUL.
check_applets() {
    local want
    want="$("$(busybox_static)" --list)"
    # (awk stops reading at the match: not a pipe, which pipefail would fail)
    awk -v want="$want" '
        BEGIN { n = split(want, w, "\n"); w[++n] = "" }
        { if ($0 == w[i + 1]) { if (++i == n) { found = 1; exit } } else i = ($0 == w[1]) }
        END { exit !found }' < <(tr '\0\n' '\n\0' <"$1") ||
        die "$1 has other applets than the host's busybox-static ($(pkg_version busybox-static)); install the same version of both"
}

# The ELF machine of FILE as 4 hex digits (e_machine, little-endian).
elf_machine() { od -An -tx1 -j18 -N2 "$1" | tr -d ' \n'; }

if [[ -n ${SPORE_GUEST_TOOLS_DIR:-} ]]; then
    signal_bin="$SPORE_GUEST_TOOLS_DIR/spore-signal"
    vsock_bin="$SPORE_GUEST_TOOLS_DIR/spore-vsock"
    reseed_bin="$SPORE_GUEST_TOOLS_DIR/spore-reseed"
else
    command -v cargo >/dev/null || die "cargo not found (or set SPORE_GUEST_TOOLS_DIR)"
    if [[ $arch == arm64 ]]; then
        # Rust's musl target brings its own libc and start files; Debian's
        # cross gcc only links.
        ensure_packages gcc-aarch64-linux-gnu
        export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_LINKER="${CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_LINKER:-aarch64-linux-gnu-gcc}"
        if command -v rustup >/dev/null && ! rustup target list --installed | grep -x "$rust_target" >/dev/null; then
            log "rustup target add $rust_target"
            rustup target add "$rust_target" >&2
        fi
    fi
    log "cargo build --release -p spore-guest-tools --target $rust_target"
    # --message-format gives the artifact paths whatever CARGO_TARGET_DIR is.
    artifacts="$(cd "$here/.." && cargo build --release -q -p spore-guest-tools \
        --target "$rust_target" --message-format json-render-diagnostics)"
    signal_bin="$(sed -n 's/.*"executable":"\([^"]*spore-signal\)".*/\1/p' <<<"$artifacts" | tail -n1)"
    vsock_bin="$(sed -n 's/.*"executable":"\([^"]*spore-vsock\)".*/\1/p' <<<"$artifacts" | tail -n1)"
    reseed_bin="$(sed -n 's/.*"executable":"\([^"]*spore-reseed\)".*/\1/p' <<<"$artifacts" | tail -n1)"
fi
[[ -n $signal_bin && -x $signal_bin ]] || die "spore-signal binary not found (${signal_bin:-none})"
[[ -n $vsock_bin && -x $vsock_bin ]] || die "spore-vsock binary not found (${vsock_bin:-none})"
[[ -n $reseed_bin && -x $reseed_bin ]] || die "spore-reseed binary not found (${reseed_bin:-none})"
for b in "$signal_bin" "$vsock_bin" "$reseed_bin"; do
    [[ $(elf_machine "$b") == "$elf_machine" ]] || die "$b is not an $arch executable"
done

if [[ $arch == arm64 ]]; then
    bb="$(busybox_static_arm64)"
    check_applets "$bb"
    arch_key=("arch=$arch")
    name=initramfs-arm64
else
    bb="$(busybox_static)"
    arch_key=() # x86_64: the key as before --arch
    name=initramfs
fi
key="$(hash_inputs "$here/build-initramfs.sh" "$here/lib.sh" "$here/init.sh" "$bb" "$signal_bin" "$vsock_bin" "$reseed_bin" \
    "$(file_specs_key "${extra[@]}")" "${arch_key[@]}")"
ext=cpio
[[ $out == *.gz ]] && ext=cpio.gz
cached="$SPORE_CACHE/$name-$key.$ext"

if [[ ! -f $cached ]]; then
    with_cache_lock "$cached"
    if [[ ! -f $cached ]]; then
        work="$(mktemp -d "$SPORE_CACHE/.initramfs-build.XXXXXX")"
        trap 'rm -rf "$work"' EXIT
        trap 'exit 130' INT
        trap 'exit 143' TERM
        root="$work/root"
        populate_busybox_root "$root"
        # The applets' symlinks are the host busybox's (checked to be the same).
        [[ $arch == x86_64 ]] || install -m 0755 "$bb" "$root/bin/busybox"
        install -m 0755 "$here/init.sh" "$root/init"
        install -m 0755 "$signal_bin" "$root/bin/spore-signal"
        install -m 0755 "$vsock_bin" "$root/bin/spore-vsock"
        install -m 0755 "$reseed_bin" "$root/bin/spore-reseed"
        for spec in "${extra[@]}"; do add_file_spec "$root" "$spec"; done
        [[ -f $root/scenario ]] && chmod 0755 "$root/scenario"
        if [[ $ext == cpio.gz ]]; then
            pack_cpio_gz "$root" "$work/initramfs.$ext"
        else
            pack_cpio "$root" "$work/initramfs.$ext"
        fi
        mv "$work/initramfs.$ext" "$cached"
        log "built $cached ($(du -h "$cached" | cut -f1))"
    fi
else
    log "cached: $cached"
fi
cached_copy "$cached" "$out"
echo "$out"
