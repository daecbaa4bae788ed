#!/usr/bin/env bash
# Makes (once) a Python virtualenv with the exact client versions of
# tests/serve/requirements.txt (boto3, botocore, the AWS CLI v1) from PyPI, under
# ${SPORE_CACHE:-/var/cache/spore}/pyclients-<hash of the pins and the Python>,
# and prints its path. Safe to rerun and to run concurrently: the venv is built
# under a lock at its final path (virtualenvs cannot move) and marked complete
# last, so a half-built one is never used.
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
reqs="$repo/tests/serve/requirements.txt"
cache="${SPORE_CACHE:-/var/cache/spore}"
python="${PYTHON:-python3}"
command -v "$python" >/dev/null || { echo "ensure-pyclients: $python not found" >&2; exit 1; }

key="$( { cat "$reqs"; "$python" -c 'import sys; print(sys.version)'; } | sha256sum | cut -c1-16)"
venv="$cache/pyclients-$key"
if [[ -f $venv/.complete ]]; then
    echo "$venv"
    exit 0
fi
mkdir -p "$cache"
exec 9>"$venv.lock"
flock 9
if [[ ! -f $venv/.complete ]]; then
    rm -rf "$venv"
    echo "ensure-pyclients: building $venv" >&2
    "$python" -m venv "$venv" >&2
    "$venv/bin/pip" install -q --disable-pip-version-check --no-input -r "$reqs" >&2
    touch "$venv/.complete"
fi
echo "$venv"
