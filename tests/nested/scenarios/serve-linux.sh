#!/bin/sh
# Tier 3, issue 17 (first part): `spore serve` runs Linux functions. The
# guest kernel ($GUEST_KERNEL) boots a runtime image (python3, provided:
# copied from the host's `spore image build` cache into /cache) with
# spore-agent as PID 1 and the function's code disk as a second drive.
# Through the Lambda API (`spore fn`): a pure-stdlib Python function and a
# `provided` function (a shell bootstrap on busybox wget) are deployed and
# invoked three times each (a cold start, then clones or warm instances);
# the Python handler's print() comes back with `LogType: Tail`; a `provided`
# function built with AWS's `lambda_runtime` crate, and a Python function
# run by AWS's `awslambdaric` (from PyPI, in its zip), answer and report
# their handlers' errors as Lambda does;
# a Python function whose import fails answers with Runtime.ImportModuleError
# (a function error, `spore fn invoke` exits 1); a zip without the handler's
# module is refused at deploy time. The zips come from the host (/fns).
#
# SnapFaaS layering (issue 17, item 3): the first Python function's first
# start boots the python3 runtime once with a placeholder code disk and
# writes its base snapshot at Standby (<state>/bases/python3-256), then
# restores it with the function's code disk swapped in and writes the
# function's snapshot as a diff on it. A second Python function reuses that
# base (the same snapshot id in /metrics and on disk) and its diff is smaller
# than the base. After a daemon restart (--no-clones, no keep-alive) every
# start restores the chain base + diff: answers are right, two restored
# instances draw different os.urandom bytes (the generation notice reseeds
# them), and a third function reuses the base recorded by the first daemon.
#
# Jailed (issue 30, item 2): every instance VMM runs as its function's uid,
# without capabilities, in a root of its own.
#
# Idle memory (issue 17, item 3): an instance that held 96 MiB and let it go
# gives it back to the host (free page reporting through the balloon).
. "${SPORE_ROOT:-}/lib/spore/scenario-lib.sh"
tmp=${SPORE_TMP:-/tmp}
cd "$tmp" || exit 1
ep=127.0.0.1:9000
F() { "$SPORE" fn --endpoint "$ep" "$@"; }

# Info lines of the daemon: the base made or reused, diff sizes, zygotes.
export SPORE_LOG=spore_serve=info,warn
# --no-cpu-cap: under TCG a guest's work costs 20-50 times its CPU time on
# hardware, and held to its MemorySize's share (a tenth of a CPU here) a warm
# invocation took 7 s instead of 0.5; the instances still get a cgroup each
# (checked below), and the cap is tested on the host tier.
"$SPORE" serve --listen "$ep" --state-dir "$tmp/s" --image-cache /cache --ready-timeout-s 240 \
    --linux-kernel "$GUEST_KERNEL" --keep-alive-ms 600000 --no-cpu-cap >"$tmp/serve.out" 2>"$tmp/serve.err" &
serve=$!
i=0
until grep -q listen "$tmp/serve.out" 2>/dev/null || [ $i -ge 100 ]; do sleep 0.1; i=$((i + 1)); done
if grep -q listen "$tmp/serve.out"; then t serve-up PASS; else t serve-up FAIL "$(tail -n 5 "$tmp/serve.err")"; fi

# deploy NAME RUNTIME HANDLER ZIP
deploy() {
    if F deploy "$1" --runtime "$2" --handler "$3" --zip "$4" --memory 256 --timeout 30 \
        --env GREETING=hi >"$tmp/deploy-$1.out" 2>&1; then
        t "deploy-$1" PASS
    else
        t "deploy-$1" FAIL "$(tail -n 3 "$tmp/deploy-$1.out")"
    fi
}

# invoke3 NAME EXPECTED-SUBSTRING-OF-BODY (n substituted per call)
invoke3() {
    for n in 1 2 3; do
        body=$(F invoke "$1" "{\"n\": $n}" 2>"$tmp/inv.err")
        rc=$?
        path=$(sed -n 's/^spore fn: \([a-z-]*\) start, \(.*\) ms.*$/\1 \2 ms/p' "$tmp/inv.err")
        want=$(echo "$2" | sed "s/@N@/$n/g")
        case "$body" in
        *"$want"*) [ $rc = 0 ] && t "invoke-$1-$n" PASS "$path" || t "invoke-$1-$n" FAIL "exit $rc: $body" ;;
        *) t "invoke-$1-$n" FAIL "exit $rc, body '$body' ($(cat "$tmp/inv.err"); $(tail -n 5 "$tmp/serve.err"))" ;;
        esac
    done
}

