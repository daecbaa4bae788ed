#!/usr/bin/env bash
# Host driver of the sandbox-envd nested scenario (run.sh --host-driver): runs
# the envd scenarios of tests/sandbox/ with the pinned e2b SDK on this host,
# against spore-envd in L1's sandbox guest (L1's port 49983, forwarded to
# 127.0.0.1:$SPORE_FWD_49983), and sends one SPORE-TEST line per scenario to
# the L1 scenario on its port 7000 ($SPORE_FWD_7000).
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../../.." && pwd)"
venv="$(bash "$repo/scripts/ensure-pyclients.sh")" || venv=""
results=""
for s in envd_process envd_files; do
    if [[ -z $venv ]]; then
        results+="SPORE-TEST $s FAIL the e2b SDK could not be installed"$'\n'
        continue
    fi
    start=$SECONDS
    if E2B_SANDBOX_URL="http://127.0.0.1:${SPORE_FWD_49983:?}" ENVD_TOKEN=spore-nested-envd-token \
        ENVD_HOME=/home/user ENVD_IN_GUEST=1 PYTHONPATH="$repo/tests/sandbox" PYTHONUNBUFFERED=1 \
        timeout 900 "$venv/bin/python" "$repo/tests/sandbox/$s.py" >"/tmp/spore-nested/sandbox-envd.$s.txt" 2>&1; then
        results+="SPORE-TEST $s PASS e2b SDK against envd in the guest ($((SECONDS - start)) s)"$'\n'
    else
        results+="SPORE-TEST $s FAIL $(grep -m1 -E 'FAIL|Error|Exception' "/tmp/spore-nested/sandbox-envd.$s.txt" | cut -c1-200) (log /tmp/spore-nested/sandbox-envd.$s.txt)"$'\n'
    fi
    cat "/tmp/spore-nested/sandbox-envd.$s.txt"
done
printf '%s' "$results"
# The L1 scenario listens on 7000 once it said SPORE-HOST-GO: retry briefly.
python3 - "${SPORE_FWD_7000:?}" "$results" <<'PY'
import socket, sys, time
port, text = int(sys.argv[1]), sys.argv[2]
for _ in range(60):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(text.encode())
        sys.exit(0)
    except OSError:
        time.sleep(1)
sys.exit("could not reach the L1 scenario's port 7000")
PY
