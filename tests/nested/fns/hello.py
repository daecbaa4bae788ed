# A pure-stdlib Python function for the serve-linux nested scenario.
import hashlib
import json
import os
import time


def handler(event, context):
    n = event.get("n", 0)
    # Goes to the invocation's log (LogType: Tail).
    print(f"hello-log n={n}")
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
    }
