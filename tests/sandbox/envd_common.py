"""Shared by the envd scenarios: the e2b SDK's own Sandbox, pointed at an envd.

The scenarios look at the sandbox only through the SDK (never at this host's
files): the same scenarios run against spore-envd on this host and against
spore-envd in a Linux guest (tests/nested/host/sandbox-envd.sh).

The harness (crates/spore-envd/tests/envd_sdk.rs) starts spore-envd on the host
and runs each scenario with E2B_SANDBOX_URL (envd's address), ENVD_TOKEN (its
access token) and ENVD_HOME (the directory its users' homes are, and every
command's working directory). The Sandbox object is built the way the SDK
builds one after the control API created it; everything after that is the
SDK's unmodified envd client code.
"""
import os
import shlex
import sys

from packaging.version import Version

from e2b import ConnectionConfig, Sandbox

# The envd version spore-envd reports (crates/spore-envd/src/state.rs).
ENVD_VERSION = "0.5.7"


def sandbox(token=None, url=None):
    """A Sandbox on the envd under test; `token` overrides ENVD_TOKEN, `url`
    E2B_SANDBOX_URL."""
    token = os.environ["ENVD_TOKEN"] if token is None else token
    # As Sandbox.create/connect build it: the access token and the sandbox's
    # id and port travel as extra headers on every envd request.
    config = ConnectionConfig(
        sandbox_url=url or os.environ["E2B_SANDBOX_URL"],
        api_key="e2b_" + "0" * 40,
        request_timeout=float(os.environ.get("ENVD_REQUEST_TIMEOUT", "30")),
        extra_sandbox_headers={
            "X-Access-Token": token,
            "E2b-Sandbox-Id": "envd-test",
            "E2b-Sandbox-Port": str(ConnectionConfig.envd_port),
        },
    )
    return Sandbox(
        sandbox_id="envd-test",
        sandbox_domain=None,
        envd_version=Version(ENVD_VERSION),
        envd_access_token=token,
        connection_config=config,
    )


def home():
    return os.environ["ENVD_HOME"]


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what}")


def sh(sbx, command, user=None):
    """The stdout of a shell command run in the sandbox (through the SDK)."""
    return sbx.commands.run(command, user=user, cwd="/").stdout


def q(path):
    return shlex.quote(path)


def exists(sbx, path):
    return sh(sbx, f"test -e {q(path)} || test -L {q(path)}; echo $?") == "0\n"


def isfile(sbx, path):
    return sh(sbx, f"test -f {q(path)}; echo $?") == "0\n"


def isdir(sbx, path):
    return sh(sbx, f"test -d {q(path)}; echo $?") == "0\n"


def listdir(sbx, path):
    return sorted(sh(sbx, f"ls -A {q(path)}").split("\n")[:-1])


def envd_is_root(sbx):
    """Whether envd may act as other users (it runs as root)."""
    try:
        return sh(sbx, "id -u", user="root") == "0\n"
    except Exception:  # a non-root envd refuses another user
        return False
