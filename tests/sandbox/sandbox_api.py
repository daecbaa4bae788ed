"""spore serve's E2B-compatible sandbox control API and sandbox proxy, driven by
the unmodified e2b Python SDK (2.63.0): create, commands, files, list, timeout,
pause and resume, fork, kill, and the errors for a wrong key or template.

Like the envd scenarios (envd_common.py) it looks at the sandboxes only through
the SDK. It runs on the host against a server in a nested VM, where everything
is slow: every call gets a generous timeout, and nothing sleeps long.

    sandbox_api.py                 the scenarios
    sandbox_api.py persist-prepare a sandbox with a file, paused (its id in
                                   $SANDBOX_PERSIST_STATE), before the daemon
                                   is killed with SIGKILL and started again
    sandbox_api.py persist-check   after the restart: it resumes, with its file
    sandbox_api.py zygote-idle     account B creates from the web template,
                                   waits past $SANDBOX_ZYGOTE_IDLE_S (the
                                   daemon's --sandbox-zygote-idle), creates
                                   again (its zygote booted again)

Environment:
    E2B_API_URL, E2B_SANDBOX_URL  spore serve's address (read by the SDK itself)
    E2B_API_KEY                   a key of account A (read by the SDK itself)
    SANDBOX_OTHER_API_KEY         a key of another account B
    SANDBOX_TEMPLATE              the template to create from (default "base")
    SANDBOX_WEB_TEMPLATE          a template whose start command serves
                                  tests/sandbox/web/app.py on port 8000
    SANDBOX_PERSIST_STATE         a file the two persist steps share
    SANDBOX_NET_PROBE             HOST:PORT a networked sandbox reaches through
                                  spore serve's NAT (a TCP server there sends
                                  "spore-net-ok"); unset: no network checks
"""
import os
import secrets
import shlex
import sys
import time
import urllib.error
import urllib.request
from datetime import datetime, timedelta, timezone

from e2b import (
    AuthenticationException,
    CommandExitException,
    NotFoundException,
    Sandbox,
    SandboxQuery,
    SandboxState,
)

from envd_common import check

API = {"request_timeout": 180}  # every control-API (and envd) request
CMD = 120  # seconds a command may take
TEMPLATE = os.environ.get("SANDBOX_TEMPLATE", "base")
RUN = secrets.token_hex(8)
MARKER = "/home/user/before-pause.txt"
COUNTER = "/home/user/counter"

created = []  # ids of every sandbox made here, killed at the end


def timed(what, fn):
    start = time.monotonic()
    result = fn()
    print(f"time: {what} {int((time.monotonic() - start) * 1000)} ms")
    return result


def sh(sbx, command):
    return sbx.commands.run(command, timeout=CMD).stdout


def listed(query, **opts):
    """Every sandbox Sandbox.list yields for `query`, all pages."""
    paginator = Sandbox.list(query=query, **{**API, **opts})
    items = []
    while paginator.has_next:
        items += paginator.next_items()
    return items


def raises(exc, fn):
    """The exception of type `exc` fn raised, or None if it raised nothing."""
    try:
        fn()
    except exc as e:
        return e
    return None


def utc(dt):
    return dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)


PROBE = os.environ.get("SANDBOX_NET_PROBE", "")


def reaches_probe(sbx):
    """Whether the sandbox opens a TCP connection to $SANDBOX_NET_PROBE and
    reads the server's line (5 s to connect)."""
    host, _, port = PROBE.rpartition(":")
    code = (f"import socket; s = socket.create_connection(({host!r}, {int(port)}), 5); "
            "s.settimeout(10); print(s.recv(64).decode().strip())")
    try:
        out = sbx.commands.run(f"python3 -c {shlex.quote(code)}", timeout=CMD).stdout
    except CommandExitException:
        return False
    return out == "spore-net-ok\n"


