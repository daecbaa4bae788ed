#!/usr/bin/env python3
"""boto3 against a spore serve cluster: one client per node.

    cluster_scenario.py --endpoints http://H1:P,http://H2:P,http://H3:P --echo-elf fn-echo
        [--invokes 1000]

Creates a spore-uk function through the first node, lists and gets it through
every other node (within 1 s), invokes it N times round-robin through all the
nodes checking every response, and prints JSON: the nodes that ran the
invocations (the `x-spore-node` response header), how many each. Exits
non-zero with a message on the first failure.
"""
import argparse
import collections
import io
import json
import sys
import time
import zipfile

import boto3
import botocore.config


def check(cond, what):
    if not cond:
        print(f"cluster scenario: FAILED: {what}", file=sys.stderr)
        sys.exit(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--endpoints", required=True)
    ap.add_argument("--echo-elf", required=True)
    ap.add_argument("--invokes", type=int, default=1000)
    ap.add_argument("--name", default="clustered")
    a = ap.parse_args()
    cfg = botocore.config.Config(retries={"max_attempts": 1}, read_timeout=60)
    clients = [
        boto3.client(
            "lambda",
            endpoint_url=e,
            region_name="us-east-1",
            aws_access_key_id="AKIDSPORETEST",
            aws_secret_access_key="spore-test-secret",
            config=cfg,
        )
        for e in a.endpoints.split(",")
    ]
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.write(a.echo_elf, "fn-echo")
    clients[0].create_function(
        FunctionName=a.name,
        Runtime="spore-uk",
        Handler="fn-echo",
        Role="arn:aws:iam::000000000000:role/x",
        Code={"ZipFile": buf.getvalue()},
        MemorySize=128,
        Environment={"Variables": {"STAGE": "one"}},
    )
    for i, c in enumerate(clients[1:], start=2):
        deadline = time.monotonic() + 1.0
        while True:
            names = [f["FunctionName"] for f in c.list_functions()["Functions"]]
            if a.name in names:
                break
            check(time.monotonic() < deadline, f"node {i} lists the function within 1 s")
            time.sleep(0.01)
        got = c.get_function(FunctionName=a.name)["Configuration"]
        check(got["Environment"]["Variables"]["STAGE"] == "one", f"node {i} has its configuration")
    ran = collections.Counter()
    for n in range(a.invokes):
        c = clients[n % len(clients)]
        r = c.invoke(FunctionName=a.name, Payload=json.dumps({"n": n}).encode())
        body = json.loads(r["Payload"].read())
        check(r["StatusCode"] == 200 and "FunctionError" not in r, f"invoke {n}: {r}")
        check(body.get("echo", {}).get("n") == n, f"invoke {n} answered {body}")
        ran[r["ResponseMetadata"]["HTTPHeaders"].get("x-spore-node", "?")] += 1
    print(json.dumps({"invokes": a.invokes, "ran_on": dict(ran)}))


if __name__ == "__main__":
    main()
