# spore: build, demo, test, bench. `make test` is what CI runs (.ci/run).
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c

CARGO ?= cargo
# rustfmt.toml's import options are nightly-only: formatting runs on this
# nightly (scripts/ensure-deps.sh installs it, minimal profile with rustfmt).
export FMT_TOOLCHAIN := nightly-2026-05-20
UK_OUT := $(CURDIR)/crates/spore-uk/target/x86_64-unknown-none/release
STATIC_SPORE := $(CURDIR)/target/x86_64-unknown-linux-musl/release/spore
SPORE := $(CURDIR)/target/release/spore
export SPORE_UK_DIR := $(UK_OUT)

.PHONY: all build uk static deps deps-nested demo test test-unit test-host test-nested \
        bench bench-peers bench-serve-linux lint fmt clean fc-sdk fuzz images images-test \
        probe-arm64

all: build uk

deps:
	@scripts/ensure-deps.sh host

deps-nested:
	@scripts/ensure-deps.sh nested

build: deps
	$(CARGO) build --release -p spore

# The unikernel runtime and its example apps (its own workspace; build from its directory
# so that its .cargo/config.toml applies).
uk: deps
	cd crates/spore-uk && $(CARGO) build --release

# A static spore for the nested harness's L1 initramfs (its C part, SQLite, is
# compiled with musl-gcc from musl-tools).
static: deps-nested
	CC_x86_64_unknown_linux_musl=musl-gcc $(CARGO) build --release -p spore --target x86_64-unknown-linux-musl

# Formatting, clippy (workspace lints in Cargo.toml, clippy.toml) and cargo-deny
# (deny.toml: licences, duplicate crates, sources; why not advisories: see
# there), warnings denied; CI runs it before the tests (.ci/run).
lint:
	@scripts/ensure-deps.sh lint
	$(CARGO) +$(FMT_TOOLCHAIN) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	cd crates/spore-uk && $(CARGO) +$(FMT_TOOLCHAIN) fmt -- --check && $(CARGO) clippy --release -- -D warnings
	$(CARGO) deny check licenses bans sources
	cd crates/spore-uk && $(CARGO) deny check licenses bans sources
	$(MAKE) lint-arm64
	python3 scripts/check-links.py
	python3 scripts/check-import-cycles.py

fmt:
	@scripts/ensure-deps.sh fmt
	$(CARGO) +$(FMT_TOOLCHAIN) fmt --all
	cd crates/spore-uk && $(CARGO) +$(FMT_TOOLCHAIN) fmt

# Tier 1: unit and device tests, no KVM needed.
# Tests named kvm_* need /dev/kvm; without it they are reported as skipped.
test-unit: deps
	@if [ -c /dev/kvm ]; then \
	    $(CARGO) test --workspace --lib --bins; \
	else \
	    echo "unit tier: kvm_* tests SKIPPED (no /dev/kvm on this host)"; \
	    $(CARGO) test --workspace --lib --bins -- --skip kvm_; \
	fi
	cd crates/spore-uk && $(CARGO) test --target x86_64-unknown-linux-gnu --lib
	# spore-agent in host mode (a Unix socket for vsock): the Runtime API,
	# spore's Python bootstrap and shell bootstraps, no VM needed.
	$(CARGO) test -p spore-guest-tools --test 'agent_*'
	# spore-envd (E2B's envd for sandboxes) on the host, driven by the e2b SDK.
	$(CARGO) test -p spore-envd --test envd_sdk

# Tier 2: the unikernel on /dev/kvm through the real binary: one test binary, a
# module per scenario (crates/spore/tests/kvm/). Without /dev/kvm the tests named
# kvm_* are reported as skipped, not passed (`::kvm_` matches the test's own name,
# not its scenario module's).
test-host: deps uk
	@if [ "$$(uname -m)" != x86_64 ]; then \
	    echo "host-KVM tier: SKIPPED (it boots the spore unikernel, which is x86_64 only; the aarch64 nested tier covers this host's VMM)"; \
	elif [ -c /dev/kvm ]; then \
	    $(CARGO) test -p spore --test kvm; \
	else \
	    echo "host-KVM tier: SKIPPED (no /dev/kvm on this host)"; \
	    $(CARGO) test -p spore --test kvm -- --skip ::kvm_; \
	fi