deploy hello python3 hello.handler /fns/hello.zip
invoke3 hello '"n": @N@'
body=$(F invoke hello '{"n": 7}' 2>/dev/null)
case "$body" in
*'"greeting": "hi"'*'"function": "hello"'*) t python3-env-and-context PASS ;;
*) t python3-env-and-context FAIL "$body" ;;
esac

# Every instance VMM (zygote, clone factory, clones) runs as a uid of its
# function's (spore serve --uid-range's default), none as root, without
# capabilities, in a root of its own.
jailed="" root=""
for d in /proc/[0-9]*; do
    case "$(tr '\0' ' ' <"$d/cmdline" 2>/dev/null)" in
    *" vmm "*"$tmp/s/"*) ;;
    *) continue ;;
    esac
    status=$(cat "$d/status" 2>/dev/null) || continue # (it ended meanwhile)
    uid=$(echo "$status" | awk '/^Uid:/ {print $2}')
    cap=$(echo "$status" | awk '/^CapEff:/ {print $2}')
    # In a root of its own: the L1's /etc is not there, its state is, and
    # of the runtime bases only its own (and the placeholder code disk).
    bases=$(ls "$d/root$tmp/s/bases" 2>/dev/null | grep -vc '^placeholder')
    if [ "$uid" -ge 100001 ] 2>/dev/null && [ "$cap" = 0000000000000000 ] &&
        [ ! -e "$d/root/etc" ] && [ -d "$d/root$tmp/s/snapshots" ] &&
        [ "$bases" -le 1 ]; then
        jailed="$jailed ${d#/proc/}:$uid"
    else
        root="$root ${d#/proc/}:$uid:$cap:bases=$bases"
    fi
done
if [ -n "$jailed" ] && [ -z "$root" ]; then
    t instances-jailed PASS "pid:uid$jailed"
else
    t instances-jailed FAIL "jailed:${jailed:- none} other:$root"
fi

