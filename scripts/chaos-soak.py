#!/usr/bin/env python3
"""A soak of `spore serve` on an operator's worst day (issue 29): mixed
RequestResponse and Event invocations of unikernel functions for a while,
kill -9 of random instance VMMs all along, and two kill -9 of the daemon,
each followed by a restart on the same state directory. Then the Event
queue is let drain, the daemon stopped (SIGTERM), and what is left counted.

    scripts/chaos-soak.py --spore target/release/spore [--seconds 600]
        [--functions 12] [--workers 4] [--out FILE.json]

Reports (JSON on stdout, and in --out): Event invocations accepted (202)
and run (a successful run of each is in its function's log: at least once,
so accepted == run), RequestResponse outcomes by status and error type
(every failure must carry Lambda's error type and a message), instance
kills, daemon restarts, and the leftovers after the final stop: processes,
sockets, run directories, temporary files and network namespaces of the
state directory (all must be 0). Exits 1 when an accepted event never ran,
a failure had no clear error, or anything was left.

Needs the unikernel apps (make uk; SPORE_UK_DIR) and /dev/kvm."""

import argparse
import base64
import io
import json
import os
import random
import re
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import zipfile


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon:
    def __init__(self, spore, state, port, extra):
        self.args = [spore, "serve", "--listen", f"127.0.0.1:{port}", "--state-dir", state] + extra
        self.state = state
        self.log = open(os.path.join(os.path.dirname(state), "daemon.log"), "ab")
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=self.log)
        line = self.proc.stdout.readline()
        if not line:
            sys.exit(f"the daemon did not start: see {self.log.name}")
        json.loads(line)

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def request(base, method, path, body=b"", headers=None, timeout=60):
    r = urllib.request.Request(base + path, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(r, timeout=timeout) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def processes_of(state):
    """Pids whose command line names the state directory (VMMs, clones,
    factories, the daemon, its guardian)."""
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            cmd = open(f"/proc/{p}/cmdline", "rb").read()
        except OSError:
            continue
        if state.encode() in cmd:
            out.append(int(p))
    return out


def vmm_pids(state):
    out = []
    for p in processes_of(state):
        try:
            cmd = open(f"/proc/{p}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if b"vmm" in cmd and b"--clone-factory" not in cmd:
            out.append(p)
    # Clones share their factory's command line: named spore-clone.
    for p in processes_of(state):
        try:
            if open(f"/proc/{p}/comm").read().strip() == "spore-clone":
                out.append(p)
        except OSError:
            pass
    return sorted(set(out))


REPORT = re.compile(r"^REPORT RequestId: (\S+)\t.*Outcome: (\w+)")


def successes(state, seen):
    """Adds the request ids with a successful run in any function log."""
    logs = os.path.join(state, "logs")
    try:
        names = os.listdir(logs)
    except OSError:
        return
    for n in names:
        try:
            text = open(os.path.join(logs, n), errors="replace").read()
        except OSError:
            continue
        for line in text.splitlines():
            m = REPORT.match(line)
            if m and m.group(2) == "success":
                seen.add(m.group(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spore", required=True)
    ap.add_argument("--seconds", type=int, default=600)
    ap.add_argument("--functions", type=int, default=12)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--out")
    a = ap.parse_args()
    uk = os.environ.get("SPORE_UK_DIR", "crates/spore-uk/target/x86_64-unknown-none/release")
    image = os.path.join(uk, "fn-echo")
    if not os.path.isfile(image):
        sys.exit(f"no {image}: make uk (or set SPORE_UK_DIR)")
    work = tempfile.mkdtemp(prefix="spore-soak-")
    state = os.path.join(work, "s")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    d = Daemon(os.path.abspath(a.spore), state, port,
               ["--event-retry-delay-ms", "500", "--keep-alive-ms", "3000",
                "--zygote-keep-alive-ms", "20000"])
    d.start()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("fn-echo", open(image, "rb").read())
    code = base64.b64encode(buf.getvalue()).decode()
    names = [f"soak{i}" for i in range(a.functions)]
    for n in names:
        body = json.dumps({"FunctionName": n, "Runtime": "spore-uk", "Handler": "fn-echo",
                           "Role": "arn:aws:iam::000000000000:role/soak", "MemorySize": 64,
                           "Code": {"ZipFile": code}}).encode()
        st, _, b = request(base, "POST", "/2015-03-31/functions", body)
        if st != 201:
            sys.exit(f"CreateFunction {n}: {st} {b[:200]}")

    lock = threading.Lock()
    accepted, refused, rr, unclear, examples = set(), {}, {}, [], {}
    down = threading.Event()
    end = time.time() + a.seconds
    seen = set()

    def worker(k):
        rnd = random.Random(k)
        i = 0
        while time.time() < end:
            i += 1
            n = rnd.choice(names)
            payload = json.dumps({"w": k, "i": i, "sleep_ms": rnd.choice([0, 0, 0, 50, 300])}).encode()
            event = rnd.random() < 0.4
            hdr = {"X-Amz-Invocation-Type": "Event"} if event else {}
            try:
                st, h, b = request(base, "POST", f"/2015-03-31/functions/{n}/invocations", payload, hdr)
            except (urllib.error.URLError, ConnectionError, socket.timeout, OSError) as e:
                # The daemon is down (killed, restarting): nothing was accepted.
                with lock:
                    key = "event" if event else "request"
                    refused[key] = refused.get(key, 0) + 1
                time.sleep(0.2)
                continue
            with lock:
                if event:
                    if st == 202:
                        rid = {k.lower(): v for k, v in h.items()}.get("x-amzn-requestid")
                        accepted.add(rid)
                    else:
                        rr[f"event {st}"] = rr.get(f"event {st}", 0) + 1
                else:
                    lower = {k.lower(): v for k, v in h.items()}
                    kind = lower.get("x-amzn-errortype") or (
                        "function:" + json.loads(b or b"{}").get("errorType", "?")
                        if lower.get("x-amz-function-error") else "ok")
                    key = f"{st} {kind}"
                    rr[key] = rr.get(key, 0) + 1
                    if st != 200 or lower.get("x-amz-function-error"):
                        try:
                            j = json.loads(b)
                            msg = j.get("message") or j.get("errorMessage")
                        except ValueError:
                            msg = None
                        if not msg or kind in ("ok", "function:?"):
                            unclear.append(f"{st} {b[:200]!r}")
                        ex = examples.setdefault(key, [])
                        if len(ex) < 3:
                            ex.append(str(msg)[:300])
            time.sleep(0.02)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(a.workers)]
    for t in threads:
        t.start()
    kills = restarts = 0
    restart_at = [time.time() + a.seconds / 3, time.time() + 2 * a.seconds / 3]
    rnd = random.Random(99)
    while time.time() < end:
        time.sleep(rnd.uniform(1.0, 4.0))
        successes(state, seen)
        if restart_at and time.time() >= restart_at[0]:
            restart_at.pop(0)
            d.kill9()
            time.sleep(1.0)
            d.start()
            restarts += 1
            continue
        pids = vmm_pids(state)
        if pids:
            try:
                os.kill(rnd.choice(pids), signal.SIGKILL)
                kills += 1
            except ProcessLookupError:
                pass
    for t in threads:
        t.join()
    # Let the queue drain: every accepted event has run once it is empty.
    drain_start = time.time()
    while time.time() - drain_start < 300:
        successes(state, seen)
        ev_dir = os.path.join(state, "events")
        left = [f for f in os.listdir(ev_dir) if f.endswith(".event")] if os.path.isdir(ev_dir) else []
        if not left:
            break
        time.sleep(1)
    successes(state, seen)
    d.stop()
    time.sleep(1.0)
    leftover_procs = processes_of(state)
    socks, temps = [], []
    for root, dirs, files in os.walk(state):
        for f in files:
            p = os.path.join(root, f)
            if f.endswith(".sock") or stat.S_ISSOCK(os.lstat(p).st_mode):
                socks.append(p)
            if ".tmp" in f or "spore-tmp" in f:
                temps.append(p)
    run_dir = os.path.join(state, "run")
    runs = os.listdir(run_dir) if os.path.isdir(run_dir) else []
    try:
        netns = [l for l in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.splitlines()
                 if l.startswith("sp")]
    except OSError:
        netns = []
    ran = accepted & seen
    report = {
        "seconds": a.seconds, "functions": a.functions, "workers": a.workers,
        "events_accepted": len(accepted), "events_run": len(ran),
        "events_never_run": sorted(accepted - seen)[:20],
        "request_response": rr, "failure_examples": examples,
        "refused_while_daemon_down": refused,
        "unclear_failures": unclear[:20],
        "instance_kills": kills, "daemon_kill9_restarts": restarts,
        "drain_s": round(time.time() - drain_start, 1),
        "leftover_processes": len(leftover_procs), "leftover_sockets": socks[:20],
        "leftover_run_dirs": runs[:20], "leftover_temp_files": temps[:20],
        "leftover_netns": netns, "loadavg": open("/proc/loadavg").read().split()[:3],
    }
    print(json.dumps(report, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1)
    bad = (report["events_never_run"] or unclear or leftover_procs or socks or runs or temps or netns)
    if not bad:
        subprocess.run(["rm", "-rf", work])
    else:
        print(f"state kept in {work}", file=sys.stderr)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