# Tier 3: Linux guests inside QEMU (TCG + emulated SVM) with a real KVM inside.
# The firecracker-go-sdk program of the fc-sdk scenario (needs Go; cached by content).
fc-sdk:
	tests/fc-sdk/build.sh >/dev/null

test-nested: deps-nested static fc-sdk
	tests/nested/run-all.sh --spore $(STATIC_SPORE)

# The four tiers in order, each timed: a table of their wall times at the end
# (scripts/stages.sh; also when one fails, whose status make returns).
test:
	@scripts/stages.sh "make test" "unit=$(MAKE) --no-print-directory test-unit" \
	    "host=$(MAKE) --no-print-directory test-host" \
	    "nested x86_64=$(MAKE) --no-print-directory test-nested" \
	    "nested arm64=$(MAKE) --no-print-directory test-nested-arm64"

# Runtime images of Linux functions (read-only ext4 root file systems from
# Debian packages; guest/README.md), cached by content in $$SPORE_CACHE: a
# rerun with the same inputs is a cache hit. Not part of `make test` yet.
# AGENT=path installs a guest agent as /sbin/spore-agent.
AGENT ?=
images: deps
	guest/build-rootfs.sh provided $(if $(AGENT),--agent $(AGENT))
	guest/build-rootfs.sh python3 $(if $(AGENT),--agent $(AGENT))

# The host test that builds the provided image into a temporary cache and
# reads it back (no VM).
images-test: deps
	$(CARGO) test -p spore --test kvm image_build:: -- --nocapture

# cargo-fuzz targets (fuzz/, nightly; scripts/fuzz.sh installs nightly and a
# pinned cargo-fuzz where missing): each target runs FUZZ_SECONDS; a crash,
# hang or OOM fails. `cargo test -p spore-vmm` replays fuzz/corpus and
# fuzz/regressions without nightly. fuzz-smoke is CI's (.ci/run): every
# target replays its corpus and then fuzzes FUZZ_SMOKE_SECONDS; make fuzz is
# the longer run, outside CI.
FUZZ_SECONDS ?= 60
FUZZ_SMOKE_SECONDS ?= 5
.PHONY: fuzz-smoke bench-sandbox
fuzz:
	scripts/fuzz.sh $(FUZZ_SECONDS)
fuzz-smoke:
	scripts/fuzz.sh $(FUZZ_SMOKE_SECONDS)

demo: build uk
	@echo "== spore unikernel on host KVM"
	$(SPORE) run --mem 128M --cmdline exit=0 --kernel $(UK_OUT)/hello
	@$(MAKE) --no-print-directory static
	@echo "== Linux guest in the nested harness (QEMU TCG + SVM; about a minute)"
	tests/nested/run-all.sh --spore $(STATIC_SPORE) --only demo

# spore and Firecracker side by side in the nested harness (issue 16): the same
# guest files, alternating per round; a benchmark, not in `make test` (tens of
# minutes). Report: $(BENCH_OUT)/peers.json and .md; e.g.
#   make bench-peers PEERS_ARGS="--rounds 3 --peer-firecracker /path/to/firecracker"
PEERS_ARGS ?=
bench-peers: static
	tests/nested/peers.sh --spore $(STATIC_SPORE) --out $(BENCH_OUT)/peers.json $(PEERS_ARGS)

# aarch64 (issue 15), a probe before the tier: an arm64 L1 under QEMU TCG with
# EL2 brings up KVM and runs an L2 vCPU (tests/nested-arm64/probe.sh); not in
# `make test`.
probe-arm64:
	tests/nested-arm64/probe.sh