# And each in a cgroup of its own (the L1 mounts cgroup v2, as a systemd host
# does): under the daemon's tree, its memory bounded.
own="" shared=""
for d in /proc/[0-9]*; do
    case "$(tr '\0' ' ' <"$d/cmdline" 2>/dev/null)" in
    *" vmm "*"$tmp/s/"*) ;;
    *) continue ;;
    esac
    cg=$(sed -n 's/^0:://p' "$d/cgroup" 2>/dev/null) || continue
    max=$(cat "/sys/fs/cgroup$cg/memory.max" 2>/dev/null)
    case "$cg:$max" in
    /sp*/*/*:[0-9]*) own="$own ${d#/proc/}:$max" ;;
    *) shared="$shared ${d#/proc/}:$cg:$max" ;;
    esac
done
if [ -n "$own" ] && [ -z "$shared" ]; then
    t instances-own-cgroups PASS "pid:memory.max$own"
else
    t instances-own-cgroups FAIL "own:${own:- none} other:$shared"
fi

deploy shell provided unused /fns/provided.zip
invoke3 shell '"provided": true, "event": {"n": @N@}'

deploy broken python3 broken.handler /fns/broken.zip
body=$(F invoke broken '{}' 2>"$tmp/inv.err")
rc=$?
if [ $rc = 1 ] && echo "$body" | grep -q '"errorType": *"Runtime.ImportModuleError"' &&
    echo "$body" | grep -q "no_such_module_here"; then
    t init-error PASS "$(echo "$body" | head -c 160)"
else
    t init-error FAIL "exit $rc, body '$body' ($(cat "$tmp/inv.err"); $(tail -n 5 "$tmp/serve.err"))"
fi

# A handler's print() is in the invocation's log: `LogType: Tail`.
F invoke hello '{"n": 11}' --log-type Tail >"$tmp/tail.out" 2>"$tmp/tail.err"
rc=$?
if [ $rc = 0 ] && grep -q "hello-log n=11" "$tmp/tail.err" && grep -q '"n": 11' "$tmp/tail.out"; then
    t log-type-tail PASS "$(grep -c . "$tmp/tail.err") lines on stderr"
else
    t log-type-tail FAIL "exit $rc: $(tail -n 6 "$tmp/tail.err" | tr '\n' ' ')"
fi

# A `provided` function built with AWS's `lambda_runtime` crate (Rust, a
# static bootstrap: tests/fixtures/lambda-rust), unmodified.
deploy rust provided unused /fns/rust.zip
F invoke rust '{"k": "v"}' >"$tmp/rust.out" 2>"$tmp/inv.err"
rc=$?
body=$(tr -d ' ' <"$tmp/rust.out")
case "$rc:$body" in
0:*'"client":"lambda_runtime"'*'"function_name":"rust"'*) t lambda-runtime-crate PASS "$(sed -n 's/^spore fn: \([a-z-]*\) start, \(.*\) ms.*$/\1 \2 ms/p' "$tmp/inv.err")" ;;
*) t lambda-runtime-crate FAIL "exit $rc, body '$body' ($(cat "$tmp/inv.err"); $(tail -n 5 "$tmp/serve.err"))" ;;
esac
F invoke rust '{"fail": true}' >"$tmp/rust-fail.out" 2>"$tmp/inv.err"
rc=$?
body=$(cat "$tmp/rust-fail.out")
if [ $rc = 1 ] && echo "$body" | grep -q '"errorMessage": *"asked to fail in '; then
    t lambda-runtime-crate-error PASS "$(echo "$body" | head -c 160)"
else
    t lambda-runtime-crate-error FAIL "exit $rc, body '$body'"
fi

# AWS's own Python runtime client (awslambdaric from PyPI, in the zip, run
# by the zip's bootstrap in place of spore's) on the python3 runtime.
deploy ric python3 handler.fn /fns/ric.zip
# (Bodies compared without blanks: each client formats its JSON its own way.)
F invoke ric '{"k": 1}' --log-type Tail >"$tmp/ric.out" 2>"$tmp/inv.err"
rc=$?
body=$(tr -d ' ' <"$tmp/ric.out")
case "$rc:$body" in
0:*'"client":"awslambdaric"'*'"function_name":"ric"'*'"remaining_ms_positive":true'*'"greeting":"hi"'*'"ric_loaded":true'*)
    if grep -q "ric-log" "$tmp/inv.err"; then
        t awslambdaric PASS "$(sed -n 's/^spore fn: \([a-z-]*\) start, \(.*\) ms.*$/\1 \2 ms/p' "$tmp/inv.err")"
    else
        t awslambdaric FAIL "no ric-log in the log tail: $(tail -n 5 "$tmp/inv.err" | tr '\n' ' ')"
    fi
    ;;
*) t awslambdaric FAIL "exit $rc, body '$body' ($(cat "$tmp/inv.err"); $(tail -n 5 "$tmp/serve.err"))" ;;
esac
F invoke ric '{"fail": true}' >"$tmp/ric-fail.out" 2>"$tmp/inv.err"
rc=$?
body=$(cat "$tmp/ric-fail.out")
if [ $rc = 1 ] && echo "$body" | grep -q '"errorType": *"Failure"' && echo "$body" | grep -q "asked to fail in "; then
    t awslambdaric-error PASS "$(echo "$body" | head -c 160)"
else
    t awslambdaric-error FAIL "exit $rc, body '$body'"
fi

# A `provided` bootstrap that is not executable: Lambda's init error.
deploy noexec provided unused /fns/noexec.zip
F invoke noexec '{}' >"$tmp/noexec.out" 2>"$tmp/inv.err"
rc=$?
body=$(cat "$tmp/noexec.out")
if [ $rc = 1 ] && echo "$body" | grep -q '"errorType": *"Runtime.InvalidEntrypoint"'; then
    t bootstrap-not-executable PASS "$(echo "$body" | head -c 160)"
else
    t bootstrap-not-executable FAIL "exit $rc, body '$body' ($(tail -n 3 "$tmp/serve.err"))"
fi

if F deploy nomodule --runtime python3 --handler missing.handler --zip /fns/hello.zip >"$tmp/nomod.out" 2>&1; then
    t deploy-refuses-missing-module FAIL "deployed"
elif grep -q "InvalidParameterValueException\|names the module 'missing'" "$tmp/nomod.out"; then
    t deploy-refuses-missing-module PASS
else
    t deploy-refuses-missing-module FAIL "$(cat "$tmp/nomod.out")"
fi

# path_of: the start path and time `spore fn invoke` reported in $tmp/inv.err.
path_of() { sed -n 's/^spore fn: \([a-z-]*\) start, \(.*\) ms.*$/\1 \2 ms/p' "$tmp/inv.err"; }
# metric NAME-AND-LABELS-PREFIX FILE: the value of the first matching line.
metric() { grep -F "$1" "$2" | head -n 1 | awk '{print $NF}'; }
rand_of() { echo "$1" | sed -n 's/.*"rand": "\([0-9a-f]*\)".*/\1/p'; }

