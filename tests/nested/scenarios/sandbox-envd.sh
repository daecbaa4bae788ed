#!/bin/sh
# Tier 3, issue 32 (sandboxes): spore-envd in a real Linux sandbox guest,
# driven by the e2b SDK. L1 boots the `sandbox-base` image (guest/runtimes/
# sandbox-base: Debian, Python 3, a `user` account, spore-agent as PID 1 in
# sandbox mode keeping spore-envd up) from the scratch disk, read-only under a
# copy-on-write overlay in memory, with vsock. It waits for envd's /health
# over vsock, gives it its access token through /init (as the sandbox API
# does), exposes vsock port 49983 on L1's TCP 49983 (`spore vsock forward`),
# and says SPORE-HOST-GO: the host driver (tests/nested/host/sandbox-envd.sh)
# then runs the envd scenarios of tests/sandbox/ with the SDK on the host,
# through run.sh's --hostfwd, and sends its SPORE-TEST lines back to port 7000.
# Then the mechanisms of a sandbox's lifecycle, on the VMM (the sandbox API
# will drive the same calls): pause = a full snapshot of the running sandbox
# (the VMM stops), resume = its restore in a new VMM process (envd's clock set
# again through /init), fork = two clones of the resumed sandbox (`spore
# clone --mode continue`), each forwarded on a port of its own; the host
# driver checks through the SDK that a file and a background command made
# before the pause are there after the resume, and that the forks diverge.
. "${SPORE_ROOT:-}/lib/spore/scenario-lib.sh"
tmp=${SPORE_TMP:-/tmp}
cd "$tmp" || exit 1
img="${SPORE_SCRATCH:-/scratch}/sandbox-base.ext4"
token=spore-nested-envd-token
if [ ! -f "$img" ]; then
    t sandbox-boot FAIL "no sandbox image at $img"
    exit 0
fi
api="$tmp/api.sock"
"$SPORE" vmm --api-sock "$api" >"$tmp/console.txt" 2>"$tmp/vmm.err" &
vmm=$!
wait_for_socket "$api"
A() { "$SPORE" api "$api" "$@" >/dev/null; }
boot_args="console=ttyS0 quiet reboot=k panic=1 pci=off root=/dev/vda rw rootfstype=ext4 init=/sbin/spore-agent spore.mode=sandbox spore.user=user"
if A PUT /boot-source "{\"kernel_image_path\":\"$GUEST_KERNEL\",\"boot_args\":\"$boot_args\"}" &&
    A PUT /machine-config '{"vcpu_count":1,"mem_size_mib":512}' &&
    A PUT /drives/rootfs "{\"drive_id\":\"rootfs\",\"path_on_host\":\"$img\",\"is_root_device\":true,\"is_read_only\":false,\"cow_overlay\":{\"path\":\"$tmp/rootfs.cow\"}}" &&
    A PUT /vsock "{\"guest_cid\":3,\"uds_path\":\"$tmp/v.sock\"}" &&
    A PUT /actions '{"action_type":"InstanceStart"}'; then
    :
else
    t sandbox-boot FAIL "$(cat "$tmp/vmm.err")"
    exit 0
fi

# envd_http REQUEST [UDS]: one HTTP/1.0 exchange with envd over vsock.
envd_http() {
    printf '%b' "$1" | timeout 20 "$SPORE" vsock connect --uds "${2:-$tmp/v.sock}" --port 49983 --timeout 5 2>/dev/null
}
# ms: milliseconds since the epoch (busybox date has no %N: /proc/uptime).
ms() { awk '{ printf "%d", $1 * 1000 }' /proc/uptime; }
i=0
until envd_http 'GET /health HTTP/1.0\r\n\r\n' | head -n1 | grep -q ' 204'; do
    i=$((i + 1))
    if [ $i -ge 120 ] || ! kill -0 "$vmm" 2>/dev/null; then
        t sandbox-boot FAIL "envd never answered /health; console: $(tail -n 8 "$tmp/console.txt" | tr '\n' '|'); VMM: $(tail -n 5 "$tmp/vmm.err" | tr '\n' '|')"
        kill "$vmm" 2>/dev/null
        cp "$tmp/console.txt" "$tmp/vmm.err" "$SPORE_OUT/" 2>/dev/null
        exit 0
    fi
    sleep 1
done
t sandbox-boot PASS "envd answered /health over vsock after ~${i} s"

body="{\"accessToken\":\"$token\",\"envVars\":{\"SPORE_SANDBOX\":\"nested\"}}"
len=$(printf '%s' "$body" | wc -c)
if envd_http "POST /init HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: $len\r\n\r\n$body" |
    head -n1 | grep -q ' 204'; then
    t envd-init PASS
