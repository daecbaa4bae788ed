"""Versions and aliases through the clients a Lambda pipeline uses: the AWS CLI
publishes two versions, creates an alias with 10 % on the newer one and shifts
it; boto3 invokes through the alias 1,000 times and counts where each went.
Run by crates/spore/tests/kvm/kvm_serve_versions.rs with the cached virtualenv.
"""
import argparse
import io
import json
import os
import subprocess
import sys
import zipfile

import boto3
import botocore.config

ENV = dict(os.environ, AWS_ACCESS_KEY_ID="AKIDSPORETEST", AWS_SECRET_ACCESS_KEY="spore-test-secret",
           AWS_CONFIG_FILE="/dev/null", AWS_SHARED_CREDENTIALS_FILE="/dev/null")


def check(cond, what):
    if not cond:
        print(f"FAILED: {what}", file=sys.stderr)
        sys.exit(1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--endpoint", required=True)
    p.add_argument("--aws", required=True)
    p.add_argument("--echo-elf", required=True)
    a = p.parse_args()

    def aws(*args):
        out = subprocess.run([a.aws, "lambda", *args, "--endpoint-url", a.endpoint, "--region", "us-east-1"],
                             env=ENV, capture_output=True, text=True)
        check(out.returncode == 0, f"aws lambda {' '.join(args)}: {out.stderr}")
        return json.loads(out.stdout) if out.stdout.strip() else {}

    lam = boto3.client("lambda", endpoint_url=a.endpoint, region_name="us-east-1",
                       aws_access_key_id="AKIDSPORETEST", aws_secret_access_key="spore-test-secret",
                       config=botocore.config.Config(retries={"max_attempts": 1}))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.write(a.echo_elf, "fn-echo")
    lam.create_function(FunctionName="ver", Runtime="spore-uk", Role="arn:aws:iam::000000000000:role/x",
                        Handler="fn-echo", Code={"ZipFile": buf.getvalue()}, MemorySize=128,
                        Environment={"Variables": {"STAGE": "one"}})

    v1 = aws("publish-version", "--function-name", "ver", "--description", "first")
    check(v1["Version"] == "1" and v1["Description"] == "first", f"publish-version: {v1}")
    aws("update-function-configuration", "--function-name", "ver", "--environment", "Variables={STAGE=two}")
    v2 = aws("publish-version", "--function-name", "ver")
    check(v2["Version"] == "2", f"second publish-version: {v2}")
    versions = [v["Version"] for v in aws("list-versions-by-function", "--function-name", "ver")["Versions"]]
    check(versions == ["$LATEST", "1", "2"], f"list-versions-by-function: {versions}")

    alias = aws("create-alias", "--function-name", "ver", "--name", "live", "--function-version", "1",
                "--routing-config", '{"AdditionalVersionWeights": {"2": 0.1}}')
    check(alias["RoutingConfig"]["AdditionalVersionWeights"] == {"2": 0.1}, f"create-alias: {alias}")

    counts = {}
    for _ in range(1000):
        r = lam.invoke(FunctionName="ver", Qualifier="live", Payload=b'{"env":"STAGE"}')
        stage = json.loads(r["Payload"].read())["value"]
        check({"1": "one", "2": "two"}[r["ExecutedVersion"]] == stage, f"version {r['ExecutedVersion']} ran {stage}")
        counts[r["ExecutedVersion"]] = counts.get(r["ExecutedVersion"], 0) + 1
    on_new = counts.get("2", 0)
    # 10 % of 1,000 within 5 points (the binomial's standard deviation is 9.5).
    check(50 <= on_new <= 150, f"1,000 invokes through the alias: {counts}")

    aws("update-alias", "--function-name", "ver", "--name", "live", "--function-version", "2",
        "--routing-config", '{"AdditionalVersionWeights": {}}')
    got = aws("get-alias", "--function-name", "ver", "--name", "live")
    check(got["FunctionVersion"] == "2" and "RoutingConfig" not in got, f"get-alias after the shift: {got}")
    for _ in range(50):
        r = lam.invoke(FunctionName="ver:live", Payload=b"{}")
        check(r["ExecutedVersion"] == "2", f"after the shift: {r['ExecutedVersion']}")
    out = subprocess.run([a.aws, "lambda", "invoke", "--endpoint-url", a.endpoint, "--region", "us-east-1",
                          "--function-name", "ver", "--qualifier", "1", "--payload", '{"env":"STAGE"}',
                          "/dev/stdout"], env=ENV, capture_output=True, text=True)
    check(out.returncode == 0 and '"one"' in out.stdout, f"aws lambda invoke --qualifier 1: {out.stdout}{out.stderr}")
    aliases = aws("list-aliases", "--function-name", "ver")["Aliases"]
    check([x["Name"] for x in aliases] == ["live"], f"list-aliases: {aliases}")
    aws("delete-alias", "--function-name", "ver", "--name", "live")
    aws("delete-function", "--function-name", "ver", "--qualifier", "1")
    versions = [v["Version"] for v in aws("list-versions-by-function", "--function-name", "ver")["Versions"]]
    check(versions == ["$LATEST", "2"], f"after delete-function --qualifier 1: {versions}")
    aws("delete-function", "--function-name", "ver")
    print(f"versions scenario: passed (alias split {counts})")


if __name__ == "__main__":
    main()