def network():
    """allow_internet_access: on by default (the sandbox reaches a server
    outside its VM through its namespace and the NAT, and has the template's
    name server), off on request (no route out, while envd still answers)."""
    if not PROBE:
        return
    online = timed("create-networked", lambda: Sandbox.create(TEMPLATE, timeout=600, **API))
    created.append(online.sandbox_id)
    check(reaches_probe(online), f"a sandbox reaches {PROBE} outside its VM (allow_internet_access by default)")
    check(online.get_info(**API).allow_internet_access is True, "its info says allow_internet_access")
    check("nameserver 10.0.2.3" in sh(online, "cat /etc/resolv.conf"),
          "its resolv.conf names the template's name server")
    offline = timed("create-offline", lambda: Sandbox.create(
        TEMPLATE, timeout=600, allow_internet_access=False, **API))
    created.append(offline.sandbox_id)
    check(not reaches_probe(offline), f"with allow_internet_access=False it cannot reach {PROBE}")
    check(sh(offline, "echo still here") == "still here\n", "and commands still run in it (over vsock)")
    check(offline.get_info(**API).allow_internet_access is False, "its info says no internet access")
    offline.update_network({"allow_internet_access": True}, **API)
    check(reaches_probe(offline), "update_network(allow_internet_access=True) opens it while it runs")
    offline.update_network({"deny_out": ["0.0.0.0/0"]}, **API)
    check(not reaches_probe(offline), "update_network(deny_out=[0.0.0.0/0]) closes it again")
    egress_rules(offline)
    for s in (online, offline):
        check(s.kill(**API) is True, "networked sandbox killed")


def egress_rules(offline):
    """Per-destination rules: allow_out wins over deny_out (E2B's
    precedence), deny_out cuts off one address, and what spore cannot
    enforce (a domain name) is refused rather than ignored."""
    probe_ip = PROBE.rpartition(":")[0]
    ruled = timed("create-allow-out", lambda: Sandbox.create(
        TEMPLATE, timeout=600, network={"allow_out": [probe_ip], "deny_out": ["0.0.0.0/0"]}, **API))
    created.append(ruled.sandbox_id)
    check(reaches_probe(ruled), f"network allow_out=[{probe_ip}], deny_out=[0.0.0.0/0]: it reaches {PROBE}")
    info = ruled.get_info(**API)
    check(info.allow_internet_access is False and (info.network or {}).get("allow_out") == [f"{probe_ip}/32"],
          f"its info: no internet access but allow_out {(info.network or {}).get('allow_out')}")
    ruled.update_network({"deny_out": [f"{probe_ip}/32"]}, **API)
    check(not reaches_probe(ruled), f"update_network(deny_out=[{probe_ip}/32]) cuts off that address")
    check(ruled.get_info(**API).allow_internet_access is True, "while its info says internet access (one address denied)")
    check(ruled.kill(**API) is True, "the sandbox with egress rules killed")
    refused = raises(Exception, lambda: Sandbox.create(
        TEMPLATE, timeout=600, network={"allow_out": ["pypi.org"], "deny_out": ["0.0.0.0/0"]}, **API))
    check(refused is not None and "domain names are not supported" in str(refused),
          f"a domain in allow_out is refused: {str(refused)[:100]}")
    refused = raises(Exception, lambda: offline.update_network({"deny_out": ["2001:db8::/32"]}, **API))
    check(refused is not None and "not an IPv4 address" in str(refused),
          f"an IPv6 block in update_network is refused: {str(refused)[:100]}")
    check(not reaches_probe(offline), "and the refused update left the sandbox's rules as they were")


def create():
    sbx = timed("create", lambda: Sandbox.create(
        TEMPLATE, metadata={"suite": "spore", "run": RUN},
        envs={"SPORE_VAR": "hello"}, timeout=600, **API))
    created.append(sbx.sandbox_id)
    check(bool(sbx.sandbox_id), f"create: sandbox {sbx.sandbox_id}")
    return sbx


def commands(sbx):
    r = sbx.commands.run("echo hi", timeout=CMD)
    check(r.stdout == "hi\n" and r.exit_code == 0, "a command runs: echo hi")
    check(sh(sbx, "echo $SPORE_VAR") == "hello\n", "the create's env vars reach commands")
    e = raises(CommandExitException, lambda: sbx.commands.run("exit 3", timeout=CMD))
    check(e is not None and e.exit_code == 3, "a failing command raises CommandExitException, exit code 3")


