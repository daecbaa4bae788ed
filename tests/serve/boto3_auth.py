#!/usr/bin/env python3
"""SigV4 against `spore serve --auth keys.toml`: boto3 signing with a configured
key is served; a wrong secret or an unknown key is refused with 403 and the
right exception.

    boto3_auth.py --endpoint URL --echo-elf PATH --key AKID --secret SECRET
"""
import argparse
import io
import json
import sys
import zipfile

import boto3
import botocore.config
import botocore.exceptions


def client(endpoint, key, secret):
    return boto3.client(
        "lambda",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        config=botocore.config.Config(retries={"max_attempts": 1}),
    )


def refused(lam, code):
    try:
        lam.list_functions()
    except botocore.exceptions.ClientError as e:
        got = e.response["Error"]["Code"]
        status = e.response["ResponseMetadata"]["HTTPStatusCode"]
        if got != code or status != 403:
            sys.exit(f"boto3 auth: expected 403 {code}, got {status} {got}")
        return
    sys.exit(f"boto3 auth: a request signed wrongly was served (expected {code})")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--endpoint", required=True)
    p.add_argument("--echo-elf", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--secret", required=True)
    a = p.parse_args()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.write(a.echo_elf, "fn-echo")
    good = client(a.endpoint, a.key, a.secret)
    good.create_function(
        FunctionName="signed", Runtime="spore-uk", Role="r", Handler="fn-echo", Code={"ZipFile": buf.getvalue()}
    )
    out = json.loads(good.invoke(FunctionName="signed", Payload=b'{"signed":true}')["Payload"].read())
    if out["echo"] != {"signed": True}:
        sys.exit(f"boto3 auth: signed invoke answered {out}")
    refused(client(a.endpoint, a.key, a.secret + "x"), "InvalidSignatureException")
    refused(client(a.endpoint, "AKIDUNKNOWN", a.secret), "UnrecognizedClientException")
    print("boto3 auth: passed")


if __name__ == "__main__":
    main()
