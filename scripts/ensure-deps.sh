#!/usr/bin/env bash
# Installs what building and testing spore needs on a Debian host, only where
# missing: the pinned Rust toolchain with its components and targets
# (rust-toolchain.toml), cargo-deny, and Debian packages. Safe to rerun.
#   scripts/ensure-deps.sh [host|lint|fmt|nested|arm64]   (default: host)
set -euo pipefail
cd "$(dirname "$0")/.."

tier=${1:-host}

# lint (`make lint`): the host tier and cargo-deny (licences, duplicate crates,
# sources; deny.toml). Compiling cargo-deny takes minutes: it is installed once
# into ~/.cargo/bin and reused while its version is this one.
CARGO_DENY_VERSION=0.20.2
# redis-cli drives the kvserver unikernel in the host-KVM tests; curl and ping
# talk to the httpd unikernel (kvm_net). iproute2 and
# nftables: taps, network namespaces and NAT (the virtio-net tests, and spore
# serve's networked functions, which run `ip` and `nft`). python3: spore-agent's
# tests run spore's Python bootstrap on the host.
need_pkgs=(redis-tools curl iputils-ping iproute2 nftables python3)
# Runtime images and code disks of Linux functions (guest/build-rootfs.sh,
# `spore image`): mmdebstrap builds the tree, e2fsprogs' mkfs.ext4 -d makes
# the image without a loop device, debugfs reads it back in the tests.
need_pkgs+=(mmdebstrap e2fsprogs)
# spore serve --cluster: the etcd-client crate compiles etcd's .proto files
# with protoc; the cluster tests run a real etcd of their own (etcd-server).
need_pkgs+=(protobuf-compiler etcd-server)
if [[ $tier == nested ]]; then
    # The guest kernel, the guest initramfs and the nested harness.
    # musl-tools: the static spore links SQLite (spore serve's catalogue), built
    # from C with musl-gcc.
    need_pkgs+=(musl-tools qemu-system-x86 linux-source-6.12 busybox-static bc flex bison
                libelf-dev libssl-dev cpio xz-utils zstd e2fsprogs gcc make)
fi
if [[ $tier == arm64 ]]; then
    # aarch64 (issue 15), `make static-arm64`: the static aarch64 spore (its
    # rustup target comes with the toolchain), linked (and its SQLite compiled) with Debian's aarch64-linux-gnu gcc; the arm64
    # nested tier's QEMU (the rest of that tier is the nested tier's list).
    need_pkgs+=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-system-arm)
    # musl's arm64 headers: SQLite's C must be compiled against the C library
    # it is linked with (glibc's headers call open64, fcntl64, ... which
    # musl does not have). A package of Debian's arm64 architecture.
    need_pkgs+=(musl-dev:arm64)
    if ! dpkg --print-foreign-architectures | grep -qx arm64; then
        [[ $(id -u) -eq 0 ]] || { echo "ensure-deps: dpkg needs the arm64 architecture (dpkg --add-architecture arm64, as root)" >&2; exit 1; }
        echo "ensure-deps: dpkg --add-architecture arm64" >&2
        dpkg --add-architecture arm64
        DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
    fi
fi

if ! command -v rustup >/dev/null 2>&1; then
    echo "ensure-deps: rustup not found; install Rust with rustup first" >&2
    exit 1
fi
# The toolchain rust-toolchain.toml names, with its components and targets:
# rustup installs them on first use, unless RUSTUP_AUTO_INSTALL=0; this does
# it either way (a no-op once installed).
toolchain=$(sed -n 's/^channel *= *"\(.*\)"/\1/p' rust-toolchain.toml)
if ! rustup run "$toolchain" rustc --version >/dev/null 2>&1; then
    echo "ensure-deps: rustup toolchain install $toolchain (rust-toolchain.toml)" >&2
    rustup toolchain install >&2
fi
# A toolchain installed before the file listed a target or component lacks it.
installed=$(rustup target list --installed)
for t in $(sed -n 's/^targets *= *\[\(.*\)\]/\1/p' rust-toolchain.toml | tr -d '",'); do
    if ! grep -qx "$t" <<<"$installed"; then
        echo "ensure-deps: rustup target add $t" >&2
        rustup target add "$t" >&2
    fi
done
installed=$(rustup component list --installed)
for c in $(sed -n 's/^components *= *\[\(.*\)\]/\1/p' rust-toolchain.toml | tr -d '",'); do
    if ! grep -q "^$c" <<<"$installed"; then
        echo "ensure-deps: rustup component add $c" >&2
        rustup component add "$c" >&2
    fi
done

# fmt and lint: rustfmt from the nightly the Makefile pins (FMT_TOOLCHAIN):
# rustfmt.toml's import grouping is a nightly-only option.
if [[ $tier == lint || $tier == fmt ]] && [[ -n ${FMT_TOOLCHAIN:-} ]] &&
    ! rustup run "$FMT_TOOLCHAIN" rustfmt --version >/dev/null 2>&1; then
    echo "ensure-deps: rustup toolchain install $FMT_TOOLCHAIN --profile minimal --component rustfmt" >&2
    rustup toolchain install "$FMT_TOOLCHAIN" --profile minimal --component rustfmt >&2
fi
if [[ $tier == lint ]] && ! cargo deny --version 2>/dev/null | grep -qxF "cargo-deny $CARGO_DENY_VERSION"; then
    echo "ensure-deps: cargo install --locked cargo-deny@$CARGO_DENY_VERSION (a few minutes, once)" >&2
    # cargo-deny's own release profile is fat LTO in one codegen unit (about
    # 5 minutes on 2 cores); a lint tool checking one dependency graph does
    # not need that: quicker settings for this build only.
    CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 \
        CARGO_PROFILE_RELEASE_OPT_LEVEL=1 cargo install --locked "cargo-deny@$CARGO_DENY_VERSION" >&2
fi

missing=()
for p in "${need_pkgs[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "ensure-deps: apt-get install ${missing[*]}" >&2
    sudo_cmd=()
    [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
    "${sudo_cmd[@]}" apt-get update -q >&2
    DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q "${missing[@]}" >&2
    # Debian starts the packaged etcd as a service on 127.0.0.1:2379; the tests
    # run their own, and nothing of spore's needs that one: stopped again.
    if [[ " ${missing[*]} " == *" etcd-server "* ]] && command -v systemctl >/dev/null &&
        systemctl is-active --quiet etcd 2>/dev/null; then
        echo "ensure-deps: stopping and disabling the etcd service etcd-server started" >&2
        "${sudo_cmd[@]}" systemctl disable --now etcd >&2 || true
    fi
fi