def metrics(sbx):
    got = sbx.get_metrics(**API)
    check(len(got) >= 1, f"get_metrics: at least the sample taken now ({len(got)})")
    m = got[-1]
    check(m.cpu_count >= 1 and m.mem_total > 256 << 20 and 0 < m.mem_used < m.mem_total,
          f"the sample is the guest's: {m.cpu_count} vCPUs, {m.mem_used >> 20} of {m.mem_total >> 20} MiB")
    check(m.disk_total > 1 << 30 and 0 < m.disk_used < m.disk_total,
          f"and its disk: {m.disk_used >> 20} of {m.disk_total >> 20} MiB")
    past = datetime.now(timezone.utc) - timedelta(hours=2)
    check(sbx.get_metrics(start=past, end=past + timedelta(hours=1), **API) == [],
          "get_metrics of a window before the sandbox: none")


def metrics_history(sbx):
    """Later: the samples the daemon took every 5 s since, oldest first,
    and a window of them."""
    got = sbx.get_metrics(**API)
    at = [m.timestamp for m in got]
    check(len(got) >= 3 and at == sorted(at),
          f"get_metrics: the history, oldest first ({len(got)} samples over "
          f"{(at[-1] - at[0]).total_seconds() if at else 0:.0f} s)")
    start = at[-2].replace(microsecond=0) if len(at) >= 3 else None
    if start is not None and at[0] < start:
        window = sbx.get_metrics(start=start, **API)
        check(len(window) >= 2 and all(m.timestamp >= start for m in window),
              f"get_metrics from {start:%H:%M:%S}: only the samples since ({len(window)}, "
              f"of {len(got)} in all)")


def background(sbx):
    h = sbx.commands.run("cat", background=True, stdin=True, timeout=CMD)
    check(h.pid in {p.pid for p in sbx.commands.list()}, "a background command is listed")
    sbx.commands.send_stdin(h.pid, "ping\n")
    out = ""
    for stdout, _, _ in h:  # until cat echoes the line (bounded by timeout=CMD)
        out += stdout or ""
        if "ping\n" in out:
            break
    check(out == "ping\n", "stdin sent to a background command reaches it")
    check(sbx.commands.kill(h.pid), "the background command is killed")
    deadline = time.monotonic() + 20
    while h.pid in {p.pid for p in sbx.commands.list()} and time.monotonic() < deadline:
        time.sleep(0.5)
    check(h.pid not in {p.pid for p in sbx.commands.list()}, "the killed command is no longer listed")


def files(sbx):
    sbx.files.write("/home/user/a.txt", "some text\n")
    check(sbx.files.read("/home/user/a.txt") == "some text\n", "a written file reads back")
    check("a.txt" in {e.name for e in sbx.files.list("/home/user")}, "the file is listed")
    sbx.files.remove("/home/user/a.txt")
    check(not sbx.files.exists("/home/user/a.txt"), "the removed file is gone")

    sbx.files.make_dir("/home/user/w")
    watch = sbx.files.watch_dir("/home/user/w")
    try:
        sbx.files.write("/home/user/w/new.txt", "x")
        seen, deadline = [], time.monotonic() + 20
        while time.monotonic() < deadline:
            seen += [e.name for e in watch.get_new_events()]
            if any(name.endswith("new.txt") for name in seen):
                break
            time.sleep(0.5)
        check(any(name.endswith("new.txt") for name in seen), f"the watch sees the new file ({seen})")
    finally:
        watch.stop()


def big_output(sbx):
    r = sbx.commands.run("head -c 10485760 /dev/zero | tr '\\0' 'a'", timeout=CMD)
    check(len(r.stdout) == 10485760, f"10 MB of stdout streams whole ({len(r.stdout)} bytes)")


def set_timeout(sbx):
    before = utc(sbx.get_info().end_at)
    sbx.set_timeout(900)
    after = utc(sbx.get_info().end_at)
    # Created with 600 s, now 900 s from later on: at least 300 s more (either
    # side of the server's rounding); independent of the two hosts' clocks.
    check(after - before >= timedelta(seconds=280), f"set_timeout moves end_at later ({before} -> {after})")


def listing(sbx):
    found = listed(SandboxQuery(metadata={"run": RUN}))
    check([s.sandbox_id for s in found] == [sbx.sandbox_id], "list by metadata: exactly the sandbox")
    check(found[0].metadata.get("suite") == "spore", "the listed sandbox has its metadata")
    check(listed(SandboxQuery(metadata={"run": "no-such-run"})) == [], "list by metadata matching nothing: empty")
    other = os.environ["SANDBOX_OTHER_API_KEY"]
    check(sbx.sandbox_id not in {s.sandbox_id for s in listed(None, api_key=other)},
          "another account's list does not show it")
    e = raises(NotFoundException, lambda: Sandbox.connect(sbx.sandbox_id, api_key=other, **API))
    check(e is not None, f"another account cannot connect to it ({type(e).__name__})")


