#!/usr/bin/env bash
# Builds the firecracker-go-sdk test program (*.go, pinned by go.mod/go.sum)
# static (CGO_ENABLED=0) for the nested harness's L1 and the host tier's jailer
# test (its `jailer` mode), cached by the content of
# its sources and the Go version as ${SPORE_CACHE:-/var/cache/spore}/fc-sdk-<sha256>.
# Modules come through the Go module proxy (GOPROXY), checked against go.sum.
# Prints the binary's path as the last line of stdout.
#   tests/fc-sdk/build.sh
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=guest/lib.sh
source "$here/../../guest/lib.sh"

go=$(command -v go || true)
[[ -n $go ]] || { [[ -x /usr/local/go/bin/go ]] && go=/usr/local/go/bin/go; }
[[ -n $go ]] || die "Go is not installed (no 'go' in PATH, no /usr/local/go/bin/go): the fc-sdk nested scenario and the host tier's jailer test need Go >= 1.21 to build its firecracker-go-sdk program; install it from https://go.dev/dl/"

key="$(hash_inputs "$here/build.sh" "$here/go.mod" "$here/go.sum" "$(cd "$here" && echo *.go)" "$here"/*.go "$("$go" version)")"
cached="$SPORE_CACHE/fc-sdk-$key"
if [[ ! -x $cached ]]; then
    with_cache_lock "$cached"
    if [[ ! -x $cached ]]; then
        log "go build (firecracker-go-sdk test program) -> $cached"
        tmp="$cached.tmp.$$"
        (cd "$here" && CGO_ENABLED=0 GOFLAGS=-mod=readonly "$go" build -trimpath -o "$tmp" .) >&2 ||
            { rm -f "$tmp"; die "go build failed in $here"; }
        mv -f "$tmp" "$cached"
    fi
else
    log "cached: $cached"
fi
echo "$cached"
