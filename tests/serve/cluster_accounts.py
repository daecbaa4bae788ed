#!/usr/bin/env python3
"""Creates spore-uk functions with boto3 under one access key (its account).

    cluster_accounts.py --endpoint http://H:P --echo-elf fn-echo \
        --key-id ID --secret SECRET --account 111111111111 NAME...

Used by the cluster's account-concurrency test, whose daemons run with
--auth: every request must be signed as a real client signs it.
"""
import argparse
import io
import sys
import zipfile

import boto3
import botocore.config


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--echo-elf", required=True)
    ap.add_argument("--key-id", required=True)
    ap.add_argument("--secret", required=True)
    ap.add_argument("--account", required=True)
    ap.add_argument("names", nargs="+")
    a = ap.parse_args()
    client = boto3.client(
        "lambda",
        endpoint_url=a.endpoint,
        region_name="us-east-1",
        aws_access_key_id=a.key_id,
        aws_secret_access_key=a.secret,
        config=botocore.config.Config(retries={"max_attempts": 1}),
    )
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.write(a.echo_elf, "fn-echo")
    for name in a.names:
        f = client.create_function(
            FunctionName=name,
            Runtime="spore-uk",
            Handler="fn-echo",
            Role=f"arn:aws:iam::{a.account}:role/x",
            Code={"ZipFile": buf.getvalue()},
            MemorySize=128,
        )
        if f":{a.account}:function:{name}" not in f["FunctionArn"]:
            print(f"unexpected ARN {f['FunctionArn']}", file=sys.stderr)
            sys.exit(1)
    print("created", " ".join(a.names))


if __name__ == "__main__":
    main()