def pause_resume(sbx):
    sbx.files.write(MARKER, "written before the pause\n")
    h = sbx.commands.run(
        # Written to a new file and renamed: a read never sees it half written.
        f"i=0; while true; do i=$((i + 1)); echo $i > {COUNTER}.new; mv {COUNTER}.new {COUNTER}; sleep 0.2; done",
        background=True, timeout=0)
    time.sleep(1)
    check(int(sbx.files.read(COUNTER).strip() or 0) > 0, "the background counter counts")
    check(timed("pause", lambda: sbx.pause(**API)) is True, "pause")
    paused = listed(SandboxQuery(metadata={"run": RUN}, state=[SandboxState.PAUSED]))
    check([s.sandbox_id for s in paused] == [sbx.sandbox_id] and paused[0].state == SandboxState.PAUSED,
          "list with state paused: the sandbox, paused")
    check(listed(SandboxQuery(metadata={"run": RUN}, state=[SandboxState.RUNNING])) == [],
          "list with state running: not there")

    resumed = timed("resume", lambda: Sandbox.connect(sbx.sandbox_id, timeout=900, **API))
    check(resumed.files.read(MARKER) == "written before the pause\n", "after the resume: the file is there")
    first = int(resumed.files.read(COUNTER).strip() or 0)
    time.sleep(1.5)
    second = int(resumed.files.read(COUNTER).strip() or 0)
    check(second > first, f"after the resume: the counter counts on ({first} -> {second})")
    check(h.pid in {p.pid for p in resumed.commands.list()}, "after the resume: the background command is listed")
    if PROBE:
        check(reaches_probe(resumed), "after the resume: the network works (its tap reopened in a new namespace)")
    return resumed


def auto_resume():
    """A sandbox created with lifecycle auto_resume: a request through the
    proxy while it is paused wakes it, as E2B's does on inbound traffic."""
    sbx = timed("create-auto-resume", lambda: Sandbox.create(
        TEMPLATE, timeout=600, lifecycle={"on_timeout": "pause", "auto_resume": True}, **API))
    created.append(sbx.sandbox_id)
    info = sbx.get_info(**API)
    check(info.lifecycle == {"on_timeout": "pause", "auto_resume": True},
          f"its info says auto_resume, pause on timeout ({info.lifecycle})")
    sbx.files.write("/home/user/auto.txt", "before the pause\n")
    check(sbx.pause(**API) is True, "auto-resume sandbox paused")
    check(Sandbox.get_info(sbx.sandbox_id, **API).state == SandboxState.PAUSED, "it is paused")
    # No connect: the next envd request through the proxy resumes it.
    body = timed("auto-resume", lambda: sbx.files.read("/home/user/auto.txt", request_timeout=900))
    check(body == "before the pause\n", "a request to the paused sandbox resumed it: the file is there")
    check(Sandbox.get_info(sbx.sandbox_id, **API).state == SandboxState.RUNNING, "it runs again")
    check(sbx.kill(**API) is True, "auto-resume sandbox killed")
    plain = Sandbox.create(TEMPLATE, timeout=600, **API)
    created.append(plain.sandbox_id)
    check(plain.get_info(**API).lifecycle == {"on_timeout": "kill", "auto_resume": False},
          "a sandbox created without a lifecycle: kill on timeout, no auto-resume")
    check(plain.kill(**API) is True, "plain sandbox killed")


def fork_fresh(sbx):
    """A sandbox never paused (a clone of its template's zygote) forks, and
    its fork forks in turn."""
    child = sbx.fork(count=1, timeout=300)[0]
    check(isinstance(child, Sandbox), f"a sandbox never paused forks ({child!r})")
    created.append(child.sandbox_id)
    check(sh(child, "echo child") == "child\n", "its fork runs a command")
    grandchild = child.fork(count=1, timeout=300)[0]
    check(isinstance(grandchild, Sandbox), f"and that fork forks in turn ({grandchild!r})")
    created.append(grandchild.sandbox_id)
    check(sh(grandchild, "echo grandchild") == "grandchild\n", "the fork's fork runs a command")
    check(child.kill(**API) is True and grandchild.kill(**API) is True, "both killed")