deploy hello2 python3 hello.handler /fns/hello.zip
body=$(F invoke hello2 '{"n": 5}' 2>"$tmp/inv.err")
case "$body" in
*'"n": 5'*'"function": "hello2"'*) t invoke-hello2-from-base PASS "$(path_of)" ;;
*) t invoke-hello2-from-base FAIL "body '$body' ($(cat "$tmp/inv.err"); $(tail -n 5 "$tmp/serve.err"))" ;;
esac

# Two at once: the idle instance and a new clone of hello2's zygote (the VM
# restored from the base that wrote the diff): different random bytes.
F invoke hello2 '{"n": 8, "sleep": 3}' >"$tmp/c1.out" 2>"$tmp/c1.err" &
c1=$!
sleep 1
F invoke hello2 '{"n": 9, "sleep": 1}' >"$tmp/c2.out" 2>"$tmp/c2.err"
wait $c1
paths=$(cat "$tmp/c1.err" "$tmp/c2.err" | sed -n 's/^spore fn: \([a-z-]*\) start.*/\1/p' | tr '\n' ' ')
r1=$(rand_of "$(cat "$tmp/c1.out")")
r2=$(rand_of "$(cat "$tmp/c2.out")")
case "$paths" in
*clone*)
    if [ -n "$r1" ] && [ -n "$r2" ] && [ "$r1" != "$r2" ]; then
        t clone-of-layered-zygote PASS "$paths: $r1 $r2"
    else
        t clone-of-layered-zygote FAIL "$paths: '$r1' '$r2'"
    fi
    ;;
*) t clone-of-layered-zygote FAIL "paths '$paths' ($(cat "$tmp/c1.err" "$tmp/c2.err"))" ;;
esac
no_zygote=$(grep -a "no zygote\|no diff snapshot\|no start from the runtime base" "$tmp/serve.err" | head -n 2)
if [ -z "$no_zygote" ] && grep -aq "zygote ready" "$tmp/serve.err"; then
    t layered-zygotes PASS "$(grep -ac 'zygote ready' "$tmp/serve.err") zygotes, each a VM started from a base"
else
    t layered-zygotes FAIL "$no_zygote"
fi

# Idle memory goes back to the host: every Linux function VM has a balloon
# with free page reporting, so memory its guest frees (after a couple of
# seconds) leaves the VMM. An instance of `hog` holds 96 MiB, lets it go,
# and one of the function's VMMs (its instance) must shrink by 64 MiB.
vmm_pids() {
    for p in /proc/[0-9]*; do
        case "$(tr '\0' ' ' <"$p/cmdline" 2>/dev/null)" in
        *" vmm "*"--api-sock $tmp/s/run/"*) echo "${p#/proc/}" ;;
        # A clone forked by its zygote's clone factory shows the factory's
        # command line and is named spore-clone (the factory runs no VM).
        *" vmm --clone-factory "*"--clone-dir $tmp/s/run/"*)
            [ "$(cat "$p/comm" 2>/dev/null)" = spore-clone ] && echo "${p#/proc/}" ;;
        esac
    done
}
pss_kib() { awk '/^Pss:/ {print $2}' "/proc/$1/smaps_rollup" 2>/dev/null; }
before_hog=" $(vmm_pids | tr '\n' ' ') "
deploy hog python3 hello.handler /fns/hello.zip
body=$(F invoke hog '{"n": 1, "hold_mib": 96}' 2>"$tmp/inv.err")
hold_path=$(path_of)
held=""
for p in $(vmm_pids); do
    case "$before_hog" in *" $p "*) continue ;; esac
    held="$held $p:$(pss_kib "$p")"