else
    t envd-init FAIL
fi
# Without the token now: 401.
if envd_http 'GET /envs HTTP/1.0\r\n\r\n' | head -n1 | grep -q ' 401'; then
    t envd-token-required PASS
else
    t envd-token-required FAIL
fi

"$SPORE" vsock forward --uds "$tmp/v.sock" --port 49983 --listen tcp:0.0.0.0:49983 2>"$tmp/forward.err" &
fwd=$!
sleep 1
echo "SPORE-HOST-GO sandbox-envd"
# The host driver's results (it runs the SDK for minutes; bounded).
timeout 1500 busybox nc -l -p 7000 >"$tmp/host-results.txt" 2>"$tmp/nc.err"
if grep -q '^SPORE-TEST ' "$tmp/host-results.txt"; then
    grep '^SPORE-TEST ' "$tmp/host-results.txt"
else
    t host-driver FAIL "no results from the host driver ($(cat "$tmp/nc.err"))"
fi
kill "$fwd" 2>/dev/null

# --- pause: a full snapshot of the running sandbox; the VMM stops.
t0=$(ms)
if "$SPORE" snapshot create "$api" --state "$tmp/pause.state" --mem "$tmp/pause.mem" --stop \
    >/dev/null 2>"$tmp/pause.err"; then
    t sandbox-pause PASS "$(($(ms) - t0)) ms; memory file $(du -k "$tmp/pause.mem" | cut -f1) KiB on disk of $(($(stat -c %s "$tmp/pause.mem") / 1024)) KiB, disk overlay $(du -k "$tmp/rootfs.cow" | cut -f1) KiB"
else
    t sandbox-pause FAIL "$(cat "$tmp/pause.err")"