# Every bench's JSON goes to $(BENCH_OUT), then one HTML page with plots.
BENCH_OUT ?= $(CURDIR)/target/bench

# SnapFaaS's experiment (issue 17) in the nested harness: `spore bench serve
# --linux` on the Python functions of tests/fixtures/python-bench, five start
# strategies (cold boot, merged full snapshot, layered base + diff, layered +
# working set, clone; warm as a reference), cold and lukewarm page cache.
# A benchmark, not in
# `make test`: under QEMU TCG a cold boot takes about 10 s, so the whole
# matrix takes hours; cut it down, e.g.
#   make bench-serve-linux BSL_FUNCTIONS=lorem,thumbnail BSL_SIZES=256 BSL_ROUNDS=3
# Report: $(BENCH_OUT)/serve-linux/bench-serve-linux.json and .txt (the table).
# SPORE_BSL_TIMEOUT (s, default 5400) bounds the QEMU run.
BSL_FUNCTIONS ?= lorem,thumbnail,enhance,matrix,compress
BSL_SIZES ?= 128,256,512
BSL_ROUNDS ?= 3
BSL_STRATEGIES ?= cold-boot,merged,layered,layered-ws,clone,warm
BSL_TEMPERATURES ?= lukewarm,cold
bench-serve-linux: deps-nested static
	SPORE_BSL_FUNCTIONS=$(BSL_FUNCTIONS) SPORE_BSL_SIZES=$(BSL_SIZES) SPORE_BSL_ROUNDS=$(BSL_ROUNDS) \
	SPORE_BSL_STRATEGIES=$(BSL_STRATEGIES) SPORE_BSL_TEMPERATURES=$(BSL_TEMPERATURES) \
	SPORE_BENCH_OUT=$(BENCH_OUT)/serve-linux \
	    tests/nested/run-all.sh --spore $(STATIC_SPORE) --only bench-serve-linux
# Sandboxes (issue 32), nested: the sandbox-envd scenario, then spore bench
# sandbox with $(SANDBOX_BENCH_ARGS); its JSON in $(BENCH_OUT)/bench-sandbox.json.
SANDBOX_BENCH_ARGS ?= --runs 10 --forks 1,20,100
bench-sandbox: deps-nested static
	SPORE_SANDBOX_BENCH="$(SANDBOX_BENCH_ARGS)" \
	    tests/nested/run-all.sh --spore $(STATIC_SPORE) --only sandbox-envd
	mkdir -p $(BENCH_OUT)
	cp /tmp/spore-nested/out-sandbox-envd/bench-sandbox.json $(BENCH_OUT)/
bench: build uk
	mkdir -p $(BENCH_OUT)
	$(SPORE) bench boot --uk $(UK_OUT)/boot-mark > $(BENCH_OUT)/boot.json
	$(SPORE) bench tmem --uk-dir $(UK_OUT) > $(BENCH_OUT)/tmem.json
	$(SPORE) bench snapshot --uk $(UK_OUT)/snapbench > $(BENCH_OUT)/snapshot.json
	$(SPORE) bench clone --uk-dir $(UK_OUT) > $(BENCH_OUT)/clone.json
	$(SPORE) bench reclaim --uk $(UK_OUT)/memtest > $(BENCH_OUT)/reclaim.json
	$(SPORE) bench serve --uk-dir $(UK_OUT) > $(BENCH_OUT)/serve.json
	$(SPORE) bench net --uk $(UK_OUT)/httpd > $(BENCH_OUT)/net.json
	$(SPORE) bench report $(BENCH_OUT)

clean:
	$(CARGO) clean
	cd crates/spore-uk && $(CARGO) clean

