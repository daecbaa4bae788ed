#!/usr/bin/env bash
# Host driver of the sandbox-envd nested scenario (run.sh --host-driver): runs
# the envd scenarios of tests/sandbox/ with the pinned e2b SDK on this host,
# against spore-envd in L1's sandbox guest (L1's port 49983, forwarded to
# 127.0.0.1:$SPORE_FWD_49983), and sends one SPORE-TEST line per scenario to
# the L1 scenario on its port 7000. Then the lifecycle: before the pause
# (envd_lifecycle.py prepare, with the results), and once L1 says READY on
# port 7001, after the resume and the fork (the forks on 49984 and 49985).
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../../.." && pwd)"
logs=/tmp/spore-nested
venv="$(bash "$repo/scripts/ensure-pyclients.sh")" || venv=""
export E2B_SANDBOX_URL="http://127.0.0.1:${SPORE_FWD_49983:?}" ENVD_TOKEN=spore-nested-envd-token \
    ENVD_HOME=/home/user PYTHONPATH="$repo/tests/sandbox" PYTHONUNBUFFERED=1 \
    ENVD_BIG_MIB=2 ENVD_REQUEST_TIMEOUT=120 \
    LIFECYCLE_STATE="$(mktemp)"
trap 'rm -f "$LIFECYCLE_STATE"' EXIT

# scenario NAME ARGS...: runs tests/sandbox/<first word of NAME>.py ARGS, adds
# its result line to $results.
results=""
scenario() {
    local name=$1 script=$2
    shift 2
    local log="$logs/sandbox-envd.$name.txt" start=$SECONDS
    if [[ -z $venv ]]; then
        results+="SPORE-TEST $name FAIL the e2b SDK could not be installed"$'\n'
        return
    fi
    if timeout 900 "$venv/bin/python" "$repo/tests/sandbox/$script.py" "$@" >"$log" 2>&1; then
        results+="SPORE-TEST $name PASS e2b SDK against envd in the guest ($((SECONDS - start)) s, $(grep -c '^ok:' "$log") checks)"$'\n'
    else
        why="$(grep -m1 '^FAIL' "$log" || grep -v '^ok:' "$log" | tail -n1)"
        # The open L2 triple-fault bug (guest/README.md) named first, where
        # run-all.sh's retry rule finds it (the line is cut at 300 bytes).
        if grep -q 'the guest reset the VM by a triple fault' "$log"; then
            why="the guest reset the VM by a triple fault: $why"
        fi
        results+="SPORE-TEST $name FAIL ${why:0:300} (log $log)"$'\n'
    fi
    cat "$log"
}

# send PORT: sends $results to the L1 scenario (listening once it is ready).
send() {
    printf '%s' "$results"
    python3 - "$1" "$results" <<'PY'
import socket, sys, time
port, text = int(sys.argv[1]), sys.argv[2]
for _ in range(120):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(text.encode())
        sys.exit(0)
    except OSError:
        time.sleep(1)
sys.exit(f"could not reach the L1 scenario's port {port}")
PY
    results=""
}

# wait_ready NAME: until L1 answers READY on its port 7001 (at most 900 s).
# wait_ready NAME: until L1 says READY on 7001; what follows READY on its
# line (the sandbox API's turns: the address a networked sandbox can reach
# in L1) becomes $SANDBOX_NET_PROBE.
wait_ready() {
    local said
    said="$(python3 - "${SPORE_FWD_7001:?}" <<'PY'
import socket, sys, time
port = int(sys.argv[1])
deadline = time.time() + 900
while time.time() < deadline:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            line = s.recv(128)
            if line.startswith(b"READY"):
                print(line.decode(errors="replace").strip())
                sys.exit(0)
    except OSError:
        pass
    time.sleep(1)
sys.exit(1)
PY
)" || results+="SPORE-TEST $1-ready FAIL L1 never said READY"$'\n'
    export SANDBOX_NET_PROBE="${said#READY}"
    SANDBOX_NET_PROBE="${SANDBOX_NET_PROBE# }"
}

scenario envd_process envd_process
scenario envd_files envd_files
scenario lifecycle-prepare envd_lifecycle prepare
send "${SPORE_FWD_7000:?}"

# L1 pauses, resumes and forks the sandbox, then answers READY on 7001.
wait_ready lifecycle
scenario lifecycle-after-resume-and-fork envd_lifecycle check \
    "http://127.0.0.1:${SPORE_FWD_49984:?}" "http://127.0.0.1:${SPORE_FWD_49985:?}"
send "$SPORE_FWD_7000"

# The sandbox API (spore serve in L1, on its port 3000): the SDK as an agent
# uses it, then a paused sandbox across a SIGKILL and restart of the daemon.
# The keys L1's keys.toml gives accounts 111111111111 and 222222222222.
export E2B_API_URL="http://127.0.0.1:${SPORE_FWD_3000:?}" E2B_SANDBOX_URL="http://127.0.0.1:$SPORE_FWD_3000" \
    E2B_API_KEY=e2b_0000000000000000000000000000000000000a11 \
    SANDBOX_OTHER_API_KEY=e2b_0000000000000000000000000000000000000b22 \
    SANDBOX_TEMPLATE=base SANDBOX_WEB_TEMPLATE=web SANDBOX_PERSIST_STATE="$(mktemp)"
trap 'rm -f "$LIFECYCLE_STATE" "$SANDBOX_PERSIST_STATE" "$SANDBOX_PERSIST_STATE.template"' EXIT
wait_ready sandbox-api
scenario sandbox-api sandbox_api
scenario sandbox-persist-prepare sandbox_api persist-prepare
send "$SPORE_FWD_7000"
wait_ready sandbox-persist
scenario sandbox-persist-after-restart sandbox_api persist-check
export SANDBOX_ZYGOTE_IDLE_S=20 # the second daemon's --sandbox-zygote-idle
scenario sandbox-zygote-idle sandbox_api zygote-idle
send "$SPORE_FWD_7000"