done
case "$body" in
*'"held_mib": 96'*)
    F invoke hog '{"n": 2, "release": true}' >"$tmp/release.out" 2>"$tmp/inv.err"
    release_path=$(path_of)
    best=0
    best_of=""
    i=0
    while [ $i -lt 45 ] && [ "$best" -lt 65536 ]; do
        sleep 1
        i=$((i + 1))
        for pv in $held; do
            now=$(pss_kib "${pv%%:*}")
            [ -n "$now" ] || continue
            drop=$((${pv#*:} - now))
            if [ "$drop" -gt "$best" ]; then
                best=$drop
                best_of="VMM ${pv%%:*}: PSS ${pv#*:} -> $now KiB"
            fi
        done
    done
    if [ "$best" -ge 65536 ]; then
        t idle-memory-returned PASS "$best_of after ${i} s (hold: $hold_path, release: $release_path)"
    else
        t idle-memory-returned FAIL "largest drop $best KiB ($best_of) in ${i} s; VMMs after the hold:$held; release: $release_path $(cat "$tmp/release.out")"
    fi
    ;;
*) t idle-memory-returned FAIL "hold: body '$body' ($(cat "$tmp/inv.err"); $(tail -n 5 "$tmp/serve.err"))" ;;
esac

F stats >"$SPORE_OUT/stats.txt" 2>&1 || true
st="$SPORE_OUT/stats.txt"
base_id=$(sed -n 's/^spore_base_snapshot_bytes{base="python3-256",id="\([^"]*\)"}.*/\1/p' "$st")
base_bytes=$(metric 'spore_base_snapshot_bytes{base="python3-256"' "$st")
built=$(metric 'spore_base_snapshot_uses_total{base="python3-256",id="'"$base_id"'",how="built"}' "$st")
reused=$(metric 'spore_base_snapshot_uses_total{base="python3-256",id="'"$base_id"'",how="reused"}' "$st")
d1=$(metric 'spore_function_diff_bytes{function="hello",base="python3-256",base_id="'"$base_id"'"}' "$st")
d2=$(metric 'spore_function_diff_bytes{function="hello2",base="python3-256",base_id="'"$base_id"'"}' "$st")
if [ -n "$base_id" ] && [ "$built" = 1 ] && [ "${reused:-0}" -ge 1 ] &&
    grep -q "\"id\": \"$base_id\"" "$tmp/s/bases/python3-256/base.json" 2>/dev/null; then
    t base-shared PASS "python3-256 id $base_id, $base_bytes bytes, built once, reused $reused times"
else
    t base-shared FAIL "id '$base_id' built '$built' reused '$reused': $(grep spore_base "$st" | tr '\n' ' ')"
fi
if grep -aq "reusing base snapshot python3-256 (id $base_id" "$tmp/serve.err" &&
    grep -aq "on base python3-256 (id $base_id" "$tmp/serve.err"; then
    t base-reuse-logged PASS "$(grep -a "diff of" "$tmp/serve.err" | sed 's/\x1b\[[0-9;]*m//g; s/^.*snapshot /snapshot /' | tr '\n' ';')"
else
    t base-reuse-logged FAIL "$(grep -a 'base' "$tmp/serve.err" | tail -n 4)"
fi
if [ -n "$d1" ] && [ -n "$d2" ] && [ "$d2" -lt "$base_bytes" ] && [ "$d1" -lt "$base_bytes" ] &&
    grep -q "\"base_id\": \"$base_id\"" "$tmp/s/snapshots/hello2-v1/layer.json" 2>/dev/null; then
    # What a function's init cost the guest (spore-agent's line at Ready).
    init_mem=$(find "$tmp/s" -name vmm.log -exec grep -ah "function init memory" {} \; 2>/dev/null |
        head -n 1 | sed 's/.*function init memory: //' | tr -d '\033' | sed 's/\[[0-9;]*m//g')
    t diffs-on-base PASS "hello $d1 bytes, hello2 $d2 bytes, base $base_bytes bytes; init: $init_mem"
else
    t diffs-on-base FAIL "hello '$d1' hello2 '$d2' base '$base_bytes': $(grep spore_function_diff "$st" | tr '\n' ' ')"
fi
if grep -q 'spore_base_snapshot_bytes{base="provided-256"' "$st"; then
    t provided-base PASS "$(grep 'spore_function_diff_bytes{function="shell"' "$st")"
else
    t provided-base FAIL "$(grep spore_ "$st" | tr '\n' ' ')"
fi
ls -ls "$tmp/s/bases" "$tmp/s/bases/"* "$tmp/s/snapshots/"* >"$SPORE_OUT/layers.txt" 2>&1 || true
cp "$tmp/serve.err" "$SPORE_OUT/serve.err" 2>/dev/null || true
kill "$serve" 2>/dev/null
wait "$serve" 2>/dev/null

# The restarted daemon: no zygotes, no warm instances: every start restores
# the chain base + diff.
"$SPORE" serve --listen "$ep" --state-dir "$tmp/s" --image-cache /cache --ready-timeout-s 240 \
    --linux-kernel "$GUEST_KERNEL" --no-clones --keep-alive-ms 0 --no-cpu-cap >"$tmp/serve2.out" 2>"$tmp/serve2.err" &
serve=$!
i=0
until grep -q listen "$tmp/serve2.out" 2>/dev/null || [ $i -ge 100 ]; do sleep 0.1; i=$((i + 1)); done
if grep -q listen "$tmp/serve2.out"; then t serve-restarted PASS; else t serve-restarted FAIL "$(tail -n 5 "$tmp/serve2.err")"; fi
rands=""
for k in 1 2; do
    body=$(F invoke hello "{\"n\": 4$k}" 2>"$tmp/inv.err")
    path=$(path_of)
    case "$path:$body" in
    restore*'"n": 4'$k*'"function": "hello"'*)
        ws=no
        [ -f "$tmp/s/snapshots/hello-v1/vm.state.ws" ] && ws=yes
        t "chain-restore-$k" PASS "$path, working set recorded before: $ws"
        rands="$rands $(rand_of "$body")"
        ;;
    *) t "chain-restore-$k" FAIL "$path: body '$body' ($(cat "$tmp/inv.err"); $(tail -n 5 "$tmp/serve2.err"))" ;;
    esac
