#!/usr/bin/env python3
"""Two accounts on one `spore serve --auth keys.toml`, driven by boto3.

Account A (key AKIDA, 111111111111: concurrency 2, 3 functions) and account B
(key AKIDB, 222222222222: memory 384M). B can neither see nor touch any of A's
functions: every operation on them answers exactly as for a function that does
not exist. Each account's limits hold: A's concurrency gives 429 at its third
concurrent invocation, A's fourth function is refused, B's memory limit ends
B's idle instances to make room and throttles when none is left.

    accounts_scenario.py --endpoint URL --echo-elf PATH
"""
import argparse
import io
import json
import sys
import threading
import urllib.request
import zipfile

import boto3
import botocore.config
import botocore.exceptions
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

A_ID, B_ID = "111111111111", "222222222222"
KEYS = {"A": ("AKIDA", "secret-a"), "B": ("AKIDB", "secret-b")}


def fail(msg):
    sys.exit(f"accounts scenario: {msg}")


def client(endpoint, who):
    key, secret = KEYS[who]
    return boto3.client(
        "lambda",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        config=botocore.config.Config(retries={"max_attempts": 1}, read_timeout=60),
    )


def error_of(call):
    """(HTTP status, error code, message) of a call that must fail."""
    try:
        call()
    except botocore.exceptions.ClientError as e:
        return (
            e.response["ResponseMetadata"]["HTTPStatusCode"],
            e.response["Error"]["Code"],
            e.response["Error"].get("Message", ""),
        )
    fail("a call that must fail succeeded")


def zip_of(elf):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.write(elf, "fn-echo")
    return buf.getvalue()


def create(lam, name, code, **extra):
    return lam.create_function(
        FunctionName=name, Runtime="spore-uk", Role="r", Handler="fn-echo", Code={"ZipFile": code}, **extra
    )


def invoke(lam, name, payload):
    r = lam.invoke(FunctionName=name, Payload=json.dumps(payload).encode())
    return json.loads(r["Payload"].read())


def b_sees_nothing_of_a(a, b, code):
    a_fn = create(a, "secret-fn", code, Environment={"Variables": {"SECRET": "a-only"}})
    if f":{A_ID}:function:secret-fn" not in a_fn["FunctionArn"]:
        fail(f"A's ARN does not carry A's account: {a_fn['FunctionArn']}")
    a.publish_version(FunctionName="secret-fn")
    a.create_alias(FunctionName="secret-fn", Name="live", FunctionVersion="1")
    a.tag_resource(Resource=a_fn["FunctionArn"], Tags={"team": "a"})
    arn = a_fn["FunctionArn"]
    if any(f["FunctionName"] == "secret-fn" for f in b.list_functions()["Functions"]):
        fail("B lists A's function")
    # Every operation B tries on A's function, by name and by A's ARN,
    # answers as for a function that does not exist at all.
    ops = {
        "get_function": lambda n: b.get_function(FunctionName=n),
        "get_function_configuration": lambda n: b.get_function_configuration(FunctionName=n),
        "invoke": lambda n: b.invoke(FunctionName=n, Payload=b"{}"),
        "invoke_alias": lambda n: b.invoke(FunctionName=n, Qualifier="live", Payload=b"{}"),
        "update_function_code": lambda n: b.update_function_code(FunctionName=n, ZipFile=code),
        "update_function_configuration": lambda n: b.update_function_configuration(FunctionName=n, Timeout=9),
        "delete_function": lambda n: b.delete_function(FunctionName=n),
        "publish_version": lambda n: b.publish_version(FunctionName=n),
        "list_versions_by_function": lambda n: b.list_versions_by_function(FunctionName=n),
        "create_alias": lambda n: b.create_alias(FunctionName=n, Name="mine", FunctionVersion="1"),
        "get_alias": lambda n: b.get_alias(FunctionName=n, Name="live"),
        "list_aliases": lambda n: b.list_aliases(FunctionName=n),
        "put_function_concurrency": lambda n: b.put_function_concurrency(
            FunctionName=n, ReservedConcurrentExecutions=1
        ),
        "create_function_url_config": lambda n: b.create_function_url_config(FunctionName=n, AuthType="NONE"),
    }
    for op, call in ops.items():
        for target, missing in (("secret-fn", "no-such-fn"), (arn, arn.replace("secret-fn", "no-such-fn"))):
            got = error_of(lambda: call(target))
            want = error_of(lambda: call(missing))
            if got[:2] != want[:2] or got[2] != want[2].replace("no-such-fn", "secret-fn"):
                fail(f"B's {op} on A's {target}: {got}, but on a missing function: {want}")
            if got[0] != 404 or got[1] != "ResourceNotFoundException":
                fail(f"B's {op} on A's {target}: {got}")
    b_arn = arn.replace(A_ID, B_ID).replace("secret-fn", "no-such-fn")
    for op, call in {
        "tag_resource": lambda r: b.tag_resource(Resource=r, Tags={"x": "y"}),
        "list_tags": lambda r: b.list_tags(Resource=r),
        "untag_resource": lambda r: b.untag_resource(Resource=r, TagKeys=["team"]),
    }.items():
        got, want = error_of(lambda: call(arn)), error_of(lambda: call(b_arn))
        if got[:2] != want[:2] or got[0] != 404:
            fail(f"B's {op} on A's ARN: {got}, on a missing one: {want}")
    # B may have a function of the same name: its own, beside A's.
    b_fn = create(b, "secret-fn", code, Environment={"Variables": {"SECRET": "b-only"}})
    if f":{B_ID}:function:secret-fn" not in b_fn["FunctionArn"]:
        fail(f"B's ARN: {b_fn['FunctionArn']}")
    # A's function is untouched by all of it.
    got = a.get_function(FunctionName="secret-fn")
    if got["Configuration"]["Environment"]["Variables"] != {"SECRET": "a-only"}:
        fail(f"A's function changed: {got['Configuration']}")
    if a.list_tags(Resource=arn)["Tags"] != {"team": "a"}:
        fail("A's tags changed")
    if invoke(a, "secret-fn", {"who": "a"})["echo"] != {"who": "a"}:
        fail("A's function does not answer A")
    b.delete_function(FunctionName="secret-fn")
    a.get_function(FunctionName="secret-fn")
    print("accounts: B sees nothing of A: passed")