def fork(sbx):
    results = timed("fork-2", lambda: sbx.fork(count=2, timeout=600))
    forks = [f for f in results if isinstance(f, Sandbox)]
    created.extend(f.sandbox_id for f in forks)
    check(len(results) == 2 and len(forks) == 2, f"fork into 2: {results}")
    ids = {sbx.sandbox_id} | {f.sandbox_id for f in forks}
    check(len(ids) == 3, "the forks have ids of their own")
    for n, f in enumerate(forks, 1):
        check(f.files.read(MARKER) == "written before the pause\n", f"fork {n}: has the sandbox's file")
    forks[0].files.write("/home/user/only-in-fork-1.txt", "1")
    check(forks[0].files.exists("/home/user/only-in-fork-1.txt"), "fork 1 wrote its file")
    check(not forks[1].files.exists("/home/user/only-in-fork-1.txt"), "fork 2 does not see fork 1's file")
    check(not sbx.files.exists("/home/user/only-in-fork-1.txt"), "the source does not see fork 1's file")
    uuids = {sh(s, "cat /proc/sys/kernel/random/uuid") for s in [sbx] + forks}
    check(len(uuids) == 3, "the three draw different random numbers")
    if PROBE:
        reached = [reaches_probe(s) for s in [sbx] + forks]
        check(all(reached), "the source and both forks reach the network at once (each fork in a "
              f"namespace of its own; source, fork 1, fork 2: {reached})")
    # A fork is a sandbox of its own: its source's pause ends the source's
    # VMM, never the forks.
    check(sbx.pause(**API) is True, "the source paused while its forks run")
    check(all(sh(f, "echo alive") == "alive\n" for f in forks),
          "both forks run on after their source is paused")
    for n, f in enumerate(forks, 1):
        check(f.kill(**API) is True, f"fork {n} killed")


def kill(sbx):
    check(sbx.kill(**API) is True, "kill the sandbox")
    e = raises(NotFoundException, lambda: Sandbox.connect(sbx.sandbox_id, **API))
    check(e is not None, f"connect to the killed sandbox: not found ({type(e).__name__})")
    # The SDK documents kill's False as "the sandbox was not found" (a 404).
    check(Sandbox.kill(sbx.sandbox_id, **API) is False, "kill the killed sandbox again: False")
    check(Sandbox.kill("no-such-sandbox-" + RUN, **API) is False, "kill an unknown id: False")


def wrong_key():
    wrong = "e2b_" + "f" * 40

    def create_wrong():
        sbx = Sandbox.create(TEMPLATE, api_key=wrong, **API)
        created.append(sbx.sandbox_id)
    check(raises(AuthenticationException, create_wrong) is not None,
          "a wrong key: create raises AuthenticationException")
    paginator = Sandbox.list(api_key=wrong, **API)
    check(raises(AuthenticationException, paginator.next_items) is not None,
          "a wrong key: list raises AuthenticationException")


def missing_template():
    try:
        sbx = Sandbox.create("no-such-template", **API)
    except Exception as e:
        check("no-such-template" in str(e), f"a missing template raises, naming it ({type(e).__name__}: {e})")
        return
    created.append(sbx.sandbox_id)
    check(False, "a missing template raises")


