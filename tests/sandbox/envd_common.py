"""Shared by the envd scenarios: the e2b SDK's own Sandbox, pointed at an envd.

The harness (crates/spore-envd/tests/envd_sdk.rs) starts spore-envd on the host
and runs each scenario with E2B_SANDBOX_URL (envd's address), ENVD_TOKEN (its
access token) and ENVD_HOME (the directory its users' homes are, and every
command's working directory). The Sandbox object is built the way the SDK
builds one after the control API created it; everything after that is the
SDK's unmodified envd client code.
"""
import os
import sys

from packaging.version import Version

from e2b import ConnectionConfig, Sandbox

# The envd version spore-envd reports (crates/spore-envd/src/state.rs).
ENVD_VERSION = "0.5.7"


def sandbox(token=None):
    """A Sandbox on the envd under test; `token` overrides ENVD_TOKEN."""
    token = os.environ["ENVD_TOKEN"] if token is None else token
    # As Sandbox.create/connect build it: the access token and the sandbox's
    # id and port travel as extra headers on every envd request.
    config = ConnectionConfig(
        sandbox_url=os.environ["E2B_SANDBOX_URL"],
        api_key="e2b_" + "0" * 40,
        request_timeout=30,
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