done
set -- $rands
if [ $# = 2 ] && [ -n "$1" ] && [ "$1" != "$2" ]; then
    t restored-instances-reseeded PASS "$1 $2"
else
    t restored-instances-reseeded FAIL "os.urandom of two restores: '$rands'"
fi
deploy hello3 python3 hello.handler /fns/hello.zip
body=$(F invoke hello3 '{"n": 6}' 2>"$tmp/inv.err")
F stats >"$SPORE_OUT/stats2.txt" 2>&1 || true
reused2=$(metric 'spore_base_snapshot_uses_total{base="python3-256",id="'"$base_id"'",how="reused"}' "$SPORE_OUT/stats2.txt")
case "$body" in
*'"n": 6'*'"function": "hello3"'*)
    if [ "${reused2:-0}" -ge 1 ] && ! grep -q 'how="built"} 1' "$SPORE_OUT/stats2.txt"; then
        t base-reused-after-restart PASS "$(path_of); $(metric 'spore_function_diff_bytes{function="hello3"' "$SPORE_OUT/stats2.txt") bytes of diff"
    else
        t base-reused-after-restart FAIL "$(grep spore_base "$SPORE_OUT/stats2.txt" | tr '\n' ' ')"
    fi
    ;;
*) t base-reused-after-restart FAIL "body '$body' ($(cat "$tmp/inv.err"); $(tail -n 5 "$tmp/serve2.err"))" ;;
esac
cp "$tmp/serve2.err" "$SPORE_OUT/serve2.err" 2>/dev/null || true
kill "$serve" 2>/dev/null
wait "$serve" 2>/dev/null
exit 0
