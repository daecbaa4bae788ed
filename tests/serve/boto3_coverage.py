#!/usr/bin/env python3
"""The Lambda API coverage table against botocore's Lambda model and against
what boto3 does with a running daemon.

    boto3_coverage.py --doc docs/serve/lambda-api.md --endpoint URL --echo-elf E --upper-elf U

1. The table under "## Operations" in the doc names every operation of the
   Lambda model of the installed (pinned) botocore exactly once, in its first
   column (comma-separated where a row groups several), and nothing else there;
   each row is marked ✓, ✗ or n/a, and an n/a row says why.
2. Runs boto3_scenario.py (the arguments after --doc are its own), recording
   with a botocore `after-call` hook every operation the daemon answered with
   success.
3. Every ✓ operation was answered with success at least once, and none marked
   ✗ or n/a was (the table would be behind the daemon).
Exits non-zero with what is wrong.
"""
import argparse
import os
import re
import sys

import boto3
import botocore.session

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import boto3_scenario  # noqa: E402 (found through the path above)

MARKS = ("✓", "✗", "n/a")


def fail(what):
    print(f"boto3 coverage: FAILED: {what}", file=sys.stderr)
    sys.exit(1)


def table(doc):
    """The operations table's rows: (operations, mark, notes)."""
    with open(doc, encoding="utf-8") as f:
        lines = f.read().splitlines()
    if "## Operations" not in lines:
        fail(f"{doc} has no '## Operations' section")
    rows = []
    for line in lines[lines.index("## Operations") + 1:]:
        if line.startswith("## ") or (rows and not line.startswith("|")):
            break
        if line.startswith("|"):
            # Split on the table's pipes, not on escaped ones (\|) in a cell.
            rows.append([c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]])
    if len(rows) < 3 or rows[0] != ["operation", "path", "supported", "notes"]:
        fail(f"the operations table of {doc} does not start with | operation | path | supported | notes |")
    out = []
    for cells in rows[2:]:
        if len(cells) != 4:
            fail(f"a row of {len(cells)} cells, not 4: {cells}")
        ops = [o.strip().strip("`").strip() for o in cells[0].split(",")]
        out.append((ops, cells[2], cells[3]))
    return out


def check_table(rows, model_ops):
    """The mark of every model operation; fails on anything the table gets wrong."""
    marks = {}
    for ops, mark, notes in rows:
        if mark not in MARKS:
            fail(f"{', '.join(ops)}: '{mark}' is not one of {', '.join(MARKS)}")
        if mark == "n/a" and not notes:
            fail(f"{', '.join(ops)}: n/a without the reason in its notes")
        for op in ops:
            if op not in model_ops:
                fail(f"the table names '{op}', which is no operation of botocore's Lambda model")
            if op in marks:
                fail(f"the table names {op} twice")
            marks[op] = mark
    missing = sorted(set(model_ops) - set(marks))
    if missing:
        fail(f"the table does not name these operations of botocore's Lambda model: {', '.join(missing)}")
    return marks


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--doc", required=True)
    a, scenario_args = p.parse_known_args()

    model_ops = botocore.session.get_session().get_service_model("lambda").operation_names
    marks = check_table(table(a.doc), model_ops)

    answered = set()

    def record(http_response=None, model=None, **_):
        if http_response is not None and model is not None and http_response.status_code < 300:
            answered.add(model.name)

    # Clients the scenario makes from the default session copy its handlers.
    boto3.setup_default_session()
    boto3.DEFAULT_SESSION.events.register("after-call.lambda", record)
    boto3_scenario.main(scenario_args)

    supported = {op for op, m in marks.items() if m == "✓"}
    not_called = sorted(supported - answered)
    if not_called:
        fail(f"marked ✓ but never answered with success in boto3_scenario.py: {', '.join(not_called)}")
    behind = sorted(answered - supported)
    if behind:
        fail(f"answered with success but not marked ✓ in {a.doc}: {', '.join(behind)}")
    counts = {m: sum(1 for v in marks.values() if v == m) for m in MARKS}
    print(f"boto3 coverage: passed ({len(model_ops)} operations: "
          f"{counts['✓']} ✓ all called, {counts['✗']} ✗, {counts['n/a']} n/a)")


if __name__ == "__main__":
    main()