def template_build():
    """E2B's template-build API through the SDK's Template.build: a template
    built from this one with a RUN, an ENV and a COPY of a local file, then
    a sandbox of it that has all three; a failing step fails the build with
    its step, and a container image is refused."""
    import tempfile

    from e2b import BuildException, Template

    ctx = tempfile.mkdtemp()
    with open(os.path.join(ctx, "hello.txt"), "w") as f:
        f.write(f"copied {RUN}\n")
    name = f"built-{RUN[:8]}"
    check(Template.exists(name, **API) is False, "Template.exists: not before its build")
    check(Template.exists(TEMPLATE, **API) is True, f"Template.exists: the daemon's {TEMPLATE}")
    logs = []
    t = (Template(file_context_path=ctx)
         .from_template(TEMPLATE)
         .run_cmd("echo from-run > /etc/spore-built.txt", user="root")
         .set_envs({"SPORE_BUILT": "yes"})
         .copy("hello.txt", "/home/user/hello.txt"))
    info = timed("template-build", lambda: Template.build(
        t, name, cpu_count=1, memory_mb=512, on_build_logs=logs.append, **API))
    check(info.template_id and info.build_id,
          f"Template.build: template {info.template_id}, build {info.build_id} ({len(logs)} log lines)")
    check(any("[1/3] RUN" in str(e.message) for e in logs), "its log names the steps as they run")
    check(Template.exists(name, **API) is True, "Template.exists: after its build")
    sbx = timed("create-built", lambda: Sandbox.create(name, timeout=600, **API))
    created.append(sbx.sandbox_id)
    check(sh(sbx, "cat /etc/spore-built.txt") == "from-run\n", "a sandbox of it has what its RUN wrote")
    check(sh(sbx, "echo $SPORE_BUILT") == "yes\n", "and its ENV")
    check(sh(sbx, "cat /home/user/hello.txt; stat -c %U /home/user/hello.txt") == f"copied {RUN}\nuser\n",
          "and the file its COPY uploaded, the user's")
    check(sbx.kill(**API) is True, "the built template's sandbox is killed")
    # The build cache: the same build again runs no step and boots no VM.
    # Built as name:v1, it is that tag's build, not the default's.
    again = []
    # min_free_disk_mb grows its image (a copy: the cached layer stays).
    v1 = timed("template-build-cached", lambda: Template.build(
        t, f"{name}:v1", cpu_count=1, memory_mb=512, min_free_disk_mb=3000,
        on_build_logs=again.append, **API))
    said = [str(e.message) for e in again]
    check(sum("(cached)" in m for m in said) == 3 and any("no build VM" in m for m in said),
          f"the same build again: its 3 steps cached, no build VM ({len(said)} log lines)")
    grown = [m for m in said if "image grown" in m]
    check(len(grown) == 1, f"min_free_disk_mb=3000 grew its image: {grown or said[-3:]}")
    # A build sharing its first step starts from the image after it, and
    # skip_cache() runs the steps after it although the cache holds them.
    more = []
    t2 = (Template(file_context_path=ctx)
          .from_template(TEMPLATE)
          .run_cmd("echo from-run > /etc/spore-built.txt", user="root")
          .set_envs({"SPORE_BUILT": "yes"})
          .skip_cache()
          .copy("hello.txt", "/home/user/hello.txt")
          .run_cmd("echo second > /etc/spore-second.txt", user="root"))
    timed("template-build-layered", lambda: Template.build(
        t2, name, cpu_count=1, memory_mb=512, on_build_logs=more.append, **API))
    said = [str(e.message) for e in more]
    check(sum("(cached)" in m for m in said) == 1 and any("[1/4] RUN" in m and "(cached)" in m for m in said)
          and any("from the build cache (after step 1)" in m for m in said),
          "a build sharing its first step: that step cached, the ones after skip_cache() run: "
          + "; ".join(m for m in said if "cached" in m or "copied" in m)[:300])
    sbx = timed("create-layered", lambda: Sandbox.create(name, timeout=600, **API))
    created.append(sbx.sandbox_id)
    check(sh(sbx, "cat /etc/spore-built.txt /etc/spore-second.txt /home/user/hello.txt; echo $SPORE_BUILT")
          == f"from-run\nsecond\ncopied {RUN}\nyes\n",
          "a sandbox of that build has every step's work, the cached one's too")
    check(sbx.kill(**API) is True, "its sandbox is killed")
    template_tags(name, info.template_id, v1.build_id)
    # For persist-check, after kill -9 and a restart of the daemon.
    with open(os.environ["SANDBOX_PERSIST_STATE"] + ".template", "w") as f:
        f.write(name)
    failing = Template().from_template(TEMPLATE).run_cmd("echo about to fail; exit 7")
    e = raises(BuildException, lambda: Template.build(failing, f"{name}-bad", **API))
    check(e is not None and "exit code 7" in str(e) and "about to fail" in str(e),
          f"a failing RUN fails the build, with its output: {str(e)[:120]}")
    image = Template().from_image("python:3.12").run_cmd("true")
    e = raises(Exception, lambda: Template.build(image, f"{name}-img", **API))
    check(e is not None and "a container image is not pulled" in str(e),
          f"a container image is refused: {str(e)[:100]}")


