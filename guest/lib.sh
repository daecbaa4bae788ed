# shellcheck shell=bash
# Shared helpers for spore's guest build scripts and the nested test harness.
# Sourced, never executed: callers already run under `set -euo pipefail`.

# Where expensive, content-addressed build results live (outside the repo).
SPORE_CACHE="${SPORE_CACHE:-/var/cache/spore}"

# Progress and errors go to stderr so that stdout stays machine-readable
# (every build script prints exactly its result path as the last stdout line).
log() { printf '[%s] %s\n' "${0##*/}" "$*" >&2; }
die() { printf '[%s] error: %s\n' "${0##*/}" "$*" >&2; exit 1; }

# ensure_packages PKG... — install the Debian packages that are missing.
# Only calls apt-get when something is missing, and only runs `apt-get update`
# when the first install attempt cannot find a package.
ensure_packages() {
    local missing=() p
    for p in "$@"; do
        if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
            missing+=("$p")
        fi
    done
    [[ ${#missing[@]} -eq 0 ]] && return 0
    [[ $(id -u) -eq 0 ]] || die "missing packages (${missing[*]}); run as root or install them"
    log "installing: ${missing[*]}"
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >&2; then
        DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
    fi
}

# pkg_version PKG — installed version of a Debian package.
pkg_version() { dpkg-query -W -f='${Version}' "$1"; }

# hash_inputs ARG... — sha256 over the given strings and files (file names are
# hashed by content, so moving the repo does not invalidate the cache).
hash_inputs() {
    local a
    for a in "$@"; do
        if [[ -f $a ]]; then
            printf 'file:%s\n' "$(sha256sum <"$a" | cut -d' ' -f1)"
        else
            printf 'str:%s\n' "$a"
        fi
    done | sha256sum | cut -d' ' -f1
}

# with_cache_lock DIR — take an exclusive lock for one cache entry, so two
# concurrent runs build it once. The lock is held until the shell exits.
with_cache_lock() {
    mkdir -p "$SPORE_CACHE"
    mkdir -p "$SPORE_CACHE/.locks"
    exec {SPORE_LOCK_FD}>"$SPORE_CACHE/.locks/${1##*/}"
    flock "$SPORE_LOCK_FD"
}

# busybox_static — path of the static busybox from Debian's busybox-static.
busybox_static() {
    ensure_packages busybox-static
    local bb
    bb="$(dpkg-query -L busybox-static | grep -m1 -E '/bin/busybox$')" || die "busybox-static ships no bin/busybox?"
    file -b "$bb" 2>/dev/null | grep -q 'dynamically linked' && die "$bb is not static"
    echo "$bb"
}

# populate_busybox_root ROOT — a minimal root: busybox with a symlink per
# applet, the usual mount points, and /dev/console (the kernel opens it for
# init's stdio before anything mounts devtmpfs; without it init has no output).
populate_busybox_root() {
    local root="$1" bb applet
    bb="$(busybox_static)"
    mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,dev,proc,sys,tmp,run,root,etc,mnt}
    chmod 1777 "$root/tmp"
    install -m 0755 "$bb" "$root/bin/busybox"
    while IFS= read -r applet; do
        [[ $applet == bin/busybox ]] && continue
        ln -sf /bin/busybox "$root/$applet"
    done < <("$bb" --list-full)
    [[ $(id -u) -eq 0 ]] || die "creating /dev/console in the initramfs needs root"
    mknod -m 0600 "$root/dev/console" c 5 1
    mknod -m 0666 "$root/dev/null" c 1 3
    printf 'root:x:0:0:root:/root:/bin/sh\n' >"$root/etc/passwd"
    printf 'root:x:0:\n' >"$root/etc/group"
}

# add_file_spec ROOT SPEC — copy SRC into ROOT; SPEC is SRC or SRC:DEST
# (DEST absolute inside the image; default /basename of SRC).
add_file_spec() {
    local root="$1" spec="$2" src dest
    src="${spec%%:*}"
    if [[ $spec == *:* ]]; then dest="${spec#*:}"; else dest="/$(basename "$src")"; fi
    [[ -f $src ]] || die "file to add does not exist: $src"
    [[ $dest == /* && $dest != */../* && $dest != */.. ]] || die "bad destination in '$spec' (must be an absolute path without ..)"
    mkdir -p "$root$(dirname "$dest")"
    cp -L "$src" "$root$dest"
}

# file_specs_key SPEC... — stable text describing file specs by content, for
# cache keys.
file_specs_key() {
    local spec src
    for spec in "$@"; do
        src="${spec%%:*}"
        [[ -f $src ]] || die "file to add does not exist: $src"
        printf '%s=%s\n' "${spec#"$src"}" "$(sha256sum <"$src" | cut -d' ' -f1)"
    done
}

# pack_cpio ROOT OUT — deterministic newc cpio: sorted names, fixed mtimes,
# owner root, sequential inode numbers.
pack_cpio() {
    local root="$1" out="$2"
    ensure_packages cpio
    find "$root" -exec touch -h -d @0 {} +
    (cd "$root" && find . -mindepth 1 -printf '%P\n' | LC_ALL=C sort |
        cpio --quiet -o -H newc -R 0:0 --reproducible) >"$out"
}

# pack_cpio_gz ROOT OUT — pack_cpio, gzip-compressed without name or time.
pack_cpio_gz() {
    ensure_packages gzip
    pack_cpio "$1" "$2.cpio"
    gzip -n -9 -c "$2.cpio" >"$2"
    rm -f "$2.cpio"
}

# cached_copy SRC OUT — put a cached artifact at OUT (atomic replace).
cached_copy() {
    local src="$1" out="$2"
    mkdir -p "$(dirname "$out")"
    cp "$src" "$out.tmp.$$"
    mv -f "$out.tmp.$$" "$out"
}