def signed_get(endpoint, who, path):
    key, secret = KEYS[who]
    req = AWSRequest(method="GET", url=endpoint + path)
    SigV4Auth(Credentials(key, secret), "lambda", "us-east-1").add_auth(req)
    with urllib.request.urlopen(urllib.request.Request(req.url, headers=dict(req.headers))) as r:
        return r.read().decode()


def metrics_are_per_account(endpoint):
    a, b = signed_get(endpoint, "A", "/metrics"), signed_get(endpoint, "B", "/metrics")
    if 'function="secret-fn"' not in a:
        fail("A's metrics do not show A's function")
    if "secret-fn" in b or A_ID in b:
        fail("B's metrics show A's function")
    if "spore_memory_bytes{" in a or "spore_memory_bytes{" in b:
        fail("an account sees the host's series (the operator's only)")
    print("accounts: metrics per account: passed")


def concurrent(lam, name, n, payload):
    """Invokes `name` n times at once; the error codes (None: success)."""
    codes = [None] * n

    def one(i):
        try:
            invoke(lam, name, payload)
        except botocore.exceptions.ClientError as e:
            codes[i] = (e.response["Error"]["Code"], e.response["Error"].get("Message", ""))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return codes


def a_limits_hold(a, b, code):
    codes = concurrent(a, "secret-fn", 4, {"sleep_ms": 1500})
    throttled = [c for c in codes if c is not None]
    if not throttled or any(c[0] != "TooManyRequestsException" for c in throttled):
        fail(f"A's concurrency limit of 2: four at once answered {codes}")
    if len(throttled) > 2:
        fail(f"A's concurrency limit of 2: only {4 - len(throttled)} of 4 ran: {codes}")
    create(a, "a-two", code)
    create(a, "a-three", code)
    got = error_of(lambda: create(a, "a-four", code))
    if got[1] != "ServiceQuotaExceededException":
        fail(f"A's fourth function: {got}")
    settings = a.get_account_settings()
    if settings["AccountUsage"]["FunctionCount"] != 3 or settings["AccountLimit"]["ConcurrentExecutions"] != 2:
        fail(f"A's account settings: {settings}")
    if b.get_account_settings()["AccountUsage"]["FunctionCount"] != 0:
        fail(f"B's account settings count A's functions: {b.get_account_settings()}")
    print(f"accounts: A's limits hold ({len(throttled)} of 4 throttled, 4th function refused): passed")


def b_memory_limit_holds(b, code):
    # 384 MiB: three 128 MiB VMs of B at once (a zygote and two clones, or
    # three instances), whatever the start path.
    create(b, "m1", code, MemorySize=128)
    create(b, "m2", code, MemorySize=128)
    codes = concurrent(b, "m1", 4, {"sleep_ms": 1500})
    throttled = [c for c in codes if c is not None]
    if not throttled or any("AccountMemoryLimitExceeded" not in c[1] for c in throttled):
        fail(f"B's memory limit: four 128 MiB instances at once answered {codes}")
    # m1's idle instances are ended to make room for m2.
    if invoke(b, "m2", {"n": 2})["echo"] != {"n": 2}:
        fail("B's m2 did not start in room made by ending m1's idle instances")
    print(f"accounts: B's memory limit holds ({len(throttled)} of 4 throttled, idle ended for room): passed")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--endpoint", required=True)
    p.add_argument("--echo-elf", required=True)
    args = p.parse_args()
    code = zip_of(args.echo_elf)
    a, b = client(args.endpoint, "A"), client(args.endpoint, "B")
    b_sees_nothing_of_a(a, b, code)
    metrics_are_per_account(args.endpoint)
    a_limits_hold(a, b, code)
    b_memory_limit_holds(b, code)
    print("accounts scenario: passed")


if __name__ == "__main__":
    main()