def template_tags(name, template_id, v1_build):
    """E2B's template tags: name:v1 starts the build tagged v1 (without the
    later build's second step), beside the default one; assign_tags gives
    that build another tag, remove_tags takes it away, get_tags lists them
    (build ids the SDK reads as UUIDs)."""
    from e2b import Template

    tags = {t.tag: t.build_id for t in Template.get_tags(template_id, **API)}
    check(tags.get("v1") == v1_build and tags.get("default") not in (None, v1_build),
          f"get_tags: v1 names the tagged build, default the later one ({sorted(tags)})")
    sbx = timed("create-tagged", lambda: Sandbox.create(f"{name}:v1", timeout=600, **API))
    created.append(sbx.sandbox_id)
    check(sh(sbx, "cat /etc/spore-built.txt; test ! -e /etc/spore-second.txt || echo second") == "from-run\n",
          "a sandbox of name:v1 runs that build (the default build's second step is not in it)")
    avail = sh(sbx, "df -m --output=avail / | tail -n 1").strip()
    check(avail.isdigit() and int(avail) >= 3000, f"and has the free space its build asked for ({avail} MiB)")
    check(sbx.kill(**API) is True, "its sandbox is killed")
    assigned = Template.assign_tags(f"{name}:v1", ["stable", "v1-1"], **API)
    check(str(assigned.build_id) == v1_build and sorted(assigned.tags) == ["stable", "v1-1"],
          f"assign_tags: stable and v1-1 on v1's build ({assigned.build_id})")
    Template.remove_tags(name, "stable", **API)
    tags = {t.tag: t.build_id for t in Template.get_tags(name, **API)}
    check("stable" not in tags and tags.get("v1-1") == v1_build,
          f"remove_tags: stable is gone, v1-1 stays ({sorted(tags)})")
    e = raises(Exception, lambda: Template.remove_tags(name, "no-such-tag", **API))
    check(e is not None and "no tag" in str(e), f"removing a tag it does not have is refused: {str(e)[:100]}")
    e = raises(Exception, lambda: Sandbox.create(f"{name}:no-such-tag", timeout=60, **API))
    check(e is not None and "not found" in str(e), f"an unknown tag starts nothing: {str(e)[:100]}")


