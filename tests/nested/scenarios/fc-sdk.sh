#!/bin/sh
# Tier 3, issue 13: firecracker-go-sdk (v1.0.0, pinned in tests/fc-sdk/go.mod)
# drives spore with its default launcher: `firecracker` in PATH is a symlink
# to spore (spore's argv[0] makes it Firecracker's command line), and the SDK
# runs it with its own flags (--api-sock, --id, --no-seccomp). The program
# (/bin/fc-sdk, tests/fc-sdk/main.go) creates and starts a Linux guest with
# vsock and a balloon, waits for it over vsock, pauses, snapshots, stops,
# loads the snapshot in a new process (WithSnapshot), resumes, checks the
# guest answers, then inflates/deflates the balloon and reads its statistics.
# It prints the SPORE-TEST lines itself.
. "${SPORE_ROOT:-}/lib/spore/scenario-lib.sh"
tmp=${SPORE_TMP:-/tmp}
cd "$tmp" || exit 1
bindir="$tmp/fc-bin"
mkdir -p "$bindir"
ln -sf "$SPORE" "$bindir/firecracker"
PATH="$bindir:$PATH" "${SPORE_ROOT:-}/bin/fc-sdk" -kernel "$GUEST_KERNEL" -initrd "$GUEST_INITRD" -dir "$tmp" 2>"$tmp/fc-sdk.err"
rc=$?
[ $rc -eq 0 ] || { echo "fc-sdk exited with status $rc; its stderr:"; tail -n 20 "$tmp/fc-sdk.err"; }
cp "$tmp/fc-sdk.err" "$tmp"/fc*.log "$SPORE_OUT/" 2>/dev/null
true