# aarch64 (issue 15). A static aarch64 spore for the arm64 nested tier's L1:
# musl, linked (and its C part, SQLite, compiled) with Debian's
# aarch64-linux-gnu gcc (scripts/ensure-deps.sh arm64 installs it and the
# rustup target).
STATIC_SPORE_ARM64 := $(CURDIR)/target/aarch64-unknown-linux-musl/release/spore
.PHONY: deps-arm64 static-arm64 lint-arm64 test-nested-arm64
ARM64_ENV := CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_LINKER=aarch64-linux-gnu-gcc \
	CC_aarch64_unknown_linux_musl=aarch64-linux-gnu-gcc \
	CFLAGS_aarch64_unknown_linux_musl="-specs /usr/lib/aarch64-linux-musl/musl-gcc.specs"
deps-arm64:
	@scripts/ensure-deps.sh arm64

static-arm64: deps-arm64
	$(ARM64_ENV) $(CARGO) build --release -p spore --target aarch64-unknown-linux-musl

# clippy over the aarch64 build (make lint runs it): the arch/aarch64 code and
# every cfg(target_arch) branch compile only there.
lint-arm64: deps-arm64
	$(ARM64_ENV) $(CARGO) clippy --target aarch64-unknown-linux-musl --all-targets -p spore-vmm -p spore -p spore-bench \
	    -p spore-guest-tools -- -D warnings

# The aarch64 nested tier: tests/nested/run-all.sh --arch arm64 (QEMU TCG
# `virt` with EL2, Debian's arm64 cloud kernel with KVM, the arm64 guest;
# scenarios in tests/nested-arm64/scenarios/ and the x86 tier's, shared).
# Part of `make test`. `build uk`: bad-input takes an x86 snapshot on the host.
# bad-input's x86 snapshot is taken by the static x86 spore the x86 tier
# builds anyway (on an x86_64 host; a second, glibc release build cost a
# fresh machine 4.5 minutes).
X86_SNAPSHOT_SPORE := $(if $(filter x86_64,$(shell uname -m)),static,)
test-nested-arm64: deps-nested static-arm64 $(X86_SNAPSHOT_SPORE) uk
	tests/nested/run-all.sh --arch arm64 --spore $(STATIC_SPORE_ARM64)

# The arm64 guest (issue 15): the kernel cross-built from linux-source-6.12
# with guest/kernel-arm64.fragment (guest/build-kernel.sh --arch arm64) and an
# arm64 initramfs (Debian's busybox-static:arm64, the guest tools built for
# aarch64-unknown-linux-musl), both cached by content in $$SPORE_CACHE
# (a cold kernel: 11 CPU-minutes, about 6 minutes on 2 idle cores); prints
# their paths.
ARM64_INITRAMFS ?= $(CURDIR)/target/guest-arm64/initramfs.cpio
# Issue 15's benchmark: boot to init, restore to the first reply, clone to its
# vCPUs' start and first reply, on both tiers (x86 then arm64), JSON per arch
# in $(BENCH_OUT)/bench-arch-{x86_64,arm64}/, the table in $(BENCH_OUT)/bench-arch.md.
# Not in `make test` (about 10 minutes).
.PHONY: bench-arch
bench-arch: deps-nested static static-arm64 build uk
	SPORE_BENCH_OUT=$(BENCH_OUT)/bench-arch-x86_64 tests/nested/run-all.sh --spore $(STATIC_SPORE) --only bench-arch
	SPORE_BENCH_OUT=$(BENCH_OUT)/bench-arch-arm64 tests/nested/run-all.sh --arch arm64 --spore $(STATIC_SPORE_ARM64) --only bench-arch
	tests/nested/bench-arch-table.py $(BENCH_OUT)/bench-arch-x86_64/bench-arch.json \
	    $(BENCH_OUT)/bench-arch-arm64/bench-arch.json | tee $(BENCH_OUT)/bench-arch.md

.PHONY: guest-arm64
guest-arm64:
	@kernel="$$(guest/build-kernel.sh --arch arm64 | tail -n1)"; \
	initramfs="$$(guest/build-initramfs.sh --arch arm64 $(ARM64_INITRAMFS) | tail -n1)"; \
	echo "arm64 kernel:    $$kernel"; \
	echo "arm64 initramfs: $$initramfs"