fi
# --stop ends the VMM: bounded, with its threads' states if it does not.
i=0
while kill -0 "$vmm" 2>/dev/null && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
if kill -0 "$vmm" 2>/dev/null; then
    threads=$(for t in /proc/"$vmm"/task/*; do
        printf '%s:%s:%s ' "$(cat "$t/comm")" "$(cut -d' ' -f3 "$t/stat")" "$(cat "$t/wchan" 2>/dev/null)"
    done)
    t sandbox-pause-vmm-exit FAIL "the VMM did not exit 30 s after its snapshot with --stop; threads: $threads; log: $(tail -n 3 "$tmp/vmm.err" | tr '\n' '|')"
    kill -9 "$vmm" 2>/dev/null
fi
wait "$vmm" 2>/dev/null

# --- resume: restored in a new VMM process; envd answers, its clock is set.
t0=$(ms)
"$SPORE" snapshot restore --state "$tmp/pause.state" --mem "$tmp/pause.mem" --api-sock "$tmp/api2.sock" \
    >"$tmp/console-resumed.txt" 2>"$tmp/resume.err" &
vmm=$!
# Up to 120 s (a vsock connect the guest does not accept waits its 5 s).
until envd_http 'GET /health HTTP/1.0\r\n\r\n' | head -n1 | grep -q ' 204'; do
    if [ $(($(ms) - t0)) -ge 120000 ] || ! kill -0 "$vmm" 2>/dev/null; then break; fi
    sleep 0.1
done
if envd_http 'GET /health HTTP/1.0\r\n\r\n' | head -n1 | grep -q ' 204'; then
    t sandbox-resume PASS "envd answered $(($(ms) - t0)) ms after the restore began"
else
    t sandbox-resume FAIL "$(tail -n 3 "$tmp/resume.err")"
fi
now=$(date -u +%Y-%m-%dT%H:%M:%SZ)
body="{\"timestamp\":\"$now\"}"
len=$(printf '%s' "$body" | wc -c)
if envd_http "POST /init HTTP/1.0\r\nX-Access-Token: $token\r\nContent-Length: $len\r\n\r\n$body" |
    head -n1 | grep -q ' 204'; then
    t envd-init-after-resume PASS
else
    t envd-init-after-resume FAIL
fi

# --- fork: two clones of the resumed sandbox, which runs on.
mkdir -p "$tmp/clones"
t0=$(ms)
if "$SPORE" clone "$tmp/api2.sock" -n 2 --mode continue --dir "$tmp/clones" >"$tmp/clone.json" 2>"$tmp/clone.err"; then
    t sandbox-fork-2 PASS "$(($(ms) - t0)) ms for 2 clones"
else
    t sandbox-fork-2 FAIL "$(cat "$tmp/clone.err")"
fi
"$SPORE" vsock forward --uds "$tmp/v.sock" --port 49983 --listen tcp:0.0.0.0:49983 2>"$tmp/forward.err" &
fwds=$!
for n in 1 2; do
    # Clone n's vsock socket is in the clones' directory, named after it.
    vs=$(ls "$tmp"/clones/*-c$n.vsock 2>/dev/null | head -n1)
    [ -S "$vs" ] || t "fork-$n-vsock" FAIL "no vsock socket for clone $n in $(ls "$tmp/clones" | tr '\n' ' ')"
    "$SPORE" vsock forward --uds "$vs" --port 49983 --listen "tcp:0.0.0.0:$((49983 + n))" \
        2>"$tmp/forward-c$n.err" &
    fwds="$fwds $!"
done
sleep 1
# The driver connects to 7001 until it reads READY, then reports on 7000.
echo READY | timeout 600 busybox nc -l -p 7001 >/dev/null 2>&1
timeout 900 busybox nc -l -p 7000 >"$tmp/host-results-2.txt" 2>"$tmp/nc.err"
if grep -q '^SPORE-TEST ' "$tmp/host-results-2.txt"; then
    grep '^SPORE-TEST ' "$tmp/host-results-2.txt"
else
    t host-driver-lifecycle FAIL "no results from the host driver ($(cat "$tmp/nc.err"))"
fi
for p in $fwds $(sed -n 's/.*"pid": *\([0-9]*\).*/\1/p' "$tmp/clone.json"); do kill "$p" 2>/dev/null; done
kill "$vmm" 2>/dev/null
wait 2>/dev/null
cp "$tmp/console.txt" "$tmp/console-resumed.txt" "$tmp/vmm.err" "$tmp/resume.err" "$tmp"/forward*.err \
    "$tmp"/clones/*.log "$SPORE_OUT/" 2>/dev/null
rm -rf "$tmp/pause.state" "$tmp/pause.mem" "$tmp/rootfs.cow" "$tmp/clones"

# --- The sandbox API: spore serve with the image as template "base", the
# SDK on the host creating, using, pausing, resuming, forking and killing
# sandboxes through it (tests/sandbox/sandbox_api.py), with two accounts'
# keys. Its state on the scratch disk: paused sandboxes' memory goes there.
state="${SPORE_SCRATCH:-/scratch}/serve"
# base has a network (the default): each sandbox's VMM in a namespace of its
# own behind spore serve's NAT, with QEMU's resolver as its name server.
printf 'name = "base"\nkernel = "%s"\nrootfs = "%s"\nmemory_mib = 512\ndns = ["10.0.2.3"]\n' \
    "$GUEST_KERNEL" "$img" >"$tmp/base.toml"
# The web template (built on the host by spore sandbox template build from
# tests/sandbox/web/spec.toml): its image and its start and ready commands.
# web has none: vsock only.
printf 'name = "web"\nkernel = "%s"\nrootfs = "%s"\nmemory_mib = 512\nnetwork = false\n' \
    "$GUEST_KERNEL" "${SPORE_SCRATCH:-/scratch}/sandbox-web.ext4" >"$tmp/web.toml"
cat "${SPORE_SCRATCH:-/scratch}/web.cmds" >>"$tmp/web.toml"
# The same API keys as the host driver's.
cat >"$tmp/keys.toml" <<'KEYS'
[[keys]]
access_key_id = "AKIDSANDBOXA"
secret_access_key = "secret-a"
account_id = "111111111111"
sandbox_api_key = "e2b_0000000000000000000000000000000000000a11"
[[keys]]
access_key_id = "AKIDSANDBOXB"
secret_access_key = "secret-b"
account_id = "222222222222"
sandbox_api_key = "e2b_0000000000000000000000000000000000000b22"
KEYS
export SPORE_LOG=spore_serve=info,warn
# What a networked sandbox reaches through the NAT: a TCP server on this
# host's (L1's) own address, port 7002, answering one line per connection
# (the host driver is told where, in the READY line). iproute2 and nftables
# are in /usr/local/sbin in L1 (run-all.sh), first in spore serve's PATH.
probe_ip=$(ip -o -f inet addr show scope global | awk '{print $4}' | cut -d/ -f1 | head -n 1)
[ -n "$probe_ip" ] || probe_ip=10.0.2.15 # L1's address on QEMU's user network
(while [ ! -f "$tmp/probe.stop" ]; do
    echo spore-net-ok | timeout 900 busybox nc -l -p 7002 >/dev/null 2>&1 || sleep 0.2
done) &
probe=$!
# start_serve N [ARG...]: spore serve with the sandbox API on L1's port 3000.
start_serve() {
    n=$1
    shift
    PATH="/usr/local/sbin:$PATH" "$SPORE" serve --listen 127.0.0.1:0 --state-dir "$state" --auth "$tmp/keys.toml" \
        --sandbox-listen 0.0.0.0:3000 --sandbox-template "$tmp/base.toml" --sandbox-template "$tmp/web.toml" "$@" \
        >"$tmp/serve-$n.out" 2>"$tmp/serve-$n.err" &
    serve=$!
    i=0
    until grep -q sandbox_listen "$tmp/serve-$n.out" 2>/dev/null || [ $i -ge 300 ]; do sleep 0.1; i=$((i + 1)); done
    if grep -q sandbox_listen "$tmp/serve-$n.out"; then
        t "sandbox-api-up-$n" PASS
    else
        t "sandbox-api-up-$n" FAIL "$(tail -n 5 "$tmp/serve-$n.err")"
    fi
}
# host_turn NAME: READY to the host driver on 7001, then its results on 7000.
host_turn() {
    echo "READY $probe_ip:7002" | timeout 600 busybox nc -l -p 7001 >/dev/null 2>&1
    timeout 1500 busybox nc -l -p 7000 >"$tmp/host-results-$1.txt" 2>"$tmp/nc.err"
    if grep -q '^SPORE-TEST ' "$tmp/host-results-$1.txt"; then
        grep '^SPORE-TEST ' "$tmp/host-results-$1.txt"
    else
        t "host-driver-$1" FAIL "no results from the host driver ($(cat "$tmp/nc.err"))"
    fi
}
# The uids of the daemons' VMMs (zygotes, sandboxes, forks, resumed ones),
# sampled every 3 s while the daemons run: every one is jailed, never root
# (spore processes whose command line names a path in the state directory;
# the daemon and its guardian name the directory itself).
(while [ ! -f "$tmp/probe.stop" ]; do
    for p in /proc/[0-9]*; do
        read -r comm <"$p/comm" 2>/dev/null || continue
        [ "$comm" = spore ] || continue
        cmd=$(tr '\0' ' ' <"$p/cmdline" 2>/dev/null)
        case "$cmd" in *"$state/"*) ;; *) continue ;; esac
        # A VMM started with --user is root only for its first moments,
        # until it drops to that user (before any guest input).
        case "$cmd" in *" --user "*) how=dropping ;; *) how=plain ;; esac
        echo "$(awk '/^Uid:/ {print $2}' "$p/status" 2>/dev/null) $how"
    done >>"$tmp/vmm-uids.txt"
    sleep 3
done) &
uid_sampler=$!
# keep_vmm_logs N: the VMM logs of daemon N's sandboxes and zygotes (a VMM
# that died says why there; run-all.sh looks for a triple fault in them),
# copied before the daemon's end removes them.
keep_vmm_logs() {
    find "$state/sbx" "$state/run" -name '*.log' 2>/dev/null | while read -r f; do
        cp "$f" "$SPORE_OUT/serve-$1_$(echo "${f#"$state/"}" | tr '/' '_')" 2>/dev/null
    done
}
start_serve 1
host_turn sandbox-api
keep_vmm_logs 1
# sandbox_api.py paused sandboxes cloned from the template: their pauses are
# diffs on the template base.
if grep -q "sandbox paused in .*a diff snapshot" "$tmp/serve-1.err"; then
    t sandbox-pause-is-a-diff PASS "$(grep -o 'sandbox paused in [^)]*)' "$tmp/serve-1.err" | head -n 2 | tr '\n' ' ')"
else
    t sandbox-pause-is-a-diff FAIL "$(grep -i 'paus\|base' "$tmp/serve-1.err" | tail -n 3 | tr '\n' ' ')"
fi
# kill -9 of the daemon: its guardian ends the VMMs; the paused sandbox stays.
kill -9 "$serve" 2>/dev/null
wait "$serve" 2>/dev/null
# The second daemon ends an account's zygote after 20 s without a create
# (the host driver's zygote-idle step: account B's web zygote, twice).
start_serve 2 --sandbox-zygote-idle 20
host_turn sandbox-persist
# Both of B's zygotes ended: the one the step's first create booted, and the
# one its second create booted again (its VMM process gone too).
i=0
until [ "$(grep "zygote ended after 20 s" "$tmp/serve-2.err" | grep -c "222222222222")" -ge 2 ] || [ $i -ge 60 ]; do
    sleep 1
    i=$((i + 1))
done
ended=$(grep "zygote ended after 20 s" "$tmp/serve-2.err" | grep -c "222222222222")
zygote_left=""
for p in /proc/[0-9]*; do
    tr '\0' ' ' <"$p/cmdline" 2>/dev/null | grep -q "run/sbx-web.222222222222" && zygote_left="$zygote_left ${p#/proc/}"
done
if [ "$ended" -ge 2 ] && [ -z "$zygote_left" ]; then
    t sandbox-idle-zygote-ends PASS "account B's web zygote ended twice after 20 s idle; no VMM of it left"
else
    t sandbox-idle-zygote-ends FAIL "$ended zygote ends logged for account B; its VMM processes left:${zygote_left:- none} ($(grep -i zygote "$tmp/serve-2.err" | tail -n 3 | tr '\n' ' '))"
fi
keep_vmm_logs 2
kill -TERM "$serve" 2>/dev/null
wait "$serve" 2>/dev/null
sleep 1
# (L1's busybox has no pgrep.)
left=""
for p in /proc/[0-9]*; do
    tr '\0' ' ' <"$p/cmdline" 2>/dev/null | grep -q "$state/" && left="$left ${p#/proc/}"
done
# Nor a sandbox's network namespace (`<prefix>.sbx...`) or host veth.
nets_left=$(ls /run/netns 2>/dev/null | grep '\.sbx' | tr '\n' ' ')
if [ -z "$left" ] && [ -z "$nets_left" ]; then
    t sandbox-api-no-leftovers PASS "no VMM and no network namespace of the daemon's left after SIGTERM"
else
    t sandbox-api-no-leftovers FAIL "processes left: ${left:-none}; namespaces left: ${nets_left:-none}"
fi
touch "$tmp/probe.stop"
kill "$probe" 2>/dev/null
wait "$uid_sampler" 2>/dev/null
samples=$(wc -l <"$tmp/vmm-uids.txt" 2>/dev/null || echo 0)
as_root=$(grep -c '^0 plain$' "$tmp/vmm-uids.txt" 2>/dev/null)
starting=$(grep -c '^0 dropping$' "$tmp/vmm-uids.txt" 2>/dev/null)
distinct=$(grep -v '^0 ' "$tmp/vmm-uids.txt" 2>/dev/null | cut -d' ' -f1 | sort -u | tr '\n' ' ')
if [ "${samples:-0}" -gt 0 ] && [ "${as_root:-0}" = 0 ] && [ "$(echo "$distinct" | wc -w)" -ge 2 ]; then
    t sandbox-vmms-jailed PASS "$samples samples of VMM processes, none root but ${starting:-0} in their first moments before the drop to their user; uids: $distinct(one per account and template)"
else
    t sandbox-vmms-jailed FAIL "$samples samples of VMM processes, ${as_root:-0} as root without --user; uids: ${distinct:-none}"
fi
grep -h "sandbox created\|sandbox paused\|sandbox resumed\|template ready\|template base\|ready_cmd" "$tmp"/serve-*.err | tail -n 20
cp "$tmp"/serve-*.err "$SPORE_OUT/" 2>/dev/null

# --- spore bench sandbox, when asked (make bench-sandbox: a marker on the
# scratch disk; not in make test): its own daemon and state, the JSON kept
# in the scenario's output.
if [ -f "${SPORE_SCRATCH:-/scratch}/bench-sandbox.args" ]; then
    rm -rf "$state"
    # shellcheck disable=SC2046 # the marker holds the bench's arguments
    # Its daemon's sandboxes are networked: ip and nft from /usr/local/sbin.
    if PATH="/usr/local/sbin:$PATH" SPORE_BENCH_DAEMON_LOG="$tmp/bench-serve.err" "$SPORE" bench sandbox --template "$tmp/base.toml" \
        $(cat "${SPORE_SCRATCH:-/scratch}/bench-sandbox.args") \
        --state-dir "${SPORE_SCRATCH:-/scratch}/bench" >"$SPORE_OUT/bench-sandbox.json" 2>"$tmp/bench.err"; then
        t bench-sandbox PASS "$(tail -n 2 "$tmp/bench.err" | tr '\n' ' ')"
    else
        t bench-sandbox FAIL "$(tail -n 3 "$tmp/bench.err" | tr '\n' '|') serve: $(tail -n 3 "$tmp/bench-serve.err" | tr '\n' '|')"
    fi
fi
cp "$tmp/bench-serve.err" "$SPORE_OUT/" 2>/dev/null
exit 0

