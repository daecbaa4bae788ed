# A pure-stdlib Python function for the serve-linux nested scenario.
import hashlib
import json
import os
import time

# Memory an invocation asked this instance to hold (the idle-memory check).
_held = []


def handler(event, context):
    n = event.get("n", 0)
    # Goes to the invocation's log (LogType: Tail).
    print(f"hello-log n={n}")
    # Touch and hold "hold_mib" MiB until an invocation says "release":
    # the host sees the guest's free memory come back afterwards.
    if event.get("hold_mib"):
        _held.append(b"\x01" * (int(event["hold_mib"]) << 20))
    if event.get("release"):
        _held.clear()
    # Keeps an instance busy, so that concurrent invocations need another.
    time.sleep(min(float(event.get("sleep", 0)), 5))
    return {
        "hello": "python3",
        "n": n,
        "sha": hashlib.sha256(str(n).encode()).hexdigest()[:12],
        "greeting": os.environ.get("GREETING", ""),
        "function": context.function_name,
        "task_root": os.environ.get("LAMBDA_TASK_ROOT", ""),
        "twice": json.loads(json.dumps([n, n])),
        # Instances cloned or restored from one snapshot must still differ.
        "rand": os.urandom(8).hex(),
        "held_mib": sum(len(b) for b in _held) >> 20,
    }
