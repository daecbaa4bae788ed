"""A sandbox's lifecycle on spore's mechanisms, seen through the unmodified
e2b SDK (the nested tier's sandbox-envd scenario; tests/nested/host/).

    envd_lifecycle.py prepare     before the pause: a file, a background command
    envd_lifecycle.py check URL1 URL2
                                  after the resume (E2B_SANDBOX_URL) and the
                                  fork (URL1, URL2: the two forks' envd)
"""
import http.client
import os
import sys
import time
import urllib.request

from envd_common import check, sandbox, sh

MARKER = "/home/user/before-pause.txt"
COUNTER = "/home/user/counter"


def prepare():
    sbx = sandbox()
    sbx.files.write(MARKER, "written before the pause\n")
    h = sbx.commands.run(
        # written aside and renamed: a read never sees the truncated file
        f"i=0; while true; do i=$((i + 1)); echo $i > {COUNTER}.new; mv {COUNTER}.new {COUNTER}; sleep 0.2; done",
        background=True, timeout=0)
    time.sleep(1)
    check(counter(sbx) > 0, "a background command counts before the pause")
    with open(os.environ["LIFECYCLE_STATE"], "w") as f:
        f.write(str(h.pid))


def counter(sbx):
    return int(sbx.files.read(COUNTER).strip() or 0)


def wait_healthy(url, limit=60):
    """Until envd answers /health through `url` (a forward that L1 started
    just before it said READY may take a moment to reach the guest)."""
    deadline = time.monotonic() + limit
    while True:
        try:
            with urllib.request.urlopen(url + "/health", timeout=10) as r:
                if r.status == 204:
                    return
        except (OSError, http.client.HTTPException):
            pass
        if time.monotonic() > deadline:
            check(False, f"envd answers /health through {url} within {limit} s")
        time.sleep(0.5)


def check_after():
    url1, url2 = sys.argv[2], sys.argv[3]
    pid = int(open(os.environ["LIFECYCLE_STATE"]).read())
    for url in (os.environ["E2B_SANDBOX_URL"], url1, url2):
        wait_healthy(url)
    resumed = sandbox()
    check(resumed.files.read(MARKER) == "written before the pause\n", "after the resume: the file is there")
    check(pid in {p.pid for p in resumed.commands.list()}, "after the resume: the background command is listed")
    first = counter(resumed)
    time.sleep(1.5)
    second = counter(resumed)
    check(second > first, f"after the resume: the background command counts on ({first} -> {second})")
    check(resumed.commands.run("echo resumed").stdout == "resumed\n", "after the resume: a new command runs")

    forks = [sandbox(url=url1), sandbox(url=url2)]
    for n, fork in enumerate(forks, 1):
        check(fork.files.read(MARKER) == "written before the pause\n", f"fork {n}: has the sandbox's file")
        check(fork.commands.run("echo fork").stdout == "fork\n", f"fork {n}: runs a command")
    forks[0].files.write("/home/user/only-in-fork-1.txt", "1")
    check(forks[0].files.exists("/home/user/only-in-fork-1.txt"), "fork 1 wrote its file")
    check(not forks[1].files.exists("/home/user/only-in-fork-1.txt"), "fork 2 does not see fork 1's file")
    check(not resumed.files.exists("/home/user/only-in-fork-1.txt"), "the source does not see fork 1's file")
    ids = {sh(s, "cat /proc/sys/kernel/random/uuid") for s in [resumed] + forks}
    check(len(ids) == 3, "the three draw different random numbers")


if __name__ == "__main__":
    {"prepare": prepare, "check": check_after}[sys.argv[1]]()
