#!/usr/bin/env bash
# Runs every cargo-fuzz target in fuzz/ for a while; non-zero exit if one of
# them crashes, hangs or runs out of memory (its input is then in
# fuzz/artifacts/<target>/: keep it in fuzz/regressions/<target>/ once fixed).
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]     (default: 60, all)
# Installs what it needs where missing: a nightly toolchain (minimal profile)
# and cargo-fuzz at a pinned version.
set -euo pipefail
cd "$(dirname "$0")/.."

CARGO_FUZZ_VERSION=0.13.2
seconds=${1:-60}
shift || true

toolchain=nightly
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
    echo "fuzz: rustup toolchain install nightly --profile minimal" >&2
    if ! rustup toolchain install nightly --profile minimal >&2; then
        # A machine that cannot download toolchains still fuzzes: the stable
        # compiler takes cargo-fuzz's -Z flags when told it may
        # (RUSTC_BOOTSTRAP), and its std ships the sanitizer runtimes.
        echo "fuzz: no nightly toolchain to be had; using stable with RUSTC_BOOTSTRAP=1" >&2
        toolchain=stable
        export RUSTC_BOOTSTRAP=1
    fi
fi
if ! cargo fuzz --version 2>/dev/null | grep -qF "$CARGO_FUZZ_VERSION"; then
    echo "fuzz: cargo install cargo-fuzz --locked --version $CARGO_FUZZ_VERSION" >&2
    cargo install cargo-fuzz --locked --version "$CARGO_FUZZ_VERSION" >&2
fi

# The build outlives a fresh clone (CI): deps are built once per machine.
target_dir=${FUZZ_TARGET_DIR:-$HOME/.cache/spore/fuzz-target}
mkdir -p "$target_dir"

cd fuzz
if (($# == 0)); then
    mapfile -t targets < <(cargo +$toolchain fuzz list)
else
    targets=("$@")
fi
# One build for all targets (cached in $target_dir between runs); the runs
# below start the built binaries themselves (what `cargo fuzz run` does after
# its own build check, once per target).
start=$SECONDS
cargo +$toolchain fuzz build -O --target-dir "$target_dir" >&2
echo "fuzz: build took $((SECONDS - start))s" >&2
bin_dir="$target_dir/$(rustc +$toolchain -vV | sed -n 's/^host: //p')/release"

failed=()
for t in "${targets[@]}"; do
    # The committed seeds stay as they are; what a run finds goes to
    # corpus-run/ (ignored by git), kept between runs.
    mkdir -p "corpus-run/$t" "artifacts/$t"
    echo "fuzz: $t for ${seconds}s" >&2
    # -timeout: an input taking 10 s is a hang; -rss_limit_mb: an OOM.
    # The committed corpus is replayed first (every input, whatever the
    # seconds), then libFuzzer mutates it for the rest of the time.
    if ! "$bin_dir/$t" -artifact_prefix="artifacts/$t/" "corpus-run/$t" "corpus/$t" \
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 >"artifacts/$t/log" 2>&1; then
        failed+=("$t")
        echo "fuzz: $t FAILED (log: fuzz/artifacts/$t/log)" >&2
        grep -E "^==[0-9]+==|panicked|SUMMARY|Test unit written|artifact_prefix" \
            "artifacts/$t/log" | head -20 >&2 || true
    else
        grep -E "stat::number_of_executed_units" "artifacts/$t/log" | sed "s/^/fuzz: $t: /" >&2 || true
    fi
done
if ((${#failed[@]})); then
    echo "fuzz: ${#failed[@]} of ${#targets[@]} targets failed: ${failed[*]}" >&2
    exit 1
fi
echo "fuzz: ${#targets[@]} targets ran ${seconds}s each, no crash ($((SECONDS - start))s with the build)" >&2