def web_template():
    """A template built by `spore sandbox template build` with a start
    command: its sandboxes start with the server already running."""
    name = os.environ.get("SANDBOX_WEB_TEMPLATE")
    if not name:
        return
    sbx = timed("create-web", lambda: Sandbox.create(name, timeout=600, **API))
    created.append(sbx.sandbox_id)
    url = os.environ["E2B_SANDBOX_URL"]
    req = urllib.request.Request(url + "/", headers={"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "8000"})
    # envd forwards a listening port to vsock within a second of seeing it
    # (the clone's envd looks again when it starts): 502 until then.
    body, deadline = None, time.monotonic() + 20
    while body is None:
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                body = r.read().decode()
        except urllib.error.HTTPError as e:
            if e.code != 502 or time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    check(body == "hello from the web template\n",
          f"the template's start command serves port 8000 through the proxy ({body!r})")
    check(sh(sbx, "grep -c serve_forever /home/user/app.py") == "1\n",
          "the template's file is in the image, as the spec put it")
    check(sbx.kill(**API) is True, "the web sandbox is killed")


def main():
    try:
        web_template()
        network()
        sbx = create()
        commands(sbx)
        metrics(sbx)
        background(sbx)
        files(sbx)
        big_output(sbx)
        set_timeout(sbx)
        listing(sbx)
        metrics_history(sbx)
        fork_fresh(sbx)
        sbx = pause_resume(sbx)
        logs(sbx)
        fork(sbx)
        kill(sbx)
        auto_resume()
        wrong_key()
        missing_template()
        template_build()
    finally:
        for sandbox_id in created:
            try:
                Sandbox.kill(sandbox_id, **API)
            except Exception as e:
                print(f"cleanup: kill {sandbox_id}: {e}")


def logs(sbx):
    """The sandbox's log, through the SDK's own generated API client (its
    Sandbox class has no call for it): what happened to it, oldest first,
    filtered and paged as E2B's v2 query says; the v1 form gives the same."""
    from e2b.api.client.api.sandboxes import get_sandboxes_sandbox_id_logs as v1_logs
    from e2b.api.client.api.sandboxes import get_v_2_sandboxes_sandbox_id_logs as v2_logs
    from e2b.api.client.models import LogLevel, LogsDirection
    from e2b.api.client_sync import get_api_client
    from e2b.connection_config import ConnectionConfig

    client = get_api_client(ConnectionConfig(**API))
    got = v2_logs.sync(sbx.sandbox_id, client=client).logs
    said = [e.message for e in got]
    check(any(m.startswith("sandbox created from template") for m in said)
          and any(m.startswith("sandbox paused in") for m in said)
          and any(m.startswith("sandbox resumed in") for m in said)
          and any(m.startswith("timeout set") for m in said),
          f"its log: created, timeout set, paused, resumed ({len(said)} entries)")
    check([e.timestamp for e in got] == sorted(e.timestamp for e in got), "oldest first")
    newest = v2_logs.sync(sbx.sandbox_id, client=client, direction=LogsDirection.BACKWARD, limit=1).logs
    check(len(newest) == 1 and newest[0].message == said[-1], f"direction=backward, limit=1: the newest ({said[-1][:40]})")
    paused = v2_logs.sync(sbx.sandbox_id, client=client, search="PAUSED").logs
    check(len(paused) >= 1 and all("paused" in e.message for e in paused), "search: the pauses")
    check(v2_logs.sync(sbx.sandbox_id, client=client, level=LogLevel.ERROR).logs == [], "level=error: none")
    old = v1_logs.sync(sbx.sandbox_id, client=client)
    check([line.line for line in old.logs] == said, "the v1 form: the same lines")


PERSISTED = "/home/user/kept-across-a-restart.txt"


def persist_prepare():
    sbx = create()
    sbx.files.write(PERSISTED, RUN)
    check(sbx.pause(**API) is True, "paused before the daemon's restart")
    with open(os.environ["SANDBOX_PERSIST_STATE"], "w") as f:
        f.write(f"{sbx.sandbox_id} {RUN}")


def persist_check():
    sandbox_id, run = open(os.environ["SANDBOX_PERSIST_STATE"]).read().split()
    found = listed(SandboxQuery(state=[SandboxState.PAUSED]))
    check(sandbox_id in {s.sandbox_id for s in found}, "after SIGKILL and a restart of the daemon: still listed, paused")
    sbx = timed("resume-after-restart", lambda: Sandbox.connect(sandbox_id, timeout=600, **API))
    check(sbx.files.read(PERSISTED) == run, "after the restart: resumed with its file")
    if PROBE:
        check(reaches_probe(sbx), "after the restart: resumed with its network")
    check(sbx.kill(**API) is True, "killed")
    built = os.environ["SANDBOX_PERSIST_STATE"] + ".template"
    if os.path.exists(built):
        name = open(built).read().strip()
        sbx = timed("create-built-after-restart", lambda: Sandbox.create(name, timeout=600, **API))
        check(sh(sbx, "cat /etc/spore-built.txt") == "from-run\n",
              f"after the restart: the built template {name} still serves, with its RUN's file")
        check(sbx.kill(**API) is True, "killed")


def zygote_idle():
    """Another account's zygote ends once it made no sandbox for the daemon's
    --sandbox-zygote-idle; that account's next create boots it again (L1
    checks the daemon's log and its processes)."""
    idle = int(os.environ["SANDBOX_ZYGOTE_IDLE_S"])
    other = {**API, "api_key": os.environ["SANDBOX_OTHER_API_KEY"]}
    name = os.environ.get("SANDBOX_WEB_TEMPLATE", TEMPLATE)
    for attempt in ("first", "again"):
        sbx = timed(f"create-other-{attempt}", lambda: Sandbox.create(name, timeout=600, **other))
        check(sh(sbx, f"echo {attempt}") == f"{attempt}\n",
              f"account B's sandbox runs ({attempt}, its zygote booted for it)")
        check(Sandbox.kill(sbx.sandbox_id, **other) is True, f"account B's sandbox killed ({attempt})")
        if attempt == "first":
            time.sleep(idle + 8)


if __name__ == "__main__":
    step = sys.argv[1] if len(sys.argv) > 1 else "all"
    steps = {"all": main, "persist-prepare": persist_prepare, "persist-check": persist_check,
             "zygote-idle": zygote_idle}
    steps[step]()
