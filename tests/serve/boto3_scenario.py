#!/usr/bin/env python3
"""boto3 against `spore serve`, as a Lambda user would drive it.

    boto3_scenario.py --endpoint http://127.0.0.1:PORT --echo-elf fn-echo --upper-elf fn-upper

Creates a spore-uk function from a zip, invokes it 100 times with distinct
payloads checking every response, lists and gets it, tags it, updates its
configuration and its code (the next invoke runs the new code), deletes it (the
next invoke raises ResourceNotFoundException), and checks that bad input raises
the right exception classes. Leaves a function named `cli-echo`, tagged
`made-by: boto3`, for the AWS CLI part. Exits non-zero with a message on the
first failure. `boto3_coverage.py` runs it to see which operations it calls.
"""
import argparse
import base64
import io
import json
import time
import sys
import zipfile

import boto3
import botocore.config
import botocore.exceptions


def zip_of(path, name):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.write(path, name)
    return buf.getvalue()


def check(cond, what):
    if not cond:
        print(f"boto3 scenario: FAILED: {what}", file=sys.stderr)
        sys.exit(1)


def expect_error(kind, call, **kwargs):
    try:
        call(**kwargs)
    except botocore.exceptions.ClientError as e:
        got = e.response["Error"]["Code"]
        check(got == kind, f"{call.__name__}: expected {kind}, got {got}: {e}")
        return
    check(False, f"{call.__name__}({list(kwargs)}) should have raised {kind}")


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--endpoint", required=True)
    p.add_argument("--echo-elf", required=True)
    p.add_argument("--upper-elf", required=True)
    a = p.parse_args(argv)

    cfg = botocore.config.Config(retries={"max_attempts": 1}, read_timeout=120)
    lam = boto3.client(
        "lambda",
        endpoint_url=a.endpoint,
        region_name="us-east-1",
        aws_access_key_id="AKIDSPORETEST",
        aws_secret_access_key="spore-test-secret",
        config=cfg,
    )
    echo_zip = zip_of(a.echo_elf, "fn-echo")
    role = "arn:aws:iam::000000000000:role/spore-test"

    conf = lam.create_function(
        FunctionName="b3-echo",
        Runtime="spore-uk",
        Role=role,
        Handler="fn-echo",
        Code={"ZipFile": echo_zip},
        MemorySize=128,
        Timeout=5,
        Environment={"Variables": {"STAGE": "one"}},
        Tags={"team": "spore", "stage": "one"},
    )
    check(conf["FunctionName"] == "b3-echo", f"create answered {conf}")
    check(conf["State"] == "Active", "function active")

    for i in range(100):
        payload = {"n": i, "text": f"payload-{i}-" + "x" * (i % 7)}
        r = lam.invoke(FunctionName="b3-echo", Payload=json.dumps(payload).encode())
        check(r["StatusCode"] == 200, f"invoke {i} status {r['StatusCode']}")
        check("FunctionError" not in r, f"invoke {i} function error")
        body = json.loads(r["Payload"].read())
        check(body["echo"] == payload, f"invoke {i}: got {body}")

    names = [f["FunctionName"] for f in lam.list_functions()["Functions"]]
    check("b3-echo" in names, f"list_functions: {names}")
    got = lam.get_function(FunctionName="b3-echo")
    check(got["Configuration"]["Handler"] == "fn-echo", f"get_function: {got['Configuration']}")
    c = lam.get_function_configuration(FunctionName="b3-echo")
    check(c["FunctionArn"] == conf["FunctionArn"] and c["Timeout"] == 5, f"get_function_configuration: {c}")

    # Tags: given at creation, then added, replaced and removed by the function's ARN.
    arn = conf["FunctionArn"]
    check(got.get("Tags") == {"team": "spore", "stage": "one"}, f"get_function Tags: {got.get('Tags')}")
    lam.tag_resource(Resource=arn, Tags={"stage": "two", "cost-center": "42", "ключ": "значение"})
    lam.untag_resource(Resource=arn, TagKeys=["team", "not-there"])
    tags = lam.list_tags(Resource=arn)["Tags"]
    check(tags == {"stage": "two", "cost-center": "42", "ключ": "значение"}, f"list_tags: {tags}")
    too_many = {f"k{i}": "v" for i in range(48)}  # 51 with the 3 it has
    for bad in [{"aws:reserved": "x"}, {"k" * 129: "x"}, {"k": "v" * 257}, {"k": "semi;colon"}, too_many]:
        expect_error("InvalidParameterValueException", lam.tag_resource, Resource=arn, Tags=bad)
    expect_error("InvalidParameterValueException", lam.untag_resource, Resource=arn, TagKeys=["aws:x"])
    expect_error("InvalidParameterValueException", lam.list_tags, Resource="b3-echo")
    expect_error("InvalidParameterValueException", lam.list_tags, Resource=arn + ":$LATEST")
    expect_error("ResourceNotFoundException", lam.list_tags, Resource=arn.replace("000000000000", "123456789012"))
    expect_error("ResourceNotFoundException", lam.tag_resource, Resource=arn + "-none", Tags={"a": "b"})
    check(lam.list_tags(Resource=arn)["Tags"] == tags, "refused tag requests changed nothing")

    lam.update_function_configuration(FunctionName="b3-echo", Environment={"Variables": {"STAGE": "two"}})
    r = lam.invoke(FunctionName="b3-echo", Payload=b'{"env":"STAGE"}')
    check(json.loads(r["Payload"].read())["value"] == "two", "new environment after update_function_configuration")

    r = lam.invoke(FunctionName="b3-echo", Payload=b'{"fail":"on purpose"}', LogType="Tail")
    check(r.get("FunctionError") == "Unhandled", f"function error header: {r.get('FunctionError')}")
    check(json.loads(r["Payload"].read())["errorMessage"] == "on purpose", "error body")
    check("fn-echo: request" in base64.b64decode(r["LogResult"]).decode(), "log tail")

    lam.update_function_code(FunctionName="b3-echo", ZipFile=zip_of(a.upper_elf, "fn-echo"))
    for _ in range(3):
        r = lam.invoke(FunctionName="b3-echo", Payload=b'{"new":"code"}')
        out = r["Payload"].read()
        check(out == b'{"NEW":"CODE"}', f"after update_function_code got {out!r}")

    r = lam.invoke(FunctionName="b3-echo", InvocationType="Event", Payload=b"{}")
    check(r["StatusCode"] == 202, "Event invoke")
    r = lam.invoke(FunctionName="b3-echo", InvocationType="DryRun", Payload=b"{}")
    check(r["StatusCode"] == 204, "DryRun invoke")

    lam.put_function_concurrency(FunctionName="b3-echo", ReservedConcurrentExecutions=3)
    check(lam.get_function(FunctionName="b3-echo")["Concurrency"]["ReservedConcurrentExecutions"] == 3, "concurrency")
    r = lam.get_function_concurrency(FunctionName="b3-echo")
    check(r.get("ReservedConcurrentExecutions") == 3, f"get_function_concurrency: {r}")
    lam.delete_function_concurrency(FunctionName="b3-echo")

    # Provisioned concurrency (HyperFork's throughput mode): fresh clones kept
    # ready, on a published version (Lambda refuses $LATEST).
    pv = lam.publish_version(FunctionName="b3-echo")["Version"]
    expect_error("InvalidParameterValueException", lam.put_provisioned_concurrency_config,
                 FunctionName="b3-echo", Qualifier="$LATEST", ProvisionedConcurrentExecutions=2)
    expect_error("ProvisionedConcurrencyConfigNotFoundException", lam.get_provisioned_concurrency_config,
                 FunctionName="b3-echo", Qualifier=pv)
    r = lam.put_provisioned_concurrency_config(FunctionName="b3-echo", Qualifier=pv,
                                               ProvisionedConcurrentExecutions=2)
    check(r["RequestedProvisionedConcurrentExecutions"] == 2, "provisioned concurrency requested")
    deadline = time.time() + 20
    while lam.get_provisioned_concurrency_config(FunctionName="b3-echo", Qualifier=pv)["Status"] != "READY":
        check(time.time() < deadline, "provisioned concurrency READY")
        time.sleep(0.1)
    r = lam.invoke(FunctionName="b3-echo", Qualifier=pv, Payload=b'{"p":1}')
    check(r["Payload"].read() == b'{"P":1}', "provisioned invoke (the fn-upper code)")
    configs = lam.list_provisioned_concurrency_configs(FunctionName="b3-echo")["ProvisionedConcurrencyConfigs"]
    check(len(configs) == 1 and configs[0]["RequestedProvisionedConcurrentExecutions"] == 2, "list provisioned")
    check(configs[0]["FunctionArn"].endswith(f":b3-echo:{pv}"), f"provisioned config ARN: {configs[0]}")
    lam.delete_provisioned_concurrency_config(FunctionName="b3-echo", Qualifier=pv)

    # Asynchronous invocation: retries, age and destinations (a function).
    lam.create_function(FunctionName="b3-sink", Runtime="spore-uk", Role=role, Handler="fn-echo",
                        Code={"ZipFile": echo_zip}, Environment={"Variables": {"ECHO_SINK": "1"}})
    sink_arn = lam.get_function(FunctionName="b3-sink")["Configuration"]["FunctionArn"]
    expect_error("ResourceNotFoundException", lam.get_function_event_invoke_config, FunctionName="b3-echo")
    r = lam.put_function_event_invoke_config(
        FunctionName="b3-echo", MaximumRetryAttempts=1, MaximumEventAgeInSeconds=3600,
        DestinationConfig={"OnFailure": {"Destination": sink_arn}})
    check(r["MaximumRetryAttempts"] == 1 and r["MaximumEventAgeInSeconds"] == 3600, f"put event invoke config: {r}")
    check(r["DestinationConfig"]["OnFailure"]["Destination"] == sink_arn, f"on-failure destination: {r}")
    check(r["LastModified"].year >= 2025, f"LastModified is a time: {r['LastModified']!r}")
    r = lam.update_function_event_invoke_config(
        FunctionName="b3-echo", DestinationConfig={"OnSuccess": {"Destination": sink_arn}})
    check(r["MaximumRetryAttempts"] == 1 and r["DestinationConfig"]["OnSuccess"]["Destination"] == sink_arn,
          f"update keeps what it does not name: {r}")
    got = lam.get_function_event_invoke_config(FunctionName="b3-echo", Qualifier="$LATEST")
    check(got["FunctionArn"].endswith(":function:b3-echo:$LATEST"), f"get event invoke config: {got}")
    listed = lam.list_function_event_invoke_configs(FunctionName="b3-echo")["FunctionEventInvokeConfigs"]
    check(len(listed) == 1, f"list event invoke configs: {listed}")
    expect_error("InvalidParameterValueException", lam.put_function_event_invoke_config,
                 FunctionName="b3-echo", MaximumRetryAttempts=5)
    expect_error("InvalidParameterValueException", lam.put_function_event_invoke_config,
                 FunctionName="b3-echo",
                 DestinationConfig={"OnFailure": {"Destination": "arn:aws:sqs:us-east-1:000000000000:dlq"}})
    lam.delete_function_event_invoke_config(FunctionName="b3-echo")
    expect_error("ResourceNotFoundException", lam.get_function_event_invoke_config, FunctionName="b3-echo")
    lam.delete_function(FunctionName="b3-sink")

    # Versions and aliases (the weighted split itself: versions_scenario.py).
    v1 = lam.publish_version(FunctionName="b3-echo", Description="v1")
    check(v1["Version"] == "1" and v1["FunctionArn"].endswith(":b3-echo:1"), f"publish_version: {v1}")
    listed = [v["Version"] for v in lam.list_versions_by_function(FunctionName="b3-echo")["Versions"]]
    check(listed == ["$LATEST", "1"], f"list_versions_by_function: {listed}")
    alias = lam.create_alias(FunctionName="b3-echo", Name="live", FunctionVersion="1")
    check(alias["AliasArn"].endswith(":b3-echo:live"), f"create_alias: {alias}")
    got = lam.get_alias(FunctionName="b3-echo", Name="live")
    updated = lam.update_alias(FunctionName="b3-echo", Name="live", Description="canary",
                               RevisionId=got["RevisionId"])
    check(updated["Description"] == "canary", f"update_alias: {updated}")
    r = lam.invoke(FunctionName="b3-echo", Qualifier="live", Payload=b'{"q":1}')
    check(r["ExecutedVersion"] == "1" and r["Payload"].read() == b'{"Q":1}', "invoke through the alias")
    names = [x["Name"] for x in lam.list_aliases(FunctionName="b3-echo", FunctionVersion="1")["Aliases"]]
    check(names == ["live"], f"list_aliases: {names}")
    expect_error("ResourceConflictException", lam.delete_function, FunctionName="b3-echo", Qualifier="1")
    expect_error("ResourceNotFoundException", lam.invoke, FunctionName="b3-echo", Qualifier="9", Payload=b"{}")
    # Function URLs (served and driven by curl in kvm_serve_urls).
    url = lam.create_function_url_config(FunctionName="b3-echo", Qualifier="live", AuthType="NONE")
    check(url["FunctionUrl"].startswith("http") and url["FunctionArn"].endswith(":b3-echo:live"),
          f"create_function_url_config: {url}")
    expect_error("ResourceConflictException", lam.create_function_url_config, FunctionName="b3-echo",
                 Qualifier="live", AuthType="NONE")
    got = lam.get_function_url_config(FunctionName="b3-echo", Qualifier="live")
    check(got["FunctionUrl"] == url["FunctionUrl"], f"get_function_url_config: {got}")
    updated = lam.update_function_url_config(FunctionName="b3-echo", Qualifier="live", AuthType="AWS_IAM")
    check(updated["AuthType"] == "AWS_IAM", f"update_function_url_config: {updated}")
    urls = lam.list_function_url_configs(FunctionName="b3-echo")["FunctionUrlConfigs"]
    check(len(urls) == 1, f"list_function_url_configs: {urls}")
    lam.delete_function_url_config(FunctionName="b3-echo", Qualifier="live")
    expect_error("ResourceNotFoundException", lam.get_function_url_config, FunctionName="b3-echo", Qualifier="live")
    lam.delete_alias(FunctionName="b3-echo", Name="live")

    settings = lam.get_account_settings()
    count = len(lam.list_functions()["Functions"])
    check(settings["AccountUsage"]["FunctionCount"] == count, f"get_account_settings: {settings}")
    check(settings["AccountLimit"]["CodeSizeZipped"] == 50 * 1024 * 1024, f"get_account_settings: {settings}")
    check(settings["AccountUsage"]["TotalCodeSize"] > 0, f"get_account_settings: {settings}")

    lam.delete_function(FunctionName="b3-echo")
    expect_error("ResourceNotFoundException", lam.invoke, FunctionName="b3-echo", Payload=b"{}")
    expect_error("ResourceNotFoundException", lam.get_function, FunctionName="b3-echo")
    expect_error("ResourceNotFoundException", lam.list_tags, Resource=arn)
    # The tags went with the function: a new one of the same name has none.
    lam.create_function(FunctionName="b3-echo", Runtime="spore-uk", Role=role, Handler="fn-echo",
                        Code={"ZipFile": echo_zip})
    check(lam.list_tags(Resource=arn)["Tags"] == {}, "a deleted function's tags are gone")
    check("Tags" not in lam.get_function(FunctionName="b3-echo"), "no Tags in get_function without tags")
    lam.delete_function(FunctionName="b3-echo")

    # Bad input: each refused with the right exception, nothing created.
    base = dict(Runtime="spore-uk", Role=role, Handler="fn-echo")
    expect_error("InvalidParameterValueException", lam.create_function, FunctionName="bad1", Code={"ZipFile": b"not a zip"}, **base)
    expect_error(
        "InvalidParameterValueException",
        lam.create_function,
        FunctionName="bad2",
        Code={"ZipFile": zip_of(a.echo_elf, "something-else")},
        **base,
    )
    expect_error(
        "InvalidParameterValueException",
        lam.create_function,
        FunctionName="bad3",
        Runtime="python9.9",
        Role=role,
        Handler="fn-echo",
        Code={"ZipFile": echo_zip},
    )
    expect_error("InvalidParameterValueException", lam.create_function, FunctionName="bad4", Code={"ZipFile": echo_zip}, MemorySize=20000, **base)
    expect_error("InvalidParameterValueException", lam.create_function, FunctionName="../bad5", Code={"ZipFile": echo_zip}, **base)
    expect_error("InvalidParameterValueException", lam.create_function, FunctionName="bad6", Code={"ZipFile": echo_zip},
                 Tags={"aws:x": "y"}, **base)

    lam.create_function(FunctionName="cli-echo", Code={"ZipFile": echo_zip}, Tags={"made-by": "boto3"}, **base)
    expect_error("RequestTooLargeException", lam.invoke, FunctionName="cli-echo", Payload=b"x" * (6 * 1024 * 1024 + 1))
    names = sorted(f["FunctionName"] for f in lam.list_functions()["Functions"])
    check(names == ["cli-echo"], f"after bad input the functions are {names}")
    print("boto3 scenario: passed (100 invocations checked)")


if __name__ == "__main__":
    main()
