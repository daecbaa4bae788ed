#!/usr/bin/env bash
# Builds the spore Linux guest initramfs: static busybox, /init (init.sh),
# /bin/spore-signal, /bin/spore-vsock and /bin/spore-reseed (crate spore-guest-tools, built with
# cargo for x86_64-unknown-linux-musl) and any
# extra files. Deterministic: the same inputs give the same bytes; the result
# is cached as ${SPORE_CACHE:-/var/cache/spore}/initramfs-<sha256>.cpio[.gz]
# and copied to OUT. OUT ending in .gz is gzip-compressed; plain .cpio is not,
# which boots faster where inflating is slow (emulated CPUs): the kernel only
# has to copy it.
# Usage: guest/build-initramfs.sh OUT.cpio[.gz] [SRC[:DEST]...]
#   SRC[:DEST]  add file SRC at DEST (absolute; default /basename(SRC));
#               e.g. my-test.sh:/scenario makes /init run it.
# Env: SPORE_CACHE; SPORE_GUEST_TOOLS_DIR (a directory with prebuilt
#      spore-signal, spore-vsock and spore-reseed instead of building them); CARGO_TARGET_DIR.
# Prints OUT as the last line of stdout.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=guest/lib.sh
source "$here/lib.sh"

[[ $# -ge 1 && $1 != -* ]] || die "usage: $0 OUT.cpio[.gz] [SRC[:DEST]...]"
out="$1"
shift
extra=("$@")

if [[ -n ${SPORE_GUEST_TOOLS_DIR:-} ]]; then
    signal_bin="$SPORE_GUEST_TOOLS_DIR/spore-signal"
    vsock_bin="$SPORE_GUEST_TOOLS_DIR/spore-vsock"
    reseed_bin="$SPORE_GUEST_TOOLS_DIR/spore-reseed"
else
    command -v cargo >/dev/null || die "cargo not found (or set SPORE_GUEST_TOOLS_DIR)"
    log "cargo build --release -p spore-guest-tools --target x86_64-unknown-linux-musl"
    # --message-format gives the artifact paths whatever CARGO_TARGET_DIR is.
    artifacts="$(cd "$here/.." && cargo build --release -q -p spore-guest-tools \
        --target x86_64-unknown-linux-musl --message-format json-render-diagnostics)"
    signal_bin="$(sed -n 's/.*"executable":"\([^"]*spore-signal\)".*/\1/p' <<<"$artifacts" | tail -n1)"
    vsock_bin="$(sed -n 's/.*"executable":"\([^"]*spore-vsock\)".*/\1/p' <<<"$artifacts" | tail -n1)"
    reseed_bin="$(sed -n 's/.*"executable":"\([^"]*spore-reseed\)".*/\1/p' <<<"$artifacts" | tail -n1)"
fi
[[ -n $signal_bin && -x $signal_bin ]] || die "spore-signal binary not found (${signal_bin:-none})"
[[ -n $vsock_bin && -x $vsock_bin ]] || die "spore-vsock binary not found (${vsock_bin:-none})"
[[ -n $reseed_bin && -x $reseed_bin ]] || die "spore-reseed binary not found (${reseed_bin:-none})"

bb="$(busybox_static)"
key="$(hash_inputs "$here/build-initramfs.sh" "$here/lib.sh" "$here/init.sh" "$bb" "$signal_bin" "$vsock_bin" "$reseed_bin" \
    "$(file_specs_key "${extra[@]}")")"
ext=cpio
[[ $out == *.gz ]] && ext=cpio.gz
cached="$SPORE_CACHE/initramfs-$key.$ext"

if [[ ! -f $cached ]]; then
    with_cache_lock "$cached"
    if [[ ! -f $cached ]]; then
        work="$(mktemp -d "$SPORE_CACHE/.initramfs-build.XXXXXX")"
        trap 'rm -rf "$work"' EXIT
        trap 'exit 130' INT
        trap 'exit 143' TERM
        root="$work/root"
        populate_busybox_root "$root"
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
