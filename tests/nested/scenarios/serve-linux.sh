#!/bin/sh
# Tier 3, issue 17 (first part): `spore serve` runs Linux functions. The
# guest kernel ($GUEST_KERNEL) boots a runtime image (python3, provided:
# copied from the host's `spore image build` cache into /cache) with
# spore-agent as PID 1 and the function's code disk as a second drive.
# Through the Lambda API (`spore fn`): a pure-stdlib Python function and a
# `provided` function (a shell bootstrap on busybox wget) are deployed and
# invoked three times each (a cold start, then clones or warm instances);
# a Python function whose import fails answers with Runtime.ImportModuleError
# (a function error, `spore fn invoke` exits 1); a zip without the handler's
# module is refused at deploy time. The zips come from the host (/fns).
. "${SPORE_ROOT:-}/lib/spore/scenario-lib.sh"
tmp=${SPORE_TMP:-/tmp}
cd "$tmp" || exit 1
ep=127.0.0.1:9000
F() { "$SPORE" fn --endpoint "$ep" "$@"; }

"$SPORE" serve --listen "$ep" --state-dir "$tmp/s" --image-cache /cache --ready-timeout-s 240 \
    --linux-kernel "$GUEST_KERNEL" --keep-alive-ms 600000 >"$tmp/serve.out" 2>"$tmp/serve.err" &
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

if F deploy nomodule --runtime python3 --handler missing.handler --zip /fns/hello.zip >"$tmp/nomod.out" 2>&1; then
    t deploy-refuses-missing-module FAIL "deployed"
elif grep -q "InvalidParameterValueException\|names the module 'missing'" "$tmp/nomod.out"; then
    t deploy-refuses-missing-module PASS
else
    t deploy-refuses-missing-module FAIL "$(cat "$tmp/nomod.out")"
fi

F stats >"$SPORE_OUT/stats.txt" 2>&1 || true
cp "$tmp/serve.err" "$SPORE_OUT/serve.err" 2>/dev/null || true
kill "$serve" 2>/dev/null
wait "$serve" 2>/dev/null
exit 0
