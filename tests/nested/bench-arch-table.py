#!/usr/bin/env python3
"""Issue 15's benchmark table: the bench-arch.json of each tier side by side.

usage: bench-arch-table.py X86_JSON ARM64_JSON
Prints a Markdown table (medians, ranges) and the boot/restore ratio the
seed's Table 1 reports, for the README and docs/bench.
"""
import json
import sys


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"bench-arch-table: cannot read {path}: {e}")


def cell(s, unit="ms"):
    if not s:
        return "n/a"
    return f"{s['median']:,.0f} {unit} ({s['min']:,.0f}–{s['max']:,.0f})"


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__.strip().splitlines()[2])
    tiers = [load(p) for p in sys.argv[1:]]
    rows = [
        ("boot: VMM start → guest /init", lambda t: (t.get("boot") or {}).get("start_to_first_mark_ms")),
        ("snapshot restore (lazy, new process) → first vsock reply", lambda t: t.get("restore_to_first_reply_ms")),
        ("clone: request → clone's vCPUs start", lambda t: t.get("clone_request_to_vcpus_start_ms")),
        ("clone: request → clone's first vsock reply", lambda t: t.get("clone_request_to_first_reply_ms")),
        ("idle clone: PSS per clone process", lambda t: (t.get("clone_idle_pss_kib") or {}).get("each"), "KiB"),
    ]
    names = [t.get("arch", "?") for t in tiers]
    print(f"| figure | {' | '.join(names)} | {names[1]} / {names[0]} |")
    print("|---|" + "---|" * (len(names) + 1))
    for label, get, *unit in rows:
        vals = [get(t) for t in tiers]
        ratio = (
            f"{vals[1]['median'] / vals[0]['median']:.2f}"
            if all(vals) and vals[0]["median"]
            else "n/a"
        )
        print(f"| {label} | {' | '.join(cell(v, *unit) for v in vals)} | {ratio} |")
    for t in tiers:
        boot = ((t.get("boot") or {}).get("start_to_first_mark_ms") or {}).get("median")
        rest = (t.get("restore_to_first_reply_ms") or {}).get("median")
        if boot and rest:
            print(f"\n{t.get('arch')}: restore to first reply is {boot / rest:.1f}× faster than a boot "
                  f"({t.get('rounds')} rounds, L1 kernel {t.get('l1_kernel')}, clock {t.get('clock')})")


main()
