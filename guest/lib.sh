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
    exec {SPORE_LOCK_FD}>"$SPORE_CACHE/.lock-${1##*/}"
    flock "$SPORE_LOCK_FD"
}
